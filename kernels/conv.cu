// Convolution forward (with its fused epilogue), data gradient and weight
// gradient as implicit GEMMs: the CUDA twins of kernels/conv.go. As there,
// with K = Cin*KH*KW, P = OutH*OutW and dy' = dy masked by y > 0 when the
// layer ends in a ReLU:
//
//	fprop: y  (Cout x N*P)   = w (Cout x K)          * col(x) (K x N*P), then bias/scale, residual, ReLU
//	dgrad: dx (Cin x N*H*W)  = w^T (Cin x Cout*KH*KW) * dy' gathered back onto input pixels
//	wgrad: dw (Cout x K)     = dy' (Cout x N*P)       * col(x)^T (N*P x K), + dbias = row sums of dy'
//
// No im2col matrix is ever built: each block gathers its tiles of col(x) (or
// of dy') straight from the NCHW tensors, zero outside the image, and the
// ReLU mask of dy is applied as the tile is staged, not in a pass of its
// own.
//
// One kernel template serves the three GEMMs. A block computes a BM x BN
// tile of the output over a range of BK-deep k-tiles (all of them, or one
// split of them for the skinny wgrad GEMM, whose partial tiles a second
// kernel sums in a fixed order). The main loop is double-buffered through
// registers: the global loads of k-tile t+1 are issued before the math of
// k-tile t and stored to the other shared-memory stage after it, so their
// latency hides behind the math, with one barrier per k-tile. float32 runs
// on the tensor cores in TF32 (operands rounded once, as they are staged;
// FP32 accumulation), or, for a Device whose GemmMath is GemmExact, on the
// CUDA cores in full float32 (fused multiply-adds, nothing rounded to TF32);
// float64, used for gradient checks, on the CUDA cores.
//
// The float32 GEMMs have faster kernels of their own, conv_pipe: cp.async
// pipelines that compute the same results; the conv_gemm kernels stay for
// comparison, for strided dgrad and for tensors too large for conv_pipe's
// 32-bit offsets. On Hopper, conv_sm90a.cu's kernels run conv_pipe's loads
// and epilogue with warpgroup MMAs instead of mma.sync.
//
// The kernels are named conv_<pass>_<math>_m<rows>_<loads>[_t<threads>]_<dtype>:
// math mma (TF32 mma.sync), wgmma (Hopper's warpgroup MMA) or fma (the
// CUDA cores, in the dtype itself); m<rows> the output channels of a
// block's tile (its pixels are 128 in float32, 64 in float64); loads i64 (conv_gemm: registers
// double-buffer the loads, offsets in 64 bits) or s<N> (an N-stage cp.async
// ring, offsets in 32 bits); t<threads> when a block is not 256 threads.
//
// The epilogue stages the accumulator tile in shared memory and writes it
// out row by row, 32 consecutive pixels per warp instruction, applying the
// bias (or a BatchNorm scale and shift), the residual and the ReLU in
// registers. For a ConvBN layer in training it also reduces each channel's
// count, sum and M2 over the tile's pixels (deterministically, in registers
// and warp shuffles), so that BatchNorm needs no pass of its own over the
// output to find the batch statistics.
#include "conv.cuh"

namespace stheno {

enum ConvMode : int { kFprop = 0, kDgrad = 1, kWgrad = 2 };

// How a conv_gemm kernel multiplies: TF32 MMAs on the tensor cores (float32
// only, each operand rounded to TF32 once, as it is staged), or fused
// multiply-adds on the CUDA cores in the dtype itself (float64, and float32
// in full precision).
enum ConvMath : int { kMma = 0, kFma = 1 };

// The math of a dtype's conv_gemm kernels unless one says otherwise.
template <typename T>
inline constexpr int kDefaultMath = sizeof(T) == 4 ? kMma : kFma;

// stheno:const ConvFarIndex
// An index far enough outside any image that a row or column marked with it
// fails every bounds check, whatever tap offset is added.
constexpr int kFar = 1 << 29;

template <typename T, int kMath>
struct ConvTile;

// float32 on the tensor cores: 8 warps of 64x32 (4x4 MMAs of 16x8x8 per
// k-step of 8). Shared-memory rows are padded so that every fragment load
// and every staging store is free of bank conflicts: A and n-major B rows by
// 4 words (lanes g, t of a fragment hit banks 4g+t), k-major B rows by 8
// (banks 8t+g), C rows by 8 (64-bit stores by half-warps).
template <>
struct ConvTile<float, kMma> {
  static constexpr int kBM = 128, kBN = 128, kBK = 32, kThreads = 256;
  static constexpr int kWarpsM = 2, kWarpsN = 4;
  static constexpr int kPadA = 4, kPadB = 8, kPadC = 8;
};

// float64 on the CUDA cores: 16x16 threads of 4x4 outputs.
template <>
struct ConvTile<double, kFma> {
  static constexpr int kBM = 64, kBN = 64, kBK = 16, kThreads = 256;
  static constexpr int kPadA = 1, kPadB = 1, kPadC = 1;
};

// float32 in full precision on the CUDA cores: 16x16 threads of 4x8
// outputs. The tile is 128 pixels wide and its k-tiles 32 deep, as every
// float32 kernel's: a ConvBN layer's statistics hold one record per column
// tile of ConvF32TileN pixels whichever kernel ran its forward. Rows padded
// by a word as float64's: the fragment reads of A (two rows per warp) and
// of n-major B (16 rows) fall in distinct banks.
template <>
struct ConvTile<float, kFma> {
  static constexpr int kBM = 64, kBN = 128, kBK = 32, kThreads = 256;
  static constexpr int kPadA = 1, kPadB = 1, kPadC = 1;
};

// Tile geometry and shared-memory layout of one GEMM. A is staged m-major
// (As[m][k]); B k-major (Bs[k][n]) when its gather runs along output pixels
// (fprop, dgrad) and n-major (Bt[n][k]) when it runs along the reduction
// (wgrad), so that consecutive lanes always stage consecutive addresses.
template <typename T, int kMode, int kMath = kDefaultMath<T>>
struct GemmShape {
  using Cfg = ConvTile<T, kMath>;
  static constexpr int BM = Cfg::kBM, BN = Cfg::kBN, BK = Cfg::kBK, NT = Cfg::kThreads;
  static constexpr bool kNMajorB = kMode == kWgrad;
  static constexpr int LDA = BK + Cfg::kPadA;
  static constexpr int LDB = kNMajorB ? BK + Cfg::kPadA : BN + Cfg::kPadB;
  static constexpr int LDC = BN + Cfg::kPadC;
  static constexpr int kAElems = BM * LDA;
  static constexpr int kBElems = kNMajorB ? BN * LDB : BK * LDB;
  static constexpr int kPipeBytes = 2 * (kAElems + kBElems) * static_cast<int>(sizeof(T));
  static constexpr int kCBytes = BM * LDC * static_cast<int>(sizeof(T));
  static constexpr int kMainBytes = ((kPipeBytes > kCBytes ? kPipeBytes : kCBytes) + 15) / 16 * 16;
  // wgrad keeps a table of its BN columns' taps after the main area.
  static constexpr int kSmemBytes = kMainBytes + (kNMajorB ? BN * 16 : 0);

  // A staging: lanes along k (tid % BK), rows tid/BK + kARows*i.
  static constexpr int kARows = NT / BK;
  static constexpr int kAPer = BM / kARows;
  // k-major B staging: lanes along n (32 per warp), k rows warp + kBRows*a.
  static constexpr int kBRows = NT / 32;
  static constexpr int kBKPer = BK / kBRows;
  static constexpr int kBNPer = BN / 32;
  // n-major B staging: lanes along k (tid % BK), n rows tid/BK + kBTRows*a.
  static constexpr int kBTRows = NT / BK;
  static constexpr int kBTPer = BN / kBTRows;

