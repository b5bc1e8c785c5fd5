// Probe (not part of the library): how much would ConvBN's elementwise
// passes gain by walking the tensor in the order that finds the previous
// kernel's last 50 MB still in L2? fpn_p2's z is [2,256,200,336] float32.
// A "producer" writes z the way conv_fprop_v6 does (tiles of 128 pixels x
// all 256 channels, tiles in ascending pixel order), then bn_apply runs in
// its grid order (planes fastest, chunks strided over the plane) or in
// descending tile order. Backward: a reduction reads z and dy ascending,
// then the dz pass in either order, then a consumer reads dz in ascending
// tile order (as the dgrad's gather does).
//
//   nvcc -O3 -std=c++17 -arch=sm_90 kernels/bench/probe_l2order.cu -o probe_l2order && ./probe_l2order
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>

constexpr int N = 2, C = 256, HW = 200 * 336, TILE = 128, TILES = HW / TILE;  // 525 tiles an image
constexpr int THREADS = 256;

#define CK(x)                                                                                       \
  do {                                                                                              \
    cudaError_t e_ = (x);                                                                           \
    if (e_ != cudaSuccess) {                                                                        \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));         \
      exit(1);                                                                                      \
    }                                                                                               \
  } while (0)

// Tile t = blockIdx.x (ascending: image 0's pixels, then image 1's): all
// channels of 128 pixels, as the conv's epilogue stores them.
__global__ void produce(float* z, float v) {
  const int t = blockIdx.x, n = t / TILES, p0 = (t % TILES) * TILE;
  for (int i = threadIdx.x; i < C * TILE / 4; i += blockDim.x) {
    const int c = i / (TILE / 4), q = i % (TILE / 4);
    reinterpret_cast<float4*>(z + (size_t(n) * C + c) * HW + p0)[q] = make_float4(v, v, v, v);
  }
}

// bn_apply_x4's order: grid (N*C planes, chunks), grid-stride in a plane.
__global__ void apply_grid(const float* z, float* y) {
  const size_t off = size_t(blockIdx.x) * HW;
  const float4* z4 = reinterpret_cast<const float4*>(z + off);
  float4* y4 = reinterpret_cast<float4*>(y + off);
  for (int i = blockIdx.y * blockDim.x + threadIdx.x; i < HW / 4; i += gridDim.y * blockDim.x) {
    const float4 a = z4[i];
    y4[i] = make_float4(fmaxf(a.x * 1.5f, 0.f), fmaxf(a.y * 1.5f, 0.f), fmaxf(a.z * 1.5f, 0.f), fmaxf(a.w * 1.5f, 0.f));
  }
}

// Descending tile order: block b takes tile N*TILES-1-b (groups of kT
// tiles), all channels.
template <int kT>
__global__ void apply_desc(const float* z, float* y) {
  const int t0 = (N * TILES / kT - 1 - blockIdx.x) * kT, n = t0 / TILES, p0 = (t0 % TILES) * TILE;
  constexpr int q_per_c = kT * TILE / 4;
  for (int i = threadIdx.x; i < C * q_per_c; i += blockDim.x) {
    const int c = i / q_per_c, q = i % q_per_c;
    const size_t o = (size_t(n) * C + c) * HW + p0;
    const float4 a = reinterpret_cast<const float4*>(z + o)[q];
    reinterpret_cast<float4*>(y + o)[q] =
        make_float4(fmaxf(a.x * 1.5f, 0.f), fmaxf(a.y * 1.5f, 0.f), fmaxf(a.z * 1.5f, 0.f), fmaxf(a.w * 1.5f, 0.f));
  }
}

