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
//   pixels of a plane. Its threads load the pixels of x that the windows
//   touching the tile read and those windows' dy into shared memory, all
//   loads at once; then find each window's winner there, once; then each
//   pixel gathers from its windows. Each window is searched about once
//   (twice at the tile's edges), where a thread per pixel would search it
//   once per pixel it holds (9 times for the ResNet stem's 3x3 windows),
//   each search a chain of loads from global memory. For windows of more
//   than one pixel whose tile touches at most kTileWindows windows reading
//   at most kTileRegion pixels (ops checks). _k3: 3x3 windows (the ResNet
//   stem's), the search unrolled.
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
constexpr int kTileH = 32;
// stheno:const MaxPool2dTileW
// The input columns of a tile of maxpool_bwd_tiled: a warp's coalesced row.
constexpr int kTileW = 32;
// stheno:const MaxPool2dTileWindows
// The most windows a tile of maxpool_bwd_tiled may touch: (kTileH + kh -
// 2)/stride_h + 1 rows of them times (kTileW + kw - 2)/stride_w + 1
// columns: 17 x 17 for the ResNet stem's pooling, 34 x 34 for 3x3 windows
// of stride 1.
constexpr int kTileWindows = 1280;
// stheno:const MaxPool2dTileRegion
// The most pixels of x those windows may read: (rows - 1)*stride_h + kh
// rows times (columns - 1)*stride_w + kw columns of them; 35 x 35 for the
// stem.
constexpr int kTileRegion = 2048;

// The winner of window (oh, ow) of a plane: its offset in the plane, and
// its value in *best. The pixels are read from src, which holds the
// plane's rows from row0 and columns from col0 on, ld apart: the plane
// itself (ld = w, row0 = col0 = 0) or a part of it in shared memory.
template <typename T>
__device__ __forceinline__ int argmax(const MaxPool2dParams& p, const T* src, int ld, int row0, int col0, int oh,
                                      int ow, T* best) {
  int h0 = oh * p.stride_h - p.pad_h, w0 = ow * p.stride_w - p.pad_w;
  const int h1 = min(h0 + p.kh, p.h), w1 = min(w0 + p.kw, p.w);
  h0 = max(h0, 0), w0 = max(w0, 0);
  T m = -std::numeric_limits<T>::infinity();
  int arg = h0 * p.w + w0;
  for (int ih = h0; ih < h1; ++ih) {
    for (int iw = w0; iw < w1; ++iw) {
      const T v = src[(ih - row0) * ld + (iw - col0)];
      // v != v: a NaN wins over anything, a later NaN over an earlier one.
      if (v > m || v != v) m = v, arg = ih * p.w + iw;
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
    argmax(p, x + pl * hw, p.w, 0, 0, r / p.out_w, r % p.out_w, &best);
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
        if (argmax(p, plane, p.w, 0, 0, oh, ow, &best) == r) sum += g[oh * p.out_w + ow];
      }
    }
    dx[i] = sum;
  }
}

// The winner of window (oh, ow) as region_argmax finds it in a tile's
// region of x (rows from rh0, columns from rw0, ld apart): its index in
// the region. The rule and the scan order are argmax's; K > 0 is the
// window's size in both dimensions, known at compile time (its loops
// unrolled), K = 0 takes p.kh and p.kw.
template <int K, typename T>
__device__ __forceinline__ int region_argmax(const MaxPool2dParams& p, const T* region, int ld, int rh0, int rw0,
                                             int oh, int ow) {
  const int kh = K > 0 ? K : p.kh, kw = K > 0 ? K : p.kw;
  int h0 = oh * p.stride_h - p.pad_h, w0 = ow * p.stride_w - p.pad_w;
  const int nh = min(h0 + kh, p.h) - max(h0, 0), nw = min(w0 + kw, p.w) - max(w0, 0);
  h0 = max(h0, 0), w0 = max(w0, 0);
  const int first = (h0 - rh0) * ld + (w0 - rw0);
  const T* q = region + first;
  T m = -std::numeric_limits<T>::infinity();
  int arg = 0;
#pragma unroll
  for (int i = 0; i < kh; ++i) {
    if (i >= nh) break;
#pragma unroll
    for (int j = 0; j < kw; ++j) {
      if (j >= nw) break;
      const T v = q[i * ld + j];
      // v != v: a NaN wins over anything, a later NaN over an earlier one.
      if (v > m || v != v) m = v, arg = i * ld + j;
    }
  }
  return first + arg;
}

