// Probe (not part of the library): does the L2 take a 128-byte row of
// float32 reductions faster as one TMA bulk reduction
// (cp.reduce.async.bulk ... add.f32, from shared memory) than as the
// eight 16-byte red.global.v4.f32.add of 8 lanes that the MSDeformAttn
// backward (msdeform_sm90a.cu) and the RoIAlign backward scatter send now?
// Their reductions bound both kernels: the L2 is ~87% busy with them
// (BENCHMARKS.md, "MSDeformAttn backward").
//
// Events stand for the encoder's sample corners: 2 x 22223 queries x 8
// heads x 16 points x 4 corners, each adding 32 channels (128 bytes) to
// one (pixel, head) row of a [2, 22223, 8, 32] float32 gradient (45.5 MB,
// L2-resident). Rows are drawn "local" (near the query's own pixel, as the
// encoder's are) or "uniform". Every event adds 1.0 to its 32 floats, so
// the buffer must sum to exactly events * 32.
//
// The machine with the GPU has nvcc 13, which assembles the bulk
// instructions (the project's nvcc 11.8 cannot; its sm_90a route would):
//
//   nvcc -O3 -std=c++17 -arch=sm_90a kernels/bench/probe_bulkred.cu -o probe_bulkred && ./probe_bulkred
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#define CK(x)                                                                               \
  do {                                                                                      \
    cudaError_t e_ = (x);                                                                   \
    if (e_ != cudaSuccess) {                                                                \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      exit(1);                                                                              \
    }                                                                                       \
  } while (0)

constexpr int IMAGES = 2, S = 22223, W = 167, HEADS = 8, SAMPLES = 16;  // samples per (query, head)
constexpr long ROWS = long(IMAGES) * S * HEADS;
constexpr long EVENTS = ROWS * SAMPLES * 4;  // one per (query, head, sample, corner)
constexpr int THREADS = 256;

__device__ __forceinline__ uint32_t mix(uint32_t x) {
  x ^= x >> 16, x *= 0x7feb352du, x ^= x >> 15, x *= 0x846ca68bu, x ^= x >> 16;
  return x;
}

// The row event e adds to.
template <bool LOCAL>
__device__ __forceinline__ long event_row(long e) {
  const long s = e >> 2;  // sample
  const int corner = int(e & 3);
  if (!LOCAL) return long(mix(uint32_t(s) * 4 + corner)) % ROWS;
  const long qh = s / SAMPLES;  // (image, query, head)
  const int head = int(qh % HEADS);
  const long iq = qh / HEADS;
  const int image = int(iq / S), q = int(iq % S);
  const uint32_t h = mix(uint32_t(s));
  int pixel = q + (int(h % 9) - 4) * W + (int((h >> 8) % 9) - 4) + (corner & 1) + (corner >> 1) * W;
  pixel = min(max(pixel, 0), S - 1);
  return (long(image) * S + pixel) * HEADS + head;
}

// A group of 8 lanes per event, 16 bytes a lane.
template <bool LOCAL>
__global__ void __launch_bounds__(THREADS) red_v4(float* g) {
  const long groups = long(gridDim.x) * THREADS / 8;
  const int lane8 = threadIdx.x & 7;
  for (long e = (long(blockIdx.x) * THREADS + threadIdx.x) / 8; e < EVENTS; e += groups) {
    float* a = g + event_row<LOCAL>(e) * 32 + lane8 * 4;
    asm volatile("red.global.v4.f32.add [%0], {%1, %2, %3, %4};" ::"l"(a), "f"(1.f), "f"(1.f), "f"(1.f), "f"(1.f)
                 : "memory");
  }
}

