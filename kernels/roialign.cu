// RoIAlign forward and backward, the CUDA twins of kernels/roialign.go.
// Kernels are named <op>_<pass>_<layout>_<design>[_occ<blocks>]_<dtype>:
// fwd or bwd; nchw (reads the NCHW input directly) or nhwc (works on a
// channels-last copy); taps (a sample's 4 taps one by one), sep
// (separable: each pixel of a bin's footprint once), bin (a thread per
// bin), cols (lanes on a bin row's sample columns); c<n>: channels a
// thread; vec4 / red4: 16-byte vector loads / reductions of 4 channels;
// atomic: scalar atomics; occ<n>: registers capped for n blocks per SM.
// ops picks among them (roiAlignKernelFor, by measurements that
// BENCHMARKS.md records); the kernels it never picks are variants
// (#if STHENO_KERNEL_VARIANTS), for tests and benchmarks only:
//
// - roialign_fwd_nchw_cols_s<S>[_cmajor]: straight from the NCHW input,
//   lanes on a bin row's sample columns, so that a warp's load reads one
//   stretch of a pixel row. The default float32 forward for a fixed
//   sampling ratio S where a bin row's PW*S samples fit a warp.
// - roialign_fwd_nchw_bin_c<n>*: straight from the NCHW input. A thread
//   owns a bin and n channels, computes each sample's taps once and
//   gathers them from all its channels' maps. The fixed-ratio forward
//   elsewhere.
// - roialign_fwd_nhwc_taps / roialign_bwd_nhwc_taps_atomic (channels-last):
//   in NCHW the 4 taps of a sample lie in one channel map, and a warp
//   gathering taps for 32 channels would touch 32 scattered cache lines per
//   load; so the input (or the gradient) is transposed to NHWC with one
//   coalesced pass (transpose_planes) and a warp works on one bin of one
//   RoI with its lanes on 32 consecutive channels: every tap is one
//   128-byte load, or atomic, shared by the warp. Outputs (or their
//   gradients) are staged in shared memory so that the [K,C,PH,PW] side
//   stays coalesced. Backward scatters into a zeroed channels-last gradient
//   that a last pass transposes back to NCHW; it is the default backward
//   for a fixed sampling ratio, except on compute capability 9.0 (below).
// - roialign_*_nhwc_sep*: the channels-last kernels with separable
//   sampling (a bin's row and column weight lists; each pixel of its
//   footprint read or scattered once): the defaults with adaptive
//   sampling, about one sample per pixel.
// - roialign_fwd_nhwc_sep_vec4*: the separable forward with 16-byte loads
//   and channel slices (float32, C % 4 == 0), a kernel of its own: the
//   adaptive forward's default there.
// - On compute capability 9.0, with float32 and C % 4 == 0, the backward is
//   roialign_sm90a.cu's roialign_bwd_nhwc_sep_red4_f32: separable, with
//   16-byte vector reductions (kQuad), two neighbouring bins at a time, for
//   any sampling ratio.
//
// The channels-last kernels take the RoIs in spatial order
// (roialign_sort_rois) and split a RoI's bins over blocks; backward, also
// its channels (grid z slices, so that the gradient being scattered into
// at once fits L2 better).
//
// MultiLevelRoIAlign (torchvision's MultiScaleRoIAlign) runs these kernels
// once per level of a feature pyramid on all of its RoIs, each launch with
// its level's map and scale and level_filter set: a block whose RoI belongs
// to another level (roi_in_level, from the RoI's box alone) returns at
// once. Each RoI is then pooled from its level straight into its row of
// the output, and scatters into its level's gradient only, with no count
// of each level's RoIs on the host and no gather or scatter of RoIs.
#include <limits>

#include "atomics.cuh"
#include "bilinear.cuh"
#include "params_gen.cuh"

