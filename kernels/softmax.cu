// Softmax and log-softmax along one axis, forward and backward: the CUDA
// twins of kernels/softmax.go. The tensor is seen as [rows, n, inner], n
// the axis's length; each of the rows*inner lines of n elements (stride
// inner) is one softmax:
//
//	forward:   y = exp(x - max) / sum exp(x - max)
//	           log: y = (x - max) - log(sum exp(x - max))
//	backward:  dx = y * (dy - sum dy*y)
//	           log: dx = dy - exp(y) * sum dy
//
// as PyTorch computes them (the max subtracted, so no exp overflows). A
// NaN anywhere in a line makes the whole line NaN, as in PyTorch: the max
// keeps a NaN it meets (nan_max), and the sum would carry one anyway; a
// line of -inf only, or holding +inf, is NaN too (-inf - -inf and inf -
// inf are NaN). An -inf among finite values gives 0 (log: -inf).
//
// Kernels are named softmax_<pass>_<design>[_v16b]_<dtype>, pass fwd or bwd
// and log-softmax a flag of the params; ops picks the design by shape
// (softmaxPlanFor in ops/softmax_device.go):
//
// - warp (inner == 1, rows of up to 32*kLaneBytes bytes: 1024 float32,
//   512 float64): a group of `lanes` lanes (a power of two, up to a warp)
//   per row, the row held in registers, kLaneBytes per lane, so that x (and
//   y, dy) are read once: a single read and a single write per element.
//   Short rows share a warp: rows of 16 float32 are 4 lanes of one 16-byte
//   vector each, 8 rows a warp.
// - lane (inner == 1, rows of up to 32 vectors): the warp design with room
//   for one vector per lane. The warp kernels' registers, sized for their
//   longest row, halve the blocks an SM holds; short rows (MSDeformAttn's
//   weights, 16 per row) are bound by the loads in flight, so they take
//   these. Same lanes, same order of every sum: the same bits as warp.
// - block (inner == 1, longer rows): a block per row, three passes over it
//   (max, sum, write; backward two), the second and third read back from
//   L2.
// - inner (inner > 1): a thread per line, threads of a warp on neighbouring
//   lines (consecutive elements, so the loads coalesce), blockDim.y threads
//   splitting each line's n elements, combined through shared memory.
// - v16b: 16-byte vector loads and stores (float4, double2) for rows whose
//   every start is 16-byte aligned (n*sizeof(T) a multiple of 16 and the
//   tensors aligned); otherwise element by element.
//
// Every sum and max runs in a fixed order: each thread (or lane) in order
// over its own elements, then a fixed tree over the threads (warp
// butterflies, a shared-memory tree): the same bits on every run, and no
// atomics. Sums accumulate in T, as PyTorch's CUDA kernels do for float32
// and float64. Element offsets are 64-bit.
#include <stdint.h>

#include <limits>

#include "params_gen.cuh"