  static_assert(NT % BK == 0 && BK <= 32 && (BK & (BK - 1)) == 0, "A lanes run along k within a warp");
  static_assert(BM % kARows == 0 && BK % kBRows == 0 && BN % 32 == 0 && BN % kBTRows == 0, "tile");
};

// What a launch of the conv_gemm kernels needs, for kernels/cuda: the
// shared memory of conv_<pass>_mma_m128_i64_f32, conv_<pass>_fma_m64_i64_f32
// and conv_<pass>_fma_m64_i64_f64, their block tiles and threads. Every
// float32 kernel's tile is ConvF32TileN pixels wide and its k-tiles
// ConvF32TileK deep (conv_pipe's, conv_sm90a.cu's and the fma ones
// included, which static_asserts pin), every float64 one's ConvF64TileN and
// ConvF64TileK.
// stheno:const ConvFpropMmaM128I64SmemBytes
static_assert(GemmShape<float, kFprop>::kSmemBytes == 71680, "kernels/cuda exports it");
// stheno:const ConvDgradMmaM128I64SmemBytes
static_assert(GemmShape<float, kDgrad>::kSmemBytes == 71680, "kernels/cuda exports it");
// stheno:const ConvWgradMmaM128I64SmemBytes
static_assert(GemmShape<float, kWgrad>::kSmemBytes == 75776, "kernels/cuda exports it");
// stheno:const ConvFpropFmaM64I64F32SmemBytes
static_assert(GemmShape<float, kFprop, kFma>::kSmemBytes == 49920, "kernels/cuda exports it");
// stheno:const ConvDgradFmaM64I64F32SmemBytes
static_assert(GemmShape<float, kDgrad, kFma>::kSmemBytes == 49920, "kernels/cuda exports it");
// stheno:const ConvWgradFmaM64I64F32SmemBytes
static_assert(GemmShape<float, kWgrad, kFma>::kSmemBytes == 52736, "kernels/cuda exports it");
// stheno:const ConvFpropFmaM64I64F64SmemBytes
static_assert(GemmShape<double, kFprop>::kSmemBytes == 34048, "kernels/cuda exports it");
// stheno:const ConvDgradFmaM64I64F64SmemBytes
static_assert(GemmShape<double, kDgrad>::kSmemBytes == 34048, "kernels/cuda exports it");
// stheno:const ConvWgradFmaM64I64F64SmemBytes
static_assert(GemmShape<double, kWgrad>::kSmemBytes == 35840, "kernels/cuda exports it");
// stheno:const ConvMmaM128I64TileM
static_assert(GemmShape<float, kFprop>::BM == 128, "kernels/cuda exports it");
// stheno:const ConvF32TileN
static_assert(GemmShape<float, kFprop>::BN == 128, "kernels/cuda exports it");
// stheno:const ConvF32TileK
static_assert(GemmShape<float, kFprop>::BK == 32, "kernels/cuda exports it");
// stheno:const ConvF32Threads
static_assert(GemmShape<float, kFprop>::NT == 256, "kernels/cuda exports it");
// stheno:const ConvFmaM64I64TileM
static_assert(GemmShape<double, kFprop>::BM == 64, "kernels/cuda exports it");
// stheno:const ConvF64TileN
static_assert(GemmShape<double, kFprop>::BN == 64, "kernels/cuda exports it");
// stheno:const ConvF64TileK
static_assert(GemmShape<double, kFprop>::BK == 16, "kernels/cuda exports it");
// stheno:const ConvF64Threads
static_assert(GemmShape<double, kFprop>::NT == 256, "kernels/cuda exports it");
static_assert(GemmShape<float, kFprop, kFma>::BM == GemmShape<double, kFprop>::BM &&
                  GemmShape<float, kFprop, kFma>::BN == GemmShape<float, kFprop>::BN &&
                  GemmShape<float, kFprop, kFma>::BK == GemmShape<float, kFprop>::BK &&
                  GemmShape<float, kFprop, kFma>::NT == GemmShape<float, kFprop>::NT,
              "fma_m64_i64_f32: ConvFmaM64I64TileM rows, ConvF32TileN, ConvF32TileK and ConvF32Threads");

// What the math reads from shared memory: for the tensor cores, float32
// rounded to TF32 once, as it is staged (every element is read by several
// warps); for the CUDA cores, the value as it is.
template <int kMath, typename T>
__device__ __forceinline__ T as_operand(T v) {
  if constexpr (kMath == kMma) {
    static_assert(sizeof(T) == 4, "TF32 MMAs are for float32");
    return bits_to_float(to_tf32(v));
  } else {
    return v;
  }
}

// ---------------------------------------------------------------------------
// Operand staging. Each loader has load(), which only issues global loads
// into registers, and store(), which applies the ReLU mask, rounds and writes
// the stage: between the two the block does the math of the previous stage.

// A, an m x k matrix read along k. fprop: w [Cout][K]; dgrad: the transposed
// weights [Cin][Cout*KH*KW]; wgrad: dy [N][Cout][P] as Cout x (N*P), masked,
// with its row sums (the bias gradient) gathered on the way.
template <typename T, int kMode, int kMath>
struct ALoader {
  using S = GemmShape<T, kMode, kMath>;
  T val[S::kAPer];
  T msk[kMode == kWgrad ? S::kAPer : 1];
  T bsum[kMode == kWgrad ? S::kAPer : 1];
  int kq, row, rows_left;
  int64_t base, step;

  __device__ __forceinline__ void init(const ConvGemmParams& p, int tid, int m0) {
    kq = tid % S::BK;
    row = tid / S::BK;
    rows_left = p.m - m0;
    const int64_t stride = kMode == kWgrad ? static_cast<int64_t>(p.out_h) * p.out_w : static_cast<int64_t>(p.k);
    base = static_cast<int64_t>(m0 + row) * stride;
    step = S::kARows * stride;
#pragma unroll
    for (int i = 0; i < (kMode == kWgrad ? S::kAPer : 1); ++i) bsum[i] = T(0);
  }

  __device__ __forceinline__ void load(const ConvGemmParams& p, int k0) {
    const int k = k0 + kq;
    const bool kv = k < p.k;
    int64_t col = k;
    if constexpr (kMode == kWgrad) {
      // Reduction index k = (n, output pixel).
      const int pix = p.out_h * p.out_w;
      const int n = fdiv(k, p.div_q);
      col = static_cast<int64_t>(n) * p.cout * pix + (k - n * pix);
    }
    const T* __restrict__ a = reinterpret_cast<const T*>(p.a);
    const T* __restrict__ mk = reinterpret_cast<const T*>(p.mask);
#pragma unroll
    for (int i = 0; i < S::kAPer; ++i) {
      const bool v = kv && row + S::kARows * i < rows_left;
      const int64_t off = base + i * step + col;
      val[i] = v ? a[off] : T(0);
      if constexpr (kMode == kWgrad) msk[i] = v && mk != nullptr ? mk[off] : T(0);
    }
  }

  __device__ __forceinline__ void store(T* sa, bool masked, bool sum_bias) {
#pragma unroll
    for (int i = 0; i < S::kAPer; ++i) {
      T v = val[i];
      if constexpr (kMode == kWgrad) {
        // PyTorch's threshold_backward: the gradient passes where y > 0
        // (written so that a NaN y blocks it, as the CPU twin's gate).
        if (masked && !(msk[i] > T(0))) v = T(0);
        if (sum_bias) bsum[i] += v;
      }
      sa[(row + S::kARows * i) * S::LDA + kq] = as_operand<kMath>(v);
    }
  }

  // Writes this block's bias-gradient partial sums: the threads that share
  // rows (the BK lanes of a k-tile) add theirs in a fixed order.
  __device__ __forceinline__ void flush_bias(const ConvGemmParams& p, int m0, int split) {
    T* out = reinterpret_cast<T*>(p.bias_grad) + static_cast<int64_t>(split) * p.m;
#pragma unroll
    for (int i = 0; i < (kMode == kWgrad ? S::kAPer : 1); ++i) {
      const T s = group_sum(bsum[i], S::BK);
      if (kq == 0 && row + S::kARows * i < rows_left) out[m0 + row + S::kARows * i] = s;
    }
  }
};

// B of fprop and dgrad, k-major, gathered along output pixels (fprop:
// col(x)[(ci,kh,kw)][(n,oh,ow)]) or input pixels (dgrad: the element of dy'
// that tap (co,kh,kw) carries to input pixel (n,ih,iw), zero where no output
// pixel does). A thread stages rows warp + kBRows*a and columns lane + 32*b;
// its columns are fixed, so their decomposition is done once.
template <typename T, int kMode, int kMath>
struct BLoaderK {
  using S = GemmShape<T, kMode, kMath>;
  T val[S::kBKPer][S::kBNPer];
  T msk[kMode == kDgrad ? S::kBKPer : 1][kMode == kDgrad ? S::kBNPer : 1];
  int64_t cbase[S::kBNPer];
  int ch[S::kBNPer], cw[S::kBNPer];
  int lane, krow;

  __device__ __forceinline__ void init(const ConvGemmParams& p, int tid, int n0) {
    lane = tid & 31;
    krow = tid >> 5;
#pragma unroll
    for (int b = 0; b < S::kBNPer; ++b) {
      const int j = n0 + lane + 32 * b;
      cbase[b] = 0;
      ch[b] = -kFar;
      cw[b] = 0;
      if (j < p.ncols) {
        const int img = fdiv(j, p.div_img);
        const int pix = j - img * p.div_img.d;
        const int r = fdiv(pix, p.div_row);
        const int c = pix - r * p.div_row.d;
        if constexpr (kMode == kFprop) {
          cbase[b] = static_cast<int64_t>(img) * (p.cin * p.h * p.w);
          ch[b] = r * p.stride_h;  // plus kh*dil-pad: the input row tap (kh, .) meets
          cw[b] = c * p.stride_w;
        } else {
          cbase[b] = static_cast<int64_t>(img) * (p.cout * p.out_h * p.out_w);
          ch[b] = r + p.pad_h;  // minus kh*dil: oh*stride of the output pixel tap (kh, .) comes from
          cw[b] = c + p.pad_w;
        }
      }
    }
  }

  __device__ __forceinline__ void load(const ConvGemmParams& p, int k0, const int4*) {
    const T* __restrict__ src = reinterpret_cast<const T*>(p.b);
    const T* __restrict__ mk = reinterpret_cast<const T*>(p.mask);
    const int kk = p.kh * p.kw;
#pragma unroll
    for (int a = 0; a < S::kBKPer; ++a) {
      const int k = k0 + krow + S::kBRows * a;
      // Tap of reduction row k: (channel, kh, kw). A row past the end gets
      // a displacement of the same sign as a column past the end, so that
      // the two never cancel.
      int roff = 0, dh = kMode == kFprop ? -kFar : kFar, dw = 0;
      if (k < p.k) {
        const int ch0 = fdiv(k, p.div_kk);
        const int t = k - ch0 * kk;
        const int kh = fdiv(t, p.div_kw);
        const int kw = t - kh * p.kw;
        if constexpr (kMode == kFprop) {
          roff = ch0 * p.h * p.w;
          dh = kh * p.dil_h - p.pad_h;
          dw = kw * p.dil_w - p.pad_w;
        } else {
          roff = ch0 * p.out_h * p.out_w;
          dh = kh * p.dil_h;
          dw = kw * p.dil_w;
        }
      }
#pragma unroll
      for (int b = 0; b < S::kBNPer; ++b) {
        if constexpr (kMode == kFprop) {
          const int ih = ch[b] + dh, iw = cw[b] + dw;
          const bool ok = static_cast<unsigned>(ih) < static_cast<unsigned>(p.h) &&
                          static_cast<unsigned>(iw) < static_cast<unsigned>(p.w);
          val[a][b] = ok ? src[cbase[b] + roff + ih * p.w + iw] : T(0);
        } else {
          // Output pixel (oh, ow) reaches this input pixel through tap
          // (kh, kw) when oh*stride = ih + pad - kh*dil, likewise for w.
          int oh = ch[b] - dh, ow = cw[b] - dw;
          bool ok = true;
          if (p.stride_h != 1 || p.stride_w != 1) {
            ok = oh >= 0 && ow >= 0;
            const int qh = fdiv(ok ? oh : 0, p.div_sh), qw = fdiv(ok ? ow : 0, p.div_sw);
            ok = ok && qh * p.stride_h == oh && qw * p.stride_w == ow;
            oh = qh;
            ow = qw;
          }
          ok = ok && static_cast<unsigned>(oh) < static_cast<unsigned>(p.out_h) &&
               static_cast<unsigned>(ow) < static_cast<unsigned>(p.out_w);
          const int64_t off = cbase[b] + roff + oh * p.out_w + ow;
          val[a][b] = ok ? src[off] : T(0);
          msk[a][b] = ok && mk != nullptr ? mk[off] : T(0);
        }
      }
    }
  }

