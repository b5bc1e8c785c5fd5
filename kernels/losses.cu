// The detection losses and box conversions: the CUDA twins of
// kernels/losses.go and kernels/boxes.go.
//
// Every loss is a weighted sum, reduction="sum" with a weight per element
// (per row for cross-entropy and GIoU), of one of these terms:
//
//   bce:      max(x,0) - x*t + log1p(exp(-|x|))     (binary_cross_entropy_with_logits)
//   smoothl1: 0.5*d*d/beta if |d| < beta, else |d| - 0.5*beta,  d = x - t
//   l1:       |x - t|
//   focal:    alpha_t * bce * (1 - p_t)^gamma        (torchvision's sigmoid_focal_loss)
//   ce:       logsumexp(x_k) - x_k[label_k]          (rows of [rows, c] logits)
//   giou:     1 - GIoU(x_k, t_k)                     (torchvision's generalized_box_iou_loss)
//
// A zero weight removes an element: neither its term nor its gradient is
// computed, so padding may hold anything (inf, NaN). Each term is computed
// in T, as PyTorch does; the weighted terms are summed in double.
//
// Forward, two kernels: loss_fwd_<kind> writes one partial sum per block
// (thread i adds items i, i + gridDim.x*blockDim.x, ... in order, then the
// block adds its threads' sums by a butterfly over each warp and one over
// the warps), and loss_sum adds the partial sums in one block the same way
// and writes the scalar. The grid depends on the item count alone
// (kLossThreads threads a block, at most kLossBlocks blocks), so the sum
// runs in one fixed order: the same bits on every run and every GPU, no
// atomics.
//
// Backward, one kernel: loss_bwd_<kind> writes dx = grad * w * dterm/dx
// item by item; grad, the gradient of the loss, is usually a host scalar
// (gorgonia seeds the backward pass with a constant on the host) that
// travels in the params; one that lives on the device (a loss reshaped and
// moved to the host, say) is read there, through dgrad. ce and giou take a thread per row (rows are short at detector
// shapes: 91 classes, 4 coordinates).
//
// A label of ce that is not an integer in [0, c) makes its row's term NaN,
// whatever its weight, and its row of dx NaN: the device cannot report an
// error without a round trip to the host (the CPU twin returns one).
//
// loss_add adds two scalar losses on the device (ops.SumLosses: gorgonia's
// own Add of scalars reads host values only).
//
// box_<from>_to_<to> convert boxes [n, 4] between (cx, cy, w, h) and (x1,
// y1, x2, y2), as torchvision's box_convert; the _bwd kernels apply the
// transposed linear map, which is the backward of the conversion.
#include <stdint.h>

#include <limits>

#include "params_gen.cuh"

