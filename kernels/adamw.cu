// AdamW (torch.optim.AdamW: decoupled weight decay, bias-corrected moments,
// eps added to sqrt(v_hat), no amsgrad, no maximize) over many tensors at
// once, with torch.nn.utils.clip_grad_norm_'s global-norm clipping before
// the step: the CUDA twins of kernels/adamw.go.
//
// One step of learning rate lr and weight decay wd (those of the tensor's
// parameter group), at step count t, on each element, with the clip
// coefficient coef (1 without clipping):
//
//   g = grad*coef
//   p = p*(1 - lr*wd)
//   m = beta1*m + (1 - beta1)*g
//   v = beta2*v + ((1 - beta2)*g)*g
//   p = p - (lr/(1 - beta1^t))*m / (sqrt(v)/sqrt(1 - beta2^t) + eps)
//
// in the element type T, every operation rounded on its own (mul_rn,
// add_rn, sub_rn: never contracted into a fused multiply-add; sqrt and
// division are IEEE's), so that the CPU twin, which rounds alike, gives the
// same bits. The per-step scalars (the brackets) are worked out in float64
// on the host and rounded to T once; they travel in the launch's params,
// the per-group ones in arrays indexed by the tensor's group.
//
// The clip coefficient: coef = min(max_norm / (norm + 1e-6), 1), norm the
// 2-norm of all the step's gradients together. NaN or infinite norms are
// not refused (torch's error_if_nonfinite=False): coef is then NaN or 0,
// and the step goes on with it. It is worked out on the device in two
// kernels and stays there: norm_partial writes the sum of squares of each
// chunk, norm_finalize adds those and writes [norm, coef] to p.norm, where
// the step reads coef. No atomics: every sum runs in an order fixed by the
// tensors' sizes alone, so the norm is the same bits run after run (and the
// CPU twin's): each thread adds its units' squares in order from zero, in
// double (the square of a float is exact in double), then the block's
// butterfly over each warp (distances 16, 8, 4, 2, 1) and over the warps'
// sums; norm_finalize adds the chunks' sums alike, thread t the chunks t,
// t + kThreads, ....
//
// Multi-tensor: the host packs a table into device memory once, and again
// only when an address changes: for each tensor kTensorWords int64 words
// (param, grad, m, v addresses, its element count and its group), then a
// word per chunk, (chunk index in the tensor << 32) | tensor index. A chunk
// is kChunkElems elements of one tensor (the last of a tensor may be
// shorter), a block's work: one launch covers every tensor of the step,
// large tensors split over many blocks, small ones a block each.
//
// Within a chunk thread t takes the units t, t + kThreads, ...: 16-byte
// vectors (4 floats, 2 doubles), read as one load where the tensors are
// 16-byte aligned and element by element otherwise (views may start
// anywhere), in the same order either way; a chunk's last unit may be
// short.
#include <stdint.h>

#include "params_gen.cuh"

