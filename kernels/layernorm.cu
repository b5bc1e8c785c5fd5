// LayerNorm over the last dimension (torch.nn.functional.layer_norm with
// normalized_shape [C]): the CUDA twins of kernels/layernorm.go, over x
// [rows, C], row-major. Per row, with mean and the biased variance var of
// the row's C values, rstd = 1/sqrt(var + eps) and xhat = (x - mean)*rstd:
//
//   forward:  y = xhat*gamma + beta                      (gamma, beta optional)
//   bwd_dx:   dx = rstd*(g - mean(g) - xhat*mean(g*xhat)),  g = dy*gamma (or dy)
//   bwd_params, colsum: dgamma = sum over rows of dy*xhat, dbeta = sum of dy
//
// The statistics are not saved by the forward pass: each backward kernel
// works them out again from the row it reads anyway, with the forward's
// own code and order of summation, so they are the forward's bit for bit.
// Keeping them would cost the graph more memory traffic than the shuffles
// that recompute them: a copy of y out of a packed [y | mean | rstd], or a
// second read of x by an op of their own (ops/layernorm.go).
//
// Statistics: two passes over the row, the sum and then the sum of squared
// deviations from the mean, accumulated in T (float for float32, as
// PyTorch's CUDA kernels; double for float64). Two passes rather than
// Welford: the row is in registers (warp kernels) or in L1 (block kernels),
// so the second pass reads nothing more from DRAM, and the sum of squared
// deviations has neither the cancellation of E[x^2] - E[x]^2 nor Welford's
// division per element.
//
// Determinism, and the CPU twin: every sum runs in an order fixed by C, the
// dtype and the launch geometry kernels.NewLayerNormParams chooses from the
// shape alone: each thread adds its elements in order from zero, a
// butterfly over the warp's lanes (add_rn with the partner lane's value at
// distances 16, 8, 4, 2, 1), then, in the block kernels, the same butterfly
// over the warps' sums. The column sums of dgamma and dbeta go in two
// passes, per-block partial sums (bwd_params) and then their sum over the
// blocks (colsum), in fixed orders too; no atomics. Every product, sum and
// difference is rounded on its own (mul_rn, add_rn, sub_rn: never
// contracted into a fused multiply-add), divisions and square roots are
// IEEE's, so the CPU twin, which adds in the same orders, gives the same
// bits.
//
// Words in the kernels' names:
//   warp_row1k, warp_row4k: a warp per row, the row held in registers, for
//     rows of up to 1 KiB (256 floats, 128 doubles) or 4 KiB whose length is
//     a multiple of a 16-byte chunk (4 floats, 2 doubles). Lane l holds the
//     row's chunks l, l+32, ...; row4k's registers would cost row1k's rows
//     occupancy. LayerNormWarps warps a block.
//   block_v16b: a block per row of any length that is a multiple of a
//     16-byte chunk, thread t owning the chunks t, t+blockDim.x, ...; the
//     row is read again (from L1/L2) for each pass.
//   block: the same with single elements, for any length.
//   bwd_dx: dx; bwd_params: per-block partial column sums of dy*xhat and of
//     dy; colsum: the sum of those partial rows.
//
// 16-byte loads need 16-byte aligned rows. Where a tensor's address is not
// (a view of whole rows may start anywhere), the same chunks are read
// element by element: what each thread adds, and in which order, is the
// same.
#include <stdint.h>

#include "params_gen.cuh"

