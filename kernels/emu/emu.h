// A host emulator for stheno's CUDA kernels, so that their logic is checked
// on machines without a GPU (`make emu-test`; CI runs it). A harness includes
// this header and then the real kernels/*.cu files, which g++ compiles as
// plain C++ (STHENO_EMULATE is defined: conv.cuh routes its inline-PTX
// wrappers here).
//
// What it emulates:
// - a launch (emu::launch): blocks run one after another; each thread of a
//   block is an OS thread, reused from block to block;
// - __syncthreads as a std::barrier over the block, __syncwarp as one over
//   the warp; a thread that returns drops out of both, as on the GPU;
// - warp shuffles (__shfl_sync, __shfl_xor_sync, __shfl_down_sync, with
//   widths) through a per-warp exchange buffer between two warp barriers:
//   every lane of the warp must take part (full masks only);
// - mma.sync.m16n8k8 TF32 (operands truncated to TF32 as the tensor cores
//   read them, FP32 accumulation), cvt.rna.tf32, ldmatrix .x4;
// - cp.async: a thread's copies are queued and land at the latest moment
//   the PTX allows (the cp.async.wait_group that must see them), or at once
//   with EMU_CP_EAGER set in the environment: the two extremes of when a
//   copy may land. Misaligned copies and ldmatrix rows abort, and so does a
//   thread that ends with copies not waited for;
// - dynamic shared memory, filled with 0xff (NaN as floats) at each block's
//   start so that reads of unwritten shared memory show up; static
//   __shared__ variables are function statics (blocks run one at a time);
// - atomicAdd/atomicMax under one global mutex (exact, race free), __ldg as
//   a plain load, the vector types the kernels use.
//
// What it does not: timing, occupancy, the GPU's memory model (anything the
// kernels get right only because of the emulated barriers' ordering is not
// a proof that they are race free), fused multiply-adds (results differ from
// the GPU in the last bits), and resource limits (registers, shared memory
// size, launch bounds).
#pragma once
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#define STHENO_EMULATE 1
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __restrict__ __restrict
#define __align__(n) alignas(n)
#define __shared__ static

using std::isinf;
using std::isnan;

