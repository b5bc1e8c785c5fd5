// The forward and data-gradient GEMMs of conv.cu on Hopper's warpgroup
// MMA (wgmma), which nvcc 11.8 cannot assemble: the Makefile compiles this
// file to PTX for compute_90 and retargets it to sm_90a, and the driver
// compiles that PTX when the module is first loaded (only on compute
// capability 9.0 GPUs, the one target sm_90a code runs on). ops picks these
// kernels on such a GPU and conv.cu's elsewhere.
//
// The GEMM is conv_pipe's (conv.cu): the same cp.async ring of three
// stages, the same gather of col(x) (or of dy) through BPixelPipe's row
// tables, the same epilogue. What changes is the math. A block's tile is
// 128 (m128) or 256 (m256) output channels x 128 pixels; its two warpgroups
// each take 64 of the pixels and all the channels, and per k-step of 8
// issue one wgmma.m64n128k8 (or n256), which reads the weights straight
// from shared memory and the gathered pixels from registers:
//
//   - wgmma multiplies TF32 only with both shared-memory operands K-major
//     (rows along the reduction). The weights are: w [Cout][K]. The
//     gathered tile is not (it runs along pixels, as the gather reads x),
//     so it is the register operand, D^T = col(x)^T * w^T, and its
//     fragments (mma.sync's A layout) come from conv_pipe's k-major tile
//     with conflict-free loads, rounded to TF32 as they are loaded.
//   - The weight tile is rows of 32 floats, exactly 128 bytes, in the
//     128-byte-swizzled layout the descriptor names: 16-byte chunk c of row
//     r at r*128 + 16*(c ^ r%8), so the copies of a row's 8 chunks hit 8
//     different bank groups. The k-steps advance the descriptor 32 bytes
//     within the rows; the swizzle applies to the whole address, which is
//     why the tiles sit on 1024-byte boundaries.
//   - The accumulators (64 or 128 per thread) go to the C tile transposed,
//     rows of channels, for conv.cu's epilogue.
//
// The weights come rounded to TF32 (ops rounds them once per launch into
// scratch memory): the MMAs read them as they are. Per k-tile each thread
// waits for its copies and fences them for the async proxy that wgmma
// reads through; one barrier; the copies of the k-tile kStages-1 ahead are
// issued; then the four MMAs, and the wait for them before the stage can
// be refilled.
#define STHENO_CONV_TEMPLATES_ONLY
#include "conv.cu"