namespace stheno::ln {

// One params struct for the row kernels: fwd, bwd_dx and bwd_params.
struct LayerNormParams {
  uint64_t x;      // [rows, c]; bwd_params reads it only for dgamma
  uint64_t gamma;  // [c] scale, or 0: none
  uint64_t beta;   // [c] shift, or 0: none (forward only)
  uint64_t dy;     // backward: the output's gradient [rows, c]
  uint64_t out;    // fwd: y [rows, c]; bwd_dx: dx [rows, c]; bwd_params: [gridDim.x, sums*c]
  int64_t rows;
  double eps;
  int32_t c;
  int32_t dgamma;  // bwd_params: sum dy*xhat into the first c columns of each partial row
  int32_t dbeta;   // bwd_params: sum dy into the c columns after dgamma's (the first c without)
  int32_t unused;
};
STHENO_PARAMS(LayerNormParams);

// colsum: out[j] = the sum over r < rows of in[r*cols + j].
struct ColSumParams {
  uint64_t in;   // [rows, cols]
  uint64_t out;  // [cols]
  int64_t rows;
  int32_t cols;
  int32_t unused;
};
STHENO_PARAMS(ColSumParams);

// stheno:const LayerNormWarps
// Warps per block of the warp kernels: each takes rows blockIdx.x*8 + warp,
// then a grid's worth of rows further, and bwd_params adds its warps'
// column sums in this order.
constexpr int kWarps = 8;

// 16-byte chunks a lane holds in the warp kernels row1k and row4k.
constexpr int kRow1kChunks = 2;
constexpr int kRow4kChunks = 8;

// stheno:const LayerNormRow1kBytes
// The longest row row1k holds: 2 chunks of 16 bytes a lane.
constexpr int kRow1kBytes = 32 * 16 * kRow1kChunks;

// stheno:const LayerNormWarpRowBytes
// The longest row the warp kernels hold (row4k): 8 chunks of 16 bytes a
// lane.
constexpr int kWarpRowBytes = 32 * 16 * kRow4kChunks;
static_assert(kRow1kBytes == 1024 && kWarpRowBytes == 4096, "the kernels' names say 1k and 4k");

// stheno:const ColSumWarps
// colsum's block: 8 warps of 32 columns; warp w adds rows w, w+8, ...
constexpr int kColSumWarps = 8;

// Elements per 16-byte chunk.
template <typename T>
constexpr int kChunk = 16 / static_cast<int>(sizeof(T));

// Arithmetic rounded step by step: nvcc never fuses these intrinsics into
// fused multiply-adds, so the results are the CPU twin's, which rounds
// every operation too.
__device__ __forceinline__ float add_rn(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ double add_rn(double a, double b) { return __dadd_rn(a, b); }
__device__ __forceinline__ float sub_rn(float a, float b) { return __fsub_rn(a, b); }
__device__ __forceinline__ double sub_rn(double a, double b) { return __dsub_rn(a, b); }
__device__ __forceinline__ float mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double mul_rn(double a, double b) { return __dmul_rn(a, b); }

// The sum of v over the warp, the same in every lane: a butterfly, in which
// lanes l and l^off add the same two values (addition commutes), so that
// the tree is ((v0+v16) + (v8+v24)) + ... whatever the lane.
template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
#pragma unroll
  for (int off = 16; off > 0; off /= 2) v = add_rn(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}

// The sum of v over the block (blockDim.x a multiple of 32, at most 1024),
// the same in every thread: warp_sum, then warp_sum over the warps' sums
// (zeros past the last warp). scratch holds 32 T of shared memory, free
// again when it returns.
template <typename T>
__device__ __forceinline__ T block_sum(T v, T* scratch) {
  v = warp_sum(v);
  const int warps = blockDim.x >> 5;
  if (warps == 1) return v;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = warp_sum(lane < warps ? scratch[lane] : T(0));
  __syncthreads();
  return v;
}

// 1/sqrt(var + eps) in T, as the CPU twin's invStd: the square root in
// float64, rounded once (for float32, the correctly rounded float square
// root), then an IEEE division.
template <typename T>
__device__ __forceinline__ T inv_std(T var, double eps) {
  return T(1) / static_cast<T>(sqrt(static_cast<double>(add_rn(var, static_cast<T>(eps)))));
}

// A 16-byte chunk at p into v: one vector load when vec (p 16-byte
// aligned), else element by element.
__device__ __forceinline__ void load_chunk(const float* p, bool vec, float* v) {
  if (vec) {
    const float4 q = *reinterpret_cast<const float4*>(p);
    v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
  } else {
#pragma unroll
    for (int e = 0; e < 4; ++e) v[e] = p[e];
  }
}
__device__ __forceinline__ void load_chunk(const double* p, bool vec, double* v) {
  if (vec) {
    const double2 q = *reinterpret_cast<const double2*>(p);
    v[0] = q.x, v[1] = q.y;
  } else {
    v[0] = p[0], v[1] = p[1];
  }
}
__device__ __forceinline__ void store_chunk(float* p, bool vec, const float* v) {
  if (vec) {
    *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
  } else {
#pragma unroll
    for (int e = 0; e < 4; ++e) p[e] = v[e];
  }
}
__device__ __forceinline__ void store_chunk(double* p, bool vec, const double* v) {
  if (vec) {
    *reinterpret_cast<double2*>(p) = make_double2(v[0], v[1]);
  } else {
    p[0] = v[0], p[1] = v[1];
  }
}

// Whether every one of these addresses is 16-byte aligned (0: absent).
__device__ __forceinline__ bool aligned16(uint64_t a, uint64_t b, uint64_t c = 0, uint64_t d = 0) {
  return ((a | b | c | d) & 15) == 0;
}

template <typename T>
__device__ __forceinline__ const T* ptr(uint64_t a) {
  return reinterpret_cast<const T*>(a);
}

// ---------------------------------------------------------------------------
// A warp per row. Lane l holds chunk l + 32*i of the row in v[i*kN, i*kN +
// kN) for i < kChunks; chunks past the row's end hold nothing and enter no
// sum.

template <typename T, int kChunks>
struct WarpRow {
  static constexpr int kN = kChunk<T>;
  T v[kChunks * kN];
};

// Whether lane's chunk i lies in a row of nchunks chunks.
__device__ __forceinline__ bool has_chunk(int lane, int i, int nchunks) { return lane + 32 * i < nchunks; }

template <typename T, int kChunks>
__device__ __forceinline__ void warp_load(WarpRow<T, kChunks>& r, const T* row, int nchunks, bool vec) {
  constexpr int kN = kChunk<T>;
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int i = 0; i < kChunks; ++i) {
    if (has_chunk(lane, i, nchunks)) load_chunk(row + static_cast<int64_t>(lane + 32 * i) * kN, vec, &r.v[i * kN]);
  }
}

// The row's mean and rstd: the sum of the lane's elements in order, the
// warp's butterfly, the mean; then the same for the squared deviations.
template <typename T, int kChunks>
__device__ __forceinline__ void warp_stats(const WarpRow<T, kChunks>& r, int nchunks, int c, double eps, T& mean,
                                           T& rstd) {
  constexpr int kN = kChunk<T>;
  const int lane = threadIdx.x & 31;
  T s = T(0);
#pragma unroll
  for (int i = 0; i < kChunks; ++i) {
    if (has_chunk(lane, i, nchunks)) {
#pragma unroll
      for (int e = 0; e < kN; ++e) s = add_rn(s, r.v[i * kN + e]);
    }
  }
  mean = warp_sum(s) / static_cast<T>(c);
  s = T(0);
#pragma unroll
  for (int i = 0; i < kChunks; ++i) {
    if (has_chunk(lane, i, nchunks)) {
#pragma unroll
      for (int e = 0; e < kN; ++e) {
        const T d = sub_rn(r.v[i * kN + e], mean);
        s = add_rn(s, mul_rn(d, d));
      }
    }
  }
  rstd = inv_std(warp_sum(s) / static_cast<T>(c), eps);
}

// The rows of the warp kernels: warp w of block b takes rows b*kWarps + w,
// then every gridDim.x*kWarps rows further (uniform over the warp, whose
// lanes all take part in its shuffles).
__device__ __forceinline__ int64_t warp_first_row() {
  return static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
}
__device__ __forceinline__ int64_t warp_row_stride() { return static_cast<int64_t>(gridDim.x) * kWarps; }

template <typename T, int kChunks>
__device__ __forceinline__ void fwd_warp(const LayerNormParams& p) {
  constexpr int kN = kChunk<T>;
  const int lane = threadIdx.x & 31;
  const int nchunks = p.c / kN;
  const bool vec = aligned16(p.x, p.out, p.gamma, p.beta);
  const T* gamma = ptr<T>(p.gamma);
  const T* beta = ptr<T>(p.beta);
  for (int64_t row = warp_first_row(); row < p.rows; row += warp_row_stride()) {
    const int64_t off = row * p.c;
    WarpRow<T, kChunks> r;
    warp_load(r, ptr<T>(p.x) + off, nchunks, vec);
    T mean, rstd;
    warp_stats(r, nchunks, p.c, p.eps, mean, rstd);
#pragma unroll
    for (int i = 0; i < kChunks; ++i) {
      if (!has_chunk(lane, i, nchunks)) continue;
      const int j = (lane + 32 * i) * kN;
      T* v = &r.v[i * kN];
      T g[kN], b[kN];
      if (gamma != nullptr) load_chunk(gamma + j, vec, g);
      if (beta != nullptr) load_chunk(beta + j, vec, b);
#pragma unroll
      for (int e = 0; e < kN; ++e) {
        T y = mul_rn(sub_rn(v[e], mean), rstd);
        if (gamma != nullptr) y = mul_rn(y, g[e]);
        if (beta != nullptr) y = add_rn(y, b[e]);
        v[e] = y;
      }
      store_chunk(reinterpret_cast<T*>(p.out) + off + j, vec, v);
    }
  }
}

template <typename T, int kChunks>
__device__ __forceinline__ void bwd_dx_warp(const LayerNormParams& p) {
  constexpr int kN = kChunk<T>;
  const int lane = threadIdx.x & 31;
  const int nchunks = p.c / kN;
  const bool vec = aligned16(p.x, p.dy, p.out, p.gamma);
  const T* gamma = ptr<T>(p.gamma);
  for (int64_t row = warp_first_row(); row < p.rows; row += warp_row_stride()) {
    const int64_t off = row * p.c;
    WarpRow<T, kChunks> r, g;
    warp_load(r, ptr<T>(p.x) + off, nchunks, vec);
    warp_load(g, ptr<T>(p.dy) + off, nchunks, vec);
    T mean, rstd;
    warp_stats(r, nchunks, p.c, p.eps, mean, rstd);
    // r becomes xhat, g dy*gamma; a and b sum g and g*xhat.
    T a = T(0), b = T(0);
#pragma unroll
    for (int i = 0; i < kChunks; ++i) {
      if (!has_chunk(lane, i, nchunks)) continue;
      T gm[kN];
      if (gamma != nullptr) load_chunk(gamma + (lane + 32 * i) * kN, vec, gm);
#pragma unroll
      for (int e = 0; e < kN; ++e) {
        const int k = i * kN + e;
        r.v[k] = mul_rn(sub_rn(r.v[k], mean), rstd);
        if (gamma != nullptr) g.v[k] = mul_rn(g.v[k], gm[e]);
        a = add_rn(a, g.v[k]);
        b = add_rn(b, mul_rn(g.v[k], r.v[k]));
      }
    }
    const T ma = warp_sum(a) / static_cast<T>(p.c);
    const T mb = warp_sum(b) / static_cast<T>(p.c);
#pragma unroll
    for (int i = 0; i < kChunks; ++i) {
      if (!has_chunk(lane, i, nchunks)) continue;
      T* v = &g.v[i * kN];
#pragma unroll
      for (int e = 0; e < kN; ++e) v[e] = mul_rn(rstd, sub_rn(sub_rn(v[e], ma), mul_rn(r.v[i * kN + e], mb)));
      store_chunk(reinterpret_cast<T*>(p.out) + off + (lane + 32 * i) * kN, vec, v);
    }
  }
}

// Per-block partial column sums: each lane adds dy*xhat (dgamma) and dy
// (dbeta) of its columns over its warp's rows, from zero and in row order;
// then the block adds its warps' sums in warp order (warp 0's as they are,
// then warp 1's, ...) in shared memory and writes them as partial row
// blockIdx.x of out: [dgamma sums | dbeta sums], whichever are asked for.
template <typename T, int kChunks>
__device__ __forceinline__ void bwd_params_warp(const LayerNormParams& p) {
  constexpr int kN = kChunk<T>;
  constexpr int kItems = kChunks * kN;
  __shared__ T sums[2 * 32 * kItems];  // the block's [dgamma | dbeta] sums
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int nchunks = p.c / kN;
  const bool dgamma = p.dgamma != 0, dbeta = p.dbeta != 0;
  const bool vec = aligned16(dgamma ? p.x : 0, p.dy);
  T ag[kItems], ab[kItems];
#pragma unroll
  for (int k = 0; k < kItems; ++k) ag[k] = T(0), ab[k] = T(0);
  for (int64_t row = warp_first_row(); row < p.rows; row += warp_row_stride()) {
    const int64_t off = row * p.c;
    WarpRow<T, kChunks> r, d;
    T mean = T(0), rstd = T(0);
    if (dgamma) {
      warp_load(r, ptr<T>(p.x) + off, nchunks, vec);
      warp_stats(r, nchunks, p.c, p.eps, mean, rstd);
    }
    warp_load(d, ptr<T>(p.dy) + off, nchunks, vec);
#pragma unroll
    for (int i = 0; i < kChunks; ++i) {
      if (!has_chunk(lane, i, nchunks)) continue;
#pragma unroll
      for (int e = 0; e < kN; ++e) {
        const int k = i * kN + e;
        if (dgamma) ag[k] = add_rn(ag[k], mul_rn(d.v[k], mul_rn(sub_rn(r.v[k], mean), rstd)));
        if (dbeta) ab[k] = add_rn(ab[k], d.v[k]);
      }
    }
  }
  const int bcol = dgamma ? p.c : 0;  // where the dbeta sums start
  for (int w = 0; w < kWarps; ++w) {
    if (warp == w) {
#pragma unroll
      for (int i = 0; i < kChunks; ++i) {
        if (!has_chunk(lane, i, nchunks)) continue;
#pragma unroll
        for (int e = 0; e < kN; ++e) {
          const int k = i * kN + e, j = (lane + 32 * i) * kN + e;
          if (dgamma) sums[j] = w == 0 ? ag[k] : add_rn(sums[j], ag[k]);
          if (dbeta) sums[bcol + j] = w == 0 ? ab[k] : add_rn(sums[bcol + j], ab[k]);
        }
      }
    }
    __syncthreads();
  }
  const int n = (dgamma + dbeta) * p.c;
  T* out = reinterpret_cast<T*>(p.out) + static_cast<int64_t>(blockIdx.x) * n;
  for (int j = threadIdx.x; j < n; j += blockDim.x) out[j] = sums[j];
}

// ---------------------------------------------------------------------------
// A block per row. Thread t owns the row's units (kV-element chunks) t,
// t + blockDim.x, ...; each pass reads them again.

// The sum over the block of f(j), j running over the thread's elements in
// order (unit by unit, each unit's elements in order), from zero.
template <typename T, int kV, typename F>
__device__ __forceinline__ T block_row_sum(int c, T* scratch, F f) {
  T s = T(0);
  for (int u = threadIdx.x; u < c / kV; u += blockDim.x) {
#pragma unroll
    for (int e = 0; e < kV; ++e) s = add_rn(s, f(u * kV + e));
  }
  return block_sum(s, scratch);
}

template <typename T, int kV>
__device__ __forceinline__ void block_stats(const T* x, int c, double eps, T* scratch, T& mean, T& rstd) {
  mean = block_row_sum<T, kV>(c, scratch, [&](int j) { return x[j]; }) / static_cast<T>(c);
  const T m = mean;
  const T ss = block_row_sum<T, kV>(c, scratch, [&](int j) {
    const T d = sub_rn(x[j], m);
    return mul_rn(d, d);
  });
  rstd = inv_std(ss / static_cast<T>(c), eps);
}

// The block's unit u of row into v: a vector load when vec (kV == kChunk).
template <typename T, int kV>
__device__ __forceinline__ void load_unit(const T* row, int u, bool vec, T* v) {
  if constexpr (kV == 1) {
    v[0] = row[u];
  } else {
    load_chunk(row + u * kV, vec, v);
  }
}
template <typename T, int kV>
__device__ __forceinline__ void store_unit(T* row, int u, bool vec, const T* v) {
  if constexpr (kV == 1) {
    row[u] = v[0];
  } else {
    store_chunk(row + u * kV, vec, v);
  }
}

template <typename T, int kV>
__device__ __forceinline__ void fwd_block(const LayerNormParams& p) {
  __shared__ T scratch[32];
  const bool vec = aligned16(p.x, p.out, p.gamma, p.beta);
  const T* gamma = ptr<T>(p.gamma);
  const T* beta = ptr<T>(p.beta);
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    const int64_t off = row * p.c;
    const T* x = ptr<T>(p.x) + off;
    T mean, rstd;
    block_stats<T, kV>(x, p.c, p.eps, scratch, mean, rstd);
    for (int u = threadIdx.x; u < p.c / kV; u += blockDim.x) {
      T v[kV], g[kV], b[kV];
      load_unit<T, kV>(x, u, vec, v);
      if (gamma != nullptr) load_unit<T, kV>(gamma, u, vec, g);
      if (beta != nullptr) load_unit<T, kV>(beta, u, vec, b);
#pragma unroll
      for (int e = 0; e < kV; ++e) {
        T y = mul_rn(sub_rn(v[e], mean), rstd);
        if (gamma != nullptr) y = mul_rn(y, g[e]);
        if (beta != nullptr) y = add_rn(y, b[e]);
        v[e] = y;
      }
      store_unit<T, kV>(reinterpret_cast<T*>(p.out) + off, u, vec, v);
    }
  }
}