struct uint3 {
  unsigned x, y, z;
};
struct dim3 {
  unsigned x, y, z;
  dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
struct alignas(16) int4 {
  int x, y, z, w;
};
inline int4 make_int4(int a, int b, int c, int d) { return int4{a, b, c, d}; }
struct alignas(8) float2 {
  float x, y;
};
inline float2 make_float2(float a, float b) { return float2{a, b}; }
struct alignas(16) float4 {
  float x, y, z, w;
};
inline float4 make_float4(float a, float b, float c, float d) { return float4{a, b, c, d}; }
struct alignas(16) double2 {
  double x, y;
};
inline double2 make_double2(double a, double b) { return double2{a, b}; }

template <class T>
inline T min(T a, T b) { return b < a ? b : a; }
template <class T>
inline T max(T a, T b) { return a < b ? b : a; }

// Arithmetic rounded step by step (the host compiler does not fuse without
// FMA instructions, which the emulator's flags do not enable).
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline double __dsub_rn(double a, double b) { return a - b; }

// __ldg: a plain load on the host.
template <class V>
inline V __ldg(const V* p) { return *p; }

// Atomics: one global lock (slow, but exact and race free).
namespace emu {
inline std::mutex atomic_mu;
}
template <class V>
inline V atomicAdd(V* p, V v) {
  std::lock_guard<std::mutex> g(emu::atomic_mu);
  const V old = *p;
  *p = old + v;
  return old;
}
inline int atomicMax(int* p, int v) {
  std::lock_guard<std::mutex> g(emu::atomic_mu);
  const int old = *p;
  if (v > old) *p = v;
  return old;
}

namespace emu {
struct Block {
  std::unique_ptr<std::barrier<>> bar;
  std::vector<std::unique_ptr<std::barrier<>>> warp_bars;
  std::vector<unsigned char> smem;
  std::vector<std::array<uint64_t, 32>> xchg;
  std::vector<std::array<uint32_t, 32 * 6>> mma;
};
struct Thread {
  uint3 tid, bid;
  dim3 bdim, gdim;
  Block* blk;
  int warp, lane;
};
inline thread_local Thread T_;
inline void warp_wait() { T_.blk->warp_bars[T_.warp]->arrive_and_wait(); }
}  // namespace emu

#define threadIdx (emu::T_.tid)
#define blockIdx (emu::T_.bid)
#define blockDim (emu::T_.bdim)
#define gridDim (emu::T_.gdim)

inline void __syncthreads() { emu::T_.blk->bar->arrive_and_wait(); }
inline void __syncwarp() { emu::warp_wait(); }

namespace emu {
// Lane src_in_seg of the calling lane's segment of `width` lanes; a source
// outside the segment returns the lane's own value (as __shfl_down_sync
// past the end does).
template <class V>
inline V shfl_from(V v, int src_in_seg, int width) {
  static_assert(sizeof(V) <= 8, "");
  if (width <= 0 || width > 32 || (width & (width - 1))) {
    fprintf(stderr, "bad shuffle width %d\n", width);
    abort();
  }
  auto& x = T_.blk->xchg[T_.warp];
  uint64_t bits = 0;
  memcpy(&bits, &v, sizeof(V));
  x[T_.lane] = bits;
  warp_wait();
  const int seg = T_.lane & ~(width - 1);
  const int src = src_in_seg >= 0 && src_in_seg < width ? seg + src_in_seg : T_.lane;
  const uint64_t o = x[src];
  warp_wait();
  V r;
  memcpy(&r, &o, sizeof(V));
  return r;
}
inline void full_mask(unsigned mask) {
  if (mask != 0xffffffffu) {
    fprintf(stderr, "emulated shuffles take full masks only\n");
    abort();
  }
}
}  // namespace emu

template <class V>
inline V __shfl_xor_sync(unsigned mask, V v, int off, int width = 32) {
  emu::full_mask(mask);
  return emu::shfl_from(v, (emu::T_.lane & (width - 1)) ^ off, width);
}
template <class V>
inline V __shfl_sync(unsigned mask, V v, int src, int width = 32) {
  emu::full_mask(mask);
  return emu::shfl_from(v, src & (width - 1), width);
}
template <class V>
inline V __shfl_down_sync(unsigned mask, V v, unsigned delta, int width = 32) {
  emu::full_mask(mask);
  const int i = (emu::T_.lane & (width - 1)) + static_cast<int>(delta);
  return emu::shfl_from(v, i < width ? i : -1, width);
}

inline unsigned __umulhi(unsigned a, unsigned b) { return static_cast<unsigned>((static_cast<uint64_t>(a) * b) >> 32); }
inline float bits_to_float(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}
inline uint32_t float_to_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
// cvt.rna.tf32.f32: round the magnitude to 10 mantissa bits, ties away.
inline uint32_t emu_to_tf32(float x) {
  uint32_t b = float_to_bits(x);
  if ((b & 0x7f800000u) != 0x7f800000u) b += 0x1000u;
  return b & 0xffffe000u;
}

// cp.async (see the header comment).
namespace emu {
struct Copy {
  void* dst;
  const void* src;
  int size, src_bytes;
};
struct CpState {
  std::vector<std::vector<Copy>> groups;  // committed, oldest first
  std::vector<Copy> open;
};
inline thread_local CpState cp;
inline bool cp_eager() {
  static const bool e = getenv("EMU_CP_EAGER") != nullptr;
  return e;
}
inline void land(const Copy& c) {
  unsigned char* d = static_cast<unsigned char*>(c.dst);
  memset(d, 0, c.size);
  if (c.src_bytes > 0) memcpy(d, c.src, c.src_bytes);
}
}  // namespace emu
// Copies of 16 bytes so far, for tests that check which path a kernel took.
inline std::atomic<long> emu_cp16_count{0};
inline void emu_cp_async(void* dst, const void* src, int size, int src_bytes) {
  if (size == 16) ++emu_cp16_count;
  if (reinterpret_cast<uintptr_t>(dst) % size != 0 || (src_bytes > 0 && reinterpret_cast<uintptr_t>(src) % size != 0)) {
    fprintf(stderr, "misaligned cp.async of %d bytes\n", size);
    abort();
  }
  emu::Copy c{dst, src, size, src_bytes};
  if (emu::cp_eager())
    emu::land(c);
  else
    emu::cp.open.push_back(c);
}
inline void emu_cp_async_commit() {
  emu::cp.groups.push_back(std::move(emu::cp.open));
  emu::cp.open.clear();
}
inline void emu_cp_async_wait(int n) {
  while (static_cast<int>(emu::cp.groups.size()) > n) {
    for (auto& c : emu::cp.groups.front()) emu::land(c);
    emu::cp.groups.erase(emu::cp.groups.begin());
  }
}

// ldmatrix .x4 .b16 of 32-bit words: lane 8j+r gives row r of matrix j;
// lane l gets word l%4 of row l/4 of matrix j in r[j].
inline void emu_ldmatrix_x4(uint32_t (&r)[4], const void* row) {
  auto& x = emu::T_.blk->xchg[emu::T_.warp];
  x[emu::T_.lane] = reinterpret_cast<uint64_t>(row);
  emu::warp_wait();
  const int l = emu::T_.lane;
  for (int j = 0; j < 4; ++j) {
    const uint64_t a = x[8 * j + l / 4];
    if (a % 16 != 0) {
      fprintf(stderr, "misaligned ldmatrix row\n");
      abort();
    }
    memcpy(&r[j], reinterpret_cast<const unsigned char*>(a) + 4 * (l % 4), 4);
  }
  emu::warp_wait();
}
inline unsigned char* emu_smem() { return emu::T_.blk->smem.data(); }

// mma.sync.m16n8k8 row.col f32.tf32.tf32.f32, per the PTX ISA fragment layout.
inline void emu_mma_tf32(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  auto& m = emu::T_.blk->mma[emu::T_.warp];
  const int L = emu::T_.lane;
  for (int i = 0; i < 4; ++i) m[L * 6 + i] = a[i];
  for (int i = 0; i < 2; ++i) m[L * 6 + 4 + i] = b[i];
  emu::warp_wait();
  float A[16][8], B[8][8];
  for (int l = 0; l < 32; ++l) {
    const int g = l >> 2, t = l & 3;
    auto tf = [&](uint32_t u) { return bits_to_float(u & 0xffffe000u); };  // the MMA reads 19 bits
    A[g][t] = tf(m[l * 6 + 0]);
    A[g + 8][t] = tf(m[l * 6 + 1]);
    A[g][t + 4] = tf(m[l * 6 + 2]);
    A[g + 8][t + 4] = tf(m[l * 6 + 3]);
    B[t][g] = tf(m[l * 6 + 4]);
    B[t + 4][g] = tf(m[l * 6 + 5]);
  }
  emu::warp_wait();
  const int g = L >> 2, t = L & 3;
  const int rows[4] = {g, g, g + 8, g + 8}, cols[4] = {2 * t, 2 * t + 1, 2 * t, 2 * t + 1};
  for (int e = 0; e < 4; ++e) {
    float s = d[e];
    for (int k = 0; k < 8; ++k) s += A[rows[e]][k] * B[k][cols[e]];
    d[e] = s;
  }
}

namespace emu {
// Runs kernel k over grid x block with smem bytes of dynamic shared memory.
// One OS thread per thread of a block, reused for every block: between
// blocks the threads meet at a barrier whose completion step sets up the
// next block's barriers and shared memory.
template <class P>
void launch(void (*k)(P), dim3 grid, dim3 block, size_t smem, const P& p) {
  const int nt = block.x * block.y * block.z;
  const int nw = (nt + 31) / 32;
  const long nblocks = long(grid.x) * grid.y * grid.z;
  if (nt <= 0 || nt > 1024 || nblocks <= 0) {
    fprintf(stderr, "bad launch: %ld blocks of %d threads\n", nblocks, nt);
    abort();
  }
  Block blk;
  long cur = 0;
  auto setup = [&] {
    blk.bar = std::make_unique<std::barrier<>>(nt);
    blk.warp_bars.clear();
    for (int w = 0; w < nw; ++w) blk.warp_bars.push_back(std::make_unique<std::barrier<>>(std::min(32, nt - 32 * w)));
    blk.smem.assign(smem + 16, 0xff);
    blk.xchg.assign(nw, {});
    blk.mma.assign(nw, {});
  };
  setup();
  auto next = [&]() noexcept {
    if (++cur < nblocks) setup();
  };
  std::barrier<decltype(next)> between(nt, next);
  std::vector<std::thread> ts;
  ts.reserve(nt);
  for (int t = 0; t < nt; ++t) {
    ts.emplace_back([&, t] {
      T_.tid = uint3{static_cast<unsigned>(t % block.x), static_cast<unsigned>(t / block.x % block.y),
                     static_cast<unsigned>(t / (block.x * block.y))};
      T_.bdim = block;
      T_.gdim = grid;
      T_.blk = &blk;
      T_.warp = t / 32;
      T_.lane = t % 32;
      for (long b = 0; b < nblocks; ++b) {
        T_.bid = uint3{static_cast<unsigned>(b % grid.x), static_cast<unsigned>(b / grid.x % grid.y),
                       static_cast<unsigned>(b / (long(grid.x) * grid.y))};
        k(p);
        // Copies still in flight when a thread ends would land after the
        // block is gone: a bug. (Empty groups may be left.)
        for (auto& g : cp.groups)
          if (!g.empty()) {
            fprintf(stderr, "a thread ended with cp.async copies not waited for\n");
            abort();
          }
        if (!cp.open.empty()) {
          fprintf(stderr, "a thread ended with cp.async copies not committed\n");
          abort();
        }
        cp.groups.clear();
        blk.warp_bars[T_.warp]->arrive_and_drop();
        blk.bar->arrive_and_drop();
        between.arrive_and_wait();
      }
    });
  }
  for (auto& th : ts) th.join();
}
}  // namespace emu
