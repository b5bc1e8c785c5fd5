// Elementwise ops with PyTorch's broadcasting, and sums along axes: the CUDA
// twins of kernels/pointwise.go and kernels/reduce.go.
//
// Elementwise (PointwiseParams): out[i] = f(a[ia], b[ib]) for one of the
// opcodes below (unary ones read a only, fill reads neither).
//
// - map (same shapes): a grid-stride loop over 16-byte vectors (v16b, when
//   a, b and out are 16-byte aligned), kUnroll of them loaded per thread
//   before any is computed, then the n % V elements left.
// - bcast (broadcasting): the output's shape, collapsed on the host (dims
//   of one dropped, neighbours that every operand walks alike merged), up
//   to kMaxDims dims, with each operand's element strides per output dim (0
//   where it is broadcast). Each thread maps its output index to the
//   operands' offsets, one division per dim (32-bit when the values fit).
//   v16b: V consecutive outputs at once, V dividing the innermost dim;
//   each operand's innermost stride is 1 (a vector load, the host checked
//   its alignment) or 0 (one value for the whole vector).
//
// Sums (ReduceParams), one pass of a plan the host makes (kernels/reduce.go,
// NewReducePlan): the input is collapsed into groups of kept and of summed
// dims, and each pass sums one summed group away:
//
// - rows ([outer, r] -> [outer], the summed group innermost): warp (r up
//   to kReduceWarpRow) gives each row a group of `lanes` lanes, lane l
//   adding elements l, l + lanes, ... in order, then a butterfly over the
//   lanes. block gives each (row, part) a block of kReduceThreads threads:
//   part p covers elements [p*chunk, (p+1)*chunk) of its row, thread t adds
//   elements t*V .. t*V+V-1, then (t + threads)*V ..., in order (V = 16
//   bytes of T, whether or not the kernel loads them as a vector: v16b
//   does when every part starts aligned), then a butterfly per warp and one
//   over the warps. With parts > 1 the block writes its partial sum and a
//   second pass sums the parts of each row.
// - cols ([outer, r, inner] -> [outer, inner], summing the middle dim):
//   blocks of bx x by threads (bx*by = kReduceThreads), threadIdx.x on
//   consecutive columns (coalesced), threadIdx.y on rows ty, ty + by, ...
//   of its part (parts as for rows, in blockIdx.y), in order, then a tree
//   over threadIdx.y in shared memory (halving: row j += row j + by/2,
//   ...).
//
// Every sum runs in that fixed order, with no atomics: the same bits on
// every run and every GPU (the plan depends on the shape alone), and the
// CPU twin (kernels/reduce.go) follows it add for add. Sums accumulate in
// T, as PyTorch's CUDA sums do for float32 and float64; each thread's
// running sum holds its share of the terms only (1/lanes of a short row,
// 1/kReduceThreads of a long row's part, 1/by of a column's part), the
// shares added pairwise by the trees. The last pass multiplies by alpha
// (Mean's 1/count; 1 for Sum).
//
// NaN and infinities go through the arithmetic as in PyTorch: a NaN
// operand gives NaN, inf - inf NaN, and a sum holding a NaN is NaN.
// Element offsets are 64-bit.
#include <stdint.h>

#include <type_traits>

#include "params_gen.cuh"