  __device__ __forceinline__ void store(T* sb, bool masked) {
#pragma unroll
    for (int a = 0; a < S::kBKPer; ++a) {
#pragma unroll
      for (int b = 0; b < S::kBNPer; ++b) {
        T v = val[a][b];
        if constexpr (kMode == kDgrad) {
          if (masked && !(msk[a][b] > T(0))) v = T(0);
        }
        sb[(krow + S::kBRows * a) * S::LDB + lane + 32 * b] = as_operand<kMath>(v);
      }
    }
  }
};

// B of wgrad, n-major: col(x)^T[(n,oh,ow)][(ci,kh,kw)], gathered along the
// reduction (output pixels, consecutive in x). The block's BN columns are
// taps whose channel offset and displacement sit in a table in shared
// memory, built once; a thread decomposes its one reduction index per
// k-tile.
template <typename T, int kMath>
struct BLoaderN {
  using S = GemmShape<T, kWgrad, kMath>;
  T val[S::kBTPer];
  int kq, nrow;

  __device__ __forceinline__ void init(const ConvGemmParams&, int tid, int) {
    kq = tid % S::BK;
    nrow = tid / S::BK;
  }

  // tab[c] = {channel offset, row displacement, column displacement, 0} of
  // column n0+c; columns past the end get a displacement that fails every
  // bounds check.
  __device__ __forceinline__ static void build_table(const ConvGemmParams& p, int n0, int4* tab) {
    for (int c = threadIdx.x; c < S::BN; c += S::NT) {
      const int col = n0 + c;
      int4 e = make_int4(0, -kFar, 0, 0);
      if (col < p.ncols) {
        const int ci = fdiv(col, p.div_kk);
        const int t = col - ci * (p.kh * p.kw);
        const int kh = fdiv(t, p.div_kw);
        const int kw = t - kh * p.kw;
        e = make_int4(ci * p.h * p.w, kh * p.dil_h - p.pad_h, kw * p.dil_w - p.pad_w, 0);
      }
      tab[c] = e;
    }
  }

  __device__ __forceinline__ void load(const ConvGemmParams& p, int k0, const int4* tab) {
    const T* __restrict__ x = reinterpret_cast<const T*>(p.b);
    const int q = k0 + kq;
    int64_t base = 0;
    int h0 = -kFar, w0 = 0;
    if (q < p.k) {
      const int pix = p.out_h * p.out_w;
      const int n = fdiv(q, p.div_q);
      const int r = q - n * pix;
      const int oh = fdiv(r, p.div_qw);
      base = static_cast<int64_t>(n) * (p.cin * p.h * p.w);
      h0 = oh * p.stride_h;
      w0 = (r - oh * p.out_w) * p.stride_w;
    }
#pragma unroll
    for (int a = 0; a < S::kBTPer; ++a) {
      const int4 e = tab[nrow + S::kBTRows * a];
      const int ih = h0 + e.y, iw = w0 + e.z;
      const bool ok = static_cast<unsigned>(ih) < static_cast<unsigned>(p.h) &&
                      static_cast<unsigned>(iw) < static_cast<unsigned>(p.w);
      val[a] = ok ? x[base + e.x + ih * p.w + iw] : T(0);
    }
  }

  __device__ __forceinline__ void store(T* sb, bool) {
#pragma unroll
    for (int a = 0; a < S::kBTPer; ++a) sb[(nrow + S::kBTRows * a) * S::LDB + kq] = as_operand<kMath>(val[a]);
  }
};

template <typename T, int kMode, int kMath>
struct BLoaderFor {
  using type = BLoaderK<T, kMode, kMath>;
};
template <typename T, int kMath>
struct BLoaderFor<T, kWgrad, kMath> {
  using type = BLoaderN<T, kMath>;
};

// ---------------------------------------------------------------------------
// The math of one stage, and the accumulators.

template <typename T, int kMode, int kMath = kDefaultMath<T>>
struct WarpMath;

template <int kMode>
struct WarpMath<float, kMode, kMma> {
  using S = GemmShape<float, kMode, kMma>;
  using Cfg = ConvTile<float, kMma>;
  static constexpr int kWM = S::BM / Cfg::kWarpsM, kWN = S::BN / Cfg::kWarpsN;
  static constexpr int kMI = kWM / 16, kNI = kWN / 8;
  static_assert(Cfg::kWarpsM * Cfg::kWarpsN * 32 == S::NT, "one warp per warp tile");
  float acc[kMI][kNI][4];
  int row0, col0, g, t4;

  __device__ __forceinline__ void init(int tid) {
    const int warp = tid >> 5, lane = tid & 31;
    row0 = (warp % Cfg::kWarpsM) * kWM;
    col0 = (warp / Cfg::kWarpsM) * kWN;
    g = lane >> 2;
    t4 = lane & 3;
#pragma unroll
    for (int mi = 0; mi < kMI; ++mi)
#pragma unroll
      for (int ni = 0; ni < kNI; ++ni)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[mi][ni][e] = 0.0f;
  }

  __device__ __forceinline__ void step(const float* sa, const float* sb) {
#pragma unroll
    for (int ks = 0; ks < S::BK; ks += 8) {
      uint32_t a[kMI][4], b[kNI][2];
#pragma unroll
      for (int mi = 0; mi < kMI; ++mi) {
        const float* q = sa + (row0 + mi * 16 + g) * S::LDA + ks + t4;
        a[mi][0] = float_to_bits(q[0]);
        a[mi][1] = float_to_bits(q[8 * S::LDA]);
        a[mi][2] = float_to_bits(q[4]);
        a[mi][3] = float_to_bits(q[8 * S::LDA + 4]);
      }
#pragma unroll
      for (int ni = 0; ni < kNI; ++ni) {
        if (S::kNMajorB) {
          const float* q = sb + (col0 + ni * 8 + g) * S::LDB + ks + t4;
          b[ni][0] = float_to_bits(q[0]);
          b[ni][1] = float_to_bits(q[4]);
        } else {
          const float* q = sb + (ks + t4) * S::LDB + col0 + ni * 8 + g;
          b[ni][0] = float_to_bits(q[0]);
          b[ni][1] = float_to_bits(q[4 * S::LDB]);
        }
      }
#pragma unroll
      for (int mi = 0; mi < kMI; ++mi)
#pragma unroll
        for (int ni = 0; ni < kNI; ++ni) mma_tf32(acc[mi][ni], a[mi], b[ni]);
    }
  }

  __device__ __forceinline__ void store(float* sc) const {
#pragma unroll
    for (int mi = 0; mi < kMI; ++mi)
#pragma unroll
      for (int ni = 0; ni < kNI; ++ni) {
        float* q = sc + (row0 + mi * 16 + g) * S::LDC + col0 + ni * 8 + 2 * t4;
        *reinterpret_cast<float2*>(q) = make_float2(acc[mi][ni][0], acc[mi][ni][1]);
        *reinterpret_cast<float2*>(q + 8 * S::LDC) = make_float2(acc[mi][ni][2], acc[mi][ni][3]);
      }
  }
};

// The CUDA cores, in T: 16x16 threads, thread (ty, tx) holding rows ty +
// 16i and columns tx + 16j of the tile (4x4 outputs in float64, 4x8 in
// float32), each output one chain of fused multiply-adds along k.
template <typename T, int kMode>
struct WarpMath<T, kMode, kFma> {
  using S = GemmShape<T, kMode, kFma>;
  static_assert(S::NT == 256 && S::BM % 16 == 0 && S::BN % 16 == 0, "16x16 threads");
  static constexpr int kTM = S::BM / 16, kTN = S::BN / 16;
  T acc[kTM][kTN];
  int ty, tx;

  __device__ __forceinline__ void init(int tid) {
    ty = tid / 16;
    tx = tid % 16;
#pragma unroll
    for (int i = 0; i < kTM; ++i)
#pragma unroll
      for (int j = 0; j < kTN; ++j) acc[i][j] = T(0);
  }

  __device__ __forceinline__ void step(const T* sa, const T* sb) {
#pragma unroll 4
    for (int k = 0; k < S::BK; ++k) {
      T a[kTM], b[kTN];
#pragma unroll
      for (int i = 0; i < kTM; ++i) a[i] = sa[(ty + 16 * i) * S::LDA + k];
#pragma unroll
      for (int j = 0; j < kTN; ++j) b[j] = S::kNMajorB ? sb[(tx + 16 * j) * S::LDB + k] : sb[k * S::LDB + tx + 16 * j];
#pragma unroll
      for (int i = 0; i < kTM; ++i)
#pragma unroll
        for (int j = 0; j < kTN; ++j) acc[i][j] = fma(a[i], b[j], acc[i][j]);
    }
  }