namespace stheno {

// The RoIAlign kernels' launch parameters, passed by value.
struct RoIAlignParams {
  uint64_t feat;    // channels-last [N,H,W,C]: forward: x (read); backward: grad_x (scattered into)
  uint64_t rois;    // [K,5] rows (batch_index, x1, y1, x2, y2)
  uint64_t pooled;  // forward: out [K,C,PH,PW] (written); backward: grad_out (read)
  uint64_t status;  // int status word, see Status in bilinear.cuh
  uint64_t order;   // int32 [K]: block b works on RoI order[b] (roialign_sort_rois), or 0: on RoI b
  double spatial_scale;
  int32_t n, c, h, w, k;
  int32_t pooled_h, pooled_w;
  int32_t sampling_ratio;     // <= 0: adaptive
  int32_t aligned;            // bool
  int32_t max_adaptive_grid;  // adaptive samples per bin side above which a RoI is an error
  // MultiLevelRoIAlign: with level_filter set, the blocks work on the RoIs
  // of one level of a feature pyramid only, those whose roi_level_size is
  // in [level_lo, level_hi); the others' outputs are left as they are
  // (another level's launch writes them) and they scatter nothing.
  double level_lo, level_hi;
  int32_t level_filter;  // bool
  int32_t unused;
};
STHENO_PARAMS(RoIAlignParams);

// stheno:const RoIAlignWarps
// A block is one RoI: 8 warps, each on groups of 32 channels (one per lane).
constexpr int kWarps = 8;
// stheno:const RoIAlignThreads
// The threads of a block: the channels-last kernels' kWarps warps, and the
// most the NCHW kernels take.
constexpr int kThreads = kWarps * 32;

// The status codes (bilinear.cuh's Status) the kernels raise, which ops
// explains.
// stheno:const RoIAlignStatusBadBatchIndex
static_assert(kStatusBadBatchIndex == 1, "kernels/cuda exports the status codes");
// stheno:const RoIAlignStatusAdaptiveGridTooLarge
static_assert(kStatusAdaptiveGridTooLarge == 2, "kernels/cuda exports the status codes");

__device__ __forceinline__ int64_t roi_of(const RoIAlignParams& p, unsigned block) {
  return p.order != 0 ? reinterpret_cast<const int*>(p.order)[block] : static_cast<int64_t>(block);
}

// The size by which MultiLevelRoIAlign gives a RoI its level, as
// kernels.RoILevelSize: sqrt(w*h) of its box in image pixels, in double
// from the T coordinates (each product and difference rounded once, as Go
// rounds them: the CPU twin's value, bit for bit); -inf for an empty,
// inverted or NaN box (the finest level), and at most the largest finite
// double (an infinite box stays below +inf, the coarsest level's bound).
template <typename T>
__device__ __forceinline__ double roi_level_size(const T* __restrict__ roi) {
  const double w = static_cast<double>(roi[3]) - static_cast<double>(roi[1]);
  const double h = static_cast<double>(roi[4]) - static_cast<double>(roi[2]);
  if (!(w > 0 && h > 0)) return -std::numeric_limits<double>::infinity();
  return fmin(sqrt(w * h), std::numeric_limits<double>::max());
}

// Whether a block works on a RoI: every RoI, or with level_filter those of
// its level. A RoI's level is a property of its box alone, so each RoI is
// in exactly one of a pyramid's launches (sizes are never NaN).
template <typename T>
__device__ __forceinline__ bool roi_in_level(const RoIAlignParams& p, const T* __restrict__ roi) {
  if (!p.level_filter) return true;
  const double s = roi_level_size(roi);
  return s >= p.level_lo && s < p.level_hi;
}

// RoIs in spatial order (roialign_sort_rois). Blocks start roughly in
// blockIdx order, so with the RoIs sorted by image, then by band of
// kOrderBand rows of their centre, then by their centre's column, the
// blocks running together touch neighbouring parts of the map: their taps
// hit in L2 and, backward, their atomics meet in L2 rather than in DRAM
// (the backward is faster, sort included). The NCHW kernels do not use it:
// their concurrent blocks already share channel planes, and the order made
// them slower. One block of kOrderThreads threads sorts up to kMaxOrder
// RoIs (bitonic, in shared memory); the launch's other blocks zero.
// stheno:const RoIAlignSortMax
constexpr int kMaxOrder = 4096;
// stheno:const RoIAlignSortThreads
constexpr int kOrderThreads = 1024;
constexpr int kOrderBand = 16;

struct RoIOrderParams {
  uint64_t rois;  // [K,5]
  uint64_t order;  // int32 [K], written
  double spatial_scale;
  int32_t k, unused;
  uint64_t zero;       // 16-byte aligned memory blocks 1.. zero while block 0 sorts, or 0
  int64_t zero_bytes;  // a multiple of 16
};
STHENO_PARAMS(RoIOrderParams);

// A sort key clamped into [0, 4095]; NaN and negatives give 0.
template <typename T>
__device__ __forceinline__ uint32_t order_field(T v) {
  return v >= T(0) ? static_cast<uint32_t>(fmin(v, T(4095))) : 0u;
}

template <typename T>
__device__ void sort_rois(const RoIOrderParams& p) {
  if (blockIdx.x > 0) {
    // The backward's gradient, zeroed alongside the sort (one launch
    // instead of a memset and then the sort).
    int4* z = reinterpret_cast<int4*>(p.zero);
    const int64_t n = p.zero_bytes / 16, step = static_cast<int64_t>(gridDim.x - 1) * blockDim.x;
    for (int64_t i = static_cast<int64_t>(blockIdx.x - 1) * blockDim.x + threadIdx.x; i < n; i += step) {
      z[i] = make_int4(0, 0, 0, 0);
    }
    return;
  }
  __shared__ uint64_t keys[kMaxOrder];
  int size = 1;
  while (size < p.k) size *= 2;
  const T* r = reinterpret_cast<const T*>(p.rois);
  const T scale = static_cast<T>(p.spatial_scale);
  for (int i = threadIdx.x; i < size; i += blockDim.x) {
    uint64_t key = ~0ull;
    if (i < p.k) {
      const T* row = r + static_cast<int64_t>(i) * 5;
      const uint32_t b = order_field(row[0]) & 0xff;
      const uint32_t band = order_field((row[2] + row[4]) * T(0.5) * scale / T(kOrderBand));
      const uint32_t col = order_field((row[1] + row[3]) * T(0.5) * scale);
      key = (static_cast<uint64_t>(b << 24 | band << 12 | col) << 32) | static_cast<uint32_t>(i);
    }
    keys[i] = key;
  }
  __syncthreads();
  for (int k = 2; k <= size; k *= 2) {
    for (int j = k / 2; j > 0; j /= 2) {
      for (int i = threadIdx.x; i < size; i += blockDim.x) {
        const int o = i ^ j;
        if (o > i) {
          const bool up = (i & k) == 0;
          const uint64_t a = keys[i], b = keys[o];
          if ((a > b) == up) {
            keys[i] = b;
            keys[o] = a;
          }
        }
      }
      __syncthreads();
    }
  }
  int* order = reinterpret_cast<int*>(p.order);
  for (int i = threadIdx.x; i < p.k; i += blockDim.x) order[i] = static_cast<int>(keys[i] & 0xffffffffu);
}

// A sample's four taps as kept in shared memory, read by a warp with two
// broadcast loads.
template <typename T>
struct alignas(16) SharedTap {
  int off[4];
  T w[4];
};

// Bins per output tile of a warp: [32 channels][tile_bins] staged in shared
// memory so that the [K,C,PH,PW] output is written (and, backward, read)
// bins-fastest, coalesced.
template <typename T>
__host__ __device__ constexpr int tile_bins() {
  return sizeof(T) == 4 ? 32 : 16;
}

// stheno:const RoIAlignTileBinsF32
static_assert(tile_bins<float>() == 32, "kernels/cuda exports tile_bins");
// stheno:const RoIAlignTileBinsF64
static_assert(tile_bins<double>() == 16, "kernels/cuda exports tile_bins");

// Taps a block keeps in shared memory at once: what is left of the 48 KB of
// static shared memory next to the warps' tiles (12 KB).
template <typename T>
__host__ __device__ constexpr int max_taps() {
  return sizeof(T) == 4 ? 384 : 256;
}

template <typename T>
struct RoIGeom {
  int batch;
  T start_y, start_x, bin_h, bin_w;
  int grid_h, grid_w;  // samples per bin side, >= 0
  T count;             // max(grid_h*grid_w, 1)
};

template <typename T>
__device__ __forceinline__ T ceil_t(T v);
template <>
__device__ __forceinline__ float ceil_t<float>(float v) { return ceilf(v); }
template <>
__device__ __forceinline__ double ceil_t<double>(double v) { return ceil(v); }

// ceil(bin) as an int, as the CPU twin's adaptiveGrid: no samples for a
// negative, NaN or infinite size; kStatusAdaptiveGridTooLarge above the limit.
template <typename T>
__device__ __forceinline__ int adaptive_grid(T bin, int limit, int* status) {
  const double c = static_cast<double>(ceil_t(bin));
  if (!(c > 0) || isinf(c)) return 0;
  if (c > limit) {
    *status = kStatusAdaptiveGridTooLarge;
    return 0;
  }
  return static_cast<int>(c);
}

// The geometry torchvision derives from one RoI row, computed in T exactly as
// roiGeometry in roialign.go. Returns a status code.
template <typename T>
__device__ int roi_geometry(const RoIAlignParams& p, const T* __restrict__ roi, RoIGeom<T>* g) {
  int status = kStatusOK;
  const T b = roi[0];
  if (!(b > T(-1) && b < static_cast<T>(p.n))) {
    g->batch = -1;
    g->grid_h = g->grid_w = 0;
    g->count = T(1);
    return kStatusBadBatchIndex;
  }
  g->batch = static_cast<int>(b);
  const T scale = static_cast<T>(p.spatial_scale);
  const T offset = p.aligned ? T(0.5) : T(0);
  // Rounded as the CPU twin does (mul_sub_rn): the adaptive grid is a
  // ceiling of what follows.
  g->start_x = mul_sub_rn(roi[1], scale, offset);
  g->start_y = mul_sub_rn(roi[2], scale, offset);
  const T end_x = mul_sub_rn(roi[3], scale, offset);
  const T end_y = mul_sub_rn(roi[4], scale, offset);
  T roi_w = end_x - g->start_x;
  T roi_h = end_y - g->start_y;
  if (!p.aligned) {
    // Legacy mode forces malformed RoIs to be at least 1x1. A NaN size
    // stays NaN, as with Go's max in the CPU twin (and torchvision's CPU
    // std::max): its samples are NaN, outside the map, and the RoI pools
    // zeros, whichever of its coordinates is NaN. (roi_w > 1 ? roi_w : 1,
    // or fmax, which torchvision's CUDA max is, would make it 1 and pool a
    // pixel-wide strip.)
    roi_w = roi_w < T(1) ? T(1) : roi_w;
    roi_h = roi_h < T(1) ? T(1) : roi_h;
  }
  g->bin_h = roi_h / static_cast<T>(p.pooled_h);
  g->bin_w = roi_w / static_cast<T>(p.pooled_w);
  if (p.sampling_ratio > 0) {
    g->grid_h = g->grid_w = p.sampling_ratio;
  } else {
    g->grid_h = adaptive_grid(g->bin_h, p.max_adaptive_grid, &status);
    g->grid_w = adaptive_grid(g->bin_w, p.max_adaptive_grid, &status);
    if (status != kStatusOK) g->grid_h = g->grid_w = 0;
  }
  const int cnt = g->grid_h * g->grid_w;
  g->count = static_cast<T>(cnt > 1 ? cnt : 1);
  return status;
}

// Taps of sample (iy, ix) of bin (ph, pw): same expression and order as
// planBins in roialign.go. Returns false for a sample outside the map.
template <typename T>
__device__ __forceinline__ bool sample_taps(const RoIAlignParams& p, const RoIGeom<T>& g, int ph, int pw, int iy,
                                            int ix, Taps<T>* t) {
  const T y = sample_coord(g.start_y, ph, g.bin_h, iy, g.grid_h);
  const T x = sample_coord(g.start_x, pw, g.bin_w, ix, g.grid_w);
  return roi_taps(y, x, p.h, p.w, t);
}

// ---------------------------------------------------------------------------
// Separable sampling. A tap's bilinear weight is a row weight times a column
// weight, and the rule that drops a sample (y outside [-1, H] or x outside
// [-1, W]) is a row test and a column test: so a bin's sum over its
// grid_h x grid_w samples is sum_r A[r] * sum_c B[c] * x[r][c], where A[r] is
// what the bin's sample rows give pixel row r (dropped ones nothing), B[c]
// likewise. The bin then reads (or, backward, scatters to) each pixel of its
// footprint once, instead of once per sample tap that covers it: with
// adaptive sampling (about one sample per pixel) that is about 4x fewer
// loads and atomics. It is the same function as the tap-by-tap sum; only
// the rounding of the sums differs.

// A bin's row (or column) list: up to two entries per sample, pixels
// nondecreasing, equal neighbours merged. put(n, pixel, weight) writes
// entry n, add(n, weight) adds to it, at(n, pixel) says whether entry n is
// that pixel's; the list's length is returned.
template <typename T, typename Put, typename Add, typename At>
__device__ int axis_walk(T start, int b, T bin, int grid, int size, Put put, Add add, At at) {
  int n = 0;
  for (int i = 0; i < grid; ++i) {
    T v = sample_coord(start, b, bin, i, grid);
    int i0;
    T l;
    if (!roi_axis(v, size, &i0, &l)) continue;
    const T wt[2] = {T(1) - l, l};
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int pix = i0 + e;
      if (pix >= size) break;
      if (n > 0 && at(n - 1, pix)) {
        add(n - 1, wt[e]);
      } else {
        put(n++, pix, wt[e]);
      }
    }
  }
  return n;
}

// axis_walk into separate pixel and weight arrays.
template <typename T>
__device__ void axis_list(T start, int b, T bin, int grid, int size, int* idx, T* w, int* count) {
  *count = axis_walk(
      start, b, bin, grid, size, [&](int n, int at, T wt) { idx[n] = at, w[n] = wt; },
      [&](int n, T wt) { w[n] += wt; }, [&](int n, int pix) { return idx[n] == pix; });
}

// The row and column lists of every bin of a RoI, in the shared memory the
// tap path uses for its taps: bin row ph's list at rows + ph*2*grid_h, its
// length in nrows[ph]; columns alike.
//
// With pairs, also the union of the column lists of bins 2t and 2t+1 of a
// bin row: pair t's columns at pcidx + t*pstride (npc[t] of them), with the
// weight each bin gives them in pw0 and pw1 (0 where a bin has none).
template <typename T>
struct SepTables {
  T* rw;
  T* cw;
  T* pw0;
  T* pw1;
  int* ridx;
  int* cidx;
  int* pcidx;
  int* nrows;
  int* ncols;
  int* npc;
  int rstride, cstride, pstride;

