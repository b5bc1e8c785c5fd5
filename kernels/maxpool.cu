// 2-D max pooling over NCHW, forward and backward: the CUDA twins of
// kernels/maxpool.go, as torch.nn.functional.max_pool2d with dilation 1
// and ceil_mode false. x is seen as [planes, h, w] (planes = N*C); output
// pixel (oh, ow) of a plane is the max of the kh x kw window whose top-left
// pixel is (oh*stride_h - pad_h, ow*stride_w - pad_w), padding never
// winning (PyTorch's implicit -inf).
//
// Which pixel wins is PyTorch's rule (argmax below): the window is scanned
// row by row, left to right, and a pixel wins when it is greater than the
// best so far or is NaN. The first maximum wins a tie; a NaN makes the
// output NaN and the last NaN wins; a window of -inf only gives -inf and
// its first pixel inside x.
//
// The backward saves nothing from the forward: maxpool_bwd finds each
// window's winner again from x. A saved index tensor would be a second
// output of another dtype (int64 in PyTorch) for the forward to write and
// the backward to read: 8 bytes per output pixel each way against the
// window's pixels read again from L1 and L2, and a value that gorgonia's
// one-output ops and float-typed graph cannot carry. Each thread owns one
// pixel of dx and gathers from the windows that may hold it, in order of
// oh then ow, adding the dy of those it won: no atomics, the same sum in
// the same order on every run and as the CPU twin adds it (bit for bit).
//
// Kernels (grid-stride loops over 64-bit indices: the grid never changes a
// result):
// - maxpool_fwd_<dtype>: a thread per output pixel.
// - maxpool_bwd_tiled_<dtype>: a block per tile of kTileH x kTileW input
//   pixels of a plane. Its threads first find the winners of every window
//   that touches the tile, once each, into shared memory with their dy;
//   then each pixel gathers from its windows there. Each window is searched
//   about once (twice or so at the tile's edges), where a thread per pixel
//   would search each window once per pixel it holds (9 times for the
//   ResNet stem's 3x3 windows). For kernels and strides whose tile touches
//   at most kTileWindows windows (ops checks).
// - maxpool_bwd_<dtype>: a thread per input pixel, searching each of its
//   windows itself: any kernel and stride.
// Both backward kernels add in the same order, the CPU twin's.
#include <stdint.h>

#include <limits>

#include "params_gen.cuh"