  __device__ __forceinline__ void store(T* sc) const {
#pragma unroll
    for (int i = 0; i < kTM; ++i)
#pragma unroll
      for (int j = 0; j < kTN; ++j) sc[(ty + 16 * i) * S::LDC + tx + 16 * j] = acc[i][j];
  }
};

// ---------------------------------------------------------------------------
// Epilogue: the C tile, staged in shared memory, leaves row by row. Warp w
// takes rows w, w+8, ...; lane l columns l, l+32, ...

// The tile S (BM, BN, NT threads, C rows of LDC) is conv_gemm's, or that
// of a conv_pipe kernel.
template <typename T, int kMode, typename S = GemmShape<T, kMode>>
__device__ __forceinline__ void epilogue(const ConvGemmParams& p, const T* sc, int m0, int n0, int tile_n, int split) {
  constexpr int kCols = S::BN / 32, kWarps = S::NT / 32;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  // Offset of column j's element of row 0, and the distance between rows.
  int64_t coff[kCols];
  bool cv[kCols];
  int64_t rstride;
  if constexpr (kMode == kWgrad) {
    rstride = p.ncols;
#pragma unroll
    for (int b = 0; b < kCols; ++b) {
      const int j = n0 + lane + 32 * b;
      cv[b] = j < p.ncols;
      coff[b] = static_cast<int64_t>(split) * p.m * p.ncols + j;
    }
  } else {
    // out [N][m][pixels]: column j is pixel j % pixels of image j / pixels.
    const int pixels = p.div_img.d;
    rstride = pixels;
#pragma unroll
    for (int b = 0; b < kCols; ++b) {
      const int j = n0 + lane + 32 * b;
      cv[b] = j < p.ncols;
      const int img = fdiv(cv[b] ? j : 0, p.div_img);
      coff[b] = static_cast<int64_t>(img) * p.m * pixels + (j - img * pixels);
    }
  }
  const int count = min(S::BN, p.ncols - n0);
  T* __restrict__ out = reinterpret_cast<T*>(p.out);
  const T* __restrict__ res = reinterpret_cast<const T*>(p.residual);
  const T* __restrict__ scale = reinterpret_cast<const T*>(p.scale);
  const T* __restrict__ shift = reinterpret_cast<const T*>(p.shift);
  for (int r = warp; r < S::BM; r += kWarps) {
    const int gm = m0 + r;
    if (gm >= p.m) break;
    T sc_r = T(1), sh_r = T(0);
    if constexpr (kMode == kFprop) {
      if (scale != nullptr) sc_r = scale[gm];
      if (shift != nullptr) sh_r = shift[gm];
    }
    T v[kCols];
    T sum = T(0);
#pragma unroll
    for (int b = 0; b < kCols; ++b) {
      v[b] = sc[r * S::LDC + lane + 32 * b];
      if (!cv[b]) continue;
      const int64_t off = coff[b] + gm * rstride;
      if constexpr (kMode == kFprop) {
        // The CPU twin's affine: (acc - 0)*scale + shift, + residual, ReLU.
        v[b] = scale != nullptr ? v[b] * sc_r + sh_r : v[b] + sh_r;
        if (res != nullptr) v[b] += res[off];
        if (p.relu && v[b] < T(0)) v[b] = T(0);
      }
      out[off] = v[b];
      sum += v[b];
    }
    if (kMode == kFprop && p.stats != 0) {
      // Count, sum and M2 about the tile's own mean (no cancellation: the
      // channel mean may be far from zero); bn_finalize merges the tiles.
      sum = warp_sum(sum);
      const T mean = sum / static_cast<T>(count);
      T m2 = T(0);
#pragma unroll
      for (int b = 0; b < kCols; ++b) {
        const T d = v[b] - mean;
        if (cv[b]) m2 += d * d;
      }
      m2 = warp_sum(m2);
      if (lane == 0) {
        double* st = reinterpret_cast<double*>(p.stats) + (static_cast<int64_t>(tile_n) * p.m + gm) * kStatsRecord;
        st[0] = count;
        st[1] = static_cast<double>(sum);
        st[2] = static_cast<double>(m2);
      }
    }
  }
}

// ---------------------------------------------------------------------------

template <typename T, int kMode, int kMath = kDefaultMath<T>>
__device__ __forceinline__ void conv_gemm(const ConvGemmParams& p) {
  using S = GemmShape<T, kMode, kMath>;
  unsigned char* smem = dynamic_smem();
  T* sa = reinterpret_cast<T*>(smem);
  T* sb = sa + 2 * S::kAElems;
  int4* tab = reinterpret_cast<int4*>(smem + S::kMainBytes);

  const int tid = threadIdx.x;
  const unsigned tiles_m = static_cast<unsigned>(p.tiles_m);
  const int tile_m = static_cast<int>(blockIdx.x % tiles_m);
  const int tile_n = static_cast<int>(blockIdx.x / tiles_m);
  const int m0 = tile_m * S::BM, n0 = tile_n * S::BN;
  const int split = blockIdx.z;
  const int k_tiles = (p.k + S::BK - 1) / S::BK;
  const int kt0 = split * p.k_tiles_per_split;
  const int kt1 = min(kt0 + p.k_tiles_per_split, k_tiles);
  const bool masked = p.mask != 0;
  // Only the first column tile of a split sums the bias gradient: every
  // column tile stages the same rows of dy.
  const bool sum_bias = kMode == kWgrad && p.bias_grad != 0 && tile_n == 0;

  ALoader<T, kMode, kMath> al;
  al.init(p, tid, m0);
  typename BLoaderFor<T, kMode, kMath>::type bl;
  bl.init(p, tid, n0);
  if constexpr (kMode == kWgrad) {
    BLoaderN<T, kMath>::build_table(p, n0, tab);
    __syncthreads();
  }
  WarpMath<T, kMode, kMath> mm;
  mm.init(tid);

  if (kt0 < kt1) {
    al.load(p, kt0 * S::BK);
    bl.load(p, kt0 * S::BK, tab);
    al.store(sa, masked, sum_bias);
    bl.store(sb, masked);
    __syncthreads();
    for (int kt = kt0; kt < kt1; ++kt) {
      const int cur = (kt - kt0) & 1;
      const bool more = kt + 1 < kt1;
      if (more) {
        al.load(p, (kt + 1) * S::BK);
        bl.load(p, (kt + 1) * S::BK, tab);
      }
      mm.step(sa + cur * S::kAElems, sb + cur * S::kBElems);
      if (more) {
        // The other stage was last read in iteration kt-1, before the
        // barrier that ended it.
        al.store(sa + (cur ^ 1) * S::kAElems, masked, sum_bias);
        bl.store(sb + (cur ^ 1) * S::kBElems, masked);
      }
      __syncthreads();
    }
  }
  // The C tile goes over the stages: every warp is past the loop's last
  // barrier, so no stage is read any more.
  mm.store(reinterpret_cast<T*>(smem));
  if (sum_bias) al.flush_bias(p, m0, split);
  __syncthreads();
  epilogue<T, kMode, S>(p, reinterpret_cast<const T*>(smem), m0, n0, tile_n, split);
}

// ---------------------------------------------------------------------------
// conv_pipe: the float32 GEMMs fed by cp.async through a ring of kStages
// shared-memory stages, with conv_gemm's epilogue. conv_gemm's register
// staging holds a k-tile's 32 values per thread between their loads and
// stores and covers one k-tile of latency; here the copies bypass
// registers and kStages-1 k-tiles are in flight while one is multiplied.
// The forward GEMM has three tiles (FpropPipe):
//
//   conv_fprop_mma_m128_s3_f32 (PipeM128S3): conv_gemm's 128x128 tile and 8
//     warps of 64x32, MMAs in the same order, so the same results bit for
//     bit. It fits in 128 registers: two blocks share an SM and hide each
//     other's barriers.
//   conv_fprop_mma_m256_s4_f32 (PipeM256S4): 256x128, 8 warps of 64x64, one
//     block per SM. A warp tile of 64x32 reads (64+32)*8*4 bytes of
//     fragments from shared memory per k-step of 8, 0.19 bytes per
//     multiply-add: shared memory's 128 bytes per clock then feed at most
//     two thirds of the ~1024 TF32 multiply-adds per clock of an SM's
//     tensor cores (less, with the copies into shared memory). 64x64 reads
//     0.125 bytes per multiply-add, at the price of 128 accumulators per
//     thread. Each output is still the same sum over k in the same order:
//     the same results as conv_gemm's. Its grid has half as many blocks:
//     for layers with many output pixels and channels.
//   conv_fprop_mma_m128_s3_t128_f32 (PipeM128S3T128): the 128x128 tile with
//     PipeM256S4's warps, 4 of 64x64 (128 threads), and three stages: two
//     blocks per SM, as many blocks as PipeM128S3, PipeM256S4's fragment
//     traffic.
//
// The backward GEMMs run on PipeM128S3's tile, the same pipeline and the
// same warps:
//
//   conv_dgrad_mma_m128_s3_f32, for stride 1 only: there, dgrad is a
//     convolution of dy with the transposed, flipped weights, and its B
//     gather is fprop's over dy instead of x, with source row ih + pad -
//     kh*dil instead of oh*stride - pad + kh*dil (PixelGather). With a
//     stride, most taps of an input pixel meet no output pixel; the gather
//     would have to skip them to gain anything, so strided layers keep
//     conv_dgrad_mma_m128_i64_f32.
//   conv_wgrad_mma_m128_s3_f32: A is dy, read along pixels (16-byte copies
//     when OutH*OutW % 4 == 0: a chunk of 4 then never straddles two
//     images); B is col(x)^T, staged n-major as conv_gemm does, gathered
//     along the reduction by 4-byte copies (16-byte ones for pointwise
//     filters), its columns' taps in a table built once per block from
//     fprop's row tables. Split-K as conv_gemm's wgrad: each split writes
//     its partial tile and conv_splitk_reduce sums them in order. The bias
//     gradient is summed by each thread over the A values it copied, as it
//     rounds them.
//
// Neither backward kernel applies the ReLU mask of dy: cp.async copies
// without looking at the data. ops/conv_device.go masks dy into scratch
// memory first (relu_mask_f32), which costs a read of dy and y and a write
// of dy' once per backward op, a few percent of the GEMMs' time; masking at
// fragment load would have to stage y beside dy through the pipeline, which
// doubles B's shared memory (dgrad: a third stage would no longer fit two
// blocks per SM) and its copies on every k-tile, and dgrad gathers each
// element of dy KH*KW times.
//
// The operands reach the MMAs rounded to TF32 as in conv_gemm, rounded
// where it costs least. B always as its fragments are loaded. A, in
// PipeM128S3, in shared memory, each thread rounding the values it copied
// once they land (cp.async.wait_group makes a thread's own copies visible
// to it: no extra barrier), with 128-bit loads and stores, rather than four
// times, once per warp that reads it; in PipeM256S4, whose shared memory is
// the tighter resource (and in PipeM128S3T128), as its fragments are loaded.
template <int kBM, int kWarpsM, int kWarpsN, int kNumStages, bool kRoundAInSmem, bool kBNMajor = false>
struct FpropPipe {
  static constexpr int BM = kBM, BN = 128, BK = 32, NT = 32 * kWarpsM * kWarpsN;
  static constexpr int kStages = kNumStages;
  static constexpr bool kRoundA = kRoundAInSmem;
  // B k-major (Bs[k][n]) when gathered along output pixels (fprop, dgrad),
  // n-major (Bt[n][k]) when gathered along the reduction (wgrad), as in
  // GemmShape: consecutive lanes copy consecutive addresses.
  static constexpr bool kNMajorB = kBNMajor;
  // Rows padded as in ConvTile<float, kMma>: conflict-free fragment loads.
  static constexpr int LDA = BK + 4, LDB = kNMajorB ? BK + 4 : BN + 8, LDC = BN + 8;
  static constexpr int kAElems = BM * LDA, kBElems = kNMajorB ? BN * LDB : BK * LDB;
  static constexpr int kStageElems = kAElems + kBElems;
  static constexpr int kPipeBytes = kStages * kStageElems * 4;
  static constexpr int kCBytes = BM * LDC * 4;
  // The row tables of the B gather (BPixelPipe): a ring of kTabSlots
  // k-tiles; wgrad's column table (BWgradPipe) in the same place.
  static constexpr int kTabSlots = 4;
  static constexpr int kMainBytes = kPipeBytes > kCBytes ? kPipeBytes : kCBytes;
  static constexpr int kSmemBytes = kMainBytes + kTabSlots * BK * 16;
  // Warp tiles of kWM x kWN: kMI x kNI MMAs per k-step of 8.
  static constexpr int kWM = BM / kWarpsM, kWN = BN / kWarpsN;
  static constexpr int kMI = kWM / 16, kNI = kWN / 8;
  static constexpr int kWarpsAlongM = kWarpsM;
  // A by 16-byte copies: 8 per row of 32 k, rows tid/8 + 32*i; or by
  // 4-byte copies, lanes along k, rows tid/32 + 8*i.
  static constexpr int kAVecRows = NT / 8, kAVecPer = BM / kAVecRows;
  static constexpr int kARows = NT / BK, kAPer = BM / kARows;
  // k-major B: lanes along n (columns lane + 32*b), k rows warp + 8*a.
  static constexpr int kBRows = NT / 32, kBKPer = BK / kBRows, kBNPer = BN / 32;
  // n-major B, as A: lanes along k, n rows tid/32 + 8*a, or by 16-byte
  // copies, n rows tid/8 + 32*a.
  static constexpr int kBTRows = NT / BK, kBTPer = BN / kBTRows;
  static constexpr int kBTVecRows = NT / 8, kBTVecPer = BN / kBTVecRows;
  // Filters of at most kMaskTaps taps test bounds with per-column masks.
  static constexpr int kMaskTaps = 32;
  static_assert(kWarpsM * kWarpsN * 32 == NT && kWM % 16 == 0 && kWN % 8 == 0, "one warp per warp tile");
  static_assert(LDA % 4 == 0 && LDB % 4 == 0 && kAElems % 4 == 0 && kStageElems % 4 == 0, "16-byte aligned rows");
  static_assert(BM % kAVecRows == 0 && BM % kARows == 0 && BK % kBRows == 0, "the loaders' lanes");
  static_assert(BN % kBTRows == 0 && BN % kBTVecRows == 0, "the n-major loaders' lanes");
  static_assert(kTabSlots >= kStages && (kTabSlots & (kTabSlots - 1)) == 0, "a table per k-tile in flight");
  static_assert(!kNMajorB || (kTabSlots * BK >= BN && NT / 32 >= BN / 32), "wgrad's column table, a warp per 32 columns");
  static_assert(NT / 32 >= kStages, "the prologue builds kStages tables, one per warp");
  static_assert(((NT / 32) & (NT / 32 - 1)) == 0, "the warps build the tables in turn");
};
using PipeM128S3 = FpropPipe<128, 2, 4, 3, true>;
using PipeM256S4 = FpropPipe<256, 4, 2, 4, false>;
using PipeM128S3T128 = FpropPipe<128, 2, 2, 3, false>;
// dgrad is fprop's GEMM shape over other tensors; wgrad stages B n-major.
using DgradPipeM128S3 = PipeM128S3;
using WgradPipeM128S3 = FpropPipe<128, 2, 4, 3, true, true>;
// PipeM128S3 is conv_gemm's tile, so that the two agree bit for bit and
// share the statistics' column tiles; the other tiles share the column
// tiles too. The backward m128_s3 kernels have conv_gemm's tiles, warps
// and MMA order as well: dgrad agrees with conv_dgrad_mma_m128_i64_f32 bit
// for bit, wgrad's dw with conv_wgrad_mma_m128_i64_f32's for the same
// splits (its bias gradient is summed in another order).
static_assert(PipeM128S3::BM == GemmShape<float, kFprop>::BM && PipeM128S3::BN == GemmShape<float, kFprop>::BN &&
                  PipeM128S3::BK == GemmShape<float, kFprop>::BK && PipeM128S3::LDA == GemmShape<float, kFprop>::LDA &&
                  PipeM128S3::LDB == GemmShape<float, kFprop>::LDB && PipeM128S3::kWM == WarpMath<float, kFprop>::kWM &&
                  PipeM128S3::kWN == WarpMath<float, kFprop>::kWN && PipeM256S4::BN == PipeM128S3::BN &&
                  PipeM128S3T128::BN == PipeM128S3::BN,
              "PipeM128S3 has conv_gemm's tile");
static_assert(WgradPipeM128S3::BM == GemmShape<float, kWgrad>::BM &&
                  WgradPipeM128S3::BN == GemmShape<float, kWgrad>::BN &&
                  WgradPipeM128S3::BK == GemmShape<float, kWgrad>::BK &&
                  WgradPipeM128S3::LDB == GemmShape<float, kWgrad>::LDB &&
                  WgradPipeM128S3::kWM == WarpMath<float, kWgrad>::kWM &&
                  WgradPipeM128S3::kWN == WarpMath<float, kWgrad>::kWN,
              "WgradPipeM128S3 has conv_gemm's tile");
// What a launch of the conv_pipe kernels needs, for kernels/cuda (tiles
// ConvF32TileN wide, k-tiles ConvF32TileK deep, ConvF32Threads threads but
// where named).
// stheno:const ConvFpropMmaM128S3SmemBytes
static_assert(PipeM128S3::kSmemBytes == 109568, "kernels/cuda exports it");
// stheno:const ConvDgradMmaM128S3SmemBytes
static_assert(DgradPipeM128S3::kSmemBytes == 109568, "kernels/cuda exports it");
// stheno:const ConvWgradMmaM128S3SmemBytes
static_assert(WgradPipeM128S3::kSmemBytes == 112640, "kernels/cuda exports it");
// stheno:const ConvMmaM128S3TileM
static_assert(PipeM128S3::BM == 128, "kernels/cuda exports it");
// stheno:const ConvFpropMmaM256S4SmemBytes
static_assert(PipeM256S4::kSmemBytes == 219136, "kernels/cuda exports it");
// stheno:const ConvMmaM256S4TileM
static_assert(PipeM256S4::BM == 256, "kernels/cuda exports it");
// stheno:const ConvFpropMmaM128S3T128SmemBytes
static_assert(PipeM128S3T128::kSmemBytes == 109568, "kernels/cuda exports it");
// stheno:const ConvMmaM128S3T128TileM
static_assert(PipeM128S3T128::BM == 128, "kernels/cuda exports it");
// stheno:const ConvMmaM128S3T128Threads
static_assert(PipeM128S3T128::NT == 128, "kernels/cuda exports it");
static_assert(PipeM128S3::NT == 256 && PipeM256S4::NT == 256 && WgradPipeM128S3::NT == 256 &&
                  PipeM256S4::BK == PipeM128S3::BK && PipeM128S3T128::BK == PipeM128S3::BK,
              "ConvF32Threads threads; ConvF32TileK-deep k-tiles");

// A of the pipelined GEMMs, rows m0.., read along k: fprop the weights w
// [Cout][K]; dgrad the transposed weights [Cin][Cout*KH*KW]; wgrad dy
// [N][Cout][P] as Cout x (N*P), whose element (m, k) with k = n*P + pixel
// sits at n*Cout*P + m*P + pixel = m*P + k + n*(Cout-1)*P. A thread copies
// 16 bytes of BM/32 rows when rows are a multiple of 4 long (fprop, dgrad:
// K; wgrad: P) and A is 16-byte aligned, else 4 bytes of BM/8 rows (the A
// staging of conv_gemm). kVec fixes that choice at compile time (wgrad,
// whose bias sums take a register per row), or leaves it to run time (-1).
// A copy past the last row or past K reads nothing and writes zeros.
template <typename C, int kMode, int kVec = -1>
struct APipe {
  static constexpr int kSums = kMode != kWgrad ? 1 : kVec == 1 ? C::kAVecPer : C::kAPer;
  const float* a;  // A at this thread's first row and column
  int64_t step;    // elements between this thread's rows
  int rows_left;   // this thread's row i exists when rows*i < rows_left
  int kc;          // column of this thread in the k-tile
  int soff;        // its offset in a stage
  bool vec_;
  float bsum[kSums];  // wgrad: this thread's share of its rows' sums (the bias gradient)