namespace stheno {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Makes this thread's writes to shared memory through the generic proxy
// (stores, cp.async) visible to later reads through the async proxy.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// Keeps the compiler from moving an accumulator across the asynchronous
// MMAs that write it.
__device__ __forceinline__ void fence_operand(float& r) { asm volatile("" : "+f"(r)::"memory"); }

// Shared-memory matrix descriptor of a K-major tile in the 128-byte
// swizzle: start address, leading byte offset (unused by this layout:
// 1), stride byte offset 1024 (between groups of 8 rows), layout 1 in
// bits 62-63.
__device__ __forceinline__ uint64_t desc_sw128(uint32_t addr) {
  return static_cast<uint64_t>((addr >> 4) & 0x3FFF) | (static_cast<uint64_t>(1) << 16) |
         (static_cast<uint64_t>(1024 >> 4) << 32) | (static_cast<uint64_t>(1) << 62);
}

// d[64xN] += a[64x8] * b[8xN] for one warpgroup, TF32 operands, FP32
// accumulation, N = 128 or 256 (by the size of d): a from registers (per
// warp, mma.sync's m16k8 A fragment of rows 16*warp..), b through its
// descriptor. d holds, for n-block j, {D[g][8j+2t], D[g][8j+2t+1],
// D[g+8][8j+2t], D[g+8][8j+2t+1]} with g = lane/4 and t = lane%4, rows
// offset by 16*warp.
__device__ __forceinline__ void wgmma_tf32(float (&d)[64], const uint32_t (&a)[4], uint64_t b) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
      "{%64, %65, %66, %67}, %68, 1, 1, 1;\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}

__device__ __forceinline__ void wgmma_tf32(float (&d)[128], const uint32_t (&a)[4], uint64_t b) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n256k8.f32.tf32.tf32 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, "
      "{%128, %129, %130, %131}, %132, 1, 1, 1;\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
        "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
        "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
        "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
        "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
        "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
        "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
        "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
        "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}

// The block tile and shared memory: kBM output channels (the MMAs' N, 128
// or 256) x 128 pixels, kStages stages. BPixelPipe reads BK, LDB, kBRows,
// kBKPer, kBNPer and kMaskTaps; the epilogue BM, BN, NT and LDC.
template <int kBM, int kNumStages, bool kDeferWait, bool kWgrad = false>
struct WgmmaPipe {
  static constexpr int BM = kBM, BN = 128, BK = 32, NT = 256;
  static constexpr int kStages = kNumStages;
  // wgrad: the gathered tile is col(x)^T, n-major (rows of 32 pixels), as
  // conv.cu's BWgradPipe stages it.
  static constexpr bool kNMajorB = kWgrad;
  // kDefer: a k-tile's MMAs are left running while the warps go on to the
  // next k-tile's barrier and copies, and waited for just before the next
  // k-tile's fragments are loaded (the MMAs read their register operand
  // asynchronously: overwriting it sooner is undefined, and measured
  // wrong); the copies then run kStages-2 k-tiles ahead instead of
  // kStages-1, so that no stage is refilled while MMAs may read it.
  static constexpr bool kDefer = kDeferWait;
  static constexpr int kAhead = kDefer ? kStages - 2 : kStages - 1;
  static constexpr int kAcc = BM / 2;  // accumulators per thread: 64 x BM over 128 threads
  static constexpr int LDB = kNMajorB ? BK + 4 : BN + 8, LDC = BN + 8;
  static constexpr int kABytes = BM * BK * 4;                        // the swizzled weight (or dy) tile
  static constexpr int kBBytes = (kNMajorB ? BN : BK) * LDB * 4;  // the gathered tile
  static constexpr int kStageBytes = kABytes + kBBytes;
  static constexpr int kPipeBytes = kStages * kStageBytes;
  static constexpr int kCBytes = BM * LDC * 4;
  static constexpr int kMainBytes = kPipeBytes > kCBytes ? kPipeBytes : kCBytes;
  static constexpr int kTabSlots = 4;
  // 1024 bytes of slack to put the stages on a 1024-byte boundary.
  static constexpr int kSmemBytes = 1024 + kMainBytes + kTabSlots * BK * 16;
  static constexpr int kBRows = NT / 32, kBKPer = BK / kBRows, kBNPer = BN / 32;
  // BWgradPipe's lanes: along k, n rows tid/32 + 8*a, or by 16-byte copies
  // n rows tid/8 + 32*a.
  static constexpr int kBTRows = NT / BK, kBTPer = BN / kBTRows;
  static constexpr int kBTVecRows = NT / 8, kBTVecPer = BN / kBTVecRows;
  static constexpr int kMaskTaps = 32;
  static_assert(BM == 128 || BM == 256, "wgmma's N");
  static_assert(BK * 4 == 128, "a weight row is one 128-byte swizzle row");
  static_assert(kABytes % 1024 == 0 && kStageBytes % 1024 == 0, "every stage's weight tile on a 1024-byte boundary");
  static_assert(kTabSlots >= kAhead + 1 && NT / 32 >= kAhead + 1, "a row table per k-tile in flight, one warp each");
  static_assert(kAhead >= 1, "copies in flight");
};
// m128_s3: 128 channels, three stages, two blocks per SM. m256_s4: 256
// channels (each gathered pixel feeds twice the MMAs), four stages, one
// block per SM, MMAs waited for a k-tile late. m128_s4: m128_s3's tile
// with m256_s4's pipeline.
using WgmmaM128S3 = WgmmaPipe<128, 3, false>;
using WgmmaM256S4 = WgmmaPipe<256, 4, true>;
using WgmmaM128S4 = WgmmaPipe<128, 4, true>;
// wgrad: 128 or 256 output channels x 128 taps, pixels reduced.
using WgradWgmmaM128S3 = WgmmaPipe<128, 3, false, true>;
using WgradWgmmaM256S4 = WgmmaPipe<256, 4, true, true>;
// The tiles are conv.cu's float32 ones in width and k-tile depth.
static_assert(WgmmaM128S3::BN == GemmShape<float, kFprop>::BN && WgmmaM128S3::BK == GemmShape<float, kFprop>::BK,
              "ConvF32TileN pixels wide, k-tiles ConvF32TileK deep");
// What a launch needs, for kernels/cuda: the shared memory of each kernel
// (fprop and dgrad share their tiles), the tiles' rows and the threads.
// stheno:const ConvFpropWgmmaM128S3SmemBytes
static_assert(WgmmaM128S3::kSmemBytes == 104448, "kernels/cuda exports it");
// stheno:const ConvDgradWgmmaM128S3SmemBytes
static_assert(WgmmaM128S3::kSmemBytes == 104448, "kernels/cuda exports it");
// stheno:const ConvWgradWgmmaM128S3SmemBytes
static_assert(WgradWgmmaM128S3::kSmemBytes == 107520, "kernels/cuda exports it");
// stheno:const ConvWgmmaM128S3TileM
static_assert(WgmmaM128S3::BM == 128, "kernels/cuda exports it");
// stheno:const ConvFpropWgmmaM256S4SmemBytes
static_assert(WgmmaM256S4::kSmemBytes == 203776, "kernels/cuda exports it");
// stheno:const ConvDgradWgmmaM256S4SmemBytes
static_assert(WgmmaM256S4::kSmemBytes == 203776, "kernels/cuda exports it");
// stheno:const ConvWgradWgmmaM256S4SmemBytes
static_assert(WgradWgmmaM256S4::kSmemBytes == 207872, "kernels/cuda exports it");
// stheno:const ConvWgmmaM256S4TileM
static_assert(WgmmaM256S4::BM == 256, "kernels/cuda exports it");
// stheno:const ConvFpropWgmmaM128S4SmemBytes
static_assert(WgmmaM128S4::kSmemBytes == 138240, "kernels/cuda exports it");
// stheno:const ConvDgradWgmmaM128S4SmemBytes
static_assert(WgmmaM128S4::kSmemBytes == 138240, "kernels/cuda exports it");
// stheno:const ConvWgmmaM128S4TileM
static_assert(WgmmaM128S4::BM == 128, "kernels/cuda exports it");
// stheno:const ConvWgmmaThreads
static_assert(WgmmaM128S3::NT == 256, "kernels/cuda exports it");

// The weights (fprop: w [Cout][K]; dgrad: the transposed weights
// [Cin][Cout*KH*KW]), already rounded to TF32 (ops rounds them into
// scratch memory once per launch, transpose_weights' round_tf32), by
// 16-byte copies into the swizzled tile: thread tid copies chunk tid%8 of
// rows tid/8 + 32*i. Needs K % 4 == 0 and A 16-byte aligned (ops checks).
// A copy past the last row or past K reads nothing and writes zeros.
template <typename C>
struct WeightPipe {
  static constexpr int kRowsPer = C::NT / 8, kPer = C::BM / kRowsPer;
  const float* a;
  int rows_left, kc;
  uint32_t soff;  // byte offset of this thread's first chunk in a stage