namespace stheno::loss {

// The launch parameters of the loss kernels, passed by value.
struct LossParams {
  uint64_t x;    // elementwise: [n]; ce: logits [n, c]; giou: boxes [n, 4]
  uint64_t t;    // elementwise: targets [n]; ce: labels [n]; giou: boxes [n, 4]
  uint64_t w;    // weights, one per item: [n]
  uint64_t out;  // fwd: double partial sums [gridDim.x]; bwd: dx, shaped as x
  uint64_t dgrad;  // bwd: a scalar T on the device that multiplies grad, or 0
  int64_t n;     // items: elements, or rows (ce, giou)
  double beta;   // smoothl1
  double alpha;  // focal; < 0: no weighting
  double gamma;  // focal
  double grad;   // bwd: the loss's gradient
  int32_t c;     // ce: classes
  int32_t unused;
};
STHENO_PARAMS(LossParams);

// loss_sum: out = the sum of partial[0, blocks), as T.
struct LossSumParams {
  uint64_t partial;  // double [blocks]
  uint64_t out;      // T, a scalar
  int32_t blocks;
  int32_t unused;
};
STHENO_PARAMS(LossSumParams);

// loss_add: out = a + b, scalars of T (SumLosses, losses summed on the
// device).
struct LossAddParams {
  uint64_t a;
  uint64_t b;
  uint64_t out;
};
STHENO_PARAMS(LossAddParams);

// box kernels: out [n, 4] from in [n, 4].
struct BoxParams {
  uint64_t in;
  uint64_t out;
  int64_t n;  // boxes
};
STHENO_PARAMS(BoxParams);

// stheno:const LossThreads
// Threads a block of every loss and box kernel.
constexpr int kLossThreads = 256;
// stheno:const LossBlocks
// The most blocks of a forward kernel, and so the most partial sums.
constexpr int kLossBlocks = 1024;
static_assert(kLossBlocks % kLossThreads == 0, "loss_sum's threads add equally many partial sums");

enum Kind { kBCE, kSmoothL1, kL1, kFocal, kCE, kGIoU };

__device__ __forceinline__ float exp_of(float v) { return expf(v); }
__device__ __forceinline__ double exp_of(double v) { return exp(v); }
__device__ __forceinline__ float log_of(float v) { return logf(v); }
__device__ __forceinline__ double log_of(double v) { return log(v); }
__device__ __forceinline__ float log1p_of(float v) { return log1pf(v); }
__device__ __forceinline__ double log1p_of(double v) { return log1p(v); }
__device__ __forceinline__ float pow_of(float a, float b) { return powf(a, b); }
__device__ __forceinline__ double pow_of(double a, double b) { return pow(a, b); }

template <typename T>
__device__ __forceinline__ T nan_of() {
  return std::numeric_limits<T>::quiet_NaN();
}

// The sum of v over the block (kLossThreads threads), in thread 0: a
// butterfly over each warp's lanes, then one over the warps' sums. red
// holds 32 doubles of shared memory.
__device__ __forceinline__ double block_sum(double v, double* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
  if (lane == 0) red[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < kLossThreads / 32 ? red[lane] : 0.0;
    for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
  }
  return v;
}

// bce's term, stable for any x: no exp overflows, and log1p keeps exp(-|x|)
// when it is tiny.
template <typename T>
__device__ __forceinline__ T bce_term(T x, T t) {
  return (x > T(0) ? x : T(0)) - x * t + log1p_of(exp_of(-fabs(x)));
}

template <typename T>
__device__ __forceinline__ T sigmoid_of(T x) {
  return T(1) / (T(1) + exp_of(-x));
}

// torchvision's alpha_t: alpha for positives, 1 - alpha for negatives.
template <typename T>
__device__ __forceinline__ T alpha_t(T t, T alpha) {
  return alpha * t + (T(1) - alpha) * (T(1) - t);
}

// The class index a label of c classes stands for, or -1.
template <typename T>
__device__ __forceinline__ int class_of(T v, int c) {
  if (!(v >= T(0) && v < T(c)) || v != trunc(v)) return -1;
  return static_cast<int>(v);
}

// logsumexp of a row of c logits, shifted by its max.
template <typename T>
__device__ __forceinline__ T row_lse(const T* row, int c) {
  T m = -std::numeric_limits<T>::infinity();
  for (int j = 0; j < c; ++j) m = row[j] > m || row[j] != row[j] ? row[j] : m;
  if (isinf(m)) return m;  // all -inf: the sum is 0; +inf: it is +inf
  T s = T(0);
  for (int j = 0; j < c; ++j) s += exp_of(row[j] - m);
  return m + log_of(s);
}

// torch.maximum and torch.minimum: a NaN of either wins.
template <typename T>
__device__ __forceinline__ T tmax(T a, T b) {
  return a > b || a != a ? a : b;
}
template <typename T>
__device__ __forceinline__ T tmin(T a, T b) {
  return a < b || a != a ? a : b;
}
// The share of the gradient of torch.maximum(a, b) (torch.minimum) that
// goes to a: all of it where a wins, half on a tie, as PyTorch splits it.
template <typename T>
__device__ __forceinline__ T max_share(T a, T b) {
  return a == b ? T(0.5) : a < b ? T(0) : T(1);
}
template <typename T>
__device__ __forceinline__ T min_share(T a, T b) {
  return a == b ? T(0.5) : a > b ? T(0) : T(1);
}

// GIoU of box a against box b (x1, y1, x2, y2), every step as torchvision
// takes it: no check of the boxes' order, eps added to the union and to
// the enclosing area.
template <typename T>
struct GIoU {
  T xk1, yk1, xk2, yk2;  // intersection corners
  bool overlap;          // both sides of the intersection positive
  T inter, uni, iou;
  T xc1, yc1, xc2, yc2;  // enclosing box
  T area_c, loss;
};

template <typename T>
__device__ __forceinline__ GIoU<T> giou_of(const T* a, const T* b) {
  const T eps = T(1e-7);
  GIoU<T> g;
  g.xk1 = tmax(a[0], b[0]);
  g.yk1 = tmax(a[1], b[1]);
  g.xk2 = tmin(a[2], b[2]);
  g.yk2 = tmin(a[3], b[3]);
  g.overlap = g.yk2 > g.yk1 && g.xk2 > g.xk1;
  g.inter = g.overlap ? (g.xk2 - g.xk1) * (g.yk2 - g.yk1) : T(0);
  g.uni = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - g.inter;
  g.iou = g.inter / (g.uni + eps);
  g.xc1 = tmin(a[0], b[0]);
  g.yc1 = tmin(a[1], b[1]);
  g.xc2 = tmax(a[2], b[2]);
  g.yc2 = tmax(a[3], b[3]);
  g.area_c = (g.xc2 - g.xc1) * (g.yc2 - g.yc1);
  g.loss = T(1) - (g.iou - (g.area_c - g.uni) / (g.area_c + eps));
  return g;
}

// The term of item i (an element, or row i for ce and giou).
template <int K, typename T>
__device__ __forceinline__ T term_of(const LossParams& p, const T* x, const T* t, int64_t i) {
  if constexpr (K == kBCE) {
    return bce_term(x[i], t[i]);
  } else if constexpr (K == kSmoothL1) {
    const T d = fabs(x[i] - t[i]), beta = T(p.beta);
    return d < beta ? T(0.5) * d * d / beta : d - T(0.5) * beta;
  } else if constexpr (K == kL1) {
    return fabs(x[i] - t[i]);
  } else if constexpr (K == kFocal) {
    const T v = x[i], tv = t[i], pr = sigmoid_of(v);
    const T pt = pr * tv + (T(1) - pr) * (T(1) - tv);
    T l = bce_term(v, tv) * pow_of(T(1) - pt, T(p.gamma));
    if (p.alpha >= 0) l *= alpha_t(tv, T(p.alpha));
    return l;
  } else if constexpr (K == kCE) {
    const T* row = x + i * p.c;
    const int k = class_of(t[i], p.c);
    if (k < 0) return nan_of<T>();
    return row_lse(row, p.c) - row[k];
  } else {
    return giou_of(x + 4 * i, t + 4 * i).loss;
  }
}

template <int K, typename T>
__device__ __forceinline__ void loss_fwd(const LossParams& p) {
  __shared__ double red[32];
  const T* x = reinterpret_cast<const T*>(p.x);
  const T* t = reinterpret_cast<const T*>(p.t);
  const T* w = reinterpret_cast<const T*>(p.w);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  double s = 0;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < p.n; i += stride) {
    // ce's bad labels count whatever their weight, as the CPU twin's.
    if (w[i] == T(0) && !(K == kCE && class_of(t[i], p.c) < 0)) continue;
    s += static_cast<double>(w[i]) * static_cast<double>(term_of<K>(p, x, t, i));
  }
  s = block_sum(s, red);
  if (threadIdx.x == 0) reinterpret_cast<double*>(p.out)[blockIdx.x] = s;
}