  // Lays the tables out in `bytes` of shared memory at base; false when
  // the RoI's lists could be longer than that holds.
  __device__ bool layout(const RoIAlignParams& p, const RoIGeom<T>& g, unsigned char* base, int bytes,
                         bool pairs = false) {
    rstride = 2 * g.grid_h;
    cstride = 2 * g.grid_w;
    pstride = pairs ? 2 * cstride : 0;
    const int pairs_n = pairs ? (p.pooled_w + 1) / 2 : 0;
    const int64_t nr = static_cast<int64_t>(rstride) * p.pooled_h, nc = static_cast<int64_t>(cstride) * p.pooled_w;
    const int64_t np = static_cast<int64_t>(pstride) * pairs_n;
    const int64_t need = (nr + nc) * static_cast<int64_t>(sizeof(T) + sizeof(int)) +
                         np * static_cast<int64_t>(2 * sizeof(T) + sizeof(int)) +
                         4 * (p.pooled_h + p.pooled_w + pairs_n);
    if (need > bytes) return false;
    rw = reinterpret_cast<T*>(base);  // the T tables first: aligned for double
    cw = rw + nr;
    pw0 = cw + nc;
    pw1 = pw0 + np;
    ridx = reinterpret_cast<int*>(pw1 + np);
    cidx = ridx + nr;
    pcidx = cidx + nc;
    nrows = pcidx + np;
    ncols = nrows + p.pooled_h;
    npc = ncols + p.pooled_w;
    return true;
  }

  // Every thread of the block takes part; the caller syncs after.
  __device__ void build(const RoIAlignParams& p, const RoIGeom<T>& g) {
    for (int i = threadIdx.x; i < p.pooled_h + p.pooled_w; i += blockDim.x) {
      if (i < p.pooled_h) {
        axis_list(g.start_y, i, g.bin_h, g.grid_h, p.h, ridx + i * rstride, rw + i * rstride, nrows + i);
      } else {
        const int b = i - p.pooled_h;
        axis_list(g.start_x, b, g.bin_w, g.grid_w, p.w, cidx + b * cstride, cw + b * cstride, ncols + b);
      }
    }
    if (pstride == 0) return;
    __syncthreads();
    // Pairs: merge the two bins' increasing column lists.
    for (int t = threadIdx.x; t < (p.pooled_w + 1) / 2; t += blockDim.x) {
      const int b0 = 2 * t, b1 = 2 * t + 1;
      const int n0 = ncols[b0], n1 = b1 < p.pooled_w ? ncols[b1] : 0;
      const int* c0 = cidx + b0 * cstride;
      const int* c1 = cidx + b1 * cstride;
      const T* w0 = cw + b0 * cstride;
      const T* w1 = cw + b1 * cstride;
      int* pc = pcidx + t * pstride;
      T* pa = pw0 + t * pstride;
      T* pb = pw1 + t * pstride;
      int i = 0, j = 0, n = 0;
      while (i < n0 || j < n1) {
        const bool take0 = i < n0 && (j >= n1 || c0[i] <= c1[j]);
        const bool take1 = j < n1 && (i >= n0 || c1[j] <= c0[i]);
        pc[n] = take0 ? c0[i] : c1[j];
        pa[n] = take0 ? w0[i++] : T(0);
        pb[n] = take1 ? w1[j++] : T(0);
        ++n;
      }
      npc[t] = n;
    }
  }
};

// The work a block shares out: RoI geometry, its taps in shared memory,
// and each warp's output tile.
template <typename T>
struct Block {
  SharedTap<T> taps[max_taps<T>()];
  T tile[kWarps][32][tile_bins<T>() + 1];  // +1: no bank conflicts on the transposed access
};

// plan_chunk fills taps for bins [b0, b0+nb) of a RoI, bin-major, sample-
// major (iy, ix) within a bin: the CPU twin's order. Samples outside the map
// get zero weights. Every thread of the block takes part.
template <typename T>
__device__ void plan_chunk(const RoIAlignParams& p, const RoIGeom<T>& g, int b0, int nb, SharedTap<T>* taps) {
  const int samples = g.grid_h * g.grid_w;
  for (int i = threadIdx.x; i < nb * samples; i += blockDim.x) {
    const int bin = b0 + i / samples, s = i % samples;
    Taps<T> t;
    SharedTap<T> st;
    const bool ok = sample_taps(p, g, bin / p.pooled_w, bin % p.pooled_w, s / g.grid_w, s % g.grid_w, &t);
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      st.off[c] = ok ? t.off[c] : 0;
      st.w[c] = ok ? t.w[c] : T(0);
    }
    taps[i] = st;
  }
}

// The taps of sample s of bin (ph, pw), from shared memory or, for bins with
// more samples than shared memory holds, computed on the spot.
template <typename T>
__device__ __forceinline__ SharedTap<T> tap_of(const RoIAlignParams& p, const RoIGeom<T>& g, const SharedTap<T>* bt,
                                               int ph, int pw, int s) {
  if (bt != nullptr) return bt[s];
  Taps<T> t;
  SharedTap<T> st;
  const bool ok = sample_taps(p, g, ph, pw, s / g.grid_w, s % g.grid_w, &t);
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    st.off[c] = ok ? t.off[c] : 0;
    st.w[c] = ok ? t.w[c] : T(0);
  }
  return st;
}

// One bin of one channel (the lane's), separably: forward sums it into
// *slot; backward scatters *slot, the bin's output gradient, with atomics.
template <typename T, bool kBackward>
__device__ __forceinline__ void sep_bin(const RoIAlignParams& p, const RoIGeom<T>& g, const SepTables<T>& sep, int ph,
                                        int pw, int64_t chan, T* slot) {
  const int64_t pix = p.c;  // elements between pixels, channels-last
  const int nr = sep.nrows[ph], nc = sep.ncols[pw];
  const int* ri = sep.ridx + ph * sep.rstride;
  const int* ci = sep.cidx + pw * sep.cstride;
  const T* rw = sep.rw + ph * sep.rstride;
  const T* cw = sep.cw + pw * sep.cstride;
  if (!kBackward) {
    const T* m = reinterpret_cast<const T*>(p.feat) + chan;
    T sum = T(0);
    for (int a = 0; a < nr; ++a) {
      const T* row = m + static_cast<int64_t>(ri[a]) * p.w * pix;
      T rs = T(0);
      int b = 0;
      // Four columns at a time: their loads are in flight together.
      for (; b + 4 <= nc; b += 4) {
        T v[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) v[u] = __ldg(row + ci[b + u] * pix);
#pragma unroll
        for (int u = 0; u < 4; ++u) rs += cw[b + u] * v[u];
      }
      for (; b < nc; ++b) rs += cw[b] * __ldg(row + ci[b] * pix);
      sum += rw[a] * rs;
    }
    *slot = sum / g.count;
  } else {
    T* m = reinterpret_cast<T*>(p.feat) + chan;
    const T grad = *slot;
    for (int a = 0; a < nr; ++a) {
      T* row = m + static_cast<int64_t>(ri[a]) * p.w * pix;
      const T gr = grad * rw[a];
      for (int b = 0; b < nc; ++b) {
        if (rw[a] != T(0) && cw[b] != T(0)) atomicAdd(row + ci[b] * pix, gr * cw[b] / g.count);
      }
    }
  }
}

// sep_bin's backward for 4 consecutive channels at chan (kQuad), and for
// up to two neighbouring bins of a bin row at once: pair t of the tables
// (bins 2t and 2t+1; has0/has1 say which of them to scatter). The 4 groups
// of 8 lanes of a warp take the bins' pixel rows row_slot, row_slot + 4,
// ...; a lane adds a pixel's 4 channels with one 16-byte reduction. A pixel
// that several taps of the two bins reach is added once: with a fixed
// sampling ratio a bin's 2x2 samples touch at most 4 rows and 4 columns,
// fewer when they share pixels, and bins a couple of pixels wide or less
// often share their boundary column: markedly fewer reductions than tap by
// tap, and than one bin at a time (BENCHMARKS.md).
template <typename T>
__device__ __forceinline__ void sep_pair_quad(const RoIAlignParams& p, const RoIGeom<T>& g, const SepTables<T>& sep,
                                              int ph, int t, int64_t chan, int row_slot, bool has0, bool has1,
                                              const T (&g0)[4], const T (&g1)[4]) {
  const int64_t pix = p.c;  // elements between pixels, channels-last
  const int nr = sep.nrows[ph], nc = sep.npc[t];
  const int* ri = sep.ridx + ph * sep.rstride;
  const int* ci = sep.pcidx + t * sep.pstride;
  const T* rw = sep.rw + ph * sep.rstride;
  const T* w0 = sep.pw0 + t * sep.pstride;
  const T* w1 = sep.pw1 + t * sep.pstride;
  // A reciprocal, not a division per channel and pixel: within an ulp of
  // the tap-by-tap kernels' (g*w)/count.
  const T inv = T(1) / g.count;
  T* m = reinterpret_cast<T*>(p.feat) + chan;
  for (int a = row_slot; a < nr; a += 4) {
    if (rw[a] == T(0)) continue;
    T* row = m + static_cast<int64_t>(ri[a]) * p.w * pix;
    T r0[4], r1[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) r0[k] = g0[k] * rw[a], r1[k] = g1[k] * rw[a];
    for (int b = 0; b < nc; ++b) {
      const T a0 = has0 ? w0[b] : T(0), a1 = has1 ? w1[b] : T(0);
      if (a0 == T(0) && a1 == T(0)) continue;
      red_add_v4(row + ci[b] * pix, (r0[0] * a0 + r1[0] * a1) * inv, (r0[1] * a0 + r1[1] * a1) * inv,
                 (r0[2] * a0 + r1[2] * a1) * inv, (r0[3] * a0 + r1[3] * a1) * inv);
    }
  }
}

