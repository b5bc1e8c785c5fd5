// BatchNorm of a ConvBN layer and the ReLU mask of its residual: the CUDA
// twins of kernels/batchnorm.go, over z [N,C,HW] (the convolution's output).
//
// Forward, training: the per-channel statistics come as partial records
// {count, sum, M2} per (slot, channel): from the convolution's epilogue (one
// slot per column tile) or, for a z from elsewhere, from bn_reduce (one slot
// per chunk of a plane). bn_finalize merges them (Chan et al.'s parallel
// update, in float64: no E[z^2]-E[z]^2 cancellation, deterministic order),
// moves the running statistics, and leaves per-channel constants for
// bn_apply, which reads z (and the residual) once and writes y. Inference
// folds the running statistics into the same constants.
//
// Backward: bn_reduce makes records {count, sum, M2, sum g, sum g*(z-mean)}
// (g = dy masked by the ReLU) in one read of z, dy and y; bn_finalize turns
// them into dgamma, dbeta and the constants of dz; bn_backward_apply writes
// dz in a second read. The statistics are recomputed from z rather than kept
// from the forward pass, as on the CPU, so that each op is a pure function of
// its inputs. That second read is also the only pass the convolution's
// backward GEMMs get over their operand: the _tf32 variants store dz rounded
// to TF32 (what the tensor cores read; conv_sm90a.cu's wgrad reads it from
// shared memory as it is).
//
// A plain Conv layer's backward has one pass too, relu_mask_sum: g (dy
// masked by the ReLU) for both GEMMs, rounded to TF32 in float32, and the
// bias gradient summed from the unrounded values.
#include "conv.cuh"