template <typename T, int kV>
__device__ __forceinline__ void bwd_dx_block(const LayerNormParams& p) {
  __shared__ T scratch[32];
  const T* gamma = ptr<T>(p.gamma);
  const bool vec = aligned16(p.x, p.dy, p.out, p.gamma);
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    const int64_t off = row * p.c;
    const T* x = ptr<T>(p.x) + off;
    const T* dy = ptr<T>(p.dy) + off;
    T mean, rstd;
    block_stats<T, kV>(x, p.c, p.eps, scratch, mean, rstd);
    // g and g*xhat, each element as the warp kernels compute it.
    const auto g = [&](int j) { return gamma != nullptr ? mul_rn(dy[j], gamma[j]) : dy[j]; };
    const auto xhat = [&](int j) { return mul_rn(sub_rn(x[j], mean), rstd); };
    const T ma = block_row_sum<T, kV>(p.c, scratch, g) / static_cast<T>(p.c);
    const T mb = block_row_sum<T, kV>(p.c, scratch, [&](int j) { return mul_rn(g(j), xhat(j)); }) /
                 static_cast<T>(p.c);
    for (int u = threadIdx.x; u < p.c / kV; u += blockDim.x) {
      T xv[kV], dv[kV], gm[kV];
      load_unit<T, kV>(x, u, vec, xv);
      load_unit<T, kV>(dy, u, vec, dv);
      if (gamma != nullptr) load_unit<T, kV>(gamma, u, vec, gm);
#pragma unroll
      for (int e = 0; e < kV; ++e) {
        const T gv = gamma != nullptr ? mul_rn(dv[e], gm[e]) : dv[e];
        const T xh = mul_rn(sub_rn(xv[e], mean), rstd);
        dv[e] = mul_rn(rstd, sub_rn(sub_rn(gv, ma), mul_rn(xh, mb)));
      }
      store_unit<T, kV>(reinterpret_cast<T*>(p.out) + off, u, vec, dv);
    }
  }
}

