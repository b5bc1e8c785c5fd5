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
// Kernels: maxpool_{fwd,bwd}_<dtype>, a thread per output pixel (fwd) or
// per input pixel (bwd), grid-stride loops over 64-bit indices, so the
// grid never changes a result.
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
// The threads of a block of either kernel.
constexpr int kMaxPoolThreads = 256;

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

}  // namespace stheno

extern "C" {
__global__ void __launch_bounds__(stheno::kMaxPoolThreads) maxpool_fwd_f32(stheno::MaxPool2dParams p) {
  stheno::maxpool_fwd<float>(p);
}
__global__ void __launch_bounds__(stheno::kMaxPoolThreads) maxpool_fwd_f64(stheno::MaxPool2dParams p) {
  stheno::maxpool_fwd<double>(p);
}
__global__ void __launch_bounds__(stheno::kMaxPoolThreads) maxpool_bwd_f32(stheno::MaxPool2dParams p) {
  stheno::maxpool_bwd<float>(p);
}
__global__ void __launch_bounds__(stheno::kMaxPoolThreads) maxpool_bwd_f64(stheno::MaxPool2dParams p) {
  stheno::maxpool_bwd<double>(p);
}
}