// One block per RoI. The block plans the taps of a chunk of bins once, in
// shared memory; then each warp takes a group of 32 channels and, lane per
// channel, sums every bin's samples from the channels-last input (each tap
// one coalesced load for the warp), in the CPU twin's order. A warp stages
// its [32 channels x bins] results and writes them bins-fastest.
//
// kQuad (backward, float, C % 4 == 0; sm_90 only, from roialign_sm90a.cu):
// the tap-by-tap scatter goes as 16-byte vector reductions. The warp's 32
// channels are 8 lanes' 4 consecutive ones, and its 4 groups of 8 lanes
// take every 4th sample of a bin: one reduction a lane per tap instead of 4
// atomics (the L2 counts requests, not bytes). Separable, a warp takes
// pairs of bins of a bin row (sep_pair_quad) and its groups of 8 lanes the
// pairs' pixel rows.
template <typename T, bool kBackward, bool kQuad = false>
__device__ void roialign(const RoIAlignParams& p, bool separable) {
  static_assert(!kQuad || (kBackward && sizeof(T) == 4), "kQuad: float backward");
  __shared__ Block<T> sh;
  constexpr int kTile = tile_bins<T>();
  const int64_t roi = roi_of(p, blockIdx.x);
  // Another level's RoI (MultiLevelRoIAlign): that level's launch does it.
  if (!roi_in_level(p, reinterpret_cast<const T*>(p.rois) + roi * 5)) return;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int bins = p.pooled_h * p.pooled_w;
  const int64_t pix = p.c;  // elements between pixels, channels-last

  RoIGeom<T> g;
  const int status = roi_geometry(p, reinterpret_cast<const T*>(p.rois) + roi * 5, &g);
  if (status != kStatusOK) {
    if (threadIdx.x == 0) atomicMax(reinterpret_cast<int*>(p.status), status);
    if (!kBackward) {
      // Defined output rather than garbage; the op reports the error.
      T* out = reinterpret_cast<T*>(p.pooled) + roi * p.c * bins;
      for (int64_t i = threadIdx.x; i < static_cast<int64_t>(p.c) * bins; i += blockDim.x) out[i] = T(0);
    }
    return;
  }
  const int samples = g.grid_h * g.grid_w;
  // Separable: the RoI's row and column lists, when they fit where the
  // taps would go (else the taps path).
  SepTables<T> sep;
  separable = separable && samples > 0 &&
              sep.layout(p, g, reinterpret_cast<unsigned char*>(sh.taps), static_cast<int>(sizeof(sh.taps)), kQuad);
  if (separable) {
    sep.build(p, g);
    __syncthreads();
  }
  // Bins per chunk: as many as fit the taps budget, at most a tile; 0 when
  // one bin alone has more samples than the budget (taps computed on the spot).
  int chunk = samples == 0 || separable ? kTile : min(kTile, max_taps<T>() / samples);
  // The separable forward splits the bins evenly over the grid's y blocks
  // (ops may launch more of them than tiles: smaller chunks spread a big
  // RoI's reads over more SMs).
  if (separable && !kBackward) chunk = min(kTile, (bins + static_cast<int>(gridDim.y) - 1) / static_cast<int>(gridDim.y));
  const int step = chunk > 0 ? chunk : kTile;
  const int64_t feat0 = static_cast<int64_t>(g.batch) * p.h * p.w * p.c;
  T (*tile)[kTile + 1] = sh.tile[warp];
  // Channel slices (backward): block z takes channels [c_begin, c_end), a
  // multiple of 32 wide, so that the blocks running together (z is the
  // slowest grid index) scatter into a slice of the gradient that L2 can
  // hold. A warp takes groups of 32 channels; when a slice has fewer groups
  // than warps, the warps of a group share its bins out instead.
  const int slice = (p.c + 32 * static_cast<int>(gridDim.z) - 1) / (32 * static_cast<int>(gridDim.z)) * 32;
  const int c_begin = static_cast<int>(blockIdx.z) * slice, c_end = min(p.c, c_begin + slice);
  const int groups = (c_end - c_begin + 31) / 32;
  int warps_per_group = 1, group = warp, group_stride = kWarps;
  if (kBackward && groups > 0 && groups < kWarps) {
    warps_per_group = kWarps / groups;
    group = warp / warps_per_group;
    group_stride = groups;
  }

  // Blocks (RoI, y) share a RoI's chunks of bins: with few RoIs (mask
  // heads) one block per RoI left most SMs idle at the end of the launch.
  for (int b0 = blockIdx.y * step; b0 < bins; b0 += gridDim.y * step) {
    const int nb = min(step, bins - b0);
    if (chunk > 0 && !separable) {
      __syncthreads();  // the previous chunk's taps are no longer read
      plan_chunk(p, g, b0, nb, sh.taps);
      __syncthreads();
    }
    for (int c0 = c_begin + group * 32; c0 < c_end; c0 += group_stride * 32) {
      const int c = c0 + lane;
      const int nc = min(32, p.c - c0);
      if (kBackward) {
        // Stage the output gradients of these channels and bins.
        const T* gout = reinterpret_cast<const T*>(p.pooled);
        for (int i = lane; i < nc * nb; i += 32) {
          tile[i / nb][i % nb] = __ldg(gout + (roi * p.c + c0 + i / nb) * bins + b0 + i % nb);
        }
        __syncwarp();
      }
      for (int j = warp % warps_per_group; j < nb; j += warps_per_group) {
        const int bin = b0 + j, ph = bin / p.pooled_w, pw = bin % p.pooled_w;
        const SharedTap<T>* bt = chunk > 0 ? sh.taps + j * samples : nullptr;
        if (separable) {
          if constexpr (kQuad) {
            // Bin j leads its pair (pw even); an odd pw is scattered by its
            // pair's lead, j-1, unless that one is in the previous chunk.
            if (pw % 2 == 1 && j > 0) continue;
            const int q = lane % 8, cq = c0 + 4 * q;  // the lane's 4 channels
            if (cq < p.c) {
              const bool has0 = pw % 2 == 0, has1 = !has0 || (pw + 1 < p.pooled_w && j + 1 < nb);
              const int j1 = has0 ? j + 1 : j;
              T g0[4], g1[4];
#pragma unroll
              for (int k = 0; k < 4; ++k) {
                g0[k] = has0 ? tile[4 * q + k][j] : T(0);
                g1[k] = has1 ? tile[4 * q + k][j1] : T(0);
              }
              sep_pair_quad(p, g, sep, ph, pw / 2, feat0 + cq, lane / 8, has0, has1, g0, g1);
            }
          } else if (c < p.c) {
            sep_bin<T, kBackward>(p, g, sep, ph, pw, feat0 + c, &tile[lane][j]);
          }
        } else if (!kBackward) {
          T sum = T(0);
          if (c < p.c) {
            const T* m = reinterpret_cast<const T*>(p.feat) + feat0 + c;
            int s = 0;
            // Four samples at a time: their 16 loads are in flight together
            // (the kernel waits on gathers, not on arithmetic); the sum still
            // adds the samples one by one, in order.
            for (; bt != nullptr && s + 4 <= samples; s += 4) {
              SharedTap<T> t[4];
              T v[4][4];
#pragma unroll
              for (int u = 0; u < 4; ++u) t[u] = bt[s + u];
#pragma unroll
              for (int u = 0; u < 4; ++u) {
#pragma unroll
                for (int i = 0; i < 4; ++i) v[u][i] = __ldg(m + t[u].off[i] * pix);
              }
#pragma unroll
              for (int u = 0; u < 4; ++u) {
                sum += t[u].w[0] * v[u][0] + t[u].w[1] * v[u][1] + t[u].w[2] * v[u][2] + t[u].w[3] * v[u][3];
              }
            }
            for (; s < samples; ++s) {
              const SharedTap<T> t = tap_of(p, g, bt, ph, pw, s);
              sum += t.w[0] * __ldg(m + t.off[0] * pix) + t.w[1] * __ldg(m + t.off[1] * pix) +
                     t.w[2] * __ldg(m + t.off[2] * pix) + t.w[3] * __ldg(m + t.off[3] * pix);
            }
          }
          tile[lane][j] = sum / g.count;
        } else if constexpr (kQuad) {
          const int q = lane % 8, cq = c0 + 4 * q;  // the lane's 4 channels
          if (cq < p.c) {
            T* m = reinterpret_cast<T*>(p.feat) + feat0 + cq;
            const T gr[4] = {tile[4 * q][j], tile[4 * q + 1][j], tile[4 * q + 2][j], tile[4 * q + 3][j]};
            for (int s = lane / 8; s < samples; s += 4) {
              const SharedTap<T> t = tap_of(p, g, bt, ph, pw, s);
#pragma unroll
              for (int i = 0; i < 4; ++i) {
                // As below, channel by channel.
                if (t.w[i] != T(0)) {
                  red_add_v4(m + t.off[i] * pix, gr[0] * t.w[i] / g.count, gr[1] * t.w[i] / g.count,
                             gr[2] * t.w[i] / g.count, gr[3] * t.w[i] / g.count);
                }
              }
            }
          }
        } else if (c < p.c) {
          T* m = reinterpret_cast<T*>(p.feat) + feat0 + c;
          const T grad = tile[lane][j];
          for (int s = 0; s < samples; ++s) {
            const SharedTap<T> t = tap_of(p, g, bt, ph, pw, s);
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              // (g*w)/count: torchvision's order of operations. Zero
              // weights are corners, or samples, outside the map.
              if (t.w[i] != T(0)) atomicAdd(m + t.off[i] * pix, grad * t.w[i] / g.count);
            }
          }
        }
      }
      __syncwarp();
      if (!kBackward) {
        T* out = reinterpret_cast<T*>(p.pooled);
        for (int i = lane; i < nc * nb; i += 32) {
          out[(roi * p.c + c0 + i / nb) * bins + b0 + i % nb] = tile[i / nb][i % nb];
        }
      }
      __syncwarp();  // the tile is reused by the next channel group
    }
  }
}