// The same groups of 8 lanes, each writing its 16 bytes into a shared-memory
// slot; the group's lane 0 sends the 128 bytes as one bulk reduction. A ring
// of NSLOT slots per group: a slot is written again only once the bulk
// operation issued NSLOT rounds before has read it.
template <bool LOCAL, int NSLOT>
__global__ void __launch_bounds__(THREADS) red_bulk(float* g) {
  __shared__ __align__(128) float slots[NSLOT][THREADS / 8][32];
  const long groups = long(gridDim.x) * THREADS / 8;
  const int lane8 = threadIdx.x & 7, group = threadIdx.x / 8;
  // Every lane of a warp runs the same number of rounds (the loop bound is
  // per warp), so that __syncwarp sees all 32.
  const long warp0 = (long(blockIdx.x) * THREADS + (threadIdx.x & ~31)) / 8;
  int round = 0;
  for (long e0 = warp0; e0 < EVENTS; e0 += groups, ++round) {
    const long e = e0 + (threadIdx.x & 31) / 8;
    const int k = round % NSLOT;
    if (lane8 == 0) asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(NSLOT - 1) : "memory");
    __syncwarp();
    if (e < EVENTS) {
      *reinterpret_cast<float4*>(&slots[k][group][lane8 * 4]) = make_float4(1.f, 1.f, 1.f, 1.f);
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    }
    __syncwarp();
    if (e < EVENTS && lane8 == 0) {
      float* dst = g + event_row<LOCAL>(e) * 32;
      const uint32_t src = uint32_t(__cvta_generic_to_shared(&slots[k][group][0]));
      asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], 128;" ::"l"(dst), "r"(src)
                   : "memory");
      asm volatile("cp.async.bulk.commit_group;" ::: "memory");
    }
  }
  if (lane8 == 0) asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}

template <class F>
static float time_ms(F launch, float* g, size_t bytes, double* sum) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  std::vector<float> ts;
  for (int i = 0; i < 12; ++i) {
    CK(cudaMemset(g, 0, bytes));
    CK(cudaEventRecord(a));
    launch();
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    float t;
    CK(cudaEventElapsedTime(&t, a, b));
    if (i >= 2) ts.push_back(t);
  }
  CK(cudaGetLastError());
  std::vector<float> h(bytes / 4);
  CK(cudaMemcpy(h.data(), g, bytes, cudaMemcpyDeviceToHost));
  *sum = 0;
  for (float x : h) *sum += x;
  std::sort(ts.begin(), ts.end());
  return ts[ts.size() / 2];
}

int main() {
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  const size_t bytes = size_t(ROWS) * 32 * 4;
  float* g;
  CK(cudaMalloc(&g, bytes));
  const int blocks = prop.multiProcessorCount * 8;
  const double want = double(EVENTS) * 32;
  printf("%s: %ld events of 128 bytes into %.1f MB, %d blocks of %d\n", prop.name, EVENTS, bytes / 1e6, blocks,
         THREADS);
  struct Run {
    const char* name;
    void (*launch)(float*, int);
  };
  const Run runs[] = {
      {"red.v4 local", [](float* g, int b) { red_v4<true><<<b, THREADS>>>(g); }},
      {"bulk local, 2 slots", [](float* g, int b) { red_bulk<true, 2><<<b, THREADS>>>(g); }},
      {"bulk local, 4 slots", [](float* g, int b) { red_bulk<true, 4><<<b, THREADS>>>(g); }},
      {"bulk local, 8 slots", [](float* g, int b) { red_bulk<true, 8><<<b, THREADS>>>(g); }},
      {"red.v4 uniform", [](float* g, int b) { red_v4<false><<<b, THREADS>>>(g); }},
      {"bulk uniform, 4 slots", [](float* g, int b) { red_bulk<false, 4><<<b, THREADS>>>(g); }},
  };
  int bad = 0;
  for (const auto& r : runs) {
    double sum;
    const float ms = time_ms([&] { r.launch(g, blocks); }, g, bytes, &sum);
    const bool ok = sum == want;
    bad += !ok;
    printf("%-24s %.4f ms  %.1f G rows/s  %s (sum %.0f, want %.0f)\n", r.name, ms, EVENTS / (ms * 1e6),
           ok ? "ok" : "WRONG", sum, want);
  }
  CK(cudaFree(g));
  return bad ? 1 : 0;
}
