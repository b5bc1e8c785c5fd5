// BatchNorm of a ConvBN layer and the ReLU mask of its residual: the CUDA
// twins of kernels/batchnorm.go, over z [N,C,HW] (the convolution's output).
//
// Forward, training: the per-channel statistics come as partial records
// {count, sum, M2} per (slot, channel): from the convolution's epilogue (one
// slot per column tile) or, for a z from elsewhere, from bn_reduce (one slot
// per chunk of a plane). bn_finalize merges them (in float64, about each
// record's own mean: no E[z^2]-E[z]^2 cancellation; deterministic order),
// moves the running statistics, and leaves per-channel constants for
// bn_apply, which reads z (and the residual) once and writes y. Inference
// folds the running statistics into the same constants.
//
// bn_finalize leaves the forward's per-channel constants {center, scale,
// shift, mean, istd} (kernels.BatchNormCoef), which the op hands on as a
// tensor of their own: bn_apply reads them, and so does the backward.
//
// Backward: bn_grad_reduce makes records {sum g, sum g*(z-mean)} in one
// read of z and dy, with g = dy masked by the ReLU and the forward's mean
// (the statistics are kept from the forward pass, as PyTorch keeps them);
// bn_finalize turns them into dgamma, dbeta and the constants of dz;
// bn_backward_apply writes dz in a second read of z and dy. The ReLU's mask
// is not read from y: it is recomputed from z (and the residual) with the
// forward's constants and its own expression (bn_preact), so it is the
// forward's y > 0 bit for bit, and each backward pass reads two tensors
// instead of three. That second read is also the only pass the
// convolution's backward GEMMs get over their operand: the _tf32 variants
// store dz rounded to TF32 (what the tensor cores read; conv_sm90a.cu's
// wgrad reads it from shared memory as it is), the others as it is (float64,
// and float32 for full-float32 GEMMs).
//
// A plain Conv layer's backward has one pass too, relu_mask_sum: g (dy
// masked by the ReLU) for both GEMMs, rounded to TF32 in float32 by the
// _tf32 variants, and the bias gradient summed from the unrounded values.
#include "conv.cuh"