template <typename T>
__device__ __forceinline__ void loss_sum(const LossSumParams& p) {
  __shared__ double red[32];
  const double* partial = reinterpret_cast<const double*>(p.partial);
  double s = 0;
  for (int i = threadIdx.x; i < p.blocks; i += blockDim.x) s += partial[i];
  s = block_sum(s, red);
  if (threadIdx.x == 0) *reinterpret_cast<T*>(p.out) = static_cast<T>(s);
}

template <typename T>
__device__ __forceinline__ void loss_add(const LossAddParams& p) {
  if (threadIdx.x == 0 && blockIdx.x == 0) {
    *reinterpret_cast<T*>(p.out) = *reinterpret_cast<const T*>(p.a) + *reinterpret_cast<const T*>(p.b);
  }
}

// dx of giou for row i: torch's autograd of giou_of, step by step, scaled
// by gl, the gradient of the row's loss.
template <typename T>
__device__ __forceinline__ void giou_grad(const T* a, const T* b, T gl, T* dx) {
  const T eps = T(1e-7);
  const GIoU<T> g = giou_of(a, b);
  // loss = 1 - (iou - q), q = (area_c - uni) / (area_c + eps)
  const T g_iou = -gl, g_q = gl;
  const T den_c = g.area_c + eps;
  const T g_num = g_q / den_c;
  const T g_area_c = g_num - g_q * ((g.area_c - g.uni) / den_c) / den_c;
  T g_uni = -g_num;
  // iou = inter / (uni + eps)
  const T den_u = g.uni + eps;
  T g_inter = g_iou / den_u;
  g_uni -= g_iou * ((g.inter / den_u) / den_u);
  // uni = area_a + area_b - inter
  g_inter -= g_uni;
  T d0 = -g_uni * (a[3] - a[1]), d2 = g_uni * (a[3] - a[1]);
  T d1 = -g_uni * (a[2] - a[0]), d3 = g_uni * (a[2] - a[0]);
  if (g.overlap) {
    const T g_iw = g_inter * (g.yk2 - g.yk1), g_ih = g_inter * (g.xk2 - g.xk1);
    d0 -= g_iw * max_share(a[0], b[0]);
    d2 += g_iw * min_share(a[2], b[2]);
    d1 -= g_ih * max_share(a[1], b[1]);
    d3 += g_ih * min_share(a[3], b[3]);
  }
  const T g_cw = g_area_c * (g.yc2 - g.yc1), g_ch = g_area_c * (g.xc2 - g.xc1);
  d0 -= g_cw * min_share(a[0], b[0]);
  d2 += g_cw * max_share(a[2], b[2]);
  d1 -= g_ch * min_share(a[1], b[1]);
  d3 += g_ch * max_share(a[3], b[3]);
  dx[0] = d0, dx[1] = d1, dx[2] = d2, dx[3] = d3;
}