// ---------------------------------------------------------------------------
// The separable forward with 16-byte loads (float32, C % 4 == 0): the
// default forward with adaptive sampling. A warp takes 32 channels as 8
// lanes x 4 consecutive channels, so one load of the warp brings 4 pixels
// (one per group of 8 lanes), each a whole 128-byte line: a quarter of the
// scalar separable kernel's load instructions for the same bytes, and four
// times the bytes in flight. The groups take a bin's pixel rows in turn
// and their sums meet through shuffles at the end of the bin.
//
// Its tables hold (offset, weight) pairs, the offsets already multiplied
// out (ops checks that H*W*C fits an int32), so that a pixel costs one
// 8-byte shared-memory broadcast, one 16-byte load and four FMAs. It is
// its own kernel, not a branch of roialign above, so that the registers
// of that kernel's other paths do not cost this one occupancy.

struct SepEntry {
  int off;  // elements from the RoI's image: row * W * C, or column * C
  float w;
};

// A bin's list of entries (axis_walk), offsets pixel * stride.
__device__ __forceinline__ int axis_entries(float start, int b, float bin, int grid, int size, int stride,
                                            SepEntry* e) {
  return axis_walk(
      start, b, bin, grid, size, [&](int n, int pix, float wt) { e[n] = SepEntry{pix * stride, wt}; },
      [&](int n, float wt) { e[n].w += wt; }, [&](int n, int pix) { return e[n].off == pix * stride; });
}

// One block per (RoI, chunk of bins, channel slice): the chunks split a
// RoI's bins evenly over the grid's y blocks, at most a tile a warp. Bins
// whose lists would not fit the tables take the tap-by-tap path, a lane
// per channel.
template <int kCols>
__device__ void roialign_forward_sep4(const RoIAlignParams& p) {
  __shared__ Block<float> sh;
  constexpr int kTile = tile_bins<float>();
  const int64_t roi = roi_of(p, blockIdx.x);
  // Another level's RoI (MultiLevelRoIAlign): that level's launch does it.
  if (!roi_in_level(p, reinterpret_cast<const float*>(p.rois) + roi * 5)) return;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int bins = p.pooled_h * p.pooled_w;
  float* out = reinterpret_cast<float*>(p.pooled) + roi * p.c * bins;

  RoIGeom<float> g;
  const int status = roi_geometry(p, reinterpret_cast<const float*>(p.rois) + roi * 5, &g);
  if (status != kStatusOK) {
    if (threadIdx.x == 0) atomicMax(reinterpret_cast<int*>(p.status), status);
    for (int64_t i = threadIdx.x; i < static_cast<int64_t>(p.c) * bins; i += blockDim.x) out[i] = 0.f;
    return;
  }
  // Tables: rows of bin row ph at rows + ph * rstride (nrows[ph] of them),
  // columns alike; in the taps' shared memory when they fit.
  const int rstride = 2 * g.grid_h, cstride = 2 * g.grid_w;
  const int64_t need = (static_cast<int64_t>(rstride) * p.pooled_h + static_cast<int64_t>(cstride) * p.pooled_w) *
                           static_cast<int64_t>(sizeof(SepEntry)) +
                       4 * (p.pooled_h + p.pooled_w);
  const bool separable = need <= static_cast<int64_t>(sizeof(sh.taps));
  SepEntry* rows = reinterpret_cast<SepEntry*>(sh.taps);
  SepEntry* cols = rows + rstride * p.pooled_h;
  int* nrows = reinterpret_cast<int*>(cols + cstride * p.pooled_w);
  int* ncols = nrows + p.pooled_h;
  if (separable) {
    for (int i = threadIdx.x; i < p.pooled_h + p.pooled_w; i += blockDim.x) {
      if (i < p.pooled_h) {
        nrows[i] = axis_entries(g.start_y, i, g.bin_h, g.grid_h, p.h, p.w * p.c, rows + i * rstride);
      } else {
        const int b = i - p.pooled_h;
        ncols[b] = axis_entries(g.start_x, b, g.bin_w, g.grid_w, p.w, p.c, cols + b * cstride);
      }
    }
    __syncthreads();
  }
  const float* feat = reinterpret_cast<const float*>(p.feat) + static_cast<int64_t>(g.batch) * p.h * p.w * p.c;
  float (*tile)[kTile + 1] = sh.tile[warp];
  const int q = lane % 8, row_slot = lane / 8;
  // Channel slices: block z takes channels [c_begin, c_end), a multiple of
  // 32 wide. z is the slowest grid index, so the blocks running together
  // read one slice of the channels-last input, which L2 can hold where the
  // whole input would not. A warp takes groups of 32 channels; when a slice
  // has fewer groups than warps, the warps of a group split each chunk's
  // bins into runs.
  const int slice = (p.c + 32 * static_cast<int>(gridDim.z) - 1) / (32 * static_cast<int>(gridDim.z)) * 32;
  const int c_begin = static_cast<int>(blockIdx.z) * slice, c_end = min(p.c, c_begin + slice);
  const int groups = (c_end - c_begin + 31) / 32;
  const int warps_per_group = groups > 0 && groups < kWarps ? kWarps / groups : 1;
  const int group = warp / warps_per_group, group_stride = warps_per_group > 1 ? groups : kWarps;
  const int run = warp % warps_per_group;
  // A warp stages at most a tile of bins: its run of a chunk.
  const int chunk = min(kTile * warps_per_group, (bins + static_cast<int>(gridDim.y) - 1) / static_cast<int>(gridDim.y));
  for (int b0 = blockIdx.y * chunk; b0 < bins; b0 += gridDim.y * chunk) {
    const int nb = min(chunk, bins - b0);
    // This warp's run of the chunk's bins: [j_begin, j_end), staged in
    // tile columns from 0.
    const int j_begin = nb * run / warps_per_group, j_end = nb * (run + 1) / warps_per_group;
    for (int c0 = c_begin + group * 32; c0 < c_end; c0 += group_stride * 32) {
      const int nc = min(32, c_end - c0);
      // Every lane takes part in the shuffles: past C, a lane reads the
      // last 4 channels (in bounds) and stores nothing.
      const int cq = c0 + 4 * q;
      const float* base = feat + min(cq, p.c - 4);
      for (int j = j_begin; j < j_end; ++j) {
        const int bin = b0 + j, ph = bin / p.pooled_w, pw = bin % p.pooled_w;
        if (!separable) {
          float sum = 0.f;
          if (c0 + lane < c_end) {
            const float* m = feat + c0 + lane;
            for (int s = 0; s < g.grid_h * g.grid_w; ++s) {
              const SharedTap<float> t = tap_of<float>(p, g, nullptr, ph, pw, s);
              sum += t.w[0] * __ldg(m + t.off[0] * p.c) + t.w[1] * __ldg(m + t.off[1] * p.c) +
                     t.w[2] * __ldg(m + t.off[2] * p.c) + t.w[3] * __ldg(m + t.off[3] * p.c);
            }
          }
          tile[lane][j - j_begin] = sum / g.count;
          continue;
        }
        const SepEntry* re = rows + ph * rstride;
        const SepEntry* ce = cols + pw * cstride;
        const int nr = nrows[ph], ncl = ncols[pw];
        float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
        for (int a = row_slot; a < nr; a += 4) {
          const SepEntry r = re[a];
          const float* row = base + r.off;
          float4 rs = make_float4(0.f, 0.f, 0.f, 0.f);
          int b = 0;
          for (; b + kCols <= ncl; b += kCols) {
            SepEntry e[kCols];
            float4 v[kCols];
#pragma unroll
            for (int u = 0; u < kCols; ++u) e[u] = ce[b + u];
#pragma unroll
            for (int u = 0; u < kCols; ++u) v[u] = __ldg(reinterpret_cast<const float4*>(row + e[u].off));
#pragma unroll
            for (int u = 0; u < kCols; ++u) {
              rs.x += e[u].w * v[u].x, rs.y += e[u].w * v[u].y, rs.z += e[u].w * v[u].z, rs.w += e[u].w * v[u].w;
            }
          }
          for (; b < ncl; ++b) {
            const SepEntry e = ce[b];
            const float4 v = __ldg(reinterpret_cast<const float4*>(row + e.off));
            rs.x += e.w * v.x, rs.y += e.w * v.y, rs.z += e.w * v.z, rs.w += e.w * v.w;
          }
          sum.x += r.w * rs.x, sum.y += r.w * rs.y, sum.z += r.w * rs.z, sum.w += r.w * rs.w;
        }
#pragma unroll
        for (int off = 8; off < 32; off *= 2) {
          sum.x += __shfl_xor_sync(0xffffffffu, sum.x, off);
          sum.y += __shfl_xor_sync(0xffffffffu, sum.y, off);
          sum.z += __shfl_xor_sync(0xffffffffu, sum.z, off);
          sum.w += __shfl_xor_sync(0xffffffffu, sum.w, off);
        }
        if (lane < 8 && cq < c_end) {
          tile[4 * q][j - j_begin] = sum.x / g.count;
          tile[4 * q + 1][j - j_begin] = sum.y / g.count;
          tile[4 * q + 2][j - j_begin] = sum.z / g.count;
          tile[4 * q + 3][j - j_begin] = sum.w / g.count;
        }
      }
      __syncwarp();
      const int nj = j_end - j_begin;
      for (int i = lane; i < nc * nj; i += 32) {
        out[static_cast<int64_t>(c0 + i / nj) * bins + b0 + j_begin + i % nj] = tile[i / nj][i % nj];
      }
      __syncwarp();  // the tile is reused by the next channel group
    }
  }
}