namespace stheno {

// stheno:const BNScratchBytes
// The dynamic shared memory of bn_reduce, bn_grad_reduce and bn_finalize:
// block_sum's scratch, 32 doubles per value summed at once, for up to four
// (they sum two).
constexpr int kBNScratchBytes = 32 * 4 * 8;
static_assert(kBNScratchBytes >= 32 * 2 * static_cast<int>(sizeof(double)), "block_sum of two values");

// count, mean and M2 (sum of squared deviations from the mean) of a set.
struct Moments {
  double n, mean, m2;
};

// 1/sqrt(v+eps) in T, exactly as the CPU twin's invStd: the square root in
// float64, rounded once.
template <typename T>
__device__ __forceinline__ T inv_std(T v, double eps) {
  return T(1) / static_cast<T>(sqrt(static_cast<double>(v + static_cast<T>(eps))));
}

// g: dy where y > 0 (a NaN y blocks it), or dy when there is no mask.
template <typename T>
__device__ __forceinline__ T masked_grad(const T* dy, const T* y, int64_t i) {
  const T g = dy[i];
  return y != nullptr && !(y[i] > T(0)) ? T(0) : g;
}

// v as the backward GEMMs' operand is stored: rounded to TF32 when kRound
// (float32 on the tensor cores, which round their operands as they load
// them; rounding twice gives what rounding once does), else as it is.
template <bool kRound, typename T>
__device__ __forceinline__ T gemm_operand(T v) {
  if constexpr (kRound) {
    static_assert(sizeof(T) == 4, "TF32 rounding is for float32");
    return bits_to_float(to_tf32(v));
  } else {
    return v;
  }
}

// Adds one element to a chunk's sums about its shift k (its first value):
// v = {sum d, sum d^2} with d = z - k, in float64.
__device__ __forceinline__ void reduce_add(double (&v)[2], double k, double z) {
  const double d = z - k;
  v[0] += d;
  v[1] += d * d;
}

// Grid (chunks, N, C): block (k, n, c) reduces elements [k*chunk, ...) of
// plane (n, c) into the statistics record (n*chunks + k, c), {count, sum,
// M2}, in one read of each element: sums of deviations from a shift (the
// chunk's first value), from which the chunk's mean and M2 follow exactly
// in float64 (the shift keeps the cancellation in M2 = sum d^2 - (sum
// d)^2/n to the size of the chunk's spread). float32 planes of whole
// float4s, 16-byte aligned, are read four elements at a time.
template <typename T>
__device__ __forceinline__ void bn_reduce(const BNParams& p) {
  const int c = blockIdx.z, n = blockIdx.y;
  const int lo = blockIdx.x * p.chunk;
  const int hi = min(lo + p.chunk, p.hw);
  const int64_t plane = (static_cast<int64_t>(n) * p.c + c) * p.hw;
  const T* __restrict__ z = reinterpret_cast<const T*>(p.z) + plane;
  const double k = static_cast<double>(z[lo]);
  double v[2] = {0.0, 0.0};
  bool done = false;
  if constexpr (sizeof(T) == 4) {
    if ((p.hw & 3) == 0 && (p.z & 15) == 0) {
      const float4* z4 = reinterpret_cast<const float4*>(z);
#pragma unroll 4
      for (int i = lo / 4 + threadIdx.x; i < hi / 4; i += blockDim.x) {
        const float4 zv = z4[i];
        reduce_add(v, k, zv.x);
        reduce_add(v, k, zv.y);
        reduce_add(v, k, zv.z);
        reduce_add(v, k, zv.w);
      }
      done = true;
    }
  }
  if (!done) {
    for (int i = lo + threadIdx.x; i < hi; i += blockDim.x) reduce_add(v, k, static_cast<double>(z[i]));
  }
  block_sum(v, reinterpret_cast<double*>(dynamic_smem()));
  if (threadIdx.x == 0) {
    const double count = hi - lo, dm = v[0] / count;  // the chunk's mean less k
    const int64_t slot = static_cast<int64_t>(n) * gridDim.x + blockIdx.x;
    double* r = reinterpret_cast<double*>(p.partial) + (slot * p.c + c) * p.rec;
    r[0] = count;
    r[1] = k * count + v[0];
    r[2] = fmax(v[1] - v[0] * dm, 0.0);
  }
}

// a*b + c rounded once, in T.
__device__ __forceinline__ float fma_rn(float a, float b, float c) { return fmaf(a, b, c); }
__device__ __forceinline__ double fma_rn(double a, double b, double c) { return fma(a, b, c); }

// The layer's output before the residual and the activation, (z -
// center)*scale + shift, with one explicit fused multiply-add: the
// forward's apply and the backward's ReLU mask compute it alike, bit for
// bit, whatever the compiler would contract.
template <typename T>
__device__ __forceinline__ T bn_preact(T z, T center, T scale, T shift) {
  return fma_rn(z - center, scale, shift);
}

// The forward's constants of channel c: center, scale, shift, mean, istd.
template <typename T>
struct FwdCoef {
  T center, scale, shift, mean, istd;
};

template <typename T>
__device__ __forceinline__ FwdCoef<T> fwd_coef(uint64_t coef, int c) {
  const T* q = reinterpret_cast<const T*>(coef) + static_cast<int64_t>(c) * kCoefStride;
  return FwdCoef<T>{q[0], q[1], q[2], q[3], q[4]};
}

// g: dy where the forward's y = act(preact + r) is positive, when the layer
// ends in a ReLU (r is the residual, or 0). y > 0 exactly when preact + r >
// 0 (a NaN passes neither), and preact is the forward's own expression, so
// the mask is the forward's without a read of y.
template <typename T>
__device__ __forceinline__ T relu_grad(T dy, T z, T r, const FwdCoef<T>& f, bool relu) {
  if (!relu) return dy;
  return bn_preact(z, f.center, f.scale, f.shift) + r > T(0) ? dy : T(0);
}

// Adds one element to a backward record: v = {sum g, sum g*(z - mean)},
// each deviation taken in T (as the CPU twin's dotDev64), summed in float64.
template <typename T>
__device__ __forceinline__ void grad_add(double (&v)[2], T g, T z, T mean) {
  v[0] += static_cast<double>(g);
  v[1] += static_cast<double>(g) * static_cast<double>(z - mean);
}

// The backward's reduction. Grid (chunks, N, C): block (k, n, c) sums g and
// g*(z - mean) over elements [k*chunk, ...) of plane (n, c) into record
// (n*chunks + k, c), reading z and dy (and the residual, for the mask of a
// layer with a residual and a ReLU) once, with the forward's mean. float32
// planes of whole float4s, 16-byte aligned, four elements at a time.
template <typename T>
__device__ __forceinline__ void bn_grad_reduce(const BNParams& p) {
  const int c = blockIdx.z, n = blockIdx.y;
  const int lo = blockIdx.x * p.chunk;
  const int hi = min(lo + p.chunk, p.hw);
  const int64_t plane = (static_cast<int64_t>(n) * p.c + c) * p.hw;
  const T* __restrict__ z = reinterpret_cast<const T*>(p.z) + plane;
  const T* __restrict__ dy = reinterpret_cast<const T*>(p.dy) + plane;
  const bool relu = p.relu != 0;
  const T* __restrict__ res = relu && p.residual != 0 ? reinterpret_cast<const T*>(p.residual) + plane : nullptr;
  const FwdCoef<T> f = fwd_coef<T>(p.fcoef, c);
  double v[2] = {0.0, 0.0};
  bool done = false;
  if constexpr (sizeof(T) == 4) {
    if ((p.hw & 3) == 0 && ((p.z | p.dy | p.residual) & 15) == 0) {
      const float4* z4 = reinterpret_cast<const float4*>(z);
      const float4* dy4 = reinterpret_cast<const float4*>(dy);
      const float4* r4 = reinterpret_cast<const float4*>(res);
#pragma unroll 4
      for (int i = lo / 4 + threadIdx.x; i < hi / 4; i += blockDim.x) {
        const float4 zv = z4[i], dv = dy4[i];
        float4 rv = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (r4 != nullptr) rv = r4[i];
        grad_add(v, relu_grad(dv.x, zv.x, rv.x, f, relu), zv.x, f.mean);
        grad_add(v, relu_grad(dv.y, zv.y, rv.y, f, relu), zv.y, f.mean);
        grad_add(v, relu_grad(dv.z, zv.z, rv.z, f, relu), zv.z, f.mean);
        grad_add(v, relu_grad(dv.w, zv.w, rv.w, f, relu), zv.w, f.mean);
      }
      done = true;
    }
  }
  if (!done) {
    for (int i = lo + threadIdx.x; i < hi; i += blockDim.x) {
      grad_add(v, relu_grad(dy[i], z[i], res != nullptr ? res[i] : T(0), f, relu), z[i], f.mean);
    }
  }
  block_sum(v, reinterpret_cast<double*>(dynamic_smem()));
  if (threadIdx.x == 0) {
    const int64_t slot = static_cast<int64_t>(n) * gridDim.x + blockIdx.x;
    double* r = reinterpret_cast<double*>(p.partial) + (slot * p.c + c) * p.rec;
    r[0] = v[0];
    r[1] = v[1];
  }
}

// Merges channel c's records {count, sum, M2} (slots of them, c channels
// apart) over the block into every thread: the count and the sum give the
// mean, then each record adds its M2 and its count times the square of its
// own mean's distance from it (M2 = sum M2_i + sum n_i (mean_i - mean)^2,
// exact, as Chan et al.'s pairwise merge is; an error d in the mean moves
// the result by only N d^2). Two block sums in a fixed order, so the result
// is the same on every run. Chan's merge, pair by pair, takes two float64
// divisions per merge, chained ~26 deep across the block: slower (the
// times are in BENCHMARKS.md).
__device__ __forceinline__ Moments merge_records(const double* part, int slots, int channels, int c, int rec,
                                                 double* scratch) {
  double v[2] = {0.0, 0.0};
  for (int s = threadIdx.x; s < slots; s += blockDim.x) {
    const double* r = part + (static_cast<int64_t>(s) * channels + c) * rec;
    v[0] += r[0];
    v[1] += r[1];
  }
  block_sum(v, scratch);
  const double mean = v[0] > 0 ? v[1] / v[0] : 0.0;
  double m2[1] = {0.0};
  for (int s = threadIdx.x; s < slots; s += blockDim.x) {
    const double* r = part + (static_cast<int64_t>(s) * channels + c) * rec;
    if (r[0] > 0) {
      const double d = r[1] / r[0] - mean;
      m2[0] += r[2] + r[0] * d * d;
    }
  }
  block_sum(m2, scratch);
  return Moments{v[0], mean, m2[0]};
}

// One block per channel. Forward (dgamma == 0) leaves coef = {center, scale,
// shift, mean, istd} from the statistics records (training) or the running
// statistics (inference). Backward sums the records of bn_grad_reduce and,
// with the forward's mean and istd (fcoef), leaves coef = {mean, istd,
// gamma*istd, mean g, mean g*xhat} and writes dgamma, dbeta. Every
// expression follows BatchNormCoef and BatchNormBackwardStats in
// kernels/batchnorm.go.
template <typename T>
__device__ __forceinline__ void bn_finalize(const BNParams& p) {
  const int c = blockIdx.x;
  double* scratch = reinterpret_cast<double*>(dynamic_smem());
  const double* part = reinterpret_cast<const double*>(p.partial);
  const T gamma = reinterpret_cast<const T*>(p.gamma)[c];
  const double m = static_cast<double>(p.n) * p.hw;
  T* coef = reinterpret_cast<T*>(p.coef) + static_cast<int64_t>(c) * kCoefStride;

  if (p.dgamma != 0) {
    const FwdCoef<T> f = fwd_coef<T>(p.fcoef, c);
    double v[2] = {0.0, 0.0};
    for (int s = threadIdx.x; s < p.slots; s += blockDim.x) {
      const double* r = part + (static_cast<int64_t>(s) * p.c + c) * p.rec;
      v[0] += r[0];
      v[1] += r[1];
    }
    block_sum(v, scratch);
    if (threadIdx.x == 0) {
      const double sgx = v[1] * static_cast<double>(f.istd);
      reinterpret_cast<T*>(p.dbeta)[c] = static_cast<T>(v[0]);
      reinterpret_cast<T*>(p.dgamma)[c] = static_cast<T>(sgx);
      coef[0] = f.mean;
      coef[1] = f.istd;
      coef[2] = gamma * f.istd;
      coef[3] = static_cast<T>(v[0] / m);
      coef[4] = static_cast<T>(sgx / m);
      for (int k = 5; k < kCoefStride; ++k) coef[k] = T(0);  // as the CPU twin leaves them
    }
    return;
  }

  Moments mo{0.0, 0.0, 0.0};
  if (p.training) mo = merge_records(part, p.slots, p.c, c, p.rec, scratch);
  if (threadIdx.x != 0) return;
  const T beta = reinterpret_cast<const T*>(p.beta)[c];
  for (int k = 5; k < kCoefStride; ++k) coef[k] = T(0);
  if (p.training) {
    const T mu = static_cast<T>(mo.mean);
    const T var = static_cast<T>(mo.m2 / m);
    const T istd = inv_std(var, p.eps);
    coef[0] = mu;
    coef[1] = gamma * istd;
    coef[2] = beta;
    coef[3] = mu;
    coef[4] = istd;
    if (p.run_mean != 0) {
      T* rm = reinterpret_cast<T*>(p.run_mean);
      T* rv = reinterpret_cast<T*>(p.run_var);
      const T mom = static_cast<T>(p.momentum), mt = static_cast<T>(static_cast<int64_t>(p.n) * p.hw);
      rm[c] = (T(1) - mom) * rm[c] + mom * mu;
      rv[c] = (T(1) - mom) * rv[c] + mom * var * mt / (mt - T(1));
    }
    if (p.batch_stats != 0) {
      T* bs = reinterpret_cast<T*>(p.batch_stats);
      bs[c] = mu;
      bs[p.c + c] = var;
    }
  } else {
    const T mu = reinterpret_cast<const T*>(p.run_mean)[c];
    const T istd = inv_std(reinterpret_cast<const T*>(p.run_var)[c], p.eps);
    const T scale = gamma * istd;
    coef[0] = T(0);
    coef[1] = scale;
    coef[2] = beta - mu * scale;
    coef[3] = mu;
    coef[4] = istd;
  }
}

// y = act(preact + residual), as the CPU twin's affine.
template <typename T>
__device__ __forceinline__ T bn_affine(T z, const FwdCoef<T>& f, T r, bool relu) {
  T v = bn_preact(z, f.center, f.scale, f.shift) + r;
  if (relu && v < T(0)) v = T(0);
  return v;
}

// Grid (N*C, blocks per plane): block (row, k) walks plane row = n*C + c
// from element k*blockDim.x with a stride of the plane's blocks.
template <typename T>
__device__ __forceinline__ void bn_apply(const BNParams& p) {
  const int64_t row = blockIdx.x;
  const FwdCoef<T> f = fwd_coef<T>(p.coef, static_cast<int>(row % p.c));
  const int64_t off = row * p.hw;
  const T* __restrict__ z = reinterpret_cast<const T*>(p.z) + off;
  const T* __restrict__ res = p.residual != 0 ? reinterpret_cast<const T*>(p.residual) + off : nullptr;
  T* __restrict__ out = reinterpret_cast<T*>(p.out) + off;
  const bool relu = p.relu != 0;
  for (int i = blockIdx.y * blockDim.x + threadIdx.x; i < p.hw; i += gridDim.y * blockDim.x) {
    out[i] = bn_affine(z[i], f, res != nullptr ? res[i] : T(0), relu);
  }
}

// bn_apply four elements at a time, for float planes of a multiple of 4
// elements (16-byte aligned: the allocator's blocks are).
__device__ __forceinline__ void bn_apply_vec4(const BNParams& p) {
  const int64_t row = blockIdx.x;
  const FwdCoef<float> f = fwd_coef<float>(p.coef, static_cast<int>(row % p.c));
  const int64_t off = row * p.hw;
  const float4* __restrict__ z = reinterpret_cast<const float4*>(reinterpret_cast<const float*>(p.z) + off);
  const float4* __restrict__ res =
      p.residual != 0 ? reinterpret_cast<const float4*>(reinterpret_cast<const float*>(p.residual) + off) : nullptr;
  float4* __restrict__ out = reinterpret_cast<float4*>(reinterpret_cast<float*>(p.out) + off);
  const bool relu = p.relu != 0;
  const int n4 = p.hw / 4;
  for (int i = blockIdx.y * blockDim.x + threadIdx.x; i < n4; i += gridDim.y * blockDim.x) {
    const float4 zv = z[i];
    float4 r = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (res != nullptr) r = res[i];
    out[i] = make_float4(bn_affine(zv.x, f, r.x, relu), bn_affine(zv.y, f, r.y, relu), bn_affine(zv.z, f, r.z, relu),
                         bn_affine(zv.w, f, r.w, relu));
  }
}

// dz = gamma*istd * (g - mean(g) - xhat*mean(g*xhat)) in training, with
// xhat = (z - mean)*istd; gamma*istd * g in inference.
template <typename T>
__device__ __forceinline__ T bn_dz(T g, T z, const T (&cf)[5], bool training) {
  if (!training) return cf[2] * g;
  const T xhat = (z - cf[0]) * cf[1];
  return cf[2] * (g - cf[3] - xhat * cf[4]);
}

// dz, rounded to TF32 when kRound: g from dy and the forward's mask
// (relu_grad), the constants from bn_finalize's backward.
template <typename T, bool kRound>
__device__ __forceinline__ void bn_backward_apply(const BNParams& p) {
  const int64_t row = blockIdx.x;
  const int c = static_cast<int>(row % p.c);
  const T* q = reinterpret_cast<const T*>(p.coef) + static_cast<int64_t>(c) * kCoefStride;
  const T cf[5] = {q[0], q[1], q[2], q[3], q[4]};
  const FwdCoef<T> f = fwd_coef<T>(p.fcoef, c);
  const int64_t off = row * p.hw;
  const bool relu = p.relu != 0;
  const T* __restrict__ z = reinterpret_cast<const T*>(p.z) + off;
  const T* __restrict__ dy = reinterpret_cast<const T*>(p.dy) + off;
  const T* __restrict__ res = relu && p.residual != 0 ? reinterpret_cast<const T*>(p.residual) + off : nullptr;
  T* __restrict__ out = reinterpret_cast<T*>(p.out) + off;
  const bool training = p.training != 0;
  for (int i = blockIdx.y * blockDim.x + threadIdx.x; i < p.hw; i += gridDim.y * blockDim.x) {
    const T zi = z[i];
    const T g = relu_grad(dy[i], zi, res != nullptr ? res[i] : T(0), f, relu);
    out[i] = gemm_operand<kRound>(bn_dz(g, zi, cf, training));
  }
}

// bn_backward_apply four elements at a time (float planes of a multiple of
// 4 elements, 16-byte aligned), with the same arithmetic per element.
template <bool kRound>
__device__ __forceinline__ void bn_backward_apply_vec4(const BNParams& p) {
  const int64_t row = blockIdx.x;
  const int c = static_cast<int>(row % p.c);
  const float* q = reinterpret_cast<const float*>(p.coef) + static_cast<int64_t>(c) * kCoefStride;
  const float cf[5] = {q[0], q[1], q[2], q[3], q[4]};
  const FwdCoef<float> f = fwd_coef<float>(p.fcoef, c);
  const int64_t off = row * p.hw;
  const bool relu = p.relu != 0;
  const float4* __restrict__ z = reinterpret_cast<const float4*>(reinterpret_cast<const float*>(p.z) + off);
  const float4* __restrict__ dy = reinterpret_cast<const float4*>(reinterpret_cast<const float*>(p.dy) + off);
  const float4* __restrict__ res =
      relu && p.residual != 0 ? reinterpret_cast<const float4*>(reinterpret_cast<const float*>(p.residual) + off)
                              : nullptr;
  float4* __restrict__ out = reinterpret_cast<float4*>(reinterpret_cast<float*>(p.out) + off);
  const bool training = p.training != 0;
  const int n4 = p.hw / 4;
  for (int i = blockIdx.y * blockDim.x + threadIdx.x; i < n4; i += gridDim.y * blockDim.x) {
    const float4 zv = z[i], dv = dy[i];
    float4 rv = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (res != nullptr) rv = res[i];
    const float zs[4] = {zv.x, zv.y, zv.z, zv.w}, ds[4] = {dv.x, dv.y, dv.z, dv.w}, rs[4] = {rv.x, rv.y, rv.z, rv.w};
    float o[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      o[e] = gemm_operand<kRound>(bn_dz<float>(relu_grad(ds[e], zs[e], rs[e], f, relu), zs[e], cf, training));
    }
    out[i] = make_float4(o[0], o[1], o[2], o[3]);
  }
}

// dx = dy where y > 0, else 0 (kernels.MaskReLU).
struct MaskParams {
  uint64_t y, dy, dx;
  int64_t n;
};
STHENO_PARAMS(MaskParams);

template <typename T>
__device__ __forceinline__ void relu_mask(const MaskParams& p) {
  const T* __restrict__ y = reinterpret_cast<const T*>(p.y);
  const T* __restrict__ dy = reinterpret_cast<const T*>(p.dy);
  T* __restrict__ dx = reinterpret_cast<T*>(p.dx);
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < p.n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    dx[i] = masked_grad(dy, y, i);
  }
}