namespace stheno {

// The launch parameters of every softmax kernel, passed by value.
struct SoftmaxParams {
  uint64_t x;      // forward: x; backward: y, the forward's output
  uint64_t dy;     // backward: the gradient of y; forward: 0
  uint64_t out;    // forward: y; backward: dx
  int64_t rows;    // the lines' outer count: elements before the axis
  int64_t inner;   // elements after the axis (1 for warp and block)
  int32_t n;       // the axis's length
  int32_t log;     // 1: log-softmax
  int32_t lanes;   // warp: lanes per row, a power of two up to 32
  int32_t unused;
};
STHENO_PARAMS(SoftmaxParams);

// stheno:const SoftmaxWarpThreads
// The threads of a warp kernel's block: 4 warps.
constexpr int kWarpThreads = 128;
// stheno:const SoftmaxLaneBytes
// The bytes of a row each lane of the warp kernels holds in registers (32
// float32 or 16 float64; twice that backward, y and dy): rows of up to
// 32*kLaneBytes bytes take the warp kernels.
constexpr int kLaneBytes = 128;

// stheno:const SoftmaxMaxThreads
// The most threads of a block kernel's or an inner kernel's block (at 1024
// the float64 block kernels spill).
constexpr int kMaxThreads = 512;

// V elements of T loaded or stored at once: one 16-byte vector access when
// aligned to its size (as PyTorch's aligned_vector), one element for V = 1.
template <typename T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

template <typename T>
__device__ __forceinline__ T neg_inf() {
  return -std::numeric_limits<T>::infinity();
}

// max(a, b) that keeps a NaN of either (fmax would drop it), so that the
// max of a line holding a NaN is NaN, and so is every x - max.
template <typename T>
__device__ __forceinline__ T nan_max(T a, T b) {
  return b > a || b != b ? b : a;
}

__device__ __forceinline__ float exp_of(float v) { return expf(v); }
__device__ __forceinline__ double exp_of(double v) { return exp(v); }
__device__ __forceinline__ float log_of(float v) { return logf(v); }
__device__ __forceinline__ double log_of(double v) { return log(v); }

// a op b: nan_max for kMax, else a + b.
template <bool kMax, typename T>
__device__ __forceinline__ T combine(T a, T b) {
  if constexpr (kMax) {
    return nan_max(a, b);
  } else {
    return a + b;
  }
}

// Reduces over the lanes of a warp whose lane index differs only in the
// bits below width (a power of two up to 32): a butterfly, so every lane
// of the group gets the same value, combined in the same order on every
// run. Every lane of the warp must take part.
template <bool kMax, typename T>
__device__ __forceinline__ T lanes_reduce(T v, int width) {
  for (int off = width / 2; off > 0; off /= 2) v = combine<kMax>(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}

// The block's dynamic shared memory, 16-byte aligned.
__device__ __forceinline__ unsigned char* softmax_smem() {
#ifdef STHENO_EMULATE
  return emu_smem();
#else
  extern __shared__ __align__(16) unsigned char stheno_softmax_smem[];
  return stheno_softmax_smem;
#endif
}

// Reduces v over a block of blockDim.x threads (a multiple of 32, at most
// 1024), every thread getting the result: each warp's butterfly, then one
// over the warps' results. red holds 32 T of shared memory; the call ends
// with a barrier, so it may be reused right after.
template <bool kMax, typename T>
__device__ __forceinline__ T block_reduce(T v, T* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = lanes_reduce<kMax>(v, 32);
  if (lane == 0) red[warp] = v;
  __syncthreads();
  v = lane < warps ? red[lane] : (kMax ? neg_inf<T>() : T(0));
  v = lanes_reduce<kMax>(v, 32);
  __syncthreads();
  return v;
}

// Reduces v over threadIdx.y (blockDim.y a power of two), separately for
// each threadIdx.x: a tree in shared memory (red holds blockDim.x *
// blockDim.y T), halving the rows at each step. Every thread gets its
// column's result; the call ends with a barrier.
template <bool kMax, typename T>
__device__ __forceinline__ T column_reduce(T v, T* red) {
  const int tx = threadIdx.x, ty = threadIdx.y, bx = blockDim.x;
  if (blockDim.y == 1) return v;
  red[ty * bx + tx] = v;
  __syncthreads();
  for (int s = blockDim.y / 2; s > 0; s /= 2) {
    if (ty < s) red[ty * bx + tx] = combine<kMax>(red[ty * bx + tx], red[(ty + s) * bx + tx]);
    __syncthreads();
  }
  v = red[tx];
  __syncthreads();
  return v;
}

// y from x - max (d) and the sum: (x - max) - log(sum), or exp(x - max) /
// sum. ls is log(sum) (log-softmax only).
template <typename T>
__device__ __forceinline__ T softmax_out(T d, T sum, T ls, bool is_log) {
  return is_log ? d - ls : exp_of(d) / sum;
}

// dx from y, dy and the sum (of dy*y, or of dy for log-softmax).
template <typename T>
__device__ __forceinline__ T softmax_grad(T y, T g, T sum, bool is_log) {
  return is_log ? g - exp_of(y) * sum : y * (g - sum);
}

// The row of a warp kernel's lane group, and the lane's place in it.
struct WarpRow {
  int64_t row;
  int lane;  // within the group
  bool live; // row < rows: the other groups still take part in the shuffles
};

__device__ __forceinline__ WarpRow warp_row(const SoftmaxParams& p) {
  const int g = p.lanes, lane = threadIdx.x & 31;
  const int64_t warp = static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  const int64_t row = warp * (32 / g) + lane / g;
  return WarpRow{row, lane & (g - 1), row < p.rows};
}

// A group of p.lanes lanes per row of n = p.n elements (inner == 1), V of
// them per access (V divides n); lane l holds vectors l, l + lanes, ...,
// up to kSlots of them (1 for the lane kernels). The max, then exp(x -
// max) kept in place of x (x - max for log-softmax) and summed, then the
// output: x is read once.
template <typename T, int V, int kSlots = kLaneBytes / (static_cast<int>(sizeof(T)) * V)>
__device__ __forceinline__ void softmax_fwd_warp(const SoftmaxParams& p) {
  using P = Pack<T, V>;
  const WarpRow w = warp_row(p);
  const int g = p.lanes, nv = p.n / V;
  const bool is_log = p.log != 0;
  const int64_t off = w.live ? w.row * p.n : 0;
  const P* __restrict__ x = reinterpret_cast<const P*>(reinterpret_cast<const T*>(p.x) + off);
  P* __restrict__ y = reinterpret_cast<P*>(reinterpret_cast<T*>(p.out) + off);
  P v[kSlots];
  T m = neg_inf<T>();
#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
    const int j = s * g + w.lane;
    if (w.live && j < nv) {
      v[s] = x[j];
#pragma unroll
      for (int e = 0; e < V; ++e) m = nan_max(m, v[s].v[e]);
    }
  }
  m = lanes_reduce<true>(m, g);
  T sum = T(0);
#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
    const int j = s * g + w.lane;
    if (w.live && j < nv) {
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const T d = v[s].v[e] - m;
        const T ex = exp_of(d);
        sum += ex;
        v[s].v[e] = is_log ? d : ex;
      }
    }
  }
  sum = lanes_reduce<false>(sum, g);
  const T ls = is_log ? log_of(sum) : T(0);