// Per-block partial column sums, a block per row: the block's partial row
// of out is zeroed, then each thread adds its columns' dy*xhat and dy to it
// row after row (rows blockIdx.x, blockIdx.x + gridDim.x, ...). Each element
// of the partial row belongs to one thread, which alone reads and writes
// it: no barrier, no atomics.
template <typename T, int kV>
__device__ __forceinline__ void bwd_params_block(const LayerNormParams& p) {
  __shared__ T scratch[32];
  const bool dgamma = p.dgamma != 0, dbeta = p.dbeta != 0;
  const bool vec = aligned16(dgamma ? p.x : 0, p.dy);
  const int bcol = dgamma ? p.c : 0;
  T* out = reinterpret_cast<T*>(p.out) + static_cast<int64_t>(blockIdx.x) * (dgamma + dbeta) * p.c;
  for (int u = threadIdx.x; u < p.c / kV; u += blockDim.x) {
#pragma unroll
    for (int e = 0; e < kV; ++e) {
      if (dgamma) out[u * kV + e] = T(0);
      if (dbeta) out[bcol + u * kV + e] = T(0);
    }
  }
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    const int64_t off = row * p.c;
    const T* x = ptr<T>(p.x) + off;
    T mean = T(0), rstd = T(0);
    if (dgamma) block_stats<T, kV>(x, p.c, p.eps, scratch, mean, rstd);
    for (int u = threadIdx.x; u < p.c / kV; u += blockDim.x) {
      T xv[kV], dv[kV];
      if (dgamma) load_unit<T, kV>(x, u, vec, xv);
      load_unit<T, kV>(ptr<T>(p.dy) + off, u, vec, dv);
#pragma unroll
      for (int e = 0; e < kV; ++e) {
        const int j = u * kV + e;
        if (dgamma) out[j] = add_rn(out[j], mul_rn(dv[e], mul_rn(sub_rn(xv[e], mean), rstd)));
        if (dbeta) out[bcol + j] = add_rn(out[bcol + j], dv[e]);
      }
    }
  }
}