template <int K, typename T>
__device__ __forceinline__ void loss_bwd(const LossParams& p) {
  const T* x = reinterpret_cast<const T*>(p.x);
  const T* t = reinterpret_cast<const T*>(p.t);
  const T* w = reinterpret_cast<const T*>(p.w);
  T* dx = reinterpret_cast<T*>(p.out);
  T grad = T(p.grad);
  if (p.dgrad != 0) grad *= *reinterpret_cast<const T*>(p.dgrad);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < p.n; i += stride) {
    const T wi = w[i];
    if constexpr (K == kCE) {
      const T* row = x + i * p.c;
      T* drow = dx + i * p.c;
      const int k = class_of(t[i], p.c);
      if (k < 0 || wi == T(0)) {
        const T v = k < 0 ? nan_of<T>() : T(0);
        for (int j = 0; j < p.c; ++j) drow[j] = v;
        continue;
      }
      const T lse = row_lse(row, p.c), scale = grad * wi;
      for (int j = 0; j < p.c; ++j) {
        T pj = exp_of(row[j] - lse);
        if (j == k) pj -= T(1);
        drow[j] = scale * pj;
      }
    } else if constexpr (K == kGIoU) {
      T* d = dx + 4 * i;
      if (wi == T(0)) {
        d[0] = d[1] = d[2] = d[3] = T(0);
        continue;
      }
      giou_grad(x + 4 * i, t + 4 * i, grad * wi, d);
    } else {
      if (wi == T(0)) {
        dx[i] = T(0);
        continue;
      }
      const T v = x[i], tv = t[i];
      T gd;
      if constexpr (K == kBCE) {
        gd = sigmoid_of(v) - tv;
      } else if constexpr (K == kSmoothL1) {
        const T d = v - tv, beta = T(p.beta);
        gd = fabs(d) < beta ? d / beta : d > T(0) ? T(1) : d < T(0) ? T(-1) : T(0);
      } else if constexpr (K == kL1) {
        const T d = v - tv;
        gd = d > T(0) ? T(1) : d < T(0) ? T(-1) : T(0);
      } else {  // focal: d/dx of alpha_t * bce * m^gamma, m = 1 - p_t
        const T pr = sigmoid_of(v), gamma = T(p.gamma);
        const T m = T(1) - (pr * tv + (T(1) - pr) * (T(1) - tv));
        // d(m^gamma)/dm; PyTorch's pow backward is 0 for gamma = 0.
        const T dpow = gamma == T(0) ? T(0) : gamma * pow_of(m, gamma - T(1));
        // Back through p_t = p*t + (1-p)*(1-t) and p = sigmoid(x) in
        // PyTorch's steps, so that an infinite dpow (0 < gamma < 1, p_t
        // rounded to 1) gives its NaN, not a signed infinity.
        const T gpt = -(bce_term(v, tv) * dpow);
        const T gp = gpt * tv - gpt * (T(1) - tv);
        gd = (pr - tv) * pow_of(m, gamma) + gp * ((T(1) - pr) * pr);
        if (p.alpha >= 0) gd *= alpha_t(tv, T(p.alpha));
      }
      dx[i] = grad * wi * gd;
    }
  }
}