namespace stheno {

// The launch parameters of the max-pooling kernels, passed by value.
struct MaxPool2dParams {
  uint64_t x;      // the input, [planes, h, w]
  uint64_t dy;     // bwd: the gradient of y, [planes, out_h, out_w]; fwd: 0
  uint64_t out;    // fwd: y, [planes, out_h, out_w]; bwd: dx, like x
  int64_t planes;  // N*C
  int32_t h, w;    // a plane of x (h*w < 2^31)
  int32_t out_h, out_w;
  int32_t kh, kw;
  int32_t stride_h, stride_w;
  int32_t pad_h, pad_w;  // at most kh/2 and kw/2: every window holds a pixel of x
};
STHENO_PARAMS(MaxPool2dParams);

// stheno:const MaxPool2dThreads
// The threads of a block of every kernel.
constexpr int kMaxPoolThreads = 256;

// stheno:const MaxPool2dTileH
// The input rows of a tile of maxpool_bwd_tiled.
constexpr int kTileH = 16;
// stheno:const MaxPool2dTileW
// The input columns of a tile of maxpool_bwd_tiled: a warp's coalesced row.
constexpr int kTileW = 32;
// stheno:const MaxPool2dTileWindows
// The most windows a tile of maxpool_bwd_tiled may touch: (kTileH + kh -
// 2)/stride_h + 1 rows of them times (kTileW + kw - 2)/stride_w + 1
// columns; 153 for the ResNet stem's pooling.
constexpr int kTileWindows = 1024;

// The winner of window (oh, ow) of a plane: its offset in the plane, and
// its value in *best.
template <typename T>
__device__ __forceinline__ int argmax(const MaxPool2dParams& p, const T* __restrict__ plane, int oh, int ow,
                                      T* best) {
  int h0 = oh * p.stride_h - p.pad_h, w0 = ow * p.stride_w - p.pad_w;
  const int h1 = min(h0 + p.kh, p.h), w1 = min(w0 + p.kw, p.w);
  h0 = max(h0, 0), w0 = max(w0, 0);
  T m = -std::numeric_limits<T>::infinity();
  int arg = h0 * p.w + w0;
  for (int ih = h0; ih < h1; ++ih) {
    for (int iw = w0; iw < w1; ++iw) {
      const int i = ih * p.w + iw;
      const T v = plane[i];
      // v != v: a NaN wins over anything, a later NaN over an earlier one.
      if (v > m || v != v) m = v, arg = i;
    }
  }
  *best = m;
  return arg;
}

template <typename T>
__device__ __forceinline__ void maxpool_fwd(const MaxPool2dParams& p) {
  const T* __restrict__ x = reinterpret_cast<const T*>(p.x);
  T* __restrict__ y = reinterpret_cast<T*>(p.out);
  const int64_t ohw = int64_t(p.out_h) * p.out_w, hw = int64_t(p.h) * p.w;
  const int64_t n = p.planes * ohw;
  for (int64_t o = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; o < n; o += int64_t(gridDim.x) * blockDim.x) {
    const int64_t pl = o / ohw;
    const int r = int(o - pl * ohw);
    T best;
    argmax(p, x + pl * hw, r / p.out_w, r % p.out_w, &best);
    y[o] = best;
  }
}

// The range [*lo, *hi) of output rows (or columns) whose windows hold input
// row i: o*stride - pad <= i < o*stride - pad + k.
__device__ __forceinline__ void windows(int i, int pad, int k, int stride, int out, int* lo, int* hi) {
  const int j = i + pad - k + 1;
  *lo = j > 0 ? (j + stride - 1) / stride : 0;
  *hi = max(*lo, min((i + pad) / stride + 1, out));
}

template <typename T>
__device__ __forceinline__ void maxpool_bwd(const MaxPool2dParams& p) {
  const T* __restrict__ x = reinterpret_cast<const T*>(p.x);
  const T* __restrict__ dy = reinterpret_cast<const T*>(p.dy);
  T* __restrict__ dx = reinterpret_cast<T*>(p.out);
  const int64_t ohw = int64_t(p.out_h) * p.out_w, hw = int64_t(p.h) * p.w;
  const int64_t n = p.planes * hw;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t pl = i / hw;
    const int r = int(i - pl * hw);
    const T* plane = x + pl * hw;
    const T* g = dy + pl * ohw;
    int oh0, oh1, ow0, ow1;
    windows(r / p.w, p.pad_h, p.kh, p.stride_h, p.out_h, &oh0, &oh1);
    windows(r % p.w, p.pad_w, p.kw, p.stride_w, p.out_w, &ow0, &ow1);
    T sum = 0;
    for (int oh = oh0; oh < oh1; ++oh) {
      for (int ow = ow0; ow < ow1; ++ow) {
        T best;
        if (argmax(p, plane, oh, ow, &best) == r) sum += g[oh * p.out_w + ow];
      }
    }
    dx[i] = sum;
  }
}