#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
    const int j = s * g + w.lane;
    if (w.live && j < nv) {
      P o;
#pragma unroll
      for (int e = 0; e < V; ++e) o.v[e] = is_log ? v[s].v[e] - ls : v[s].v[e] / sum;
      y[j] = o;
    }
  }
}

// The warp kernels' backward: y and dy held in registers, read once.
template <typename T, int V, int kSlots = kLaneBytes / (static_cast<int>(sizeof(T)) * V)>
__device__ __forceinline__ void softmax_bwd_warp(const SoftmaxParams& p) {
  using P = Pack<T, V>;
  const WarpRow w = warp_row(p);
  const int g = p.lanes, nv = p.n / V;
  const bool is_log = p.log != 0;
  const int64_t off = w.live ? w.row * p.n : 0;
  const P* __restrict__ y = reinterpret_cast<const P*>(reinterpret_cast<const T*>(p.x) + off);
  const P* __restrict__ dy = reinterpret_cast<const P*>(reinterpret_cast<const T*>(p.dy) + off);
  P* __restrict__ dx = reinterpret_cast<P*>(reinterpret_cast<T*>(p.out) + off);
  P yv[kSlots], gv[kSlots];
  T sum = T(0);
#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
    const int j = s * g + w.lane;
    if (w.live && j < nv) {
      yv[s] = y[j];
      gv[s] = dy[j];
#pragma unroll
      for (int e = 0; e < V; ++e) sum += is_log ? gv[s].v[e] : gv[s].v[e] * yv[s].v[e];
    }
  }
  sum = lanes_reduce<false>(sum, g);
#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
    const int j = s * g + w.lane;
    if (w.live && j < nv) {
      P o;
#pragma unroll
      for (int e = 0; e < V; ++e) o.v[e] = softmax_grad(yv[s].v[e], gv[s].v[e], sum, is_log);
      dx[j] = o;
    }
  }
}