// Box conversions. kMode: 0 cxcywh -> xyxy; 1 its backward; 2 xyxy ->
// cxcywh; 3 its backward.
template <int kMode, typename T>
__device__ __forceinline__ void box_convert(const BoxParams& p) {
  const T* in = reinterpret_cast<const T*>(p.in);
  T* out = reinterpret_cast<T*>(p.out);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < p.n; i += stride) {
    const T a = in[4 * i], b = in[4 * i + 1], c = in[4 * i + 2], d = in[4 * i + 3];
    T* o = out + 4 * i;
    if constexpr (kMode == 0) {  // (cx, cy, w, h) -> (x1, y1, x2, y2)
      o[0] = a - T(0.5) * c, o[1] = b - T(0.5) * d, o[2] = a + T(0.5) * c, o[3] = b + T(0.5) * d;
    } else if constexpr (kMode == 1) {  // (dx1, dy1, dx2, dy2) -> (dcx, dcy, dw, dh)
      o[0] = a + c, o[1] = b + d, o[2] = T(0.5) * (c - a), o[3] = T(0.5) * (d - b);
    } else if constexpr (kMode == 2) {  // (x1, y1, x2, y2) -> (cx, cy, w, h)
      o[0] = (a + c) / T(2), o[1] = (b + d) / T(2), o[2] = c - a, o[3] = d - b;
    } else {  // (dcx, dcy, dw, dh) -> (dx1, dy1, dx2, dy2)
      o[0] = a / T(2) - c, o[1] = b / T(2) - d, o[2] = a / T(2) + c, o[3] = b / T(2) + d;
    }
  }
}

}  // namespace stheno::loss

#define STHENO_LOSS_FWD(name, K, T)                                                              \
  __global__ void __launch_bounds__(stheno::loss::kLossThreads) name(stheno::loss::LossParams p) { \
    stheno::loss::loss_fwd<stheno::loss::K, T>(p);                                                 \
  }
