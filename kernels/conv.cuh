// What the convolution (conv.cu) and BatchNorm (conv_bn.cu) kernels share:
// their params structs, fast division by run-time constants, the TF32
// tensor-core instruction, and deterministic warp and block reductions.
//
// STHENO_EMULATE builds the kernels as plain C++ for a host emulator that
// runs each CUDA thread as a fiber (used while developing without a
// GPU); nvcc never defines it, and every intrinsic the emulator replaces is
// wrapped here, so conv.cu and conv_bn.cu hold no #ifdef of their own.
#pragma once

#include <stdint.h>

#include "params_gen.cuh"

namespace stheno {

// FastDiv divides a non-negative int below 2^31 by a divisor d >= 1 fixed
// at launch with a multiply-high and a shift (Granlund and Montgomery; the
// scheme of CUTLASS's FastDivmod): the implicit im2col divides every index
// by the kernel and image sizes, and a plain int division costs ~20
// instructions. With l = ceil(log2 d), mul = ceil(2^(31+l)/d) < 2^32 and
// shr = l-1, q = umulhi(n, mul) >> shr is exact for every n < 2^31 (the
// rounding error of mul adds less than 1/d to n/d). d == 1 has mul == 0.
// ops.fastDiv computes the constants; ops' TestConvFastDiv checks them.
struct FastDiv {
  int32_t d;
  uint32_t mul;
  uint32_t shr;
  int32_t unused;
};
STHENO_PARAMS(FastDiv);

__device__ __forceinline__ int fdiv(int n, const FastDiv& f) {
  return f.mul == 0 ? n : static_cast<int>(__umulhi(static_cast<uint32_t>(n), f.mul) >> f.shr);
}

// Implicit-GEMM convolution launch parameters (conv.cu, conv_sm90a.cu). The
// geometry is kernels.ConvParams; the GEMM the launch runs is described
// after it.
struct ConvGemmParams {
  uint64_t a;          // fprop: w [Cout,K]; dgrad: w transposed [Cin, Cout*KH*KW]; wgrad: dy [N,Cout,P]
  uint64_t b;          // fprop, wgrad: x [N,Cin,H,W]; dgrad: dy [N,Cout,OutH,OutW]
  uint64_t mask;       // y whose ReLU masks dy (dgrad: B; wgrad: A), or 0
  uint64_t out;        // fprop: y; dgrad: dx; wgrad: dw, or split-K workspace [splits,Cout,K]
  uint64_t scale;      // fprop epilogue: per output channel scale, or 0 (1)
  uint64_t shift;      // fprop epilogue: per output channel shift (the bias), or 0
  uint64_t residual;   // fprop epilogue: added before the ReLU, like y, or 0
  uint64_t stats;      // fprop: {count, sum, M2} doubles per (column tile, channel), or 0
  uint64_t bias_grad;  // wgrad: per (split, Cout) sums of the masked dy, or 0
  int32_t n, cin, h, w;
  int32_t cout, kh, kw;
  int32_t stride_h, stride_w, pad_h, pad_w, dil_h, dil_w;
  int32_t out_h, out_w;
  int32_t relu;        // fprop epilogue
  int32_t m, ncols, k; // the GEMM: out (m x ncols) = A (m x k) * B (k x ncols)
  int32_t tiles_m;     // tiles along m: blockIdx.x = tile_n*tiles_m + tile_m
  int32_t k_tiles_per_split;  // blockIdx.z is the split
  int32_t unused;
  FastDiv div_kk;   // KH*KW
  FastDiv div_kw;   // KW
  FastDiv div_img;  // pixels per image of the columns: fprop OutH*OutW, dgrad H*W
  FastDiv div_row;  // their row length: fprop OutW, dgrad W
  FastDiv div_q;    // wgrad: OutH*OutW, the reduction runs over (n, output pixel)
  FastDiv div_qw;   // wgrad: OutW
  FastDiv div_sh;   // dgrad with stride: StrideH
  FastDiv div_sw;   // dgrad with stride: StrideW
};
STHENO_PARAMS(ConvGemmParams);

// BatchNorm launch parameters (conv_bn.cu), one struct for its kernels.
struct BNParams {
  uint64_t z;            // [N,C,HW], the convolution's output
  uint64_t dy;           // backward: the output's gradient, or 0 (forward)
  uint64_t fcoef;        // backward: the forward's constants, for the ReLU's mask of dy
  uint64_t residual;     // added before the ReLU (forward apply; backward mask), or 0
  uint64_t out;          // apply: y (forward) or dz (backward)
  uint64_t partial;      // per (slot, channel) records of `rec` doubles
  uint64_t gamma, beta;  // [C]
  uint64_t run_mean, run_var;  // [C]: read in inference; updated in training when non-zero
  uint64_t batch_stats;  // finalize, training: [2C] batch mean, biased variance, or 0
  uint64_t coef;         // finalize out, apply in: kCoefStride T per channel
  uint64_t dgamma, dbeta;  // backward finalize: [C]
  double eps, momentum;
  int32_t n, c, hw;
  int32_t slots;         // records per channel in partial
  int32_t rec;           // doubles per record: 3 (count, sum, M2) or, backward, 2 (sum g, sum g*(z-mean))
  int32_t chunk;         // reduce: elements of a plane per block
  int32_t training, relu;
};
STHENO_PARAMS(BNParams);

// stheno:const BNCoefStride
// Per-channel constants that bn_finalize hands to the apply kernels.
constexpr int kCoefStride = 8;

// stheno:const BNStatsRecord
// Doubles per record of the forward's statistics, {count, sum, M2}: conv.cu's
// epilogue writes one per (column tile, channel), bn_reduce one per (chunk,
// channel), and bn_finalize merges them (BNParams::rec).
constexpr int kStatsRecord = 3;

// stheno:const BNGradRecord
// Doubles per record of the backward's sums, {sum g, sum g*(z - mean)}, that
// bn_grad_reduce writes and bn_finalize reads (BNParams::rec).
constexpr int kGradRecord = 2;

// Bit casts that the emulator provides itself.
#ifndef STHENO_EMULATE
__device__ __forceinline__ float bits_to_float(uint32_t u) { return __uint_as_float(u); }
__device__ __forceinline__ uint32_t float_to_bits(float f) { return __float_as_uint(f); }
#endif

// x rounded to TF32 (10-bit mantissa, to nearest, ties away from zero), as
// the bit pattern the tensor cores read. The MMA itself would truncate the
// low 13 bits: rounding halves the error and removes its bias toward zero,
// which would otherwise accumulate over long reductions.
__device__ __forceinline__ uint32_t to_tf32(float x) {
#ifdef STHENO_EMULATE
  return emu_to_tf32(x);
#else
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
  return r;
#endif
}

// x rounded to TF32 as the tensor cores read it: the MMA truncates its
// operands to TF32, so adding half a TF32 ulp to the magnitude (ties away
// from zero) and leaving the low bits for the MMA to drop gives it exactly
// to_tf32(x), in two instructions instead of three: there is no single
// instruction for cvt.rna.tf32 on sm_80/sm_90, and ptxas expands it to an
// Inf/NaN test, this add and a mask. Inf and NaN are left as they are (an
// add could carry a NaN's mantissa into its sign). CUTLASS's
// round_half_ulp_truncate.
__device__ __forceinline__ uint32_t to_tf32_for_mma(float x) {
  uint32_t u = float_to_bits(x);
  if (fabsf(x) < INFINITY) u += 0x1000u;
  return u;
}

// d += a*b on the tensor cores for one warp: A 16x8 (row), B 8x8 (col), TF32
// operands, FP32 accumulation. Fragments as the PTX ISA lays them out, with
// g = lane/4 and t = lane%4: a = {A[g][t], A[g+8][t], A[g][t+4], A[g+8][t+4]},
// b = {B[t][g], B[t+4][g]}, d = {D[g][2t], D[g][2t+1], D[g+8][2t], D[g+8][2t+1]}.
__device__ __forceinline__ void mma_tf32(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#ifdef STHENO_EMULATE
  emu_mma_tf32(d, a, b);
#else
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

// Asynchronous copies from global to shared memory (sm_80 cp.async): the
// data goes to shared memory without passing through registers, so a
// pipeline of several stages costs no staging registers. src_bytes below
// the copy's size fills the rest with zeros: 0 zero-fills the whole
// destination and reads nothing, which is how the gathers pad outside the
// image. A thread's copies are grouped by cp_async_commit; cp_async_wait<N>
// waits until at most N of its groups are still in flight (its own copies
// only: a barrier must follow before other threads read them).
__device__ __forceinline__ void cp_async4(void* smem_dst, const void* src, int src_bytes) {
#ifdef STHENO_EMULATE
  emu_cp_async(smem_dst, src, 4, src_bytes);
#else
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(d), "l"(src), "r"(src_bytes) : "memory");
#endif
}

// 16 bytes, both addresses 16-byte aligned; .cg: through L2 only.
__device__ __forceinline__ void cp_async16(void* smem_dst, const void* src, int src_bytes) {
#ifdef STHENO_EMULATE
  emu_cp_async(smem_dst, src, 16, src_bytes);
#else
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(src_bytes) : "memory");
#endif
}