template <int K, typename T>
__device__ __forceinline__ void maxpool_bwd_tiled(const MaxPool2dParams& p) {
  // The pixels of x the tile's windows read; each window's winner (its
  // index in region) and dy; the windows of each row and column of the
  // tile.
  __shared__ T region[kTileRegion];
  __shared__ int win_arg[kTileWindows];
  __shared__ T win_dy[kTileWindows];
  __shared__ int row_win[2][kTileH], col_win[2][kTileW];
  const T* __restrict__ x = reinterpret_cast<const T*>(p.x);
  const T* __restrict__ dy = reinterpret_cast<const T*>(p.dy);
  T* __restrict__ dx = reinterpret_cast<T*>(p.out);
  const int64_t ohw = int64_t(p.out_h) * p.out_w, hw = int64_t(p.h) * p.w;
  const int tiles_w = (p.w + kTileW - 1) / kTileW;
  const int64_t per_plane = int64_t((p.h + kTileH - 1) / kTileH) * tiles_w;
  const int64_t tiles = p.planes * per_plane;
  // Thread (tx, ty) of the block seen as kTileW x (blockDim.x/kTileW) (a
  // multiple of kTileW threads) takes columns tx, tx + kTileW, ... of rows
  // ty, ty + rows, ...: no division, and a warp on consecutive columns of
  // a row.
  const int tx = threadIdx.x % kTileW, ty = threadIdx.x / kTileW, rows = blockDim.x / kTileW;
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
    // Their pixels inside x: rows [rh0, rh1), columns [rw0, rw1).
    const int rh0 = max(oh0 * p.stride_h - p.pad_h, 0), rh1 = min((oh1 - 1) * p.stride_h - p.pad_h + p.kh, p.h);
    const int rw0 = max(ow0 * p.stride_w - p.pad_w, 0), rw1 = min((ow1 - 1) * p.stride_w - p.pad_w + p.kw, p.w);
    const int ld = rw1 - rw0;
    const T* plane = x + pl * hw;
    const T* g = dy + pl * ohw;
    // Every load of the tile at once: its region of x and its windows' dy.
    if (nwin > 0) {
      for (int rr = ty; rr < rh1 - rh0; rr += rows)
        for (int cc = tx; cc < ld; cc += kTileW) region[rr * ld + cc] = plane[(rh0 + rr) * p.w + rw0 + cc];
      for (int rr = ty; rr < oh1 - oh0; rr += rows)
        for (int cc = tx; cc < nw; cc += kTileW) win_dy[rr * nw + cc] = g[(oh0 + rr) * p.out_w + ow0 + cc];
    }
    for (int i = threadIdx.x; i < kTileH + kTileW; i += blockDim.x) {
      if (i < kTileH) {
        windows(ih0 + i, p.pad_h, p.kh, p.stride_h, p.out_h, &row_win[0][i], &row_win[1][i]);
      } else {
        const int c = i - kTileH;
        windows(iw0 + c, p.pad_w, p.kw, p.stride_w, p.out_w, &col_win[0][c], &col_win[1][c]);
      }
    }
    __syncthreads();
    for (int w = threadIdx.x; w < nwin; w += blockDim.x) {
      win_arg[w] = region_argmax<K>(p, region, ld, rh0, rw0, oh0 + w / nw, ow0 + w % nw);
    }
    __syncthreads();
    // Each thread gathers the pixels of its column: the column's windows
    // found once.
    const int iw = iw0 + tx;
    if (iw < iw1) {
      const int b0 = col_win[0][tx] - ow0, b1 = col_win[1][tx] - ow0;
      for (int ih = ih0 + ty; ih < ih1; ih += rows) {
        // The pixel's index in region (where it lies if a window holds it).
        const int rr = (ih - rh0) * ld + (iw - rw0);
        const int a0 = row_win[0][ih - ih0] - oh0, a1 = row_win[1][ih - ih0] - oh0;
        T sum = 0;
        for (int oh = a0; oh < a1; ++oh) {
          for (int ow = b0; ow < b1; ++ow) {
            const int w = oh * nw + ow;
            if (win_arg[w] == rr) sum += win_dy[w];
          }
        }
        dx[pl * hw + ih * p.w + iw] = sum;
      }
    }
    // The next tile overwrites the shared memory.
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
  stheno::maxpool_bwd_tiled<0, float>(p);
}
__global__ void __launch_bounds__(stheno::kMaxPoolThreads) maxpool_bwd_tiled_f64(stheno::MaxPool2dParams p) {
  stheno::maxpool_bwd_tiled<0, double>(p);
}
__global__ void __launch_bounds__(stheno::kMaxPoolThreads) maxpool_bwd_tiled_k3_f32(stheno::MaxPool2dParams p) {
  stheno::maxpool_bwd_tiled<3, float>(p);
}
__global__ void __launch_bounds__(stheno::kMaxPoolThreads) maxpool_bwd_tiled_k3_f64(stheno::MaxPool2dParams p) {
  stheno::maxpool_bwd_tiled<3, double>(p);
}
__global__ void __launch_bounds__(stheno::kMaxPoolThreads) maxpool_bwd_f32(stheno::MaxPool2dParams p) {
  stheno::maxpool_bwd<float>(p);
}
__global__ void __launch_bounds__(stheno::kMaxPoolThreads) maxpool_bwd_f64(stheno::MaxPool2dParams p) {
  stheno::maxpool_bwd<double>(p);
}
}