// A block per row (inner == 1), threads strided over its vectors of V
// elements: the max, the sum, then the output, each pass reading x (the
// later ones mostly from L2). Shared memory: 32 T.
template <typename T, int V>
__device__ __forceinline__ void softmax_fwd_block(const SoftmaxParams& p) {
  using P = Pack<T, V>;
  const int64_t off = static_cast<int64_t>(blockIdx.x) * p.n;
  const int nv = p.n / V;
  const bool is_log = p.log != 0;
  const P* __restrict__ x = reinterpret_cast<const P*>(reinterpret_cast<const T*>(p.x) + off);
  P* __restrict__ y = reinterpret_cast<P*>(reinterpret_cast<T*>(p.out) + off);
  T* red = reinterpret_cast<T*>(softmax_smem());
  T m = neg_inf<T>();
  for (int j = threadIdx.x; j < nv; j += blockDim.x) {
    const P a = x[j];
#pragma unroll
    for (int e = 0; e < V; ++e) m = nan_max(m, a.v[e]);
  }
  m = block_reduce<true>(m, red);
  T sum = T(0);
  for (int j = threadIdx.x; j < nv; j += blockDim.x) {
    const P a = x[j];
#pragma unroll
    for (int e = 0; e < V; ++e) sum += exp_of(a.v[e] - m);
  }
  sum = block_reduce<false>(sum, red);
  const T ls = is_log ? log_of(sum) : T(0);
  for (int j = threadIdx.x; j < nv; j += blockDim.x) {
    const P a = x[j];
    P o;
#pragma unroll
    for (int e = 0; e < V; ++e) o.v[e] = softmax_out(a.v[e] - m, sum, ls, is_log);
    y[j] = o;
  }
}

// The block kernels' backward: the sum, then dx, each pass reading y and
// dy.
template <typename T, int V>
__device__ __forceinline__ void softmax_bwd_block(const SoftmaxParams& p) {
  using P = Pack<T, V>;
  const int64_t off = static_cast<int64_t>(blockIdx.x) * p.n;
  const int nv = p.n / V;
  const bool is_log = p.log != 0;
  const P* __restrict__ y = reinterpret_cast<const P*>(reinterpret_cast<const T*>(p.x) + off);
  const P* __restrict__ dy = reinterpret_cast<const P*>(reinterpret_cast<const T*>(p.dy) + off);
  P* __restrict__ dx = reinterpret_cast<P*>(reinterpret_cast<T*>(p.out) + off);
  T* red = reinterpret_cast<T*>(softmax_smem());
  T sum = T(0);
  for (int j = threadIdx.x; j < nv; j += blockDim.x) {
    const P a = y[j], b = dy[j];
#pragma unroll
    for (int e = 0; e < V; ++e) sum += is_log ? b.v[e] : b.v[e] * a.v[e];
  }
  sum = block_reduce<false>(sum, red);
  for (int j = threadIdx.x; j < nv; j += blockDim.x) {
    const P a = y[j], b = dy[j];
    P o;
#pragma unroll
    for (int e = 0; e < V; ++e) o.v[e] = softmax_grad(a.v[e], b.v[e], sum, is_log);
    dx[j] = o;
  }
}

// The line of an inner kernel's thread: line = blockIdx.x*blockDim.x +
// threadIdx.x of the rows*inner lines, its first element and whether it
// exists (the others still take part in the barriers).
struct InnerLine {
  int64_t first;
  bool live;
};

__device__ __forceinline__ InnerLine inner_line(const SoftmaxParams& p) {
  const int64_t line = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (line >= p.rows * p.inner) return InnerLine{0, false};
  const int64_t r = line / p.inner, i = line - r * p.inner;
  return InnerLine{r * p.n * p.inner + i, true};
}