  __device__ __forceinline__ bool vec() const { return kVec == -1 ? vec_ : kVec == 1; }

  __device__ __forceinline__ void init(const ConvGemmParams& p, int tid, int m0) {
    const int64_t ld = kMode == kWgrad ? static_cast<int64_t>(p.div_q.d) : static_cast<int64_t>(p.k);
    vec_ = ld % 4 == 0 && p.a % 16 == 0;
    const int row = vec() ? tid / 8 : tid / C::BK;
    kc = vec() ? 4 * (tid % 8) : tid % C::BK;
    step = (vec() ? C::kAVecRows : C::kARows) * ld;
    rows_left = p.m - m0 - row;
    a = reinterpret_cast<const float*>(p.a) + static_cast<int64_t>(m0 + row) * ld + kc;
    soff = row * C::LDA + kc;
#pragma unroll
    for (int i = 0; i < kSums; ++i) bsum[i] = 0.0f;
  }

  // The address of a copy that reads nothing (src_bytes 0) is not used:
  // it is left as computed, past the end or not.
  __device__ __forceinline__ void load(const ConvGemmParams& p, int k0, float* sa) const {
    const bool kv = k0 + kc < p.k;  // vec: the whole chunk, as K % 4 == 0
    int64_t col = k0;
    if constexpr (kMode == kWgrad) {
      const int n = fdiv(kv ? k0 + kc : 0, p.div_q);
      col += static_cast<int64_t>(n) * (p.cout - 1) * p.div_q.d;
    }
    if (vec()) {
#pragma unroll
      for (int i = 0; i < C::kAVecPer; ++i) {
        const bool v = kv && C::kAVecRows * i < rows_left;
        cp_async16(sa + soff + C::kAVecRows * i * C::LDA, a + (i * step + col), v ? 16 : 0);
      }
    } else {
#pragma unroll
      for (int i = 0; i < C::kAPer; ++i) {
        const bool v = kv && C::kARows * i < rows_left;
        cp_async4(sa + soff + C::kARows * i * C::LDA, a + (i * step + col), v ? 4 : 0);
      }
    }
  }