  __device__ __forceinline__ void init(const ConvGemmParams& p, int tid, int m0) {
    const int row = tid / 8, c = tid % 8;
    kc = 4 * c;
    rows_left = p.m - m0 - row;
    a = reinterpret_cast<const float*>(p.a) + static_cast<int64_t>(m0 + row) * p.k + kc;
    // Rows 32 apart share row % 8, and so the swizzle.
    soff = row * 128 + ((c ^ (row & 7)) << 4);
  }

  __device__ __forceinline__ void load(const ConvGemmParams& p, int k0, unsigned char* st) const {
    const bool kv = k0 + kc < p.k;
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const bool v = kv && kRowsPer * i < rows_left;
      cp_async16(st + soff + i * kRowsPer * 128, a + (static_cast<int64_t>(i) * kRowsPer * p.k + k0), v ? 16 : 0);
    }
  }
};

// wgrad's dy' (masked, rounded to TF32 by the layer's one elementwise pass
// of the backward: conv_bn.cu's relu_mask_sum_tf32 or
// bn_backward_apply_tf32, or by the wgrad's own relu_mask_sum_tf32 pass
// otherwise), [N][Cout][P] as the Cout x (N*P) matrix whose element (m, k)
// with k = n*P + pixel sits at m*P + k + n*(Cout-1)*P (as conv.cu's
// APipe), into the swizzled tile as WeightPipe copies the weights: 16-byte
// copies, so P % 4 == 0 (a chunk never straddles two images) and dy'
// 16-byte aligned (ops checks).
template <typename C>
struct DyPipe {
  static constexpr int kRowsPer = C::NT / 8, kPer = C::BM / kRowsPer;
  const float* a;
  int rows_left, kc;
  uint32_t soff;