namespace stheno::pw {

// stheno:const PointwiseMaxDims
// The most dims of a broadcast's collapsed output shape.
constexpr int kMaxDims = 6;

// The opcodes of PointwiseParams.op, kernels/pointwise.go's PointwiseOp.
// Unary: out = f(a).
// stheno:const PointwiseScale
constexpr int kScale = 0;  // a * alpha
// stheno:const PointwiseReLU
constexpr int kReLU = 1;  // a <= 0 ? 0 : a (NaN stays)
// stheno:const PointwiseSigmoid
constexpr int kSigmoid = 2;  // 1 / (1 + exp(-a))
// stheno:const PointwiseInverseSigmoid
constexpr int kInverseSigmoid = 3;  // log(max(c, eps) / max(1 - c, eps)), c = clamp(a, 0, 1), eps = alpha
// stheno:const PointwiseExp
constexpr int kExp = 4;
// stheno:const PointwiseLog
constexpr int kLog = 5;
// stheno:const PointwiseSqrt
constexpr int kSqrt = 6;
// stheno:const PointwiseSquare
constexpr int kSquare = 7;  // a * a
// stheno:const PointwiseFill
constexpr int kFill = 8;  // alpha, reading nothing
// Binary: out = f(a, b).
// stheno:const PointwiseAdd
constexpr int kAdd = 9;
// stheno:const PointwiseSub
constexpr int kSub = 10;
// stheno:const PointwiseMul
constexpr int kMul = 11;
// stheno:const PointwiseDiv
constexpr int kDiv = 12;
// stheno:const PointwiseNegDiv
constexpr int kNegDiv = 13;  // -(a / b): Div's gradient of b, -dy * (y / b)
// stheno:const PointwiseReLUGrad
constexpr int kReLUGrad = 14;  // a = y, b = dy: y <= 0 ? 0 : dy
// stheno:const PointwiseSigmoidGrad
constexpr int kSigmoidGrad = 15;  // a = y, b = dy: dy * (1 - y) * y
// stheno:const PointwiseSqrtGrad
constexpr int kSqrtGrad = 16;  // a = y, b = dy: dy / (2 * y)
// stheno:const PointwiseSquareGrad
constexpr int kSquareGrad = 17;  // a = x, b = dy: dy * (2 * x)
// stheno:const PointwiseInverseSigmoidGrad
constexpr int kInverseSigmoidGrad = 18;  // a = x, b = dy, eps = alpha
// stheno:const PointwiseOps
constexpr int kOps = 19;
static_assert(kInverseSigmoidGrad + 1 == kOps, "kOps counts the opcodes");

// The launch parameters of the elementwise kernels, passed by value.
struct PointwiseParams {
  uint64_t a;      // first operand (0 for fill)
  uint64_t b;      // second operand (0 for unary ops)
  uint64_t out;    // the output, n elements
  int64_t n;       // the output's elements
  double alpha;    // Scale's factor, InverseSigmoid's eps, Fill's value
  int32_t op;      // an opcode above
  int32_t rank;    // bcast: dims of shape, 1 to kMaxDims
  int64_t shape[kMaxDims];     // bcast: the collapsed output shape, innermost last
  int64_t stride_a[kMaxDims];  // bcast: a's element stride per dim of shape (0: broadcast)
  int64_t stride_b[kMaxDims];  // bcast: b's
};
STHENO_PARAMS(PointwiseParams);

// The launch parameters of one pass of a sum, passed by value.
struct ReduceParams {
  uint64_t in;    // [outer, r] (rows) or [outer, r, inner] (cols)
  uint64_t out;   // [outer, parts] (rows) or [outer, parts, inner] (cols); parts == 1: [outer(, inner)]
  int64_t outer;  // rows, or the outer count of cols
  int64_t r;      // the summed length
  int64_t inner;  // cols: the elements after the summed dim
  int64_t chunk;  // block and cols: elements of r per part
  int64_t parts;  // partial sums per output: ceil(r / chunk)
  double alpha;   // multiplies each sum written when parts == 1
  int32_t lanes;  // rows warp: lanes per row, a power of two up to 32
  int32_t bx;     // cols: threads across columns, a power of two up to 32
};
STHENO_PARAMS(ReduceParams);

// stheno:const ReduceThreads
// The threads of every sum kernel's block.
constexpr int kReduceThreads = 256;
// stheno:const ReduceWarpRow
// The longest row the rows warp kernel takes: 32 elements a lane.
constexpr int kReduceWarpRow = 1024;
static_assert(kReduceWarpRow == 32 * 32, "a lane of the rows warp kernel adds up to 32 elements");

template <typename T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

__device__ __forceinline__ float exp_of(float v) { return expf(v); }
__device__ __forceinline__ double exp_of(double v) { return exp(v); }
__device__ __forceinline__ float log_of(float v) { return logf(v); }
__device__ __forceinline__ double log_of(double v) { return log(v); }
__device__ __forceinline__ float sqrt_of(float v) { return sqrtf(v); }
__device__ __forceinline__ double sqrt_of(double v) { return sqrt(v); }

// min and max that keep a NaN of v (clamp's behaviour in PyTorch): the
// comparisons are false for NaN, which then passes through.
template <typename T>
__device__ __forceinline__ T lower_to(T v, T lo) {
  return v < lo ? lo : v;
}
template <typename T>
__device__ __forceinline__ T upper_to(T v, T hi) {
  return v > hi ? hi : v;
}

// How many operands kOp reads: 0 (fill), 1 (unary) or 2.
template <int kOp>
constexpr int arity() {
  return kOp == kFill ? 0 : kOp < kAdd ? 1 : 2;
}

// One element of opcode kOp: the arithmetic of PyTorch's kernels for the
// op, in its order.
template <int kOp, typename T>
__device__ __forceinline__ T apply(T a, T b, T alpha) {
  if constexpr (kOp == kScale) {
    return a * alpha;
  } else if constexpr (kOp == kReLU) {
    return a <= T(0) ? T(0) : a;
  } else if constexpr (kOp == kSigmoid) {
    return T(1) / (T(1) + exp_of(-a));
  } else if constexpr (kOp == kInverseSigmoid) {
    const T c = upper_to(lower_to(a, T(0)), T(1));
    return log_of(lower_to(c, alpha) / lower_to(T(1) - c, alpha));
  } else if constexpr (kOp == kExp) {
    return exp_of(a);
  } else if constexpr (kOp == kLog) {
    return log_of(a);
  } else if constexpr (kOp == kSqrt) {
    return sqrt_of(a);
  } else if constexpr (kOp == kSquare) {
    return a * a;
  } else if constexpr (kOp == kFill) {
    return alpha;
  } else if constexpr (kOp == kAdd) {
    return a + b;
  } else if constexpr (kOp == kSub) {
    return a - b;
  } else if constexpr (kOp == kMul) {
    return a * b;
  } else if constexpr (kOp == kDiv) {
    return a / b;
  } else if constexpr (kOp == kNegDiv) {
    return -(a / b);
  } else if constexpr (kOp == kReLUGrad) {
    return a <= T(0) ? T(0) : b;
  } else if constexpr (kOp == kSigmoidGrad) {
    return b * (T(1) - a) * a;
  } else if constexpr (kOp == kSqrtGrad) {
    return b / (T(2) * a);
  } else if constexpr (kOp == kSquareGrad) {
    return b * (T(2) * a);
  } else {
    static_assert(kOp == kInverseSigmoidGrad, "unknown opcode");
    // PyTorch's autograd of inverse_sigmoid, step by step: c = clamp(x, 0,
    // 1), x1 = clamp(c, min=eps), x2 = clamp(1 - c, min=eps), q = x1 / x2,
    // y = log(q). A clamp passes the gradient where its input lies within
    // its bounds, ends included (NaN: nowhere).
    const T c = upper_to(lower_to(a, T(0)), T(1));
    const T x1 = lower_to(c, alpha), x2 = lower_to(T(1) - c, alpha);
    const T q = x1 / x2;
    const T gq = b / q;
    const T g1 = gq / x2;
    const T g2 = -gq * (q / x2);
    const T gc1 = c >= alpha ? g1 : T(0);
    const T gc2 = T(1) - c >= alpha ? g2 : T(0);
    const T gc = gc1 - gc2;
    return a >= T(0) && a <= T(1) ? gc : T(0);
  }
}

// Calls f(std::integral_constant<int, op>{}) for the runtime opcode op: the
// one switch per thread that picks a loop compiled for its opcode.
template <typename F>
__device__ __forceinline__ void dispatch(int op, F&& f) {
#define STHENO_PW_CASE(k) \
  case k:                 \
    f(std::integral_constant<int, k>{}); \
    break;
  switch (op) {
    STHENO_PW_CASE(kScale)
    STHENO_PW_CASE(kReLU)
    STHENO_PW_CASE(kSigmoid)
    STHENO_PW_CASE(kInverseSigmoid)
    STHENO_PW_CASE(kExp)
    STHENO_PW_CASE(kLog)
    STHENO_PW_CASE(kSqrt)
    STHENO_PW_CASE(kSquare)
    STHENO_PW_CASE(kFill)
    STHENO_PW_CASE(kAdd)
    STHENO_PW_CASE(kSub)
    STHENO_PW_CASE(kMul)
    STHENO_PW_CASE(kDiv)
    STHENO_PW_CASE(kNegDiv)
    STHENO_PW_CASE(kReLUGrad)
    STHENO_PW_CASE(kSigmoidGrad)
    STHENO_PW_CASE(kSqrtGrad)
    STHENO_PW_CASE(kSquareGrad)
    STHENO_PW_CASE(kInverseSigmoidGrad)
    default:
      break;
  }
#undef STHENO_PW_CASE
}

__device__ __forceinline__ int64_t first_index() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t grid_stride() {
  return static_cast<int64_t>(gridDim.x) * blockDim.x;
}

// stheno:const PointwiseUnroll
// The vectors (or elements) an elementwise thread loads before it computes
// any: several loads in flight per thread hide more of the memory's
// latency.
constexpr int kUnroll = 2;

// Same shapes: V elements a vector (V > 1: 16-byte vectors, every pointer
// aligned), each thread taking kUnroll vectors a grid stride apart per
// step, then the n % V elements left, one a thread.
template <int kOp, typename T, int V>
__device__ __forceinline__ void map_loop(const PointwiseParams& p) {
  using P = Pack<T, V>;
  constexpr int kIn = arity<kOp>();
  const T alpha = static_cast<T>(p.alpha);
  const T* __restrict__ a = reinterpret_cast<const T*>(p.a);
  const T* __restrict__ b = reinterpret_cast<const T*>(p.b);
  T* __restrict__ out = reinterpret_cast<T*>(p.out);
  const int64_t nv = p.n / V, step = grid_stride();
  for (int64_t i0 = first_index(); i0 < nv; i0 += kUnroll * step) {
    P x[kUnroll] = {}, y[kUnroll] = {};
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = i0 + u * step;
      if (i < nv) {
        if constexpr (kIn >= 1) x[u] = reinterpret_cast<const P*>(a)[i];
        if constexpr (kIn == 2) y[u] = reinterpret_cast<const P*>(b)[i];
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = i0 + u * step;
      if (i < nv) {
        P o;
#pragma unroll
        for (int e = 0; e < V; ++e) o.v[e] = apply<kOp>(x[u].v[e], y[u].v[e], alpha);
        reinterpret_cast<P*>(out)[i] = o;
      }
    }
  }
  for (int64_t i = nv * V + first_index(); i < p.n; i += step) {
    const T x = kIn >= 1 ? a[i] : T(0), y = kIn == 2 ? b[i] : T(0);
    out[i] = apply<kOp>(x, y, alpha);
  }
}

template <typename T, int V>
__device__ __forceinline__ void map(const PointwiseParams& p) {
  dispatch(p.op, [&](auto k) { map_loop<decltype(k)::value, T, V>(p); });
}

// n / d for n >= 0, d > 0, in 32 bits when both fit: a 64-bit division
// takes several times the instructions.
__device__ __forceinline__ int64_t div_of(int64_t n, int64_t d) {
  if (((static_cast<uint64_t>(n) | static_cast<uint64_t>(d)) >> 32) == 0) {
    return static_cast<int64_t>(static_cast<uint32_t>(n) / static_cast<uint32_t>(d));
  }
  return n / d;
}

// The broadcast operands' offsets of output element i.
struct Offsets {
  int64_t a, b;
};

__device__ __forceinline__ Offsets offsets_of(const PointwiseParams& p, int64_t i) {
  Offsets o{0, 0};
#pragma unroll
  for (int d = kMaxDims - 1; d > 0; --d) {
    if (d < p.rank) {
      const int64_t q = div_of(i, p.shape[d]);
      const int64_t c = i - q * p.shape[d];
      o.a += c * p.stride_a[d];
      o.b += c * p.stride_b[d];
      i = q;
    }
  }
  o.a += i * p.stride_a[0];
  o.b += i * p.stride_b[0];
  return o;
}

// V consecutive elements of an operand from offset off: a vector where
// its innermost stride is 1, one value repeated where it is 0.
template <typename T, int V>
__device__ __forceinline__ Pack<T, V> load_pack(const T* __restrict__ x, int64_t off, bool unit) {
  Pack<T, V> v;
  if (V > 1 && unit) {
    v = *reinterpret_cast<const Pack<T, V>*>(x + off);
  } else {
    const T s = x[off];
#pragma unroll
    for (int e = 0; e < V; ++e) v.v[e] = s;
  }
  return v;
}

template <int kOp, typename T, int V>
__device__ __forceinline__ void bcast_loop(const PointwiseParams& p) {
  using P = Pack<T, V>;
  constexpr int kIn = arity<kOp>();
  const T alpha = static_cast<T>(p.alpha);
  const T* __restrict__ a = reinterpret_cast<const T*>(p.a);
  const T* __restrict__ b = reinterpret_cast<const T*>(p.b);
  T* __restrict__ out = reinterpret_cast<T*>(p.out);
  const bool unit_a = p.stride_a[p.rank - 1] == 1, unit_b = p.stride_b[p.rank - 1] == 1;
  const int64_t nv = p.n / V, step = grid_stride();
  for (int64_t i0 = first_index(); i0 < nv; i0 += kUnroll * step) {
    P x[kUnroll] = {}, y[kUnroll] = {};
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = i0 + u * step;
      if (i < nv) {
        const Offsets off = offsets_of(p, i * V);
        if constexpr (kIn >= 1) x[u] = load_pack<T, V>(a, off.a, unit_a);
        if constexpr (kIn == 2) y[u] = load_pack<T, V>(b, off.b, unit_b);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = i0 + u * step;
      if (i < nv) {
        P o;
#pragma unroll
        for (int e = 0; e < V; ++e) o.v[e] = apply<kOp>(x[u].v[e], y[u].v[e], alpha);
        reinterpret_cast<P*>(out)[i] = o;
      }
    }
  }
}

template <typename T, int V>
__device__ __forceinline__ void bcast(const PointwiseParams& p) {
  dispatch(p.op, [&](auto k) { bcast_loop<decltype(k)::value, T, V>(p); });
}

// Sums over the lanes of a warp whose index differs only in the bits
// below width (a power of two up to 32): a butterfly, every lane getting
// the group's sum, the same halving tree as the twin's. Every lane of the
// warp takes part.
template <typename T>
__device__ __forceinline__ T lanes_sum(T v, int width) {
  for (int off = width / 2; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

// rows warp: a group of p.lanes lanes per row (p.parts == 1), kReduceThreads
// / p.lanes rows a block.
template <typename T>
__device__ __forceinline__ void rows_warp(const ReduceParams& p) {
  const int g = p.lanes, lane = threadIdx.x & (g - 1);
  const int64_t row = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / g;
  const bool live = row < p.outer;
  const T* __restrict__ x = reinterpret_cast<const T*>(p.in) + (live ? row * p.r : 0);
  T s = T(0);
  if (live) {
    for (int64_t k = lane; k < p.r; k += g) s += x[k];
  }
  s = lanes_sum(s, g);
  if (live && lane == 0) reinterpret_cast<T*>(p.out)[row] = s * static_cast<T>(p.alpha);
}

// rows block: a block per (row, part), blockIdx.x = row * parts + part.
// Thread t adds elements t*V + e (e < V) of each stretch of
// kReduceThreads*V, in order; kVec loads each V as one vector (the host
// checked that every part starts 16-byte aligned and holds whole vectors).
template <typename T, bool kVec>
__device__ __forceinline__ void rows_block(const ReduceParams& p) {
  constexpr int V = 16 / static_cast<int>(sizeof(T));
  __shared__ T red[32];
  const int64_t row = blockIdx.x / p.parts, part = blockIdx.x - row * p.parts;
  const int64_t first = part * p.chunk;
  const int64_t len = p.r - first < p.chunk ? p.r - first : p.chunk;
  const T* __restrict__ x = reinterpret_cast<const T*>(p.in) + row * p.r + first;
  T s = T(0);
  for (int64_t j = static_cast<int64_t>(threadIdx.x) * V; j < len; j += kReduceThreads * V) {
    if constexpr (kVec) {
      const Pack<T, V> v = *reinterpret_cast<const Pack<T, V>*>(x + j);
#pragma unroll
      for (int e = 0; e < V; ++e) s += v.v[e];
    } else {
#pragma unroll
      for (int e = 0; e < V; ++e) {
        if (j + e < len) s += x[j + e];
      }
    }
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  s = lanes_sum(s, 32);
  if (lane == 0) red[warp] = s;
  __syncthreads();
  if (warp == 0) {
    s = lane < kReduceThreads / 32 ? red[lane] : T(0);
    s = lanes_sum(s, 32);
    if (lane == 0) {
      T* __restrict__ out = reinterpret_cast<T*>(p.out);
      if (p.parts == 1) {
        out[row] = s * static_cast<T>(p.alpha);
      } else {
        out[blockIdx.x] = s;
      }
    }
  }
}

// cols: blockIdx.x = o * ceil(inner / bx) + column block, blockIdx.y the
// part; thread (tx, ty) adds rows ty, ty + by, ... of its part in column
// cb*bx + tx, then the tree over ty.
template <typename T>
__device__ __forceinline__ void cols(const ReduceParams& p) {
  __shared__ T red[kReduceThreads];
  const int bx = p.bx, by = kReduceThreads / bx;
  const int tx = threadIdx.x & (bx - 1), ty = threadIdx.x / bx;
  const int64_t cblocks = (p.inner + bx - 1) / bx;
  const int64_t o = blockIdx.x / cblocks;
  const int64_t col = (blockIdx.x - o * cblocks) * bx + tx;
  const int64_t part = blockIdx.y;
  const int64_t first = part * p.chunk;
  const int64_t len = p.r - first < p.chunk ? p.r - first : p.chunk;
  const bool live = col < p.inner;
  T s = T(0);
  if (live) {
    const T* __restrict__ x = reinterpret_cast<const T*>(p.in) + (o * p.r + first) * p.inner + col;
    for (int64_t k = ty; k < len; k += by) s += x[k * p.inner];
  }
  red[threadIdx.x] = s;
  __syncthreads();
  for (int h = by / 2; h > 0; h /= 2) {
    if (ty < h) red[threadIdx.x] += red[threadIdx.x + h * bx];
    __syncthreads();
  }
  if (ty == 0 && live) {
    T* __restrict__ out = reinterpret_cast<T*>(p.out);
    if (p.parts == 1) {
      out[o * p.inner + col] = red[tx] * static_cast<T>(p.alpha);
    } else {
      out[(o * p.parts + part) * p.inner + col] = red[tx];
    }
  }
}

}  // namespace stheno::pw

extern "C" {
// clang-format off
__global__ void __launch_bounds__(256) pointwise_map_f32(stheno::pw::PointwiseParams p) { stheno::pw::map<float, 1>(p); }
__global__ void __launch_bounds__(256) pointwise_map_f64(stheno::pw::PointwiseParams p) { stheno::pw::map<double, 1>(p); }
__global__ void __launch_bounds__(256) pointwise_map_v16b_f32(stheno::pw::PointwiseParams p) { stheno::pw::map<float, 4>(p); }
__global__ void __launch_bounds__(256) pointwise_map_v16b_f64(stheno::pw::PointwiseParams p) { stheno::pw::map<double, 2>(p); }
__global__ void __launch_bounds__(256) pointwise_bcast_f32(stheno::pw::PointwiseParams p) { stheno::pw::bcast<float, 1>(p); }
__global__ void __launch_bounds__(256) pointwise_bcast_f64(stheno::pw::PointwiseParams p) { stheno::pw::bcast<double, 1>(p); }
__global__ void __launch_bounds__(256) pointwise_bcast_v16b_f32(stheno::pw::PointwiseParams p) { stheno::pw::bcast<float, 4>(p); }
__global__ void __launch_bounds__(256) pointwise_bcast_v16b_f64(stheno::pw::PointwiseParams p) { stheno::pw::bcast<double, 2>(p); }

__global__ void __launch_bounds__(256) reduce_rows_warp_f32(stheno::pw::ReduceParams p) { stheno::pw::rows_warp<float>(p); }
__global__ void __launch_bounds__(256) reduce_rows_warp_f64(stheno::pw::ReduceParams p) { stheno::pw::rows_warp<double>(p); }
__global__ void __launch_bounds__(256) reduce_rows_block_f32(stheno::pw::ReduceParams p) { stheno::pw::rows_block<float, false>(p); }
__global__ void __launch_bounds__(256) reduce_rows_block_f64(stheno::pw::ReduceParams p) { stheno::pw::rows_block<double, false>(p); }
__global__ void __launch_bounds__(256) reduce_rows_block_v16b_f32(stheno::pw::ReduceParams p) { stheno::pw::rows_block<float, true>(p); }
__global__ void __launch_bounds__(256) reduce_rows_block_v16b_f64(stheno::pw::ReduceParams p) { stheno::pw::rows_block<double, true>(p); }
__global__ void __launch_bounds__(256) reduce_cols_f32(stheno::pw::ReduceParams p) { stheno::pw::cols<float>(p); }
__global__ void __launch_bounds__(256) reduce_cols_f64(stheno::pw::ReduceParams p) { stheno::pw::cols<double>(p); }
// clang-format on
}