  // Rounds the values this thread copied, once they have landed; wgrad
  // with sum_bias first adds them to its rows' sums (copies that read
  // nothing landed zeros).
  __device__ __forceinline__ void round(float* sa, bool sum_bias) {
    if (vec()) {
#pragma unroll
      for (int i = 0; i < C::kAVecPer; ++i) {
        float4* q = reinterpret_cast<float4*>(sa + soff + C::kAVecRows * i * C::LDA);
        const float4 v = *q;
        if constexpr (kMode == kWgrad && kVec == 1) {
          if (sum_bias) bsum[i] += (v.x + v.y) + (v.z + v.w);
        }
        *q = make_float4(bits_to_float(to_tf32_for_mma(v.x)), bits_to_float(to_tf32_for_mma(v.y)),
                         bits_to_float(to_tf32_for_mma(v.z)), bits_to_float(to_tf32_for_mma(v.w)));
      }
    } else {
#pragma unroll
      for (int i = 0; i < C::kAPer; ++i) {
        float* q = sa + soff + C::kARows * i * C::LDA;
        if constexpr (kMode == kWgrad && kVec == 0) {
          if (sum_bias) bsum[i] += *q;
        }
        *q = bits_to_float(to_tf32_for_mma(*q));
      }
    }
  }

  // wgrad: writes this block's bias-gradient partial sums, those of split
  // `split`. The lanes that share a row (8 or 32 consecutive ones) add
  // theirs in a fixed order. Every thread of the block calls it.
  __device__ __forceinline__ void flush_bias(const ConvGemmParams& p, int split) const {
    static_assert(kMode == kWgrad && kVec != -1, "wgrad fixes its A copies");
    float* out = reinterpret_cast<float*>(p.bias_grad) + static_cast<int64_t>(split) * p.m;
    constexpr int kRows = kVec == 1 ? C::kAVecRows : C::kARows;
#pragma unroll
    for (int i = 0; i < kSums; ++i) {
      const float s = group_sum(bsum[i], kVec == 1 ? 8 : 32);
      if (kc == 0 && kRows * i < rows_left) out[p.m - rows_left + kRows * i] = s;  // row m0 + row + kRows*i
    }
  }
};

// How the B gathers go: the general case, filters of at most kMaskTaps
// taps, and 1x1 filters of stride 1 without padding over images of a
// multiple of 4 pixels, 16-byte aligned (pointwise: col(x) is x itself,
// image by image, and likewise dgrad's gather of dy).
enum PipeGather : int { kGatherCompare = 0, kGatherMask = 1, kGatherPointwise = 2 };

// The geometry of the gathers along output pixels. B element (k, j) of
// fprop is x[img][ci][r*stride_h + kh*dil_h - pad_h][c*stride_w + ...] with
// (img, r, c) column j's pixel of the output and (ci, kh, kw) = k's tap; of
// dgrad at stride 1, dy[img][co][r + pad_h - kh*dil_h][c + pad_w - ...]
// with (img, r, c) j's pixel of the input. Both split into a column part,
// source row h0 = r*stride_h or r + pad_h (w0 likewise), and a tap's
// displacement dh = kh*dil_h - pad_h or -kh*dil_h (dw likewise), over a
// source of chans() x rows() x cols().
template <int kMode>
struct PixelGather {
  static_assert(kMode == kFprop || kMode == kDgrad, "gathers along output pixels");
  static constexpr bool kD = kMode == kDgrad;
  __device__ __forceinline__ static int chans(const ConvGemmParams& p) { return kD ? p.cout : p.cin; }
  __device__ __forceinline__ static int rows(const ConvGemmParams& p) { return kD ? p.out_h : p.h; }
  __device__ __forceinline__ static int cols(const ConvGemmParams& p) { return kD ? p.out_w : p.w; }
  __device__ __forceinline__ static int dh(const ConvGemmParams& p, int kh) {
    return kD ? -kh * p.dil_h : kh * p.dil_h - p.pad_h;
  }
  __device__ __forceinline__ static int dw(const ConvGemmParams& p, int kw) {
    return kD ? -kw * p.dil_w : kw * p.dil_w - p.pad_w;
  }
  // The column part of the offset of pixel j (j < the pixels of the
  // images), with its h0 and w0; div_img and div_row divide by the pixels
  // of an image and of a row (wgrad passes its own).
  __device__ __forceinline__ static int column(const ConvGemmParams& p, int j, const FastDiv& div_img,
                                               const FastDiv& div_row, int& h0, int& w0) {
    const int img = fdiv(j, div_img);
    const int pix = j - img * div_img.d;
    const int r = fdiv(pix, div_row);
    const int c = pix - r * div_row.d;
    h0 = kD ? r + p.pad_h : r * p.stride_h;
    w0 = kD ? c + p.pad_w : c * p.stride_w;
    return img * (chans(p) * rows(p) * cols(p)) + h0 * cols(p) + w0;
  }
};

// B of the pipelined fprop and dgrad (stride 1), gathered as BLoaderK
// does (rows warp + 8*a, columns lane + 32*b) but by 4-byte copies. The
// offset of element (k, j) splits into PixelGather's column part, fixed
// per thread and kept, and a row part, ch*rows*cols + dh*cols + dw. The
// row parts of a k-tile are found once per block, by one warp, into a
// small table in shared memory (a ring of k-tiles, written a k-tile ahead
// of its use, so that the loop's one barrier orders the two). The sum
// stays below (N+1)*chans*rows*cols, which ops/conv_device.go keeps under
// 2^31 for these kernels.
//
// Whether tap (kh, kw) of column j falls inside the source depends on the
// tap and on j's pixel only, not on the channel: with kGatherMask each
// column keeps a mask of its taps inside, built once, and each table row
// the bit of its tap (none past K), so that an element's bounds test is an
// AND; kGatherCompare's rows carry (dh, dw) and each element tests the
// source row and column, two adds and two compares. kGatherPointwise
// copies 16 bytes, 4 columns of a row, lanes along n (columns 4*lane..):
// its columns are consecutive pixels of one image (an image's first pixel
// is a multiple of 4), all inside it.
template <typename C, int kMode, int kGather>
struct BPixelPipe {
  using G = PixelGather<kMode>;
  static constexpr bool kMask = kGather == kGatherMask, kPoint = kGather == kGatherPointwise;
  static constexpr int kCols = kPoint ? 1 : C::kBNPer;  // column parts kept per thread
  int coff[kCols];                                      // column part of the offset
  int ch[kMask || kPoint ? 1 : kCols], cw[kMask || kPoint ? 1 : kCols];  // h0, w0; -kFar past the end
  uint32_t taps[kMask || kPoint ? kCols : 1];  // bit kh*KW+kw when that tap is inside (pointwise: bit 0)
  int krow, soff;

  __device__ __forceinline__ void init(const ConvGemmParams& p, int tid, int n0) {
    const int lane = tid & 31;
    krow = tid >> 5;
    soff = krow * C::LDB + (kPoint ? 4 * lane : lane);
#pragma unroll
    for (int b = 0; b < kCols; ++b) {
      const int j = n0 + (kPoint ? 4 * lane : lane + 32 * b);
      int h0 = -kFar, w0 = 0;
      coff[b] = j < p.ncols ? G::column(p, j, p.div_img, p.div_row, h0, w0) : 0;
      if constexpr (kPoint) {
        taps[b] = j < p.ncols ? 1u : 0u;
      } else if constexpr (kMask) {
        uint32_t m = 0;
        for (int kh = 0; kh < p.kh; ++kh) {
          const int ih = h0 + G::dh(p, kh);
          if (static_cast<unsigned>(ih) >= static_cast<unsigned>(G::rows(p))) continue;
          for (int kw = 0; kw < p.kw; ++kw) {
            const int iw = w0 + G::dw(p, kw);
            if (static_cast<unsigned>(iw) < static_cast<unsigned>(G::cols(p))) m |= 1u << (kh * p.kw + kw);
          }
        }
        taps[b] = m;
      } else {
        ch[b] = h0;
        cw[b] = w0;
      }
    }
  }

  // tab[r] = {row part of the offset, dh, dw, tap bit} of row k0 + r < end,
  // for the calling warp's lane r. A row past the end gets no tap bit and a
  // dh that fails every bounds check. (wgrad's column table is fprop's.)
  __device__ __forceinline__ static void build_rows(const ConvGemmParams& p, int k0, int end, int4* tab) {
    const int r = threadIdx.x & 31, k = k0 + r;
    int4 e = make_int4(0, -kFar, 0, 0);
    if (k < end) {
      const int ci = fdiv(k, p.div_kk);
      const int t = k - ci * p.div_kk.d;
      const int kh = fdiv(t, p.div_kw);
      const int dh = G::dh(p, kh);
      const int dw = G::dw(p, t - kh * p.kw);
      e = make_int4(ci * (G::rows(p) * G::cols(p)) + dh * G::cols(p) + dw, dh, dw,
                    kMask || kPoint ? static_cast<int>(1u << t) : 0);
    }
    tab[r] = e;
  }