  __device__ __forceinline__ void init(const ConvGemmParams& p, int tid, int m0) {
    const int row = tid / 8, c = tid % 8;
    kc = 4 * c;
    rows_left = p.m - m0 - row;
    a = reinterpret_cast<const float*>(p.a) + static_cast<int64_t>(m0 + row) * p.div_q.d + kc;
    soff = row * 128 + ((c ^ (row & 7)) << 4);
  }

  __device__ __forceinline__ void load(const ConvGemmParams& p, int k0, unsigned char* st) const {
    const bool kv = k0 + kc < p.k;
    const int n = fdiv(kv ? k0 + kc : 0, p.div_q);
    const int64_t col = k0 + static_cast<int64_t>(n) * (p.cout - 1) * p.div_q.d;
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const bool v = kv && kRowsPer * i < rows_left;
      cp_async16(st + soff + i * kRowsPer * 128, a + (static_cast<int64_t>(i) * kRowsPer * p.div_q.d + col), v ? 16 : 0);
    }
  }
};

// A warpgroup's 64 pixels x BM channels. Warp w (of the block) holds
// pixels 16w + g and 16w + g + 8 of the tile.
// The gathered tile is k-major (rows of k, fprop and dgrad) or, with
// C::kNMajorB, m-major (rows of 32 k, wgrad's col(x)^T); both are read
// without bank conflicts.
template <typename C>
struct WgmmaWarps {
  float acc[C::kAcc];
  int frag;  // offset of this lane's fragment in the gathered tile
  int g, t4, warp;
  // Offsets of a fragment's rows +8 and columns +4, and of k-step ks.
  static constexpr int kRow8 = C::kNMajorB ? 8 * C::LDB : 8, kCol4 = C::kNMajorB ? 4 : 4 * C::LDB;
  static constexpr int kStep = C::kNMajorB ? 8 : 8 * C::LDB;

  __device__ __forceinline__ void init(int tid) {
    warp = tid >> 5;
    const int lane = tid & 31;
    g = lane >> 2;
    t4 = lane & 3;
    frag = C::kNMajorB ? (16 * warp + g) * C::LDB + t4 : t4 * C::LDB + 16 * warp + g;
#pragma unroll
    for (int i = 0; i < C::kAcc; ++i) acc[i] = 0.0f;
  }