template <typename T>
__device__ __forceinline__ void maxpool_bwd_tiled(const MaxPool2dParams& p) {
  // Each window that touches the tile: its winner (an offset in the plane)
  // and its dy.
  __shared__ int win_arg[kTileWindows];
  __shared__ T win_dy[kTileWindows];
  const T* __restrict__ x = reinterpret_cast<const T*>(p.x);
  const T* __restrict__ dy = reinterpret_cast<const T*>(p.dy);
  T* __restrict__ dx = reinterpret_cast<T*>(p.out);
  const int64_t ohw = int64_t(p.out_h) * p.out_w, hw = int64_t(p.h) * p.w;
  const int tiles_w = (p.w + kTileW - 1) / kTileW;
  const int64_t per_plane = int64_t((p.h + kTileH - 1) / kTileH) * tiles_w;
  const int64_t tiles = p.planes * per_plane;
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int64_t pl = t / per_plane;
    const int tr = int(t - pl * per_plane);
    const int ih0 = tr / tiles_w * kTileH, iw0 = tr % tiles_w * kTileW;
    const int ih1 = min(ih0 + kTileH, p.h), iw1 = min(iw0 + kTileW, p.w);
    // The windows of the tile's first and last rows (columns) bound those
    // of every row (column) between.
    int oh0, oh1, ow0, ow1, unused;
    windows(ih0, p.pad_h, p.kh, p.stride_h, p.out_h, &oh0, &unused);
    windows(ih1 - 1, p.pad_h, p.kh, p.stride_h, p.out_h, &unused, &oh1);
    windows(iw0, p.pad_w, p.kw, p.stride_w, p.out_w, &ow0, &unused);
    windows(iw1 - 1, p.pad_w, p.kw, p.stride_w, p.out_w, &unused, &ow1);
    const int nw = max(ow1 - ow0, 0), nwin = max(oh1 - oh0, 0) * nw;
    const T* plane = x + pl * hw;
    const T* g = dy + pl * ohw;
    for (int w = threadIdx.x; w < nwin; w += blockDim.x) {
      const int oh = oh0 + w / nw, ow = ow0 + w % nw;
      T best;
      win_arg[w] = argmax(p, plane, oh, ow, &best);
      win_dy[w] = g[oh * p.out_w + ow];
    }
    __syncthreads();
    for (int i = threadIdx.x; i < kTileH * kTileW; i += blockDim.x) {
      const int ih = ih0 + i / kTileW, iw = iw0 + i % kTileW;
      if (ih >= ih1 || iw >= iw1) continue;
      const int r = ih * p.w + iw;
      int a0, a1, b0, b1;
      windows(ih, p.pad_h, p.kh, p.stride_h, p.out_h, &a0, &a1);
      windows(iw, p.pad_w, p.kw, p.stride_w, p.out_w, &b0, &b1);
      T sum = 0;
      for (int oh = a0; oh < a1; ++oh) {
        for (int ow = b0; ow < b1; ++ow) {
          const int w = (oh - oh0) * nw + (ow - ow0);
          if (win_arg[w] == r) sum += win_dy[w];
        }
      }
      dx[pl * hw + r] = sum;
    }
    // The next tile's windows overwrite these.
    __syncthreads();
  }
}

}  // namespace stheno

extern "C" {
__global__ void __launch_bounds__(stheno::kMaxPoolThreads) maxpool_fwd_f32(stheno::MaxPool2dParams p) {
  stheno::maxpool_fwd<float>(p);
}
__global__ void __launch_bounds__(stheno::kMaxPoolThreads) maxpool_fwd_f64(stheno::MaxPool2dParams p) {
  stheno::maxpool_fwd<double>(p);
}
__global__ void __launch_bounds__(stheno::kMaxPoolThreads) maxpool_bwd_tiled_f32(stheno::MaxPool2dParams p) {
  stheno::maxpool_bwd_tiled<float>(p);
}
__global__ void __launch_bounds__(stheno::kMaxPoolThreads) maxpool_bwd_tiled_f64(stheno::MaxPool2dParams p) {
  stheno::maxpool_bwd_tiled<double>(p);
}
__global__ void __launch_bounds__(stheno::kMaxPoolThreads) maxpool_bwd_f32(stheno::MaxPool2dParams p) {
  stheno::maxpool_bwd<float>(p);
}
__global__ void __launch_bounds__(stheno::kMaxPoolThreads) maxpool_bwd_f64(stheno::MaxPool2dParams p) {
  stheno::maxpool_bwd<double>(p);
}
}