// Backward dz pass: reads z and dy, writes dz.
__global__ void bwd_grid(const float* z, const float* dy, float* dz) {
  const size_t off = size_t(blockIdx.x) * HW;
  const float4 *z4 = reinterpret_cast<const float4*>(z + off), *d4 = reinterpret_cast<const float4*>(dy + off);
  float4* o4 = reinterpret_cast<float4*>(dz + off);
  for (int i = blockIdx.y * blockDim.x + threadIdx.x; i < HW / 4; i += gridDim.y * blockDim.x) {
    const float4 a = z4[i], d = d4[i];
    o4[i] = make_float4(a.x > 0 ? d.x - a.x : 0.f, a.y > 0 ? d.y - a.y : 0.f, a.z > 0 ? d.z - a.z : 0.f,
                        a.w > 0 ? d.w - a.w : 0.f);
  }
}
template <int kT>
__global__ void bwd_desc(const float* z, const float* dy, float* dz) {
  const int t0 = (N * TILES / kT - 1 - blockIdx.x) * kT, n = t0 / TILES, p0 = (t0 % TILES) * TILE;
  constexpr int q_per_c = kT * TILE / 4;
  for (int i = threadIdx.x; i < C * q_per_c; i += blockDim.x) {
    const int c = i / q_per_c, q = i % q_per_c;
    const size_t o = (size_t(n) * C + c) * HW + p0;
    const float4 a = reinterpret_cast<const float4*>(z + o)[q], d = reinterpret_cast<const float4*>(dy + o)[q];
    reinterpret_cast<float4*>(dz + o)[q] = make_float4(a.x > 0 ? d.x - a.x : 0.f, a.y > 0 ? d.y - a.y : 0.f,
                                                       a.z > 0 ? d.z - a.z : 0.f, a.w > 0 ? d.w - a.w : 0.f);
  }
}

// dz pass plane by plane, planes descending (grid (chunks, planes)): starts
// where a plane-by-plane reduction ended.
__global__ void bwd_planes_desc(const float* z, const float* dy, float* dz) {
  const int r = gridDim.y - 1 - blockIdx.y;  // the reduction's order (c slowest), reversed
  const size_t off = size_t((r % N) * C + r / N) * HW;
  const float4 *z4 = reinterpret_cast<const float4*>(z + off), *d4 = reinterpret_cast<const float4*>(dy + off);
  float4* o4 = reinterpret_cast<float4*>(dz + off);
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < HW / 4; i += gridDim.x * blockDim.x) {
    const float4 a = z4[i], d = d4[i];
    o4[i] = make_float4(a.x > 0 ? d.x - a.x : 0.f, a.y > 0 ? d.y - a.y : 0.f, a.z > 0 ? d.z - a.z : 0.f,
                        a.w > 0 ? d.w - a.w : 0.f);
  }
}

// Reads z and dy plane by plane, as bn_grad_reduce's grid (chunks, N, C)
// does (grid (chunks, planes) here), or dz in ascending tile order (a stand-in for the dgrad).
__global__ void read_two(const float* a, const float* b, float* sink) {
  const int plane = (blockIdx.y % N) * C + blockIdx.y / N;  // c slowest, as bn_grad_reduce
  const size_t off = size_t(plane) * HW;
  const int chunk = (HW / 4 + gridDim.x - 1) / gridDim.x;
  float s = 0.f;
  for (int i = blockIdx.x * chunk + threadIdx.x; i < min(HW / 4, (int(blockIdx.x) + 1) * chunk); i += blockDim.x) {
    const float4 u = reinterpret_cast<const float4*>(a + off)[i], v = reinterpret_cast<const float4*>(b + off)[i];
    s += u.x + u.y + u.z + u.w + v.x + v.y + v.z + v.w;
  }
  if (s == 12345.f) sink[0] = s;
}
__global__ void read_tiles(const float* a, float* sink) {
  const int t = blockIdx.x, n = t / TILES, p0 = (t % TILES) * TILE;
  float s = 0.f;
  for (int i = threadIdx.x; i < C * TILE / 4; i += blockDim.x) {
    const int c = i / (TILE / 4), q = i % (TILE / 4);
    const float4 u = reinterpret_cast<const float4*>(a + (size_t(n) * C + c) * HW + p0)[q];
    s += u.x + u.y + u.z + u.w;
  }
  if (s == 12345.f) sink[0] = s;
}