  // The address of a copy that reads nothing (src_bytes 0) is not used.
  __device__ __forceinline__ void load(const ConvGemmParams& p, const int4* tab, float* sb) const {
    const float* __restrict__ x = reinterpret_cast<const float*>(p.b);
#pragma unroll
    for (int a = 0; a < C::kBKPer; ++a) {
      const int4 e = tab[krow + C::kBRows * a];
#pragma unroll
      for (int b = 0; b < kCols; ++b) {
        bool ok;
        if constexpr (kMask || kPoint) {
          ok = (taps[b] & static_cast<uint32_t>(e.w)) != 0;
        } else {
          ok = static_cast<unsigned>(ch[b] + e.y) < static_cast<unsigned>(G::rows(p)) &&
               static_cast<unsigned>(cw[b] + e.z) < static_cast<unsigned>(G::cols(p));
        }
        // Unsigned: a valid offset is non-negative, and then needs no sign
        // extension.
        const float* src = x + static_cast<unsigned>(coff[b] + e.x);
        float* dst = sb + soff + (C::kBRows * a) * C::LDB + 32 * b;
        if constexpr (kPoint) {
          cp_async16(dst, src, ok ? 16 : 0);
        } else {
          cp_async4(dst, src, ok ? 4 : 0);
        }
      }
    }
  }
};

// B of the pipelined wgrad, n-major: col(x)^T[(n,oh,ow)][(ci,kh,kw)], the
// transpose of fprop's B. Its columns are fprop's rows: their table
// (offset ci*H*W + dh*W + dw, dh, dw), built once per block by
// BPixelPipe<fprop>::build_rows, a warp per 32 columns; its rows are
// fprop's columns, of which a thread decomposes one per k-tile
// (PixelGather's column part, by OutH*OutW and OutW). Lanes run along the
// reduction, consecutive pixels, as in BLoaderN; pointwise filters (as
// kGatherPointwise, and OutH*OutW % 4 == 0) copy 16 bytes, 4 pixels of
// one image. Bounds are compared per element: a per-pixel tap mask would
// have to be rebuilt every k-tile.
template <typename C, bool kPoint>
struct BWgradPipe {
  using G = PixelGather<kFprop>;
  static constexpr int kRows = kPoint ? C::kBTVecRows : C::kBTRows, kPer = kPoint ? C::kBTVecPer : C::kBTPer;
  int kq, nrow, soff;

  __device__ __forceinline__ void init(const ConvGemmParams&, int tid, int) {
    kq = kPoint ? 4 * (tid % 8) : tid % C::BK;
    nrow = kPoint ? tid / 8 : tid / C::BK;
    soff = nrow * C::LDB + kq;
  }

  __device__ __forceinline__ static void build_table(const ConvGemmParams& p, int n0, int4* tab) {
    const int warp = threadIdx.x >> 5;
    if (warp < C::BN / 32) BPixelPipe<C, kFprop, kGatherCompare>::build_rows(p, n0 + 32 * warp, p.ncols, tab + 32 * warp);
  }

  __device__ __forceinline__ void load(const ConvGemmParams& p, int k0, const int4* tab, float* sb) const {
    const float* __restrict__ x = reinterpret_cast<const float*>(p.b);
    const int q = k0 + kq;
    int h0 = -kFar, w0 = 0, coff = 0;
    if (q < p.k) coff = G::column(p, q, p.div_q, p.div_qw, h0, w0);
#pragma unroll
    for (int a = 0; a < kPer; ++a) {
      const int4 e = tab[nrow + kRows * a];
      const bool ok = static_cast<unsigned>(h0 + e.y) < static_cast<unsigned>(p.h) &&
                      static_cast<unsigned>(w0 + e.z) < static_cast<unsigned>(p.w);
      const float* src = x + static_cast<unsigned>(coff + e.x);
      float* dst = sb + soff + kRows * a * C::LDB;
      if constexpr (kPoint) {
        cp_async16(dst, src, ok ? 16 : 0);
      } else {
        cp_async4(dst, src, ok ? 4 : 0);
      }
    }
  }
};

// The warps' math: WarpMath<float, .>'s layout and MMA order, with A's
// fragments by ldmatrix (one instruction instead of four loads) and the
// rounding of FpropPipe.
template <typename C>
struct FpropWarps {
  float acc[C::kMI][C::kNI][4];
  int row0, col0, g, t4, a_lane;

  __device__ __forceinline__ void init(int tid) {
    const int warp = tid >> 5, lane = tid & 31;
    row0 = (warp % C::kWarpsAlongM) * C::kWM;
    col0 = (warp / C::kWarpsAlongM) * C::kWN;
    g = lane >> 2;
    t4 = lane & 3;
    // Lane l gives ldmatrix row l%8 of matrix l/8 (ldmatrix_x4): row
    // 8*((l/8)%2) + l%8 of the m16 block, k 4*(l/16).
    a_lane = (row0 + (lane & 7) + 8 * ((lane >> 3) & 1)) * C::LDA + 4 * (lane >> 4);
#pragma unroll
    for (int mi = 0; mi < C::kMI; ++mi)
#pragma unroll
      for (int ni = 0; ni < C::kNI; ++ni)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[mi][ni][e] = 0.0f;
  }

  __device__ __forceinline__ void step(const float* sa, const float* sb) {
#pragma unroll
    for (int ks = 0; ks < C::BK; ks += 8) {
      uint32_t a[C::kMI][4], b[C::kNI][2];
#pragma unroll
      for (int mi = 0; mi < C::kMI; ++mi) {
        ldmatrix_x4(a[mi], sa + a_lane + mi * 16 * C::LDA + ks);
        if constexpr (!C::kRoundA) {
#pragma unroll
          for (int e = 0; e < 4; ++e) a[mi][e] = to_tf32_for_mma(bits_to_float(a[mi][e]));
        }
      }
#pragma unroll
      for (int ni = 0; ni < C::kNI; ++ni) {
        if constexpr (C::kNMajorB) {
          const float* q = sb + (col0 + ni * 8 + g) * C::LDB + ks + t4;
          b[ni][0] = to_tf32_for_mma(q[0]);
          b[ni][1] = to_tf32_for_mma(q[4]);
        } else {
          const float* q = sb + (ks + t4) * C::LDB + col0 + ni * 8 + g;
          b[ni][0] = to_tf32_for_mma(q[0]);
          b[ni][1] = to_tf32_for_mma(q[4 * C::LDB]);
        }
      }
#pragma unroll
      for (int mi = 0; mi < C::kMI; ++mi)
#pragma unroll
        for (int ni = 0; ni < C::kNI; ++ni) mma_tf32(acc[mi][ni], a[mi], b[ni]);
    }
  }

