// Bilinear sampling shared by every kernel that samples a feature map
// (RoIAlign and MSDeformAttn). The Go twin is kernels/bilinear.go: keep the two
// in step, expression for expression.
#pragma once

#include <stdint.h>

namespace stheno {

// The four corners of one bilinear sample of an h×w map, in the order
// (y0,x0), (y0,x1), (y1,x0), (y1,x1). A corner outside the map has weight 0
// and offset 0, so a weighted sum over all four reads only inside the map.
template <typename T>
struct Taps {
  int off[4];  // y*w + x of each corner within one map
  T w[4];      // interpolation weight; 0 outside the map
  T ly, lx;    // fractional parts, for gradients w.r.t. the position
  bool in[4];  // corner lies inside the map
};

template <typename T>
__device__ __forceinline__ T floor_t(T v);
template <>
__device__ __forceinline__ float floor_t<float>(float v) { return floorf(v); }
template <>
__device__ __forceinline__ double floor_t<double>(double v) { return floor(v); }

// Taps of a sample at (y, x), corners outside contributing zero. The caller
// guarantees -1 < y < h+1 and -1 < x < w+1 (no NaN), so the floors fit an int.
template <typename T>
__device__ __forceinline__ Taps<T> bilinear(T y, T x, int h, int w) {
  const int y0 = static_cast<int>(floor_t(y));
  const int x0 = static_cast<int>(floor_t(x));
  Taps<T> t;
  t.ly = y - static_cast<T>(y0);  // exact: y with its integer part dropped
  t.lx = x - static_cast<T>(x0);
  const T hy = T(1) - t.ly;
  const T hx = T(1) - t.lx;
  const T ws[4] = {hy * hx, hy * t.lx, t.ly * hx, t.ly * t.lx};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int yy = y0 + (i >> 1);
    const int xx = x0 + (i & 1);
    t.in[i] = yy >= 0 && yy < h && xx >= 0 && xx < w;
    t.off[i] = t.in[i] ? yy * w + xx : 0;
    t.w[i] = t.in[i] ? ws[i] : T(0);
  }
  return t;
}

// Samples the way torchvision's roi_align does: a point more than one pixel
// outside the map contributes nothing (returns false), a point inside that
// band is clamped onto the border row or column.
template <typename T>
__device__ __forceinline__ bool roi_taps(T y, T x, int h, int w, Taps<T>* t) {
  // Written so that NaN takes the "outside" branch.
  if (!(y >= T(-1) && y <= static_cast<T>(h) && x >= T(-1) && x <= static_cast<T>(w))) {
    return false;
  }
  y = fmin(fmax(y, T(0)), static_cast<T>(h - 1));
  x = fmin(fmax(x, T(0)), static_cast<T>(w - 1));
  *t = bilinear(y, x, h, w);
  return true;
}

// One axis of roi_taps: whether coordinate v of a map of `size` pixels
// along it is sampled at all, and if so the first pixel i0 and the weight
// frac of pixel i0+1 (that of i0 is 1-frac; i0+1 may lie past the map,
// where frac is 0). roi_taps' corners are the products of the two axes'.
template <typename T>
__device__ __forceinline__ bool roi_axis(T v, int size, int* i0, T* frac) {
  if (!(v >= T(-1) && v <= static_cast<T>(size))) return false;
  v = fmin(fmax(v, T(0)), static_cast<T>(size - 1));
  *i0 = static_cast<int>(floor_t(v));
  *frac = v - static_cast<T>(*i0);
  return true;
}

// a*b - c rounded after the multiply and again after the subtraction, as
// the CPU twins compute it (they convert the product explicitly, which Go
// does not fuse). nvcc would fuse the two into one multiply-add, rounded
// once, and where a result decides something discontinuous the two
// roundings can decide differently:
// - MSDeformAttn's pixel coordinate loc*size - 0.5: within an ulp of an
//   integer they pick different cells, and a location gradient is the
//   difference across the cell, so it jumps by the whole step between
//   neighbouring pixels (one coordinate of TARGETS.md's encoder locations:
//   17.9 against the CPU's result);
// - RoIAlign's box corners roi*scale - offset: the adaptive sample count is
//   the ceiling of the bin size (with power-of-two scales the product is
//   exact and both agree anyway).
template <typename T>
__device__ __forceinline__ T mul_sub_rn(T a, T b, T c);
template <>
__device__ __forceinline__ float mul_sub_rn<float>(float a, float b, float c) {
  return __fsub_rn(__fmul_rn(a, b), c);
}
template <>
__device__ __forceinline__ double mul_sub_rn<double>(double a, double b, double c) {
  return __dsub_rn(__dmul_rn(a, b), c);
}

// a*b + c rounded in two steps, as mul_sub_rn.
template <typename T>
__device__ __forceinline__ T mul_add_rn(T a, T b, T c);
template <>
__device__ __forceinline__ float mul_add_rn<float>(float a, float b, float c) {
  return __fadd_rn(__fmul_rn(a, b), c);
}
template <>
__device__ __forceinline__ double mul_add_rn<double>(double a, double b, double c) {
  return __dadd_rn(__dmul_rn(a, b), c);
}

// loc*size - 0.5: grid_sample(align_corners=False)'s pixel coordinate of a
// normalised location.
template <typename T>
__device__ __forceinline__ T pixel_coord(T loc, int size) {
  return mul_sub_rn(loc, static_cast<T>(size), T(0.5));
}

// Coordinate of sample i (of grid) of bin b along one axis of a RoI that
// starts at start with bins of size bin, as planBins in roialign.go, with
// start + b*bin rounded in two steps as there (mul_add_rn): roi_taps drops
// a sample below -1 or past the map, so a fused rounding would drop or keep
// a sample lying an ulp from that edge where the CPU twin does the other
// (a box from x = -21.640625 to 4.546875 at scale 1/4 has one).
template <typename T>
__device__ __forceinline__ T sample_coord(T start, int b, T bin, int i, int grid) {
  return mul_add_rn(static_cast<T>(b), bin, start) +
         static_cast<T>(static_cast<float>(i) + 0.5f) * bin / static_cast<T>(grid);
}

// Samples the way grid_sample(bilinear, zeros, align_corners=False) does once
// the normalised location has been mapped to pixels (loc*size - 0.5): a point
// whose four corners all lie outside contributes nothing (returns false).
template <typename T>
__device__ __forceinline__ bool grid_taps(T y, T x, int h, int w, Taps<T>* t) {
  if (!(y > T(-1) && y < static_cast<T>(h) && x > T(-1) && x < static_cast<T>(w))) {
    return false;
  }
  *t = bilinear(y, x, h, w);
  return true;
}

// The interpolated value of one map, summed in the same order as the CPU twin
// and the reference implementations.
template <typename T>
__device__ __forceinline__ T sample(const Taps<T>& t, const T* __restrict__ m) {
  return t.w[0] * m[t.off[0]] + t.w[1] * m[t.off[1]] + t.w[2] * m[t.off[2]] + t.w[3] * m[t.off[3]];
}

// Status codes kernels report through a device word (atomicMax, so the worst
// problem of a launch survives). The Go side decodes them in ops.
enum Status : int {
  kStatusOK = 0,
  kStatusBadBatchIndex = 1,
  kStatusAdaptiveGridTooLarge = 2,
};

}  // namespace stheno