// Lines of stride inner > 1: threadIdx.x on consecutive lines,
// threadIdx.y on elements ty, ty + blockDim.y, ... of its line; the
// partial results are combined over threadIdx.y (column_reduce). Shared
// memory: blockDim.x*blockDim.y T.
template <typename T>
__device__ __forceinline__ void softmax_fwd_inner(const SoftmaxParams& p) {
  const InnerLine l = inner_line(p);
  const int64_t st = p.inner;
  const bool is_log = p.log != 0;
  const T* __restrict__ x = reinterpret_cast<const T*>(p.x) + l.first;
  T* __restrict__ y = reinterpret_cast<T*>(p.out) + l.first;
  T* red = reinterpret_cast<T*>(softmax_smem());
  T m = neg_inf<T>();
  if (l.live) {
    for (int k = threadIdx.y; k < p.n; k += blockDim.y) m = nan_max(m, x[k * st]);
  }
  m = column_reduce<true>(m, red);
  T sum = T(0);
  if (l.live) {
    for (int k = threadIdx.y; k < p.n; k += blockDim.y) sum += exp_of(x[k * st] - m);
  }
  sum = column_reduce<false>(sum, red);
  if (!l.live) return;
  const T ls = is_log ? log_of(sum) : T(0);
  for (int k = threadIdx.y; k < p.n; k += blockDim.y) y[k * st] = softmax_out(x[k * st] - m, sum, ls, is_log);
}

template <typename T>
__device__ __forceinline__ void softmax_bwd_inner(const SoftmaxParams& p) {
  const InnerLine l = inner_line(p);
  const int64_t st = p.inner;
  const bool is_log = p.log != 0;
  const T* __restrict__ y = reinterpret_cast<const T*>(p.x) + l.first;
  const T* __restrict__ dy = reinterpret_cast<const T*>(p.dy) + l.first;
  T* __restrict__ dx = reinterpret_cast<T*>(p.out) + l.first;
  T* red = reinterpret_cast<T*>(softmax_smem());
  T sum = T(0);
  if (l.live) {
    for (int k = threadIdx.y; k < p.n; k += blockDim.y) sum += is_log ? dy[k * st] : dy[k * st] * y[k * st];
  }
  sum = column_reduce<false>(sum, red);
  if (!l.live) return;
  for (int k = threadIdx.y; k < p.n; k += blockDim.y) dx[k * st] = softmax_grad(y[k * st], dy[k * st], sum, is_log);
}

}  // namespace stheno