  __device__ __forceinline__ void store(float* sc) const {
#pragma unroll
    for (int mi = 0; mi < C::kMI; ++mi)
#pragma unroll
      for (int ni = 0; ni < C::kNI; ++ni) {
        float* q = sc + (row0 + mi * 16 + g) * C::LDC + col0 + ni * 8 + 2 * t4;
        *reinterpret_cast<float2*>(q) = make_float2(acc[mi][ni][0], acc[mi][ni][1]);
        *reinterpret_cast<float2*>(q + 8 * C::LDC) = make_float2(acc[mi][ni][2], acc[mi][ni][3]);
      }
  }
};

// The B loader of a pipelined GEMM.
template <typename C, int kMode, int kGather>
struct BPipeFor {
  using type = BPixelPipe<C, kMode, kGather>;
};
template <typename C, int kGather>
struct BPipeFor<C, kWgrad, kGather> {
  using type = BWgradPipe<C, kGather == kGatherPointwise>;
};

// One GEMM of tile C through the pipeline: blockIdx.x the output tile,
// blockIdx.z (wgrad) the split of the k-tiles.
template <typename C, int kMode, int kGather, int kVecA>
__device__ __forceinline__ void conv_pipe(const ConvGemmParams& p) {
  constexpr bool kW = kMode == kWgrad;
  using BL = typename BPipeFor<C, kMode, kGather>::type;
  float* smem = reinterpret_cast<float*>(dynamic_smem());
  int4* tabs = reinterpret_cast<int4*>(dynamic_smem() + C::kMainBytes);
  const int tid = threadIdx.x, warp = tid >> 5;
  const unsigned tiles_m = static_cast<unsigned>(p.tiles_m);
  const int tile_m = static_cast<int>(blockIdx.x % tiles_m);
  const int tile_n = static_cast<int>(blockIdx.x / tiles_m);
  const int m0 = tile_m * C::BM, n0 = tile_n * C::BN;
  const int k_tiles = (p.k + C::BK - 1) / C::BK;
  const int split = kW ? static_cast<int>(blockIdx.z) : 0;
  const int kt0 = kW ? split * p.k_tiles_per_split : 0;
  const int kt1 = kW ? min(kt0 + p.k_tiles_per_split, k_tiles) : k_tiles;
  // Only the first column tile of a split sums the bias gradient: every
  // column tile stages the same rows of dy.
  const bool sum_bias = kW && p.bias_grad != 0 && tile_n == 0;
  auto stage = [&](int s) { return smem + s * C::kStageElems; };
  auto tab = [&](int kt) { return tabs + (kt & (C::kTabSlots - 1)) * C::BK; };

  APipe<C, kMode, kVecA> al;
  al.init(p, tid, m0);
  BL bl;
  bl.init(p, tid, n0);
  FpropWarps<C> mm;
  mm.init(tid);
  auto load = [&](int kt, float* st) {
    al.load(p, kt * C::BK, st);
    if constexpr (kW) {
      bl.load(p, kt * C::BK, tabs, st + C::kAElems);
    } else {
      bl.load(p, tab(kt), st + C::kAElems);
    }
  };

  // Prologue: the row tables of the first kStages k-tiles (warp s builds
  // k-tile s's), or wgrad's column table, then the first kStages-1 k-tiles
  // in flight. Every slot commits a group, empty or not, so that "k-tile
  // kt has landed" is always "at most kStages-2 groups pending" below.
  if constexpr (kW) {
    BL::build_table(p, n0, tabs);
  } else if (warp < C::kStages) {
    BL::build_rows(p, warp * C::BK, p.k, tab(warp));
  }
  __syncthreads();
#pragma unroll
  for (int s = 0; s < C::kStages - 1; ++s) {
    if (kt0 + s < kt1) load(kt0 + s, stage(s));
    cp_async_commit();
  }
  int read = 0, write = C::kStages - 1;  // stages of k-tiles kt and kt+kStages-1
  for (int kt = kt0; kt < kt1; ++kt) {
    cp_async_wait<C::kStages - 2>();
    if constexpr (C::kRoundA) al.round(stage(read), sum_bias);
    // After it, k-tile kt is in shared memory (A rounded, with kRoundA);
    // every warp is done with the math of k-tile kt-1, whose stage is
    // refilled next; and the row table of k-tile kt+kStages-1, built in
    // the previous iteration, is complete.
    __syncthreads();
    const int next = kt + C::kStages - 1;
    if (next < kt1) load(next, stage(write));
    cp_async_commit();
    // The table of k-tile kt+kStages, by each warp in turn. Its slot last
    // held that of k-tile kt+kStages-kTabSlots, gathered iterations ago.
    if constexpr (!kW) {
      if (warp == (kt & (C::NT / 32 - 1)) && next + 1 < kt1) BL::build_rows(p, (next + 1) * C::BK, p.k, tab(next + 1));
    }
    mm.step(stage(read), stage(read) + C::kAElems);
    read = read == C::kStages - 1 ? 0 : read + 1;
    write = write == C::kStages - 1 ? 0 : write + 1;
  }
  // The C tile goes over the stages once no copy is in flight and no warp
  // reads them.
  cp_async_wait<0>();
  __syncthreads();
  mm.store(smem);
  if constexpr (kW) {
    if (sum_bias) al.flush_bias(p, split);
  }
  __syncthreads();
  epilogue<float, kMode, C>(p, smem, m0, n0, tile_n, split);
}

// 1x1 filters of stride 1 without padding: every column of col(x) is a
// pixel of x (or of dy).
__device__ __forceinline__ bool pointwise(const ConvGemmParams& p) {
  return p.kh == 1 && p.kw == 1 && p.stride_h == 1 && p.stride_w == 1 && p.pad_h == 0 && p.pad_w == 0;
}

// Chooses the gather at run time. dgrad must have stride 1, wgrad
// OutH*OutW % 4 == 0 and dy 16-byte aligned (16-byte A copies):
// ops/conv_device.go sends other layers to conv_gemm. (wgrad's 4-byte A
// copies would need a bias sum per row, 16 per thread: they spilled.)
template <typename C, int kMode>
__device__ __forceinline__ void conv_pipe(const ConvGemmParams& p) {
  if constexpr (kMode == kWgrad) {
    if (pointwise(p) && p.b % 16 == 0) {
      conv_pipe<C, kMode, kGatherPointwise, 1>(p);
    } else {
      conv_pipe<C, kMode, kGatherCompare, 1>(p);
    }
  } else if (pointwise(p) && p.div_img.d % 4 == 0 && p.b % 16 == 0) {
    conv_pipe<C, kMode, kGatherPointwise, -1>(p);
  } else if (p.kh * p.kw <= C::kMaskTaps) {
    conv_pipe<C, kMode, kGatherMask, -1>(p);
  } else {
    conv_pipe<C, kMode, kGatherCompare, -1>(p);
  }
}


// Sums the split-K partial tiles of wgrad in split order (deterministic):
// out[i] = sum_s ws[s][i] for i < n, and bias_out[i] = sum_s bias_ws[s][i]
// for i < m when bias_ws is non-zero.
struct SplitKParams {
  uint64_t ws, out, bias_ws, bias_out;
  int64_t n;
  int32_t m, splits;
};
STHENO_PARAMS(SplitKParams);

template <typename T>
__device__ __forceinline__ void splitk_reduce(const SplitKParams& p) {
  const T* __restrict__ ws = reinterpret_cast<const T*>(p.ws);
  T* __restrict__ out = reinterpret_cast<T*>(p.out);
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = first; i < p.n; i += stride) {
    T s = ws[i];
    for (int k = 1; k < p.splits; ++k) s += ws[k * p.n + i];
    out[i] = s;
  }
  if (p.bias_ws != 0) {
    const T* __restrict__ bws = reinterpret_cast<const T*>(p.bias_ws);
    T* __restrict__ bout = reinterpret_cast<T*>(p.bias_out);
    for (int64_t i = first; i < p.m; i += stride) {
      T s = bws[i];
      for (int k = 1; k < p.splits; ++k) s += bws[static_cast<int64_t>(k) * p.m + i];
      bout[i] = s;
    }
  }
}

// wt[ci][co][kh][kw] = w[co][ci][kh][kw]: dgrad's A operand, read along its
// reduction (co, kh, kw) like fprop reads w along (ci, kh, kw). With
// round_tf32 (float32 only) the values are rounded to TF32 on the way: the
// kernels that round their A operand as they stage it then find nothing to
// change, and conv_sm90a.cu's, whose MMAs read the weights straight from
// shared memory, need it. With cin == 1 it is a copy of [cout][kk].
struct WeightTParams {
  uint64_t w, wt;
  int64_t n;
  int32_t cout, cin, kk, round_tf32;
};
STHENO_PARAMS(WeightTParams);

template <typename T>
__device__ __forceinline__ void transpose_weights(const WeightTParams& p) {
  const T* __restrict__ w = reinterpret_cast<const T*>(p.w);
  T* __restrict__ wt = reinterpret_cast<T*>(p.wt);
  const int64_t per_co = static_cast<int64_t>(p.cin) * p.kk;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < p.n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t co = i / per_co, r = i - co * per_co;
    const int64_t ci = r / p.kk, t = r - ci * p.kk;
    T v = w[i];
    if constexpr (sizeof(T) == 4) {
      if (p.round_tf32) v = bits_to_float(to_tf32(v));
    }
    wt[(ci * p.cout + co) * p.kk + t] = v;
  }
}

}  // namespace stheno

// conv_sm90a.cu includes this file for its templates and defines
// STHENO_CONV_TEMPLATES_ONLY, so that its module holds only its own kernels.
#ifndef STHENO_CONV_TEMPLATES_ONLY
extern "C" {
// conv_gemm, offsets in 64 bits: the GEMMs conv_pipe's kernels do not run.
__global__ void __launch_bounds__(256, 1) conv_fprop_mma_m128_i64_f32(stheno::ConvGemmParams p) {
  stheno::conv_gemm<float, stheno::kFprop>(p);
}
// Two blocks per SM: at most 128 registers.
__global__ void __launch_bounds__(256, 2) conv_fprop_mma_m128_s3_f32(stheno::ConvGemmParams p) {
  stheno::conv_pipe<stheno::PipeM128S3, stheno::kFprop>(p);
}
#if STHENO_KERNEL_VARIANTS
// One block per SM: up to 255 registers, 128 of them accumulators.
__global__ void __launch_bounds__(256, 1) conv_fprop_mma_m256_s4_f32(stheno::ConvGemmParams p) {
  stheno::conv_pipe<stheno::PipeM256S4, stheno::kFprop>(p);
}
// 128 threads, two blocks per SM: up to 255 registers.
__global__ void __launch_bounds__(128, 2) conv_fprop_mma_m128_s3_t128_f32(stheno::ConvGemmParams p) {
  stheno::conv_pipe<stheno::PipeM128S3T128, stheno::kFprop>(p);
}
#endif
__global__ void __launch_bounds__(256, 1) conv_dgrad_mma_m128_i64_f32(stheno::ConvGemmParams p) {
  stheno::conv_gemm<float, stheno::kDgrad>(p);
}
// Stride 1 only; dy already masked. Two blocks per SM, as fprop's.
__global__ void __launch_bounds__(256, 2) conv_dgrad_mma_m128_s3_f32(stheno::ConvGemmParams p) {
  stheno::conv_pipe<stheno::DgradPipeM128S3, stheno::kDgrad>(p);
}
__global__ void __launch_bounds__(256, 1) conv_wgrad_mma_m128_i64_f32(stheno::ConvGemmParams p) {
  stheno::conv_gemm<float, stheno::kWgrad>(p);
}
// dy already masked. Two blocks per SM where shared memory allows (sm_90).
__global__ void __launch_bounds__(256, 2) conv_wgrad_mma_m128_s3_f32(stheno::ConvGemmParams p) {
  stheno::conv_pipe<stheno::WgradPipeM128S3, stheno::kWgrad>(p);
}
// Full float32 on the CUDA cores, for a Device whose GemmMath is GemmExact:
// conv_gemm's loads, masks and epilogue, nothing rounded to TF32.
__global__ void __launch_bounds__(256) conv_fprop_fma_m64_i64_f32(stheno::ConvGemmParams p) {
  stheno::conv_gemm<float, stheno::kFprop, stheno::kFma>(p);
}
__global__ void __launch_bounds__(256) conv_dgrad_fma_m64_i64_f32(stheno::ConvGemmParams p) {
  stheno::conv_gemm<float, stheno::kDgrad, stheno::kFma>(p);
}
__global__ void __launch_bounds__(256) conv_wgrad_fma_m64_i64_f32(stheno::ConvGemmParams p) {
  stheno::conv_gemm<float, stheno::kWgrad, stheno::kFma>(p);
}
__global__ void __launch_bounds__(256) conv_fprop_fma_m64_i64_f64(stheno::ConvGemmParams p) {
  stheno::conv_gemm<double, stheno::kFprop>(p);
}
__global__ void __launch_bounds__(256) conv_dgrad_fma_m64_i64_f64(stheno::ConvGemmParams p) {
  stheno::conv_gemm<double, stheno::kDgrad>(p);
}
__global__ void __launch_bounds__(256) conv_wgrad_fma_m64_i64_f64(stheno::ConvGemmParams p) {
  stheno::conv_gemm<double, stheno::kWgrad>(p);
}
__global__ void conv_splitk_reduce_f32(stheno::SplitKParams p) { stheno::splitk_reduce<float>(p); }
__global__ void conv_splitk_reduce_f64(stheno::SplitKParams p) { stheno::splitk_reduce<double>(p); }
__global__ void conv_transpose_weights_f32(stheno::WeightTParams p) { stheno::transpose_weights<float>(p); }
__global__ void conv_transpose_weights_f64(stheno::WeightTParams p) { stheno::transpose_weights<double>(p); }
}
#endif  // STHENO_CONV_TEMPLATES_ONLY