namespace stheno {

// count, mean and M2 (sum of squared deviations from the mean) of a set.
struct Moments {
  double n, mean, m2;
};

// The union of two sets (Chan, Golub and LeVeque). Merging in a fixed
// order makes the result the same on every run.
__device__ __forceinline__ Moments merge(const Moments& a, const Moments& b) {
  if (b.n == 0) return a;
  if (a.n == 0) return b;
  const double n = a.n + b.n, d = b.mean - a.mean;
  return Moments{n, a.mean + d * (b.n / n), a.m2 + b.m2 + d * d * (a.n * b.n / n)};
}

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
// v = {sum d, sum d^2, sum g, sum g*d} with d = z - k, in float64.
__device__ __forceinline__ void reduce_add(double (&v)[4], double k, double z, double g) {
  const double d = z - k;
  v[0] += d;
  v[1] += d * d;
  v[2] += g;
  v[3] += g * d;
}

// Grid (chunks, N, C): block (k, n, c) reduces elements [k*chunk, ...) of
// plane (n, c) into record (n*chunks + k, c), in one read of each element:
// sums of deviations from a shift (the chunk's first value), from which
// the chunk's mean, M2 and gradient sum about the mean follow exactly in
// float64 (the shift keeps the cancellation in M2 = sum d^2 - (sum d)^2/n
// to the size of the chunk's spread). float32 planes of whole float4s,
// 16-byte aligned, are read four elements at a time.
template <typename T>
__device__ __forceinline__ void bn_reduce(const BNParams& p) {
  const int c = blockIdx.z, n = blockIdx.y;
  const int lo = blockIdx.x * p.chunk;
  const int hi = min(lo + p.chunk, p.hw);
  const int64_t plane = (static_cast<int64_t>(n) * p.c + c) * p.hw;
  const T* __restrict__ z = reinterpret_cast<const T*>(p.z) + plane;
  const T* __restrict__ dy = p.dy != 0 ? reinterpret_cast<const T*>(p.dy) + plane : nullptr;
  const T* __restrict__ y = p.y != 0 ? reinterpret_cast<const T*>(p.y) + plane : nullptr;
  const double k = static_cast<double>(z[lo]);
  double v[4] = {0.0, 0.0, 0.0, 0.0};
  bool done = false;
  if constexpr (sizeof(T) == 4) {
    if ((p.hw & 3) == 0 && ((p.z | p.dy | p.y) & 15) == 0) {
      const float4* z4 = reinterpret_cast<const float4*>(z);
      const float4* dy4 = reinterpret_cast<const float4*>(dy);
      const float4* y4 = reinterpret_cast<const float4*>(y);
#pragma unroll 4
      for (int i = lo / 4 + threadIdx.x; i < hi / 4; i += blockDim.x) {
        const float4 zv = z4[i];
        float4 gv = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (dy4 != nullptr) gv = dy4[i];
        if (y4 != nullptr) {
          const float4 yv = y4[i];
          gv.x = !(yv.x > 0.0f) ? 0.0f : gv.x;
          gv.y = !(yv.y > 0.0f) ? 0.0f : gv.y;
          gv.z = !(yv.z > 0.0f) ? 0.0f : gv.z;
          gv.w = !(yv.w > 0.0f) ? 0.0f : gv.w;
        }
        reduce_add(v, k, zv.x, gv.x);
        reduce_add(v, k, zv.y, gv.y);
        reduce_add(v, k, zv.z, gv.z);
        reduce_add(v, k, zv.w, gv.w);
      }
      done = true;
    }
  }
  if (!done) {
    for (int i = lo + threadIdx.x; i < hi; i += blockDim.x) {
      reduce_add(v, k, static_cast<double>(z[i]), dy != nullptr ? static_cast<double>(masked_grad(dy, y, i)) : 0.0);
    }
  }
  block_sum(v, reinterpret_cast<double*>(dynamic_smem()));
  if (threadIdx.x == 0) {
    const double count = hi - lo, dm = v[0] / count;  // the chunk's mean less k
    const int64_t slot = static_cast<int64_t>(n) * gridDim.x + blockIdx.x;
    double* r = reinterpret_cast<double*>(p.partial) + (slot * p.c + c) * p.rec;
    r[0] = count;
    r[1] = k * count + v[0];
    r[2] = fmax(v[1] - v[0] * dm, 0.0);
    if (p.rec == 5) {
      r[3] = v[2];
      r[4] = v[3] - dm * v[2];
    }
  }
}

// Merges Moments over a block, in a fixed order, into every thread. scratch
// holds 32*3 doubles (of the 32*4 bn_reduce and bn_finalize are given).
__device__ __forceinline__ Moments block_merge(Moments mo, double* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  for (int off = 1; off < 32; off *= 2) {
    Moments o;
    o.n = __shfl_xor_sync(0xffffffffu, mo.n, off);
    o.mean = __shfl_xor_sync(0xffffffffu, mo.mean, off);
    o.m2 = __shfl_xor_sync(0xffffffffu, mo.m2, off);
    // Both partners merge (lower lane, higher lane), so they agree bit for bit.
    mo = (lane & off) != 0 ? merge(o, mo) : merge(mo, o);
  }
  if (lane == 0) {
    scratch[warp * 3] = mo.n;
    scratch[warp * 3 + 1] = mo.mean;
    scratch[warp * 3 + 2] = mo.m2;
  }
  __syncthreads();
  Moments all{0.0, 0.0, 0.0};
  for (int w = 0; w < warps; ++w) all = merge(all, Moments{scratch[w * 3], scratch[w * 3 + 1], scratch[w * 3 + 2]});
  __syncthreads();
  return all;
}

// One block per channel. Forward (dgamma == 0) leaves coef = {center, scale,
// shift}; backward leaves coef = {mean, istd, gamma*istd, mean g, mean
// g*xhat} and writes dgamma, dbeta. Every expression follows
// BatchNormForward and BatchNormBackward in kernels/batchnorm.go.
template <typename T>
__device__ __forceinline__ void bn_finalize(const BNParams& p) {
  const int c = blockIdx.x;
  const bool backward = p.dgamma != 0;
  double* scratch = reinterpret_cast<double*>(dynamic_smem());
  const double* part = reinterpret_cast<const double*>(p.partial);
  const T gamma = reinterpret_cast<const T*>(p.gamma)[c];
  const double m = static_cast<double>(p.n) * p.hw;

  Moments mo{0.0, 0.0, 0.0};
  if (part != nullptr) {
    for (int s = threadIdx.x; s < p.slots; s += blockDim.x) {
      const double* r = part + (static_cast<int64_t>(s) * p.c + c) * p.rec;
      if (r[0] > 0) mo = merge(mo, Moments{r[0], r[1] / r[0], r[2]});
    }
    mo = block_merge(mo, scratch);
  }
  T mu, var = T(0), istd;
  if (p.training) {
    mu = static_cast<T>(mo.mean);
    var = static_cast<T>(mo.m2 / m);
    istd = inv_std(var, p.eps);
  } else {
    mu = reinterpret_cast<const T*>(p.run_mean)[c];
    istd = inv_std(reinterpret_cast<const T*>(p.run_var)[c], p.eps);
  }
  T* coef = reinterpret_cast<T*>(p.coef) + static_cast<int64_t>(c) * kCoefStride;

  if (backward) {
    // sum g and sum g*(z - mu): each record's is about its own mean; move
    // it to mu (sum g*(z-mu) = sum g*(z-mean_s) + (mean_s-mu)*sum g).
    const double center = static_cast<double>(mu);
    double v[2] = {0.0, 0.0};
    for (int s = threadIdx.x; s < p.slots; s += blockDim.x) {
      const double* r = part + (static_cast<int64_t>(s) * p.c + c) * p.rec;
      if (r[0] > 0) {
        v[0] += r[3];
        v[1] += r[4] + (r[1] / r[0] - center) * r[3];
      }
    }
    block_sum(v, scratch);
    if (threadIdx.x == 0) {
      const double sgx = v[1] * static_cast<double>(istd);
      reinterpret_cast<T*>(p.dbeta)[c] = static_cast<T>(v[0]);
      reinterpret_cast<T*>(p.dgamma)[c] = static_cast<T>(sgx);
      coef[0] = mu;
      coef[1] = istd;
      coef[2] = gamma * istd;
      coef[3] = static_cast<T>(v[0] / m);
      coef[4] = static_cast<T>(sgx / m);
      for (int k = 5; k < kCoefStride; ++k) coef[k] = T(0);  // as the CPU twin leaves them
    }
    return;
  }
  if (threadIdx.x != 0) return;
  const T beta = reinterpret_cast<const T*>(p.beta)[c];
  if (p.training) {
    coef[0] = mu;
    coef[1] = gamma * istd;
    coef[2] = beta;
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
    const T scale = gamma * istd;
    coef[0] = T(0);
    coef[1] = scale;
    coef[2] = beta - mu * scale;
  }
}

// y = act((z - center)*scale + shift + residual), as the CPU twin's affine.
template <typename T>
__device__ __forceinline__ T bn_affine(T z, T center, T scale, T shift, const T* res, int64_t i, bool relu) {
  T v = (z - center) * scale + shift;
  if (res != nullptr) v += res[i];
  if (relu && v < T(0)) v = T(0);
  return v;
}

// Grid (N*C, blocks per plane): block (row, k) walks plane row = n*C + c
// from element k*blockDim.x with a stride of the plane's blocks.
template <typename T>
__device__ __forceinline__ void bn_apply(const BNParams& p) {
  const int64_t row = blockIdx.x;
  const int c = static_cast<int>(row % p.c);
  const T* cf = reinterpret_cast<const T*>(p.coef) + static_cast<int64_t>(c) * kCoefStride;
  const T center = cf[0], scale = cf[1], shift = cf[2];
  const int64_t off = row * p.hw;
  const T* __restrict__ z = reinterpret_cast<const T*>(p.z) + off;
  const T* __restrict__ res = p.residual != 0 ? reinterpret_cast<const T*>(p.residual) + off : nullptr;
  T* __restrict__ out = reinterpret_cast<T*>(p.out) + off;
  const bool relu = p.relu != 0;
  for (int i = blockIdx.y * blockDim.x + threadIdx.x; i < p.hw; i += gridDim.y * blockDim.x) {
    out[i] = bn_affine(z[i], center, scale, shift, res, i, relu);
  }
}

// bn_apply four elements at a time, for float planes of a multiple of 4
// elements (16-byte aligned: the allocator's blocks are).
__device__ __forceinline__ void bn_apply_x4(const BNParams& p) {
  const int64_t row = blockIdx.x;
  const int c = static_cast<int>(row % p.c);
  const float* cf = reinterpret_cast<const float*>(p.coef) + static_cast<int64_t>(c) * kCoefStride;
  const float center = cf[0], scale = cf[1], shift = cf[2];
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
    float4 o;
    o.x = bn_affine<float>(zv.x, center, scale, shift, nullptr, 0, false);
    o.y = bn_affine<float>(zv.y, center, scale, shift, nullptr, 0, false);
    o.z = bn_affine<float>(zv.z, center, scale, shift, nullptr, 0, false);
    o.w = bn_affine<float>(zv.w, center, scale, shift, nullptr, 0, false);
    if (res != nullptr) {
      o.x += r.x;
      o.y += r.y;
      o.z += r.z;
      o.w += r.w;
    }
    if (relu) {
      if (o.x < 0.0f) o.x = 0.0f;
      if (o.y < 0.0f) o.y = 0.0f;
      if (o.z < 0.0f) o.z = 0.0f;
      if (o.w < 0.0f) o.w = 0.0f;
    }
    out[i] = o;
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

// dz, rounded to TF32 when kRound.
template <typename T, bool kRound>
__device__ __forceinline__ void bn_backward_apply(const BNParams& p) {
  const int64_t row = blockIdx.x;
  const int c = static_cast<int>(row % p.c);
  const T* q = reinterpret_cast<const T*>(p.coef) + static_cast<int64_t>(c) * kCoefStride;
  const T cf[5] = {q[0], q[1], q[2], q[3], q[4]};
  const int64_t off = row * p.hw;
  const T* __restrict__ z = reinterpret_cast<const T*>(p.z) + off;
  const T* __restrict__ dy = reinterpret_cast<const T*>(p.dy) + off;
  const T* __restrict__ y = p.y != 0 ? reinterpret_cast<const T*>(p.y) + off : nullptr;
  T* __restrict__ out = reinterpret_cast<T*>(p.out) + off;
  const bool training = p.training != 0;
  for (int i = blockIdx.y * blockDim.x + threadIdx.x; i < p.hw; i += gridDim.y * blockDim.x) {
    out[i] = gemm_operand<kRound>(bn_dz(masked_grad(dy, y, i), z[i], cf, training));
  }
}

// bn_backward_apply four elements at a time (float planes of a multiple of
// 4 elements, 16-byte aligned), with the same arithmetic per element.
template <bool kRound>
__device__ __forceinline__ void bn_backward_apply_x4(const BNParams& p) {
  const int64_t row = blockIdx.x;
  const int c = static_cast<int>(row % p.c);
  const float* q = reinterpret_cast<const float*>(p.coef) + static_cast<int64_t>(c) * kCoefStride;
  const float cf[5] = {q[0], q[1], q[2], q[3], q[4]};
  const int64_t off = row * p.hw;
  const float4* __restrict__ z = reinterpret_cast<const float4*>(reinterpret_cast<const float*>(p.z) + off);
  const float4* __restrict__ dy = reinterpret_cast<const float4*>(reinterpret_cast<const float*>(p.dy) + off);
  const float4* __restrict__ y =
      p.y != 0 ? reinterpret_cast<const float4*>(reinterpret_cast<const float*>(p.y) + off) : nullptr;
  float4* __restrict__ out = reinterpret_cast<float4*>(reinterpret_cast<float*>(p.out) + off);
  const bool training = p.training != 0;
  const int n4 = p.hw / 4;
  for (int i = blockIdx.y * blockDim.x + threadIdx.x; i < n4; i += gridDim.y * blockDim.x) {
    const float4 zv = z[i], dv = dy[i];
    float g[4] = {dv.x, dv.y, dv.z, dv.w};
    if (y != nullptr) {
      const float4 yv = y[i];
      const float ys[4] = {yv.x, yv.y, yv.z, yv.w};
#pragma unroll
      for (int e = 0; e < 4; ++e) g[e] = !(ys[e] > 0.0f) ? 0.0f : g[e];
    }
    const float zs[4] = {zv.x, zv.y, zv.z, zv.w};
    float o[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) o[e] = gemm_operand<kRound>(bn_dz<float>(g[e], zs[e], cf, training));
    out[i] = make_float4(o[0], o[1], o[2], o[3]);
  }
}

// dx = dy where y > 0, else 0 (kernels.MaskReLU).
struct MaskParams {
  uint64_t y, dy, dx;
  int64_t n;
};
static_assert(sizeof(MaskParams) == 32, "ops/batchnorm_device.go mirrors MaskParams");

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
static_assert(sizeof(MaskSumParams) == 48, "ops/conv_device.go mirrors MaskSumParams");

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
__device__ __forceinline__ void relu_mask_sum_x4(const MaskSumParams& p) {
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
__global__ void bn_finalize_f32(stheno::BNParams p) { stheno::bn_finalize<float>(p); }
__global__ void bn_finalize_f64(stheno::BNParams p) { stheno::bn_finalize<double>(p); }
__global__ void bn_apply_f32(stheno::BNParams p) { stheno::bn_apply<float>(p); }
__global__ void bn_apply_f32x4(stheno::BNParams p) { stheno::bn_apply_x4(p); }
__global__ void bn_apply_f64(stheno::BNParams p) { stheno::bn_apply<double>(p); }
__global__ void bn_backward_apply_f32(stheno::BNParams p) { stheno::bn_backward_apply<float, false>(p); }
__global__ void bn_backward_apply_f64(stheno::BNParams p) { stheno::bn_backward_apply<double, false>(p); }
__global__ void bn_backward_apply_f32x4(stheno::BNParams p) { stheno::bn_backward_apply_x4<false>(p); }
__global__ void bn_backward_apply_tf32_f32(stheno::BNParams p) { stheno::bn_backward_apply<float, true>(p); }
__global__ void bn_backward_apply_tf32_f32x4(stheno::BNParams p) { stheno::bn_backward_apply_x4<true>(p); }
__global__ void relu_mask_f32(stheno::MaskParams p) { stheno::relu_mask<float>(p); }
__global__ void relu_mask_f64(stheno::MaskParams p) { stheno::relu_mask<double>(p); }
__global__ void relu_mask_tf32_f32(stheno::MaskSumParams p) { stheno::relu_mask_sum<float, true>(p); }
__global__ void relu_mask_tf32_f32x4(stheno::MaskSumParams p) { stheno::relu_mask_sum_x4<true>(p); }
__global__ void relu_mask_sum_f64(stheno::MaskSumParams p) { stheno::relu_mask_sum<double, false>(p); }
}