__device__ __forceinline__ void cp_async_commit() {
#ifdef STHENO_EMULATE
  emu_cp_async_commit();
#else
  asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}

template <int N>
__device__ __forceinline__ void cp_async_wait() {
#ifdef STHENO_EMULATE
  emu_cp_async_wait(N);
#else
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
#endif
}

// ldmatrix .x4 of 32-bit elements: lanes 8j..8j+7 give the addresses of the
// 16-byte rows of matrix j (8 rows of 4 words); lane l receives word l%4 of
// row l/4 of matrix j in r[j]. For an m16k8 TF32 A fragment at As[m][k],
// matrices (rows 0-7, k 0-3), (8-15, 0-3), (0-7, 4-7), (8-15, 4-7) give
// exactly mma_tf32's a[0..3]: one instruction instead of four loads.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* smem_row) {
#ifdef STHENO_EMULATE
  emu_ldmatrix_x4(r, smem_row);
#else
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(smem_row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
#endif
}

// The block's dynamic shared memory, 16-byte aligned.
__device__ __forceinline__ unsigned char* dynamic_smem() {
#ifdef STHENO_EMULATE
  return emu_smem();
#else
  extern __shared__ __align__(16) unsigned char stheno_conv_smem[];
  return stheno_conv_smem;
#endif
}