  __device__ __forceinline__ void step(const unsigned char* st) {
    const float* sb = reinterpret_cast<const float*>(st + C::kABytes);
    uint32_t a[C::BK / 8][4];
#pragma unroll
    for (int ks = 0; ks < C::BK / 8; ++ks) {
      const float* q = sb + ks * kStep + frag;
      a[ks][0] = to_tf32_for_mma(q[0]);
      a[ks][1] = to_tf32_for_mma(q[kRow8]);
      a[ks][2] = to_tf32_for_mma(q[kCol4]);
      a[ks][3] = to_tf32_for_mma(q[kRow8 + kCol4]);
    }
    const uint32_t w = smem_u32(st);
#pragma unroll
    for (int i = 0; i < C::kAcc; ++i) fence_operand(acc[i]);
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < C::BK / 8; ++ks) wgmma_tf32(acc, a[ks], desc_sw128(w + ks * 32));
    wgmma_commit();
    if constexpr (!C::kDefer) finish();
  }

  // Waits for the MMAs issued so far: before the accumulators are read,
  // and with kDefer before the next step, whose fragment loads would
  // otherwise overwrite registers the running MMAs still read.
  __device__ __forceinline__ void finish() {
    wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < C::kAcc; ++i) fence_operand(acc[i]);
  }

  // The C tile as the epilogue reads it: rows of channels, columns of pixels.
  __device__ __forceinline__ void store(float* sc) const {
    const int pix = 16 * warp + g;
#pragma unroll
    for (int j = 0; j < C::BM / 8; ++j) {
      const int co = 8 * j + 2 * t4;
      sc[co * C::LDC + pix] = acc[4 * j];
      sc[(co + 1) * C::LDC + pix] = acc[4 * j + 1];
      sc[co * C::LDC + pix + 8] = acc[4 * j + 2];
      sc[(co + 1) * C::LDC + pix + 8] = acc[4 * j + 3];
    }
  }
};

template <typename C, int kMode, int kGather>
__device__ __forceinline__ void conv_wgmma(const ConvGemmParams& p) {
  using BL = BPixelPipe<C, kMode, kGather>;
  unsigned char* raw = dynamic_smem();
  unsigned char* smem = raw + ((1024 - (smem_u32(raw) & 1023)) & 1023);
  int4* tabs = reinterpret_cast<int4*>(smem + C::kMainBytes);
  const int tid = threadIdx.x, warp = tid >> 5;
  const unsigned tiles_m = static_cast<unsigned>(p.tiles_m);
  const int tile_m = static_cast<int>(blockIdx.x % tiles_m);
  const int tile_n = static_cast<int>(blockIdx.x / tiles_m);
  const int m0 = tile_m * C::BM, n0 = tile_n * C::BN;
  const int k_tiles = (p.k + C::BK - 1) / C::BK;
  auto stage = [&](int s) { return smem + s * C::kStageBytes; };
  auto tab = [&](int kt) { return tabs + (kt & (C::kTabSlots - 1)) * C::BK; };

  WeightPipe<C> al;
  al.init(p, tid, m0);
  BL bl;
  bl.init(p, tid, n0);
  WgmmaWarps<C> mm;
  mm.init(tid);
  auto load = [&](int kt, unsigned char* st) {
    al.load(p, kt * C::BK, st);
    bl.load(p, tab(kt), reinterpret_cast<float*>(st + C::kABytes));
  };

  // As conv_pipe: the first kAhead+1 row tables, then kAhead k-tiles in
  // flight, a commit group per slot, empty or not (so that "k-tile kt has
  // landed" is always "at most kAhead-1 groups pending").
  if (warp <= C::kAhead) BL::build_rows(p, warp * C::BK, p.k, tab(warp));
  __syncthreads();
#pragma unroll
  for (int s = 0; s < C::kAhead; ++s) {
    if (s < k_tiles) load(s, stage(s));
    cp_async_commit();
  }
  int read = 0, write = C::kAhead;  // stages of k-tiles kt and kt+kAhead
  for (int kt = 0; kt < k_tiles; ++kt) {
    cp_async_wait<C::kAhead - 1>();
    fence_proxy_async();
    // After it k-tile kt is in shared memory, visible to wgmma; the MMAs
    // that read the stage refilled next are done (each warpgroup waited
    // for its own: kt-1's, or with kDefer kt-2's, before it issued kt-1's);
    // and the row table of k-tile kt+kAhead is complete.
    __syncthreads();
    const int next = kt + C::kAhead;
    if (next < k_tiles) load(next, stage(write));
    cp_async_commit();
    if (warp == (kt & (C::NT / 32 - 1)) && next + 1 < k_tiles) BL::build_rows(p, (next + 1) * C::BK, p.k, tab(next + 1));
    if constexpr (C::kDefer) mm.finish();
    mm.step(stage(read));
    read = read == C::kStages - 1 ? 0 : read + 1;
    write = write == C::kStages - 1 ? 0 : write + 1;
  }
  mm.finish();
  cp_async_wait<0>();
  __syncthreads();
  float* sc = reinterpret_cast<float*>(smem);
  mm.store(sc);
  __syncthreads();
  epilogue<float, kMode, C>(p, sc, m0, n0, tile_n, 0);
}