// g = dy where y > 0, else 0 (no mask when y == 0), stored rounded to TF32
// when kRound: the dy operand of the convolution's backward GEMMs, which
// both read it as it is (conv_sm90a.cu's wgrad from shared memory, where
// nothing could round it). With partial != 0 it also sums the unrounded
// values of each plane (n, c) chunk by chunk, for the bias gradient: block
// b takes chunk b % chunks of plane b / chunks and writes its sum to
// partial[(n*chunks + k)*C + c], so that conv_splitk_reduce over N*chunks
// "splits" of C values adds them per channel, in a fixed order.
struct MaskSumParams {
  uint64_t y, dy, dx, partial;
  int32_t c, plane, chunk, chunks;
};
STHENO_PARAMS(MaskSumParams);

// stheno:const MaskSumScratchBytes
// The dynamic shared memory of relu_mask_sum: block_sum's scratch for one
// value.
constexpr int kMaskSumScratchBytes = 32 * 8;
static_assert(kMaskSumScratchBytes >= 32 * static_cast<int>(sizeof(double)), "block_sum of one value");

// The block's plane row (n*C + c), its chunk k and the chunk's bounds.
struct MaskChunk {
  int64_t row;
  int k, lo, hi;
};

__device__ __forceinline__ MaskChunk mask_chunk(const MaskSumParams& p) {
  const int64_t b = blockIdx.x;
  const int64_t row = b / p.chunks;
  const int k = static_cast<int>(b - row * p.chunks);
  const int lo = k * p.chunk;
  return MaskChunk{row, k, lo, min(lo + p.chunk, p.plane)};
}