// Sums over the lanes of a warp whose lane index differs only in the bits
// below `width` (a power of two up to 32): a butterfly, so every lane gets
// the same sum, added in the same order on every run.
template <typename V>
__device__ __forceinline__ V group_sum(V v, int width) {
  for (int off = width / 2; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

template <typename V>
__device__ __forceinline__ V warp_sum(V v) {
  return group_sum(v, 32);
}

// Sums kN values over a block of blockDim.x threads (a multiple of 32, at
// most 1024) in a fixed order; every thread gets the sums. scratch holds
// 32*kN doubles of shared memory; the call ends with a barrier, so scratch
// may be reused right after.
template <int kN>
__device__ __forceinline__ void block_sum(double (&v)[kN], double* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
#pragma unroll
  for (int i = 0; i < kN; ++i) v[i] = warp_sum(v[i]);
  if (lane == 0) {
#pragma unroll
    for (int i = 0; i < kN; ++i) scratch[warp * kN + i] = v[i];
  }
  __syncthreads();
#pragma unroll
  for (int i = 0; i < kN; ++i) v[i] = lane < warps ? scratch[lane * kN + i] : 0.0;
#pragma unroll
  for (int i = 0; i < kN; ++i) v[i] = warp_sum(v[i]);
  __syncthreads();
}

}  // namespace stheno