// wgrad: dw (or split `split`'s partial tile of it) = dy' * col(x)^T over
// the pixels of k-tiles [kt0, kt1), as conv_pipe's wgrad: dy' the
// shared-memory operand (rows of channels, as the weights of fprop), the
// gathered col(x)^T the register operand (its taps the MMAs' M). The bias
// gradient is not summed here (p.bias_grad must be 0): the values the
// MMAs read are rounded, and the bias gradient is a sum of the unrounded
// ones, which the pass that rounds them takes.
template <typename C, bool kPoint>
__device__ __forceinline__ void conv_wgmma_wgrad(const ConvGemmParams& p) {
  using BL = BWgradPipe<C, kPoint>;
  unsigned char* raw = dynamic_smem();
  unsigned char* smem = raw + ((1024 - (smem_u32(raw) & 1023)) & 1023);
  int4* tabs = reinterpret_cast<int4*>(smem + C::kMainBytes);
  const int tid = threadIdx.x;
  const unsigned tiles_m = static_cast<unsigned>(p.tiles_m);
  const int tile_m = static_cast<int>(blockIdx.x % tiles_m);
  const int tile_n = static_cast<int>(blockIdx.x / tiles_m);
  const int m0 = tile_m * C::BM, n0 = tile_n * C::BN;
  const int k_tiles = (p.k + C::BK - 1) / C::BK;
  const int split = static_cast<int>(blockIdx.z);
  const int kt0 = split * p.k_tiles_per_split;
  const int kt1 = min(kt0 + p.k_tiles_per_split, k_tiles);
  auto stage = [&](int s) { return smem + s * C::kStageBytes; };

  DyPipe<C> al;
  al.init(p, tid, m0);
  BL bl;
  bl.init(p, tid, n0);
  WgmmaWarps<C> mm;
  mm.init(tid);
  auto load = [&](int kt, unsigned char* st) {
    al.load(p, kt * C::BK, st);
    bl.load(p, kt * C::BK, tabs, reinterpret_cast<float*>(st + C::kABytes));
  };

  BL::build_table(p, n0, tabs);
  __syncthreads();
#pragma unroll
  for (int s = 0; s < C::kAhead; ++s) {
    if (kt0 + s < kt1) load(kt0 + s, stage(s));
    cp_async_commit();
  }
  int read = 0, write = C::kAhead;
  for (int kt = kt0; kt < kt1; ++kt) {
    cp_async_wait<C::kAhead - 1>();
    fence_proxy_async();
    // As conv_wgmma's loop.
    __syncthreads();
    const int next = kt + C::kAhead;
    if (next < kt1) load(next, stage(write));
    cp_async_commit();
    if constexpr (C::kDefer) mm.finish();
    mm.step(stage(read));
    read = read == C::kStages - 1 ? 0 : read + 1;
    write = write == C::kStages - 1 ? 0 : write + 1;
  }
  mm.finish();
  cp_async_wait<0>();
  __syncthreads();
  float* sc = reinterpret_cast<float*>(smem);
  mm.store(sc);
  __syncthreads();
  epilogue<float, kWgrad, C>(p, sc, m0, n0, tile_n, split);
}