template <typename T>
__device__ __forceinline__ void mask_chunk_sum(const MaskSumParams& p, const MaskChunk& m, double s) {
  double v[1] = {s};
  block_sum(v, reinterpret_cast<double*>(dynamic_smem()));
  if (threadIdx.x == 0) {
    const int64_t n = m.row / p.c, c = m.row - n * p.c;
    reinterpret_cast<T*>(p.partial)[(n * p.chunks + m.k) * p.c + c] = static_cast<T>(v[0]);
  }
}

template <typename T, bool kRound>
__device__ __forceinline__ void relu_mask_sum(const MaskSumParams& p) {
  const MaskChunk m = mask_chunk(p);
  const int64_t off = m.row * p.plane;
  const T* __restrict__ dy = reinterpret_cast<const T*>(p.dy) + off;
  const T* __restrict__ y = p.y != 0 ? reinterpret_cast<const T*>(p.y) + off : nullptr;
  T* __restrict__ dx = reinterpret_cast<T*>(p.dx) + off;
  double s = 0.0;
  for (int i = m.lo + threadIdx.x; i < m.hi; i += blockDim.x) {
    const T g = masked_grad(dy, y, i);
    dx[i] = gemm_operand<kRound>(g);
    s += static_cast<double>(g);
  }
  if (p.partial != 0) mask_chunk_sum<T>(p, m, s);  // the same for the whole block
}