namespace stheno::adamw {

// stheno:const AdamWChunkElems
// The elements of a chunk, a block's work: 16 vectors of 4 floats a thread.
constexpr int64_t kChunkElems = 16384;

// stheno:const AdamWThreads
// The threads of every block of these kernels.
constexpr int kThreads = 256;

// stheno:const AdamWMaxGroups
// The parameter groups a step may have: their scalars travel in the
// launch's params.
constexpr int kMaxGroups = 16;

// stheno:const AdamWTensorWords
// The int64 words of a tensor's row of the table: param, grad, m, v (device
// addresses), element count, group.
constexpr int kTensorWords = 6;

static_assert(kChunkElems % (32 * 4) == 0, "a chunk is whole vectors of either dtype");

// norm_partial and norm_finalize.
struct AdamWNormParams {
  uint64_t table;    // int64 [tensors*kTensorWords + chunks]: the tensors' rows, then the chunks
  uint64_t partial;  // double [chunks]: each chunk's sum of squares
  uint64_t norm;     // double [2]: finalize writes the norm and the clip coefficient
  int64_t tensors;   // rows of the table: where the chunks' words start
  double max_norm;   // finalize: the clipping threshold (> 0)
  int32_t chunks;
  int32_t unused;
};
STHENO_PARAMS(AdamWNormParams);

// The step.
struct AdamWStepParams {
  uint64_t table;    // as AdamWNormParams'
  uint64_t norm;     // double [2], when clip: norm_finalize's [norm, coef]
  int64_t tensors;
  double beta1, one_minus_beta1, beta2, one_minus_beta2;
  double eps;
  double bc2_sqrt;                // sqrt(1 - beta2^t)
  double decay[kMaxGroups];       // per group: 1 - lr*wd
  double step_size[kMaxGroups];   // per group: lr / (1 - beta1^t)
  int32_t chunks;
  int32_t clip;       // scale the gradients by coef
  int32_t zero_grad;  // write zeros over the gradients once read
  int32_t unused;
};
STHENO_PARAMS(AdamWStepParams);

// Arithmetic rounded step by step: nvcc never fuses these intrinsics into
// fused multiply-adds, so the results are the CPU twin's.
__device__ __forceinline__ float add_rn(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ double add_rn(double a, double b) { return __dadd_rn(a, b); }
__device__ __forceinline__ float sub_rn(float a, float b) { return __fsub_rn(a, b); }
__device__ __forceinline__ double sub_rn(double a, double b) { return __dsub_rn(a, b); }
__device__ __forceinline__ float mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double mul_rn(double a, double b) { return __dmul_rn(a, b); }
// IEEE square roots (nvcc's default -prec-sqrt=true; the float one
// correctly rounded, as the twin's float32(math.Sqrt)).
__device__ __forceinline__ float sqrt_rn(float a) { return sqrtf(a); }
__device__ __forceinline__ double sqrt_rn(double a) { return sqrt(a); }

// Elements per 16-byte vector.
template <typename T>
constexpr int kVec = 16 / static_cast<int>(sizeof(T));

// The sum of v over the block (kThreads threads), in thread 0: a butterfly
// over each warp, then one over the warps' sums (zeros past the last
// warp), as the twin's threadSum. scratch holds 32 doubles of shared
// memory.
__device__ __forceinline__ double block_sum(double v, double* scratch) {
  constexpr int kWarps = kThreads / 32;
#pragma unroll
  for (int off = 16; off > 0; off /= 2) v = add_rn(v, __shfl_xor_sync(0xffffffffu, v, off));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < kWarps ? scratch[lane] : 0.0;
#pragma unroll
    for (int off = 16; off > 0; off /= 2) v = add_rn(v, __shfl_xor_sync(0xffffffffu, v, off));
  }
  return v;
}

// A tensor's row of the table.
struct Tensor {
  uint64_t param, grad, m, v;
  int64_t n;
  int32_t group;
};

// The chunk of this block: its tensor's row, where the chunk starts in the
// tensor and its length.
struct Chunk {
  Tensor t;
  int64_t start;
  int n;
};

__device__ __forceinline__ Chunk chunk_of(uint64_t table, int64_t tensors, int chunk) {
  const int64_t* tab = reinterpret_cast<const int64_t*>(table);
  const int64_t w = tab[tensors * kTensorWords + chunk];
  const int64_t* row = tab + (w & 0xffffffff) * kTensorWords;
  Chunk c;
  c.t.param = static_cast<uint64_t>(row[0]), c.t.grad = static_cast<uint64_t>(row[1]);
  c.t.m = static_cast<uint64_t>(row[2]), c.t.v = static_cast<uint64_t>(row[3]);
  c.t.n = row[4], c.t.group = static_cast<int32_t>(row[5]);
  c.start = (w >> 32) * kChunkElems;
  c.n = static_cast<int>(c.t.n - c.start < kChunkElems ? c.t.n - c.start : kChunkElems);
  return c;
}

template <typename T>
__device__ __forceinline__ T* at(uint64_t a, int64_t i) {
  return reinterpret_cast<T*>(a) + i;
}

// Unit u of a chunk (k elements, kVec<T> but for a short last unit) into
// v: one vector load when vec and the unit is whole, else element by
// element.
template <typename T>
__device__ __forceinline__ void load_unit(const T* p, int k, bool vec, T* v) {
  if constexpr (sizeof(T) == 4) {
    if (vec && k == 4) {
      const float4 q = *reinterpret_cast<const float4*>(p);
      v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
      return;
    }
  } else {
    if (vec && k == 2) {
      const double2 q = *reinterpret_cast<const double2*>(p);
      v[0] = q.x, v[1] = q.y;
      return;
    }
  }
  for (int e = 0; e < k; ++e) v[e] = p[e];
}
template <typename T>
__device__ __forceinline__ void store_unit(T* p, int k, bool vec, const T* v) {
  if constexpr (sizeof(T) == 4) {
    if (vec && k == 4) {
      *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
      return;
    }
  } else {
    if (vec && k == 2) {
      *reinterpret_cast<double2*>(p) = make_double2(v[0], v[1]);
      return;
    }
  }
  for (int e = 0; e < k; ++e) p[e] = v[e];
}

// Block b: the sum of the squares of chunk b's gradients into partial[b].
template <typename T>
__device__ __forceinline__ void norm_partial(const AdamWNormParams& p) {
  constexpr int kV = kVec<T>;
  __shared__ double scratch[32];
  const Chunk c = chunk_of(p.table, p.tensors, blockIdx.x);
  const T* g = at<T>(c.t.grad, c.start);
  const bool vec = (c.t.grad & 15) == 0;
  double s = 0.0;
  for (int u = threadIdx.x; u * kV < c.n; u += kThreads) {
    const int k = c.n - u * kV < kV ? c.n - u * kV : kV;
    T x[kV];
    load_unit(g + u * kV, k, vec, x);
    for (int e = 0; e < k; ++e) {
      const double d = static_cast<double>(x[e]);
      s = add_rn(s, mul_rn(d, d));
    }
  }
  s = block_sum(s, scratch);
  if (threadIdx.x == 0) reinterpret_cast<double*>(p.partial)[blockIdx.x] = s;
}

// One block: the chunks' sums added, the norm and the clip coefficient.
// The coefficient's comparison lets NaN through, as torch's clamp does.
__device__ __forceinline__ void norm_finalize(const AdamWNormParams& p) {
  __shared__ double scratch[32];
  const double* partial = reinterpret_cast<const double*>(p.partial);
  double s = 0.0;
  for (int i = threadIdx.x; i < p.chunks; i += kThreads) s = add_rn(s, partial[i]);
  s = block_sum(s, scratch);
  if (threadIdx.x == 0) {
    const double norm = sqrt(s);
    double coef = p.max_norm / add_rn(norm, 1e-6);
    if (coef > 1.0) coef = 1.0;
    double* out = reinterpret_cast<double*>(p.norm);
    out[0] = norm, out[1] = coef;
  }
}

// Block b: the step on chunk b.
template <typename T>
__device__ __forceinline__ void step(const AdamWStepParams& p) {
  constexpr int kV = kVec<T>;
  const Chunk c = chunk_of(p.table, p.tensors, blockIdx.x);
  const int group = c.t.group;
  const T decay = static_cast<T>(p.decay[group]), step_size = static_cast<T>(p.step_size[group]);
  const T beta1 = static_cast<T>(p.beta1), omb1 = static_cast<T>(p.one_minus_beta1);
  const T beta2 = static_cast<T>(p.beta2), omb2 = static_cast<T>(p.one_minus_beta2);
  const T eps = static_cast<T>(p.eps), bc2_sqrt = static_cast<T>(p.bc2_sqrt);
  const T coef = p.clip ? static_cast<T>(reinterpret_cast<const double*>(p.norm)[1]) : T(1);
  T* pp = at<T>(c.t.param, c.start);
  T* gp = at<T>(c.t.grad, c.start);
  T* mp = at<T>(c.t.m, c.start);
  T* vp = at<T>(c.t.v, c.start);
  const bool vec = ((c.t.param | c.t.grad | c.t.m | c.t.v) & 15) == 0;
  for (int u = threadIdx.x; u * kV < c.n; u += kThreads) {
    const int k = c.n - u * kV < kV ? c.n - u * kV : kV;
    const int64_t o = static_cast<int64_t>(u) * kV;
    T x[kV], g[kV], m[kV], v[kV];
    load_unit(pp + o, k, vec, x);
    load_unit(gp + o, k, vec, g);
    load_unit(mp + o, k, vec, m);
    load_unit(vp + o, k, vec, v);
#pragma unroll
    for (int e = 0; e < kV; ++e) {
      if (e >= k) break;
      const T ge = p.clip ? mul_rn(g[e], coef) : g[e];
      const T xe = mul_rn(x[e], decay);
      m[e] = add_rn(mul_rn(beta1, m[e]), mul_rn(omb1, ge));
      v[e] = add_rn(mul_rn(beta2, v[e]), mul_rn(mul_rn(omb2, ge), ge));
      const T denom = add_rn(sqrt_rn(v[e]) / bc2_sqrt, eps);
      x[e] = sub_rn(xe, mul_rn(step_size, m[e]) / denom);
      g[e] = T(0);
    }
    store_unit(pp + o, k, vec, x);
    store_unit(mp + o, k, vec, m);
    store_unit(vp + o, k, vec, v);
    if (p.zero_grad) store_unit(gp + o, k, vec, g);
  }
}

}  // namespace stheno::adamw

extern "C" {
// clang-format off
__global__ void __launch_bounds__(256) adamw_norm_partial_f32(stheno::adamw::AdamWNormParams p) { stheno::adamw::norm_partial<float>(p); }
__global__ void __launch_bounds__(256) adamw_norm_partial_f64(stheno::adamw::AdamWNormParams p) { stheno::adamw::norm_partial<double>(p); }
__global__ void __launch_bounds__(256) adamw_norm_finalize(stheno::adamw::AdamWNormParams p) { stheno::adamw::norm_finalize(p); }
__global__ void __launch_bounds__(256) adamw_step_f32(stheno::adamw::AdamWStepParams p) { stheno::adamw::step<float>(p); }
__global__ void __launch_bounds__(256) adamw_step_f64(stheno::adamw::AdamWStepParams p) { stheno::adamw::step<double>(p); }
// clang-format on
}
