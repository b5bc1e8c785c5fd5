// Nearest-neighbour upsampling by an integer factor f, forward and
// backward: the CUDA twins of kernels/upsample.go, as PyTorch's
// interpolate(mode="nearest") with an integer scale. x [N, C, H, W] is seen
// as rows = N*C*H rows of w pixels, and y [N, C, H*f, W*f] as rows*f rows
// of w*f: input row r's block of output rows is r*f .. r*f + f-1, since
// the planes of y follow one another as those of x do. Pixel (r, c) of x
// is copied to the f x f block of y at rows r*f.., columns c*f..; the
// backward sums that block of dy back into dx[r, c].
//
// Kernels (grid-stride loops over 64-bit indices: the grid never changes a
// result):
// - upsample_nearest_fwd_<dtype>: a thread per pixel of x, writing its
//   block row by row. Neighbouring threads write neighbouring stretches of
//   each output row, so a warp's stores of a row are one coalesced run.
// - upsample_nearest_bwd_<dtype>: a thread per pixel of dx, summing its
//   block: each row of the block left to right into a row sum, the row sums
//   added top to bottom into the pixel's sum, both from zero. No atomics:
//   the same sum in the same order on every run and as the CPU twin adds
//   it (bit for bit).
// - _x2_vec2: factor 2 (FPN's top-down path) with a 2-element vector per
//   row of the block (float2, double2): one store (forward) or load
//   (backward) per row instead of two. The block's element offsets are
//   then even, so the vectors are aligned where the tensors' starts are
//   (ops checks); the backward adds the vector's two elements in the order
//   of the generic kernel.
#include <stdint.h>

#include "params_gen.cuh"

namespace stheno::upsample {

// The launch parameters of the upsampling kernels, passed by value.
struct UpsampleParams {
  uint64_t in;   // fwd: x [rows, w]; bwd: dy [rows*factor, w*factor]
  uint64_t out;  // fwd: y [rows*factor, w*factor]; bwd: dx [rows, w]
  int64_t rows;  // N*C*H, the rows of x
  int32_t w;     // a row of x
  int32_t factor;
};
STHENO_PARAMS(UpsampleParams);

// stheno:const UpsampleThreads
// The threads of a block of every kernel.
constexpr int kThreads = 256;

// A vector of two T.
template <typename T>
struct Vec2;
template <>
struct Vec2<float> {
  using type = float2;
};
template <>
struct Vec2<double> {
  using type = double2;
};

template <typename T>
__device__ __forceinline__ void forward(const UpsampleParams& p) {
  const T* __restrict__ x = reinterpret_cast<const T*>(p.in);
  T* __restrict__ y = reinterpret_cast<T*>(p.out);
  const int f = p.factor;
  const int64_t ow = int64_t(p.w) * f, n = p.rows * p.w;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = i / p.w;
    const int col = int(i - row * p.w);
    const T v = x[i];
    T* dst = y + row * f * ow + int64_t(col) * f;
    for (int r = 0; r < f; ++r, dst += ow) {
      for (int c = 0; c < f; ++c) dst[c] = v;
    }
  }
}

template <typename T>
__device__ __forceinline__ void forward_x2(const UpsampleParams& p) {
  using V = typename Vec2<T>::type;
  const T* __restrict__ x = reinterpret_cast<const T*>(p.in);
  T* __restrict__ y = reinterpret_cast<T*>(p.out);
  const int64_t ow = int64_t(p.w) * 2, n = p.rows * p.w;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = i / p.w;
    const int col = int(i - row * p.w);
    const T v = x[i];
    V pair;
    pair.x = v, pair.y = v;
    // Even element offsets: aligned for V.
    T* dst = y + row * 2 * ow + int64_t(col) * 2;
    *reinterpret_cast<V*>(dst) = pair;
    *reinterpret_cast<V*>(dst + ow) = pair;
  }
}

template <typename T>
__device__ __forceinline__ void backward(const UpsampleParams& p) {
  const T* __restrict__ dy = reinterpret_cast<const T*>(p.in);
  T* __restrict__ dx = reinterpret_cast<T*>(p.out);
  const int f = p.factor;
  const int64_t ow = int64_t(p.w) * f, n = p.rows * p.w;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = i / p.w;
    const int col = int(i - row * p.w);
    const T* src = dy + row * f * ow + int64_t(col) * f;
    T sum = T(0);
    for (int r = 0; r < f; ++r, src += ow) {
      T rs = T(0);
      for (int c = 0; c < f; ++c) rs += src[c];
      sum += rs;
    }
    dx[i] = sum;
  }
}

template <typename T>
__device__ __forceinline__ void backward_x2(const UpsampleParams& p) {
  using V = typename Vec2<T>::type;
  const T* __restrict__ dy = reinterpret_cast<const T*>(p.in);
  T* __restrict__ dx = reinterpret_cast<T*>(p.out);
  const int64_t ow = int64_t(p.w) * 2, n = p.rows * p.w;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = i / p.w;
    const int col = int(i - row * p.w);
    const T* src = dy + row * 2 * ow + int64_t(col) * 2;
    const V a = __ldg(reinterpret_cast<const V*>(src));
    const V b = __ldg(reinterpret_cast<const V*>(src + ow));
    // The generic kernel's order: each row's sum from zero, then the row
    // sums from zero (0 + v is not v for v = -0).
    T r0 = T(0), r1 = T(0), sum = T(0);
    r0 += a.x;
    r0 += a.y;
    r1 += b.x;
    r1 += b.y;
    sum += r0;
    sum += r1;
    dx[i] = sum;
  }
}

}  // namespace stheno::upsample

extern "C" {
__global__ void __launch_bounds__(stheno::upsample::kThreads) upsample_nearest_fwd_f32(stheno::upsample::UpsampleParams p) {
  stheno::upsample::forward<float>(p);
}
__global__ void __launch_bounds__(stheno::upsample::kThreads) upsample_nearest_fwd_f64(stheno::upsample::UpsampleParams p) {
  stheno::upsample::forward<double>(p);
}
__global__ void __launch_bounds__(stheno::upsample::kThreads)
    upsample_nearest_fwd_x2_vec2_f32(stheno::upsample::UpsampleParams p) {
  stheno::upsample::forward_x2<float>(p);
}
__global__ void __launch_bounds__(stheno::upsample::kThreads)
    upsample_nearest_fwd_x2_vec2_f64(stheno::upsample::UpsampleParams p) {
  stheno::upsample::forward_x2<double>(p);
}
__global__ void __launch_bounds__(stheno::upsample::kThreads) upsample_nearest_bwd_f32(stheno::upsample::UpsampleParams p) {
  stheno::upsample::backward<float>(p);
}
__global__ void __launch_bounds__(stheno::upsample::kThreads) upsample_nearest_bwd_f64(stheno::upsample::UpsampleParams p) {
  stheno::upsample::backward<double>(p);
}
__global__ void __launch_bounds__(stheno::upsample::kThreads)
    upsample_nearest_bwd_x2_vec2_f32(stheno::upsample::UpsampleParams p) {
  stheno::upsample::backward_x2<float>(p);
}
__global__ void __launch_bounds__(stheno::upsample::kThreads)
    upsample_nearest_bwd_x2_vec2_f64(stheno::upsample::UpsampleParams p) {
  stheno::upsample::backward_x2<double>(p);
}
}