// relu_mask_sum in float32 four elements at a time (planes of a multiple of
// 4 elements, 16-byte aligned; chunk a multiple of 4).
template <bool kRound>
__device__ __forceinline__ void relu_mask_sum_vec4(const MaskSumParams& p) {
  const MaskChunk m = mask_chunk(p);
  const int64_t off = m.row * p.plane;
  const float4* __restrict__ dy = reinterpret_cast<const float4*>(reinterpret_cast<const float*>(p.dy) + off);
  const float4* __restrict__ y =
      p.y != 0 ? reinterpret_cast<const float4*>(reinterpret_cast<const float*>(p.y) + off) : nullptr;
  float4* __restrict__ dx = reinterpret_cast<float4*>(reinterpret_cast<float*>(p.dx) + off);
  double s = 0.0;
  for (int i = m.lo / 4 + threadIdx.x; i < m.hi / 4; i += blockDim.x) {
    const float4 dv = dy[i];
    float g[4] = {dv.x, dv.y, dv.z, dv.w};
    if (y != nullptr) {
      const float4 yv = y[i];
      const float ys[4] = {yv.x, yv.y, yv.z, yv.w};
#pragma unroll
      for (int e = 0; e < 4; ++e) g[e] = !(ys[e] > 0.0f) ? 0.0f : g[e];
    }
    dx[i] = make_float4(gemm_operand<kRound>(g[0]), gemm_operand<kRound>(g[1]), gemm_operand<kRound>(g[2]),
                        gemm_operand<kRound>(g[3]));
    s += (static_cast<double>(g[0]) + static_cast<double>(g[1])) + (static_cast<double>(g[2]) + static_cast<double>(g[3]));
  }
  if (p.partial != 0) mask_chunk_sum<float>(p, m, s);
}

}  // namespace stheno