// Forward straight from NCHW, without the transpose
// (roialign_fwd_nchw_bin_c<kCPT>).
//
// A thread owns one bin and kCPT channels of one RoI: it computes each
// sample's taps once and gathers them from all its channels, so the tap
// arithmetic is shared by kCPT channels (torchvision's kernel redoes it per
// output) and every sample puts 4*kCPT independent loads in flight. Lanes of
// a warp hold neighbouring bins of one channel, so their taps fall in one
// map close together, and their outputs are consecutive in [K,C,PH,PW]. The
// block's threads are split into `phases` = blockDim.x/bins groups of bins:
// phase f takes channels c0+f, c0+f+phases, ... of the block's range.
template <typename T, int kCPT>
__device__ void roialign_forward_nchw(const RoIAlignParams& p) {
  const int64_t roi = roi_of(p, blockIdx.x);
  // Another level's RoI (MultiLevelRoIAlign): that level's launch does it.
  if (!roi_in_level(p, reinterpret_cast<const T*>(p.rois) + roi * 5)) return;
  const int bins = p.pooled_h * p.pooled_w;
  const int phases = max(1, static_cast<int>(blockDim.x) / bins);
  const int c_begin = blockIdx.y * phases * kCPT;
  const int64_t plane = static_cast<int64_t>(p.h) * p.w;
  T* out = reinterpret_cast<T*>(p.pooled) + roi * p.c * bins;

  RoIGeom<T> g;
  const int status = roi_geometry(p, reinterpret_cast<const T*>(p.rois) + roi * 5, &g);
  if (status != kStatusOK && threadIdx.x == 0) atomicMax(reinterpret_cast<int*>(p.status), status);
  const int samples = g.grid_h * g.grid_w;  // 0 for a bad RoI: zero outputs
  const T* x = reinterpret_cast<const T*>(p.feat) + static_cast<int64_t>(max(g.batch, 0)) * p.c * plane;

  for (int item = threadIdx.x; item < bins * phases; item += blockDim.x) {
    const int bin = item % bins, c0 = c_begin + item / bins;
    if (c0 >= p.c) continue;
    const int ph = bin / p.pooled_w, pw = bin % p.pooled_w;
    // Channel j is c0 + j*phases; past the end, loads repeat the last
    // channel (in bounds, cheaper than a branch per load) and are not stored.
    const T* m[kCPT];
#pragma unroll
    for (int j = 0; j < kCPT; ++j) m[j] = x + min(c0 + j * phases, p.c - 1) * plane;
    T acc[kCPT];
#pragma unroll
    for (int j = 0; j < kCPT; ++j) acc[j] = T(0);
    for (int s = 0; s < samples; ++s) {
      Taps<T> t;
      if (!sample_taps(p, g, ph, pw, s / g.grid_w, s % g.grid_w, &t)) continue;
      T v[kCPT][4];
#pragma unroll
      for (int j = 0; j < kCPT; ++j)
#pragma unroll
        for (int i = 0; i < 4; ++i) v[j][i] = __ldg(m[j] + t.off[i]);
      // The CPU twin's (and torchvision's) expression, sample by sample.
#pragma unroll
      for (int j = 0; j < kCPT; ++j) acc[j] += t.w[0] * v[j][0] + t.w[1] * v[j][1] + t.w[2] * v[j][2] + t.w[3] * v[j][3];
    }
#pragma unroll
    for (int j = 0; j < kCPT; ++j) {
      const int c = c0 + j * phases;
      if (c < p.c) out[static_cast<int64_t>(c) * bins + bin] = acc[j] / g.count;
    }
  }
}

// Forward with lanes on sample columns, for a fixed sampling ratio kS with
// PW*kS <= 32 (roialign_fwd_nchw_cols_s<kS>): a warp gathers one bin row of
// a RoI from one channel map, or from 32/(PW*kS) maps side by side, lane j
// on the row's sample column j. A load instruction of the warp then reads
// one stretch of one pixel row per map: a few 32-byte sectors for its
// PW*kS samples, where roialign_fwd_nchw_bin, a lane per bin, touches about
// a sector per lane. A sample's taps are a row part times a column part
// (roi_axis): a lane's column is fixed for the RoI and the rows for a bin
// row, so the warp works out each bin row's taps (offsets within a map and
// weights) once for its whole stretch of channels, and a channel then costs
// 4*kS loads and FMAs a lane. The kS lanes of a bin add their sums by
// shuffles and the first writes the bin.
//
// No branch per load: taps with weight 0 (outside the map, or of a sample
// outside the RoI's range) still read a pixel inside the map, as the CPU
// twin's read pixel 0, so a non-finite input there can make a bin NaN (as
// in torchvision, whose clamped corners read the border with weight 0).
//
// Blocks are (RoI, slice of the channels: grid y). A block's warps split its
// (bin row, group of channels) items in contiguous runs, bin rows slowest,
// so a warp works out taps again only when its run crosses a bin row. kS is
// a template argument: with the ratio known at compile time the tap tables
// stay in registers and the bin's shuffles and output index are constants.
// stheno:const RoIAlignColsMaxS
// The largest sampling ratio (kS) of roialign_fwd_nchw_cols.
constexpr int kColsMaxS = 4;
// stheno:const RoIAlignColsMaxRows
// Sample rows of a RoI (PH*S) the _cmajor kernels' table holds.
constexpr int kColsMaxRows = 128;

// One sample row of a RoI, for the _cmajor kernels of roialign_fwd_nchw_cols: the
// byte offset in a map of the first of its two pixel rows, and their
// weights (both 0 for a row outside the RoI's range, at offset 0).
template <typename T>
struct ColRow {
  unsigned off;
  T top, bottom;
};

