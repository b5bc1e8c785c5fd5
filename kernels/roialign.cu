// RoIAlign forward and backward, the CUDA twins of kernels/roialign.go.
//
// One block per (RoI, group of channels). The block first computes the
// bilinear taps of every sample of every bin of its RoI into shared memory,
// once, and then its threads walk (channel, bin) pairs, bins fastest, reading
// the taps back: the geometry is shared by all channels instead of being
// recomputed per output element, and output writes are coalesced. The
// backward pass scatters g*w/count onto the taps with atomicAdd into a
// gradient the op has zeroed.
#include "bilinear.cuh"

namespace stheno {

// Launch parameters, passed by value. Mirrors roiAlignArgs in ops (Go); keep
// field order and types in step.
struct RoIAlignParams {
  uint64_t feat;    // forward: x [N,C,H,W] (read); backward: grad_x (scattered into)
  uint64_t rois;    // [K,5] rows (batch_index, x1, y1, x2, y2)
  uint64_t pooled;  // forward: out [K,C,PH,PW] (written); backward: grad_out (read)
  uint64_t status;  // int status word, see Status in bilinear.cuh
  double spatial_scale;
  int32_t n, c, h, w, k;
  int32_t pooled_h, pooled_w;
  int32_t sampling_ratio;    // <= 0: adaptive
  int32_t aligned;           // bool
  int32_t channels_per_block;
  int32_t max_taps;          // taps that fit in the dynamic shared memory
  int32_t max_adaptive_grid; // adaptive samples per bin side above which a RoI is an error
};

// A tap as stored in shared memory: the four corners of one sample.
template <typename T>
struct SharedTap {
  int off[4];
  T w[4];
};

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
  g->start_x = roi[1] * scale - offset;
  g->start_y = roi[2] * scale - offset;
  const T end_x = roi[3] * scale - offset;
  const T end_y = roi[4] * scale - offset;
  T roi_w = end_x - g->start_x;
  T roi_h = end_y - g->start_y;
  if (!p.aligned) {
    // Legacy mode forces malformed RoIs to be at least 1x1.
    roi_w = roi_w > T(1) ? roi_w : T(1);
    roi_h = roi_h > T(1) ? roi_h : T(1);
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
// planBins in roialign.go. A sample outside the map gets zero weights.
template <typename T>
__device__ __forceinline__ SharedTap<T> plan_sample(const RoIAlignParams& p, const RoIGeom<T>& g,
                                                    int ph, int pw, int iy, int ix) {
  const T y = g.start_y + static_cast<T>(ph) * g.bin_h +
              static_cast<T>(static_cast<float>(iy) + 0.5f) * g.bin_h / static_cast<T>(g.grid_h);
  const T x = g.start_x + static_cast<T>(pw) * g.bin_w +
              static_cast<T>(static_cast<float>(ix) + 0.5f) * g.bin_w / static_cast<T>(g.grid_w);
  Taps<T> t;
  SharedTap<T> s;
  if (roi_taps(y, x, p.h, p.w, &t)) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      s.off[i] = t.off[i];
      s.w[i] = t.w[i];
    }
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      s.off[i] = 0;
      s.w[i] = T(0);
    }
  }
  return s;
}

template <typename T>
__device__ __forceinline__ T weighted(const SharedTap<T>& s, const T* __restrict__ m) {
  return s.w[0] * __ldg(m + s.off[0]) + s.w[1] * __ldg(m + s.off[1]) + s.w[2] * __ldg(m + s.off[2]) +
         s.w[3] * __ldg(m + s.off[3]);
}

template <typename T>
__device__ __forceinline__ void scatter(const SharedTap<T>& s, T grad, T count, T* m) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    // (g*w)/count: torchvision's order of operations. Zero weights are
    // corners outside the map or samples outside it.
    if (s.w[i] != T(0)) atomicAdd(m + s.off[i], grad * s.w[i] / count);
  }
}