extern "C" {
__global__ void bn_reduce_f32(stheno::BNParams p) { stheno::bn_reduce<float>(p); }
__global__ void bn_reduce_f64(stheno::BNParams p) { stheno::bn_reduce<double>(p); }
__global__ void bn_grad_reduce_f32(stheno::BNParams p) { stheno::bn_grad_reduce<float>(p); }
__global__ void bn_grad_reduce_f64(stheno::BNParams p) { stheno::bn_grad_reduce<double>(p); }
__global__ void bn_finalize_f32(stheno::BNParams p) { stheno::bn_finalize<float>(p); }
__global__ void bn_finalize_f64(stheno::BNParams p) { stheno::bn_finalize<double>(p); }
__global__ void bn_apply_f32(stheno::BNParams p) { stheno::bn_apply<float>(p); }
__global__ void bn_apply_vec4_f32(stheno::BNParams p) { stheno::bn_apply_vec4(p); }
__global__ void bn_apply_f64(stheno::BNParams p) { stheno::bn_apply<double>(p); }
__global__ void bn_backward_apply_f32(stheno::BNParams p) { stheno::bn_backward_apply<float, false>(p); }
__global__ void bn_backward_apply_f64(stheno::BNParams p) { stheno::bn_backward_apply<double, false>(p); }
__global__ void bn_backward_apply_vec4_f32(stheno::BNParams p) { stheno::bn_backward_apply_vec4<false>(p); }
__global__ void bn_backward_apply_tf32_f32(stheno::BNParams p) { stheno::bn_backward_apply<float, true>(p); }
__global__ void bn_backward_apply_tf32_vec4_f32(stheno::BNParams p) { stheno::bn_backward_apply_vec4<true>(p); }
__global__ void relu_mask_f32(stheno::MaskParams p) { stheno::relu_mask<float>(p); }
__global__ void relu_mask_f64(stheno::MaskParams p) { stheno::relu_mask<double>(p); }
__global__ void relu_mask_sum_tf32_f32(stheno::MaskSumParams p) { stheno::relu_mask_sum<float, true>(p); }
__global__ void relu_mask_sum_tf32_vec4_f32(stheno::MaskSumParams p) { stheno::relu_mask_sum_vec4<true>(p); }
__global__ void relu_mask_sum_f32(stheno::MaskSumParams p) { stheno::relu_mask_sum<float, false>(p); }
__global__ void relu_mask_sum_vec4_f32(stheno::MaskSumParams p) { stheno::relu_mask_sum_vec4<false>(p); }
__global__ void relu_mask_sum_f64(stheno::MaskSumParams p) { stheno::relu_mask_sum<double, false>(p); }
}