// kCM (channel-major, _cmajor): a warp's run goes through the bin rows of one
// group of channels before the next, so that the pixel rows a RoI's
// neighbouring sample rows share are still in L1; the RoI's sample rows
// are worked out once per block into shared memory (ColRow).
template <typename T, int kS, bool kCM = false>
__device__ void roialign_forward_cols(const RoIAlignParams& p) {
  static_assert(kS >= 1 && kS <= kColsMaxS, "kS");
  // Groups of channels a warp gathers at a time (4 measured no faster).
  constexpr int kU = 2;
  // ops launches this kernel only where it fits (colsFit, the ratio kS);
  // elsewhere it would divide by zero below.
  if (p.sampling_ratio != kS || p.pooled_w * kS > 32 || (kCM && p.pooled_h * kS > kColsMaxRows)) return;
  const int64_t roi = blockIdx.x;
  // Another level's RoI (MultiLevelRoIAlign): that level's launch does it.
  if (!roi_in_level(p, reinterpret_cast<const T*>(p.rois) + roi * 5)) return;
  const int cols = p.pooled_w * kS, slots = 32 / cols;  // sample columns of a bin row; maps a warp reads at once
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const int slot = lane / cols, sc = lane - slot * cols;
  const bool active = slot < slots;  // idle lanes past the last slot still take part in the shuffles
  const int bins = p.pooled_h * p.pooled_w;
  const int chunk = (p.c + gridDim.y - 1) / gridDim.y;
  const int c_begin = blockIdx.y * chunk, c_end = min(p.c, c_begin + chunk);
  const int groups = c_end > c_begin ? (c_end - c_begin + slots - 1) / slots : 0;
  const int items = p.pooled_h * groups, per = (items + warps - 1) / warps;  // items a warp
  const int it_end = min(items, (warp + 1) * per);

  RoIGeom<T> g;
  const int status = roi_geometry(p, reinterpret_cast<const T*>(p.rois) + roi * 5, &g);
  if (status != kStatusOK && threadIdx.x == 0 && blockIdx.y == 0) atomicMax(reinterpret_cast<int*>(p.status), status);
  const int64_t plane = static_cast<int64_t>(p.h) * p.w, plane_bytes = plane * static_cast<int64_t>(sizeof(T));
  const T* x = reinterpret_cast<const T*>(p.feat) + static_cast<int64_t>(max(g.batch, 0)) * p.c * plane;
  T* out = reinterpret_cast<T*>(p.pooled) + roi * p.c * bins;

  // The lane's sample column, for the whole RoI (none for a bad RoI, whose
  // outputs are then 0): pixels x0 and x0+1, weights hx and lx.
  int x0 = 0;
  T lx = T(0);
  const bool col_ok =
      active && g.grid_w > 0 && roi_axis(sample_coord(g.start_x, sc / kS, g.bin_w, sc % kS, kS), p.w, &x0, &lx);
  const T hx = T(1) - lx;
  // x1 outside: the 2x2 starts one column left, its right pixel taking x0's
  // weight (see the taps below). wl and wr: the left and right columns'.
  const int left = x0 + 1 >= p.w ? 1 : 0;
  const T wl = col_ok ? (left ? T(0) : hx) : T(0), wr = col_ok ? (left ? hx : lx) : T(0);
  const unsigned row_bytes = static_cast<unsigned>(p.w) * static_cast<unsigned>(sizeof(T));
  const bool leader = active && sc % kS == 0;
  const int bin_col = sc / kS;

  // The bin's sum over its kS lanes, written by the first.
  auto put = [&](int c, int br, T acc) {
    T sum = acc;
#pragma unroll
    for (int j = 1; j < kS; ++j) sum += __shfl_down_sync(0xffffffffu, acc, j);
    // count is kS*kS (1 for a bad RoI, whose sum is 0): for a power of
    // two, multiplying by its inverse is exact and saves the division.
    T avg;
    if constexpr ((kS & (kS - 1)) == 0) {
      avg = sum * (T(1) / T(kS * kS));
    } else {
      avg = sum / g.count;
    }
    if (leader && c < c_end) out[static_cast<int64_t>(c) * bins + br * p.pooled_w + bin_col] = avg;
  };
  if constexpr (kCM) {
    __shared__ ColRow<T> rows[kColsMaxRows];
    for (int r = threadIdx.x; r < p.pooled_h * kS; r += blockDim.x) {
      int y0 = 0;
      T ly = T(0);
      const bool ok = g.grid_h > 0 && roi_axis(sample_coord(g.start_y, r / kS, g.bin_h, r % kS, kS), p.h, &y0, &ly);
      const T hy = T(1) - ly;
      const bool up = y0 + 1 >= p.h;  // as below
      rows[r] = ColRow<T>{ok ? static_cast<unsigned>(y0 - up) * row_bytes : 0u, ok ? (up ? T(0) : hy) : T(0),
                          ok ? (up ? hy : ly) : T(0)};
    }
    __syncthreads();
    const unsigned col_off = col_ok ? static_cast<unsigned>(x0 - left) * static_cast<unsigned>(sizeof(T)) : 0u;
    // Items (group of channels, bin row), bin rows fastest.
    const int ph = p.pooled_h;
    for (int it = warp * per; it < it_end;) {
      const int gi = it / ph, b0 = it - gi * ph, b1 = min(ph, b0 + (it_end - it));
      it += b1 - b0;
      const int c = c_begin + gi * slots + slot;
      const char* m = reinterpret_cast<const char*>(x) + static_cast<int64_t>(c < c_end ? c : c_begin) * plane_bytes;
      auto gather = [&](int br) {
        T v[kS][4], w[kS][4];
#pragma unroll
        for (int sr = 0; sr < kS; ++sr) {
          const ColRow<T> e = rows[br * kS + sr];
          const T* r0 = reinterpret_cast<const T*>(m + e.off + col_off);
          const T* r1 = reinterpret_cast<const T*>(m + e.off + col_off + row_bytes);
          v[sr][0] = __ldg(r0), v[sr][1] = __ldg(r0 + 1), v[sr][2] = __ldg(r1), v[sr][3] = __ldg(r1 + 1);
          w[sr][0] = e.top * wl, w[sr][1] = e.top * wr, w[sr][2] = e.bottom * wl, w[sr][3] = e.bottom * wr;
        }
        T acc = w[0][0] * v[0][0] + w[0][1] * v[0][1] + w[0][2] * v[0][2] + w[0][3] * v[0][3];
#pragma unroll
        for (int sr = 1; sr < kS; ++sr) {
          acc += w[sr][0] * v[sr][0] + w[sr][1] * v[sr][1] + w[sr][2] * v[sr][2] + w[sr][3] * v[sr][3];
        }
        return acc;
      };
      for (int br = b0; br < b1; br += kU) {
        T acc[kU];
#pragma unroll
        for (int u = 0; u < kU; ++u) acc[u] = gather(min(br + u, b1 - 1));
#pragma unroll
        for (int u = 0; u < kU; ++u) {
          if (br + u < b1) put(c, br + u, acc[u]);
        }
      }
    }
  } else {
    for (int it = warp * per; it < it_end;) {
      const int br = it / groups, g0 = it - br * groups, g1 = min(groups, g0 + (it_end - it));
      it += g1 - g0;
      // The lane's taps in this bin row: for sample row sr, the byte offset
      // within a map of its top-left corner, and the weights of the 2x2
      // pixels from there, in bilinear's expressions. A corner past the last
      // column (or row) has weight 0, and the 2x2 is moved one pixel left (or
      // up) instead, its far pixels taking the weights of the near ones: the
      // four loads are then always at +0 and +4 bytes of two rows, every one
      // inside the map (ops requires H, W >= 2). A sample outside the RoI's
      // range (roi_taps' test, split into a row and a column test) has
      // weights 0 at offset 0.
      unsigned off[kS];
      T w[kS][4];
#pragma unroll
      for (int sr = 0; sr < kS; ++sr) {
        int y0 = 0;
        T ly = T(0);
        const bool ok = col_ok && roi_axis(sample_coord(g.start_y, br, g.bin_h, sr, kS), p.h, &y0, &ly);
        const T hy = T(1) - ly;
        const bool up = y0 + 1 >= p.h;  // y1 outside: the 2x2 starts one row up
        const T top = ok ? (up ? T(0) : hy) : T(0), bottom = ok ? (up ? hy : ly) : T(0);
        off[sr] = ok ? static_cast<unsigned>((y0 - up) * p.w + x0 - left) * static_cast<unsigned>(sizeof(T)) : 0u;
        w[sr][0] = top * wl, w[sr][1] = top * wr, w[sr][2] = bottom * wl, w[sr][3] = bottom * wr;
      }
      // Channel c's sum over the lane's samples of this bin row, sample by
      // sample in the CPU twin's order.
      auto gather = [&](int c) {
        const char* m = reinterpret_cast<const char*>(x) + static_cast<int64_t>(c) * plane_bytes;
        T v[kS][4];
#pragma unroll
        for (int sr = 0; sr < kS; ++sr) {
          const T* r0 = reinterpret_cast<const T*>(m + off[sr]);
          const T* r1 = reinterpret_cast<const T*>(m + off[sr] + row_bytes);
          v[sr][0] = __ldg(r0), v[sr][1] = __ldg(r0 + 1), v[sr][2] = __ldg(r1), v[sr][3] = __ldg(r1 + 1);
        }
        // (0 + the first sample is the first sample: no add of 0.)
        T acc = w[0][0] * v[0][0] + w[0][1] * v[0][1] + w[0][2] * v[0][2] + w[0][3] * v[0][3];
#pragma unroll
        for (int sr = 1; sr < kS; ++sr) {
          acc += w[sr][0] * v[sr][0] + w[sr][1] * v[sr][1] + w[sr][2] * v[sr][2] + w[sr][3] * v[sr][3];
        }
        return acc;
      };
      // kU groups at a time, so that kU times the loads are in flight.
      // Lanes past the channels load channel c_begin's map (in bounds) and
      // write nothing.
      for (int gi = g0; gi < g1; gi += kU) {
        T acc[kU];
#pragma unroll
        for (int u = 0; u < kU; ++u) {
          const int c = c_begin + (gi + u) * slots + slot;
          acc[u] = gather(gi + u < g1 && c < c_end ? c : c_begin);
        }
#pragma unroll
        for (int u = 0; u < kU; ++u) {
          if (gi + u < g1) put(c_begin + (gi + u) * slots + slot, br, acc[u]);
        }
      }
    }
  }
}

// transpose_planes' tiles: kTransposeTileRows rows of A (a lane each) by
// kTransposeTileCols* columns of B, 16 KB; its blocks kTransposeTileRows x
// kTransposeBlockY threads.
// stheno:const TransposeTileRows
constexpr int kTransposeTileRows = 32;
// stheno:const TransposeBlockY
constexpr int kTransposeBlockY = 8;
// stheno:const TransposeTileColsF32
constexpr int kTransposeTileColsF32 = 128;
// stheno:const TransposeTileColsF64
constexpr int kTransposeTileColsF64 = 64;