extern "C" {
__global__ void __launch_bounds__(stheno::kWarpThreads) softmax_fwd_warp_f32(stheno::SoftmaxParams p) {
  stheno::softmax_fwd_warp<float, 1>(p);
}
__global__ void __launch_bounds__(stheno::kWarpThreads) softmax_fwd_warp_f64(stheno::SoftmaxParams p) {
  stheno::softmax_fwd_warp<double, 1>(p);
}
__global__ void __launch_bounds__(stheno::kWarpThreads) softmax_fwd_warp_v16b_f32(stheno::SoftmaxParams p) {
  stheno::softmax_fwd_warp<float, 4>(p);
}
__global__ void __launch_bounds__(stheno::kWarpThreads) softmax_fwd_warp_v16b_f64(stheno::SoftmaxParams p) {
  stheno::softmax_fwd_warp<double, 2>(p);
}
__global__ void __launch_bounds__(stheno::kWarpThreads) softmax_bwd_warp_f32(stheno::SoftmaxParams p) {
  stheno::softmax_bwd_warp<float, 1>(p);
}
__global__ void __launch_bounds__(stheno::kWarpThreads) softmax_bwd_warp_f64(stheno::SoftmaxParams p) {
  stheno::softmax_bwd_warp<double, 1>(p);
}
__global__ void __launch_bounds__(stheno::kWarpThreads) softmax_bwd_warp_v16b_f32(stheno::SoftmaxParams p) {
  stheno::softmax_bwd_warp<float, 4>(p);
}
__global__ void __launch_bounds__(stheno::kWarpThreads) softmax_bwd_warp_v16b_f64(stheno::SoftmaxParams p) {
  stheno::softmax_bwd_warp<double, 2>(p);
}
__global__ void __launch_bounds__(stheno::kWarpThreads) softmax_fwd_lane_f32(stheno::SoftmaxParams p) {
  stheno::softmax_fwd_warp<float, 1, 1>(p);
}
__global__ void __launch_bounds__(stheno::kWarpThreads) softmax_fwd_lane_f64(stheno::SoftmaxParams p) {
  stheno::softmax_fwd_warp<double, 1, 1>(p);
}
__global__ void __launch_bounds__(stheno::kWarpThreads) softmax_fwd_lane_v16b_f32(stheno::SoftmaxParams p) {
  stheno::softmax_fwd_warp<float, 4, 1>(p);
}
__global__ void __launch_bounds__(stheno::kWarpThreads) softmax_fwd_lane_v16b_f64(stheno::SoftmaxParams p) {
  stheno::softmax_fwd_warp<double, 2, 1>(p);
}
__global__ void __launch_bounds__(stheno::kWarpThreads) softmax_bwd_lane_f32(stheno::SoftmaxParams p) {
  stheno::softmax_bwd_warp<float, 1, 1>(p);
}
__global__ void __launch_bounds__(stheno::kWarpThreads) softmax_bwd_lane_f64(stheno::SoftmaxParams p) {
  stheno::softmax_bwd_warp<double, 1, 1>(p);
}
__global__ void __launch_bounds__(stheno::kWarpThreads) softmax_bwd_lane_v16b_f32(stheno::SoftmaxParams p) {
  stheno::softmax_bwd_warp<float, 4, 1>(p);
}
__global__ void __launch_bounds__(stheno::kWarpThreads) softmax_bwd_lane_v16b_f64(stheno::SoftmaxParams p) {
  stheno::softmax_bwd_warp<double, 2, 1>(p);
}
__global__ void __launch_bounds__(stheno::kMaxThreads) softmax_fwd_block_f32(stheno::SoftmaxParams p) {
  stheno::softmax_fwd_block<float, 1>(p);
}
__global__ void __launch_bounds__(stheno::kMaxThreads) softmax_fwd_block_f64(stheno::SoftmaxParams p) {
  stheno::softmax_fwd_block<double, 1>(p);
}
__global__ void __launch_bounds__(stheno::kMaxThreads) softmax_fwd_block_v16b_f32(stheno::SoftmaxParams p) {
  stheno::softmax_fwd_block<float, 4>(p);
}
__global__ void __launch_bounds__(stheno::kMaxThreads) softmax_fwd_block_v16b_f64(stheno::SoftmaxParams p) {
  stheno::softmax_fwd_block<double, 2>(p);
}
__global__ void __launch_bounds__(stheno::kMaxThreads) softmax_bwd_block_f32(stheno::SoftmaxParams p) {
  stheno::softmax_bwd_block<float, 1>(p);
}
__global__ void __launch_bounds__(stheno::kMaxThreads) softmax_bwd_block_f64(stheno::SoftmaxParams p) {
  stheno::softmax_bwd_block<double, 1>(p);
}
__global__ void __launch_bounds__(stheno::kMaxThreads) softmax_bwd_block_v16b_f32(stheno::SoftmaxParams p) {
  stheno::softmax_bwd_block<float, 4>(p);
}
__global__ void __launch_bounds__(stheno::kMaxThreads) softmax_bwd_block_v16b_f64(stheno::SoftmaxParams p) {
  stheno::softmax_bwd_block<double, 2>(p);
}
__global__ void __launch_bounds__(stheno::kMaxThreads) softmax_fwd_inner_f32(stheno::SoftmaxParams p) {
  stheno::softmax_fwd_inner<float>(p);
}
__global__ void __launch_bounds__(stheno::kMaxThreads) softmax_fwd_inner_f64(stheno::SoftmaxParams p) {
  stheno::softmax_fwd_inner<double>(p);
}
__global__ void __launch_bounds__(stheno::kMaxThreads) softmax_bwd_inner_f32(stheno::SoftmaxParams p) {
  stheno::softmax_bwd_inner<float>(p);
}
__global__ void __launch_bounds__(stheno::kMaxThreads) softmax_bwd_inner_f64(stheno::SoftmaxParams p) {
  stheno::softmax_bwd_inner<double>(p);
}
}