#define STHENO_LOSS_BWD(name, K, T)                                                              \
  __global__ void __launch_bounds__(stheno::loss::kLossThreads) name(stheno::loss::LossParams p) { \
    stheno::loss::loss_bwd<stheno::loss::K, T>(p);                                                 \
  }
#define STHENO_BOX(name, mode, T)                                                               \
  __global__ void __launch_bounds__(stheno::loss::kLossThreads) name(stheno::loss::BoxParams p) { \
    stheno::loss::box_convert<mode, T>(p);                                                        \
  }

extern "C" {
STHENO_LOSS_FWD(loss_fwd_bce_f32, kBCE, float)
STHENO_LOSS_FWD(loss_fwd_bce_f64, kBCE, double)
STHENO_LOSS_FWD(loss_fwd_smoothl1_f32, kSmoothL1, float)
STHENO_LOSS_FWD(loss_fwd_smoothl1_f64, kSmoothL1, double)
STHENO_LOSS_FWD(loss_fwd_l1_f32, kL1, float)
STHENO_LOSS_FWD(loss_fwd_l1_f64, kL1, double)
STHENO_LOSS_FWD(loss_fwd_focal_f32, kFocal, float)
STHENO_LOSS_FWD(loss_fwd_focal_f64, kFocal, double)
STHENO_LOSS_FWD(loss_fwd_ce_f32, kCE, float)
STHENO_LOSS_FWD(loss_fwd_ce_f64, kCE, double)
STHENO_LOSS_FWD(loss_fwd_giou_f32, kGIoU, float)
STHENO_LOSS_FWD(loss_fwd_giou_f64, kGIoU, double)

STHENO_LOSS_BWD(loss_bwd_bce_f32, kBCE, float)
STHENO_LOSS_BWD(loss_bwd_bce_f64, kBCE, double)
STHENO_LOSS_BWD(loss_bwd_smoothl1_f32, kSmoothL1, float)
STHENO_LOSS_BWD(loss_bwd_smoothl1_f64, kSmoothL1, double)
STHENO_LOSS_BWD(loss_bwd_l1_f32, kL1, float)
STHENO_LOSS_BWD(loss_bwd_l1_f64, kL1, double)
STHENO_LOSS_BWD(loss_bwd_focal_f32, kFocal, float)
STHENO_LOSS_BWD(loss_bwd_focal_f64, kFocal, double)
STHENO_LOSS_BWD(loss_bwd_ce_f32, kCE, float)
STHENO_LOSS_BWD(loss_bwd_ce_f64, kCE, double)
STHENO_LOSS_BWD(loss_bwd_giou_f32, kGIoU, float)
STHENO_LOSS_BWD(loss_bwd_giou_f64, kGIoU, double)

__global__ void __launch_bounds__(stheno::loss::kLossThreads) loss_sum_f32(stheno::loss::LossSumParams p) {
  stheno::loss::loss_sum<float>(p);
}
__global__ void __launch_bounds__(stheno::loss::kLossThreads) loss_sum_f64(stheno::loss::LossSumParams p) {
  stheno::loss::loss_sum<double>(p);
}

__global__ void __launch_bounds__(32) loss_add_f32(stheno::loss::LossAddParams p) { stheno::loss::loss_add<float>(p); }
__global__ void __launch_bounds__(32) loss_add_f64(stheno::loss::LossAddParams p) { stheno::loss::loss_add<double>(p); }

STHENO_BOX(box_cxcywh_to_xyxy_f32, 0, float)
STHENO_BOX(box_cxcywh_to_xyxy_f64, 0, double)
STHENO_BOX(box_cxcywh_to_xyxy_bwd_f32, 1, float)
STHENO_BOX(box_cxcywh_to_xyxy_bwd_f64, 1, double)
STHENO_BOX(box_xyxy_to_cxcywh_f32, 2, float)
STHENO_BOX(box_xyxy_to_cxcywh_f64, 2, double)
STHENO_BOX(box_xyxy_to_cxcywh_bwd_f32, 3, float)
STHENO_BOX(box_xyxy_to_cxcywh_bwd_f64, 3, double)
}