// Transposes [N][A][B] to [N][B][A] through shared-memory tiles of 32 rows
// of A by kTB columns of B, reads and writes both coalesced: NCHW <-> NHWC
// with (A, B) = (C, HW) or (HW, C). A block of 32x8 threads moves a whole
// tile, 4*kTB/32 elements per thread, so that many loads are in flight.
template <typename T, int kTB>
__device__ void transpose(const T* __restrict__ in, T* __restrict__ out, int a, int b) {
  constexpr int kRows = kTransposeTileRows, kY = kTransposeBlockY;
  __shared__ T tile[kRows][kTB + 1];
  const int64_t plane = static_cast<int64_t>(a) * b;
  in += blockIdx.z * plane;
  out += blockIdx.z * plane;
  const int b0 = blockIdx.x * kTB, a0 = blockIdx.y * kRows;
#pragma unroll
  for (int j = 0; j < kTB; j += kRows) {
#pragma unroll
    for (int i = threadIdx.y; i < kRows; i += kY) {
      const int ai = a0 + i, bi = b0 + j + threadIdx.x;
      if (ai < a && bi < b) tile[i][j + threadIdx.x] = __ldg(in + static_cast<int64_t>(ai) * b + bi);
    }
  }
  __syncthreads();
#pragma unroll
  for (int j = threadIdx.y; j < kTB; j += kY) {
    const int bi = b0 + j, ai = a0 + threadIdx.x;
    if (ai < a && bi < b) out[static_cast<int64_t>(bi) * a + ai] = tile[threadIdx.x][j];
  }
}

struct TransposeParams {
  uint64_t in, out;
  int32_t a, b;  // each of the N planes is a x b in, b x a out
};
STHENO_PARAMS(TransposeParams);

}  // namespace stheno

// roialign_sm90a.cu includes this file for its templates with
// STHENO_ROIALIGN_TEMPLATES_ONLY, so that its module holds only its own kernels.
#ifndef STHENO_ROIALIGN_TEMPLATES_ONLY
extern "C" {
#define STHENO_ROIALIGN(name, T, backward, separable)                                    \
  __global__ void __launch_bounds__(stheno::kThreads) name(stheno::RoIAlignParams p) { \
    stheno::roialign<T, backward>(p, separable);                                       \
  }
// Lanes on sample columns (fixed ratio S, PW*S <= 32), one kernel per
// ratio. (Registers capped for 4 or 5 blocks per SM measured no faster:
// the ratio-2 kernel needs 64.)
#define STHENO_ROIALIGN_COLS(name, T, S, CM)                                             \
  __global__ void __launch_bounds__(stheno::kThreads) name(stheno::RoIAlignParams p) { \
    stheno::roialign_forward_cols<T, S, CM>(p);                                        \
  }

// Forward, fixed sampling ratio: float32 where colsFit, else a thread a bin.
STHENO_ROIALIGN_COLS(roialign_fwd_nchw_cols_s1_f32, float, 1, false)
STHENO_ROIALIGN_COLS(roialign_fwd_nchw_cols_s1_cmajor_f32, float, 1, true)
STHENO_ROIALIGN_COLS(roialign_fwd_nchw_cols_s2_f32, float, 2, false)
STHENO_ROIALIGN_COLS(roialign_fwd_nchw_cols_s2_cmajor_f32, float, 2, true)
STHENO_ROIALIGN_COLS(roialign_fwd_nchw_cols_s3_f32, float, 3, false)
STHENO_ROIALIGN_COLS(roialign_fwd_nchw_cols_s3_cmajor_f32, float, 3, true)
STHENO_ROIALIGN_COLS(roialign_fwd_nchw_cols_s4_f32, float, 4, false)
STHENO_ROIALIGN_COLS(roialign_fwd_nchw_cols_s4_cmajor_f32, float, 4, true)
// occ4: registers capped (64) so that 4 blocks share an SM instead of 3
// (faster); capped for 5 or 6 it was slower.
__global__ void __launch_bounds__(stheno::kThreads, 4) roialign_fwd_nchw_bin_c4_occ4_f32(stheno::RoIAlignParams p) {
  stheno::roialign_forward_nchw<float, 4>(p);
}
__global__ void __launch_bounds__(stheno::kThreads) roialign_fwd_nchw_bin_c4_f64(stheno::RoIAlignParams p) {
  stheno::roialign_forward_nchw<double, 4>(p);
}

// Forward, adaptive sampling: channels-last and separable; float32 with
// C % 4 == 0 with 16-byte loads (vec4), registers capped for 4 blocks per
// SM. 8 columns in flight instead of 4 was slower.
__global__ void __launch_bounds__(stheno::kThreads, 4) roialign_fwd_nhwc_sep_vec4_occ4_f32(stheno::RoIAlignParams p) {
  stheno::roialign_forward_sep4<4>(p);
}
STHENO_ROIALIGN(roialign_fwd_nhwc_sep_f32, float, false, true)
STHENO_ROIALIGN(roialign_fwd_nhwc_sep_f64, double, false, true)

// Backward: channels-last scatters with scalar atomics, tap by tap (fixed
// ratio) or separable (adaptive); on compute capability 9.0,
// roialign_sm90a.cu's vector reductions instead.
STHENO_ROIALIGN(roialign_bwd_nhwc_taps_atomic_f32, float, true, false)
STHENO_ROIALIGN(roialign_bwd_nhwc_taps_atomic_f64, double, true, false)
STHENO_ROIALIGN(roialign_bwd_nhwc_sep_atomic_f32, float, true, true)
STHENO_ROIALIGN(roialign_bwd_nhwc_sep_atomic_f64, double, true, true)

// The channels-last kernels' helpers: the RoIs in spatial order (and the
// backward's gradient zeroed), and NCHW <-> NHWC.
__global__ void __launch_bounds__(stheno::kOrderThreads) roialign_sort_rois_f32(stheno::RoIOrderParams p) {
  stheno::sort_rois<float>(p);
}
__global__ void __launch_bounds__(stheno::kOrderThreads) roialign_sort_rois_f64(stheno::RoIOrderParams p) {
  stheno::sort_rois<double>(p);
}
__global__ void __launch_bounds__(stheno::kTransposeTileRows * stheno::kTransposeBlockY)
    transpose_planes_f32(stheno::TransposeParams p) {
  stheno::transpose<float, stheno::kTransposeTileColsF32>(reinterpret_cast<const float*>(p.in),
                                                          reinterpret_cast<float*>(p.out), p.a, p.b);
}
__global__ void __launch_bounds__(stheno::kTransposeTileRows * stheno::kTransposeBlockY)
    transpose_planes_f64(stheno::TransposeParams p) {
  stheno::transpose<double, stheno::kTransposeTileColsF64>(reinterpret_cast<const double*>(p.in),
                                                           reinterpret_cast<double*>(p.out), p.a, p.b);
}

#if STHENO_KERNEL_VARIANTS
// Variants: the forward tap by tap (channels-last), the defaults' siblings
// (uncapped registers, 8 channels a thread) and float64 lanes on sample
// columns. The emulator checks them against the defaults.
STHENO_ROIALIGN(roialign_fwd_nhwc_taps_f32, float, false, false)
STHENO_ROIALIGN(roialign_fwd_nhwc_taps_f64, double, false, false)
__global__ void __launch_bounds__(stheno::kThreads) roialign_fwd_nhwc_sep_vec4_f32(stheno::RoIAlignParams p) {
  stheno::roialign_forward_sep4<4>(p);
}
__global__ void __launch_bounds__(stheno::kThreads) roialign_fwd_nchw_bin_c4_f32(stheno::RoIAlignParams p) {
  stheno::roialign_forward_nchw<float, 4>(p);
}
__global__ void __launch_bounds__(stheno::kThreads) roialign_fwd_nchw_bin_c8_f32(stheno::RoIAlignParams p) {
  stheno::roialign_forward_nchw<float, 8>(p);
}
__global__ void __launch_bounds__(stheno::kThreads) roialign_fwd_nchw_bin_c8_f64(stheno::RoIAlignParams p) {
  stheno::roialign_forward_nchw<double, 8>(p);
}
STHENO_ROIALIGN_COLS(roialign_fwd_nchw_cols_s1_f64, double, 1, false)
STHENO_ROIALIGN_COLS(roialign_fwd_nchw_cols_s1_cmajor_f64, double, 1, true)
STHENO_ROIALIGN_COLS(roialign_fwd_nchw_cols_s2_f64, double, 2, false)
STHENO_ROIALIGN_COLS(roialign_fwd_nchw_cols_s2_cmajor_f64, double, 2, true)
STHENO_ROIALIGN_COLS(roialign_fwd_nchw_cols_s3_f64, double, 3, false)
STHENO_ROIALIGN_COLS(roialign_fwd_nchw_cols_s3_cmajor_f64, double, 3, true)
STHENO_ROIALIGN_COLS(roialign_fwd_nchw_cols_s4_f64, double, 4, false)
STHENO_ROIALIGN_COLS(roialign_fwd_nchw_cols_s4_cmajor_f64, double, 4, true)
#endif
}
#endif  // STHENO_ROIALIGN_TEMPLATES_ONLY