// The gather, chosen at run time as conv_pipe's.
template <typename C, int kMode>
__device__ __forceinline__ void conv_wgmma(const ConvGemmParams& p) {
  if (pointwise(p) && p.div_img.d % 4 == 0 && p.b % 16 == 0) {
    conv_wgmma<C, kMode, kGatherPointwise>(p);
  } else if (p.kh * p.kw <= C::kMaskTaps) {
    conv_wgmma<C, kMode, kGatherMask>(p);
  } else {
    conv_wgmma<C, kMode, kGatherCompare>(p);
  }
}

}  // namespace stheno

extern "C" {
// Two blocks per SM: at most 128 registers, 64 of them accumulators.
__global__ void __launch_bounds__(256, 2) conv_fprop_wgmma_m128_s3_f32(stheno::ConvGemmParams p) {
  stheno::conv_wgmma<stheno::WgmmaM128S3, stheno::kFprop>(p);
}
// One block per SM: 128 accumulators.
__global__ void __launch_bounds__(256, 1) conv_fprop_wgmma_m256_s4_f32(stheno::ConvGemmParams p) {
  stheno::conv_wgmma<stheno::WgmmaM256S4, stheno::kFprop>(p);
}
__global__ void __launch_bounds__(256, 1) conv_fprop_wgmma_m128_s4_f32(stheno::ConvGemmParams p) {
  stheno::conv_wgmma<stheno::WgmmaM128S4, stheno::kFprop>(p);
}
// Stride 1 only; dy already masked (as conv_dgrad_mma_m128_s3_f32).
__global__ void __launch_bounds__(256, 2) conv_dgrad_wgmma_m128_s3_f32(stheno::ConvGemmParams p) {
  stheno::conv_wgmma<stheno::WgmmaM128S3, stheno::kDgrad>(p);
}
__global__ void __launch_bounds__(256, 1) conv_dgrad_wgmma_m256_s4_f32(stheno::ConvGemmParams p) {
  stheno::conv_wgmma<stheno::WgmmaM256S4, stheno::kDgrad>(p);
}
__global__ void __launch_bounds__(256, 1) conv_dgrad_wgmma_m128_s4_f32(stheno::ConvGemmParams p) {
  stheno::conv_wgmma<stheno::WgmmaM128S4, stheno::kDgrad>(p);
}
// dy' masked and rounded to TF32 beforehand, OutH*OutW % 4 == 0, dy'
// 16-byte aligned (as conv_wgrad_mma_m128_s3_f32's 16-byte copies of dy);
// no bias gradient.
__global__ void __launch_bounds__(256, 2) conv_wgrad_wgmma_m128_s3_f32(stheno::ConvGemmParams p) {
  if (stheno::pointwise(p) && p.b % 16 == 0) {
    stheno::conv_wgmma_wgrad<stheno::WgradWgmmaM128S3, true>(p);
  } else {
    stheno::conv_wgmma_wgrad<stheno::WgradWgmmaM128S3, false>(p);
  }
}
__global__ void __launch_bounds__(256, 1) conv_wgrad_wgmma_m256_s4_f32(stheno::ConvGemmParams p) {
  if (stheno::pointwise(p) && p.b % 16 == 0) {
    stheno::conv_wgmma_wgrad<stheno::WgradWgmmaM256S4, true>(p);
  } else {
    stheno::conv_wgmma_wgrad<stheno::WgradWgmmaM256S4, false>(p);
  }
}
}