// One output (forward) or one output gradient (backward) of channel c and
// bin, reading taps [first, first+samples) from shared memory, or computing
// them on the fly when tp is null (bins too large for shared memory).
template <typename T, bool kBackward>
__device__ __forceinline__ void visit_bin(const RoIAlignParams& p, const RoIGeom<T>& g, int64_t roi,
                                          int c, int bin, const SharedTap<T>* tp) {
  const int bins = p.pooled_h * p.pooled_w;
  const int64_t map = static_cast<int64_t>(p.h) * p.w;
  const int64_t feat_off = (static_cast<int64_t>(g.batch) * p.c + c) * map;
  const int64_t out_off = (roi * p.c + c) * bins + bin;
  const int samples = g.grid_h * g.grid_w;
  const int ph = bin / p.pooled_w, pw = bin % p.pooled_w;
  if (!kBackward) {
    const T* m = reinterpret_cast<const T*>(p.feat) + feat_off;
    T sum = T(0);
    for (int s = 0; s < samples; ++s) {
      const SharedTap<T> t = tp ? tp[s] : plan_sample(p, g, ph, pw, s / g.grid_w, s % g.grid_w);
      sum += weighted(t, m);
    }
    reinterpret_cast<T*>(p.pooled)[out_off] = sum / g.count;
  } else {
    T* m = reinterpret_cast<T*>(p.feat) + feat_off;
    const T grad = __ldg(reinterpret_cast<const T*>(p.pooled) + out_off);
    for (int s = 0; s < samples; ++s) {
      const SharedTap<T> t = tp ? tp[s] : plan_sample(p, g, ph, pw, s / g.grid_w, s % g.grid_w);
      scatter(t, grad, g.count, m);
    }
  }
}

template <typename T, bool kBackward>
__device__ void roialign(const RoIAlignParams& p) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  SharedTap<T>* taps = reinterpret_cast<SharedTap<T>*>(smem_raw);

  const int64_t roi = blockIdx.x;
  const int c0 = blockIdx.y * p.channels_per_block;
  const int c1 = min(c0 + p.channels_per_block, p.c);
  const int nc = c1 - c0;
  const int bins = p.pooled_h * p.pooled_w;

  RoIGeom<T> g;
  const int status = roi_geometry(p, reinterpret_cast<const T*>(p.rois) + roi * 5, &g);
  if (status != kStatusOK) {
    if (threadIdx.x == 0 && blockIdx.y == 0) atomicMax(reinterpret_cast<int*>(p.status), status);
    if (!kBackward) {
      // Defined output rather than garbage; the op reports the error.
      T* out = reinterpret_cast<T*>(p.pooled);
      for (int i = threadIdx.x; i < nc * bins; i += blockDim.x) {
        out[(roi * p.c + c0 + i / bins) * bins + i % bins] = T(0);
      }
    }
    return;
  }
  const int samples = g.grid_h * g.grid_w;
  // Bins whose taps fit in shared memory at once; 0 when even one bin's do not.
  const int chunk = samples == 0 ? bins : min(bins, p.max_taps / samples);
  if (chunk == 0) {
    for (int i = threadIdx.x; i < nc * bins; i += blockDim.x) {
      visit_bin<T, kBackward>(p, g, roi, c0 + i / bins, i % bins, nullptr);
    }
    return;
  }
  for (int b0 = 0; b0 < bins; b0 += chunk) {
    const int nb = min(chunk, bins - b0);
    __syncthreads();  // the previous chunk's taps are no longer read
    for (int i = threadIdx.x; i < nb * samples; i += blockDim.x) {
      const int bin = b0 + i / samples, s = i % samples;
      taps[i] = plan_sample(p, g, bin / p.pooled_w, bin % p.pooled_w, s / g.grid_w, s % g.grid_w);
    }
    __syncthreads();
    for (int i = threadIdx.x; i < nc * nb; i += blockDim.x) {
      const int c = c0 + i / nb, j = i % nb;
      visit_bin<T, kBackward>(p, g, roi, c, b0 + j, taps + j * samples);
    }
  }
}

}  // namespace stheno

extern "C" {
__global__ void roialign_forward_f32(stheno::RoIAlignParams p) { stheno::roialign<float, false>(p); }
__global__ void roialign_forward_f64(stheno::RoIAlignParams p) { stheno::roialign<double, false>(p); }
__global__ void roialign_backward_f32(stheno::RoIAlignParams p) { stheno::roialign<float, true>(p); }
__global__ void roialign_backward_f64(stheno::RoIAlignParams p) { stheno::roialign<double, true>(p); }
}