// The second pass of the column sums: block b sums columns [32b, 32b+32)
// of in; warp w adds rows w, w + kColSumWarps, ... from zero, and thread
// (w = 0, lane) adds the warps' sums in warp order.
template <typename T>
__device__ __forceinline__ void colsum(const ColSumParams& p) {
  __shared__ T part[kColSumWarps][32];
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * 32 + lane;
  const T* in = ptr<T>(p.in);
  T s = T(0);
  if (j < p.cols) {
    for (int64_t r = w; r < p.rows; r += kColSumWarps) s = add_rn(s, in[r * p.cols + j]);
  }
  part[w][lane] = s;
  __syncthreads();
  if (w == 0 && j < p.cols) {
    T t = part[0][lane];
#pragma unroll
    for (int k = 1; k < kColSumWarps; ++k) t = add_rn(t, part[k][lane]);
    reinterpret_cast<T*>(p.out)[j] = t;
  }
}

}  // namespace stheno::ln

extern "C" {
// clang-format off
__global__ void __launch_bounds__(256) layernorm_fwd_warp_row1k_f32(stheno::ln::LayerNormParams p) { stheno::ln::fwd_warp<float, stheno::ln::kRow1kChunks>(p); }
__global__ void __launch_bounds__(256) layernorm_fwd_warp_row1k_f64(stheno::ln::LayerNormParams p) { stheno::ln::fwd_warp<double, stheno::ln::kRow1kChunks>(p); }
__global__ void __launch_bounds__(256) layernorm_fwd_warp_row4k_f32(stheno::ln::LayerNormParams p) { stheno::ln::fwd_warp<float, stheno::ln::kRow4kChunks>(p); }
__global__ void __launch_bounds__(256) layernorm_fwd_warp_row4k_f64(stheno::ln::LayerNormParams p) { stheno::ln::fwd_warp<double, stheno::ln::kRow4kChunks>(p); }
__global__ void __launch_bounds__(1024) layernorm_fwd_block_v16b_f32(stheno::ln::LayerNormParams p) { stheno::ln::fwd_block<float, 4>(p); }
__global__ void __launch_bounds__(1024) layernorm_fwd_block_v16b_f64(stheno::ln::LayerNormParams p) { stheno::ln::fwd_block<double, 2>(p); }
__global__ void __launch_bounds__(1024) layernorm_fwd_block_f32(stheno::ln::LayerNormParams p) { stheno::ln::fwd_block<float, 1>(p); }
__global__ void __launch_bounds__(1024) layernorm_fwd_block_f64(stheno::ln::LayerNormParams p) { stheno::ln::fwd_block<double, 1>(p); }

__global__ void __launch_bounds__(256) layernorm_bwd_dx_warp_row1k_f32(stheno::ln::LayerNormParams p) { stheno::ln::bwd_dx_warp<float, stheno::ln::kRow1kChunks>(p); }
__global__ void __launch_bounds__(256) layernorm_bwd_dx_warp_row1k_f64(stheno::ln::LayerNormParams p) { stheno::ln::bwd_dx_warp<double, stheno::ln::kRow1kChunks>(p); }
__global__ void __launch_bounds__(256) layernorm_bwd_dx_warp_row4k_f32(stheno::ln::LayerNormParams p) { stheno::ln::bwd_dx_warp<float, stheno::ln::kRow4kChunks>(p); }
__global__ void __launch_bounds__(256) layernorm_bwd_dx_warp_row4k_f64(stheno::ln::LayerNormParams p) { stheno::ln::bwd_dx_warp<double, stheno::ln::kRow4kChunks>(p); }
__global__ void __launch_bounds__(1024) layernorm_bwd_dx_block_v16b_f32(stheno::ln::LayerNormParams p) { stheno::ln::bwd_dx_block<float, 4>(p); }
__global__ void __launch_bounds__(1024) layernorm_bwd_dx_block_v16b_f64(stheno::ln::LayerNormParams p) { stheno::ln::bwd_dx_block<double, 2>(p); }
__global__ void __launch_bounds__(1024) layernorm_bwd_dx_block_f32(stheno::ln::LayerNormParams p) { stheno::ln::bwd_dx_block<float, 1>(p); }
__global__ void __launch_bounds__(1024) layernorm_bwd_dx_block_f64(stheno::ln::LayerNormParams p) { stheno::ln::bwd_dx_block<double, 1>(p); }

__global__ void __launch_bounds__(256) layernorm_bwd_params_warp_row1k_f32(stheno::ln::LayerNormParams p) { stheno::ln::bwd_params_warp<float, stheno::ln::kRow1kChunks>(p); }
__global__ void __launch_bounds__(256) layernorm_bwd_params_warp_row1k_f64(stheno::ln::LayerNormParams p) { stheno::ln::bwd_params_warp<double, stheno::ln::kRow1kChunks>(p); }
__global__ void __launch_bounds__(256) layernorm_bwd_params_warp_row4k_f32(stheno::ln::LayerNormParams p) { stheno::ln::bwd_params_warp<float, stheno::ln::kRow4kChunks>(p); }
__global__ void __launch_bounds__(256) layernorm_bwd_params_warp_row4k_f64(stheno::ln::LayerNormParams p) { stheno::ln::bwd_params_warp<double, stheno::ln::kRow4kChunks>(p); }
__global__ void __launch_bounds__(1024) layernorm_bwd_params_block_v16b_f32(stheno::ln::LayerNormParams p) { stheno::ln::bwd_params_block<float, 4>(p); }
__global__ void __launch_bounds__(1024) layernorm_bwd_params_block_v16b_f64(stheno::ln::LayerNormParams p) { stheno::ln::bwd_params_block<double, 2>(p); }
__global__ void __launch_bounds__(1024) layernorm_bwd_params_block_f32(stheno::ln::LayerNormParams p) { stheno::ln::bwd_params_block<float, 1>(p); }
__global__ void __launch_bounds__(1024) layernorm_bwd_params_block_f64(stheno::ln::LayerNormParams p) { stheno::ln::bwd_params_block<double, 1>(p); }

__global__ void __launch_bounds__(256) layernorm_colsum_f32(stheno::ln::ColSumParams p) { stheno::ln::colsum<float>(p); }
__global__ void __launch_bounds__(256) layernorm_colsum_f64(stheno::ln::ColSumParams p) { stheno::ln::colsum<double>(p); }
// clang-format on
}