int main() {
  const size_t n = size_t(N) * C * HW;
  float *z, *y, *dy, *sink;
  CK(cudaMalloc(&z, n * 4));
  CK(cudaMalloc(&y, n * 4));
  CK(cudaMalloc(&dy, n * 4));
  CK(cudaMalloc(&sink, 4));
  CK(cudaMemset(dy, 0, n * 4));
  cudaEvent_t ev[4];
  for (auto& e : ev) CK(cudaEventCreate(&e));
  const dim3 grid_planes(N * C, 17);  // bn_apply's grid for fpn_p2: 16800 float4 a plane / 1024
  auto time = [&](const char* name, auto before, auto step, auto after) {
    std::vector<float> t, tot;
    for (int r = 0; r < 35; ++r) {
      before();
      CK(cudaEventRecord(ev[0]));
      step();
      CK(cudaEventRecord(ev[1]));
      after();
      CK(cudaEventRecord(ev[2]));
      CK(cudaEventSynchronize(ev[2]));
      float a, b;
      CK(cudaEventElapsedTime(&a, ev[0], ev[1]));
      CK(cudaEventElapsedTime(&b, ev[0], ev[2]));
      if (r >= 5) t.push_back(a), tot.push_back(b);
    }
    CK(cudaGetLastError());
    std::sort(t.begin(), t.end());
    std::sort(tot.begin(), tot.end());
    printf("%-40s pass %.4f ms   pass + next %.4f ms\n", name, t[t.size() / 2], tot[tot.size() / 2]);
  };
  auto nothing = [] {};
  auto prod = [&] { produce<<<N * TILES, THREADS>>>(z, 0.5f); };
  auto flush = [&] { CK(cudaMemset(y, 0, n * 4)); };  // evicts z from L2
  // Forward: the apply after the producer.
  time("fwd apply, grid order, after conv", prod, [&] { apply_grid<<<grid_planes, THREADS>>>(z, y); }, nothing);
  time("fwd apply, descending tiles(1)", prod, [&] { apply_desc<1><<<N * TILES, THREADS>>>(z, y); }, nothing);
  time("fwd apply, descending tiles(4)", prod, [&] { apply_desc<4><<<N * TILES / 4, THREADS>>>(z, y); }, nothing);
  time("fwd apply, grid order, cold", [&] { prod(); flush(); }, [&] { apply_grid<<<grid_planes, THREADS>>>(z, y); }, nothing);
  time("fwd apply, descending(1), cold", [&] { prod(); flush(); }, [&] { apply_desc<1><<<N * TILES, THREADS>>>(z, y); }, nothing);
  // Backward: reduce (ascending), dz pass, then a dgrad-like tile reader.
  auto reduce = [&] { read_two<<<dim3(17, N * C), THREADS>>>(z, dy, sink); };
  auto dgrad = [&] { read_tiles<<<N * TILES, THREADS>>>(y, sink); };
  time("bwd dz pass, grid order", reduce, [&] { bwd_grid<<<grid_planes, THREADS>>>(z, dy, y); }, dgrad);
  time("bwd dz pass, descending tiles(1)", reduce, [&] { bwd_desc<1><<<N * TILES, THREADS>>>(z, dy, y); }, dgrad);
  time("bwd dz pass, descending tiles(4)", reduce, [&] { bwd_desc<4><<<N * TILES / 4, THREADS>>>(z, dy, y); }, dgrad);
  time("bwd dz pass, planes descending", reduce, [&] { bwd_planes_desc<<<dim3(17, N * C), THREADS>>>(z, dy, y); }, dgrad);
  time("dgrad-like reader alone, cold", [&] { flush(); CK(cudaMemset(z, 0, n * 4)); }, dgrad, nothing);
  return 0;
}
