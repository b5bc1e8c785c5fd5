// The passes of ConvTranspose that are not convolutions: the CUDA twins of
// ops' convTBiasAct and convTChannelSums (ops/convtranspose.go). The GEMMs
// are conv.cu's (ops/convtranspose_device.go says which).
//
// - conv_transpose_epilogue_<dtype>: y = act(z + bias), with a depth-to-space
//   rearrangement by (fh, fw) on the way: z [N, C*fh*fw, H, W] is a 1x1
//   convolution's output whose channel c*fh*fw + a*fw + b holds the pixels
//   (i*fh + a, j*fw + b) of channel c of y [N, C, H*fh, W*fw] (a transposed
//   convolution whose stride is its kernel, Mask R-CNN's 2x2 stride-2
//   upsampling, is that 1x1 convolution to C*fh*fw channels). fh = fw = 1
//   is the plain bias and activation pass after the strided data-gradient
//   GEMM (any other transposed convolution), which may run in place. A
//   thread per element of y, in order (the writes coalesce; with fw = 2 a
//   warp reads two rows of z, each coalesced). The arithmetic is the CPU
//   twin's: with a bias or a ReLU, v = z + bias[c] (0 without a bias), and
//   the ReLU writes 0 where !(v > 0), NaN included; with neither, y = z.
// - conv_transpose_bias_grad_<dtype>: db[c] = the sum of dy [N, C, HW] over its
//   images and pixels: a block per channel, the images in order, each
//   plane's sum (threads over strided pixels, then a tree in shared
//   memory) added to the channel's in image order. The same sum on every
//   run; the CPU twin adds each plane in pixel order instead (TolParity).
//
// Element offsets are 64-bit.
#include <stdint.h>

#include "params_gen.cuh"

namespace stheno::convt {

// stheno:const ConvTransposeThreads
// The threads of a block of both kernels.
constexpr int kThreads = 256;

// conv_transpose_epilogue's parameters.
struct ConvTransposeEpilogueParams {
  uint64_t z;     // [N, C*fh*fw, H, W]
  uint64_t y;     // [N, C, H*fh, W*fw]; may be z when fh = fw = 1
  uint64_t bias;  // [C], or 0
  int64_t planes; // N*C, the planes of y
  int32_t c;
  int32_t h, w;   // a plane of z
  int32_t factor_h, factor_w;  // fh, fw
  int32_t relu;                 // bool
};
STHENO_PARAMS(ConvTransposeEpilogueParams);

// conv_transpose_bias_grad's parameters.
struct ConvTransposeBiasGradParams {
  uint64_t dy;  // [N, C, HW]
  uint64_t bias_grad;  // db [C]
  int64_t hw;
  int32_t n, c;
};
STHENO_PARAMS(ConvTransposeBiasGradParams);

template <typename T>
__device__ __forceinline__ void epilogue(const ConvTransposeEpilogueParams& p) {
  const T* z = reinterpret_cast<const T*>(p.z);
  T* y = reinterpret_cast<T*>(p.y);
  const T* bias = reinterpret_cast<const T*>(p.bias);
  const int ow = p.w * p.factor_w, oh = p.h * p.factor_h;
  const int64_t ohw = int64_t(oh) * ow, n = p.planes * ohw, hw = int64_t(p.h) * p.w;
  const bool affine = bias != nullptr || p.relu;
  for (int64_t o = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; o < n; o += int64_t(gridDim.x) * blockDim.x) {
    const int64_t plane = o / ohw;
    const int r = int(o - plane * ohw);
    const int yr = r / ow, yc = r - yr * ow;
    const int i = yr / p.factor_h, a = yr - i * p.factor_h;
    const int j = yc / p.factor_w, b = yc - j * p.factor_w;
    const int64_t img = plane / p.c;
    const int c = int(plane - img * p.c);
    // z's channel c*fh*fw + a*fw + b of image img.
    const int64_t zc = (img * p.c + c) * p.factor_h * p.factor_w + a * p.factor_w + b;
    T v = z[zc * hw + int64_t(i) * p.w + j];
    if (affine) {
      v += bias != nullptr ? bias[c] : T(0);
      // !(v > 0): NaN goes to 0 too, as the CPU twin's.
      if (p.relu && !(v > T(0))) v = T(0);
    }
    y[o] = v;
  }
}

template <typename T>
__device__ __forceinline__ void bias_grad(const ConvTransposeBiasGradParams& p) {
  __shared__ T part[kThreads];
  const T* dy = reinterpret_cast<const T*>(p.dy);
  const int c = blockIdx.x;
  T acc = T(0);
  for (int img = 0; img < p.n; ++img) {
    const T* plane = dy + (int64_t(img) * p.c + c) * p.hw;
    T s = T(0);
    for (int64_t i = threadIdx.x; i < p.hw; i += blockDim.x) s += plane[i];
    part[threadIdx.x] = s;
    __syncthreads();
    for (unsigned half = blockDim.x / 2; half > 0; half /= 2) {
      if (threadIdx.x < half) part[threadIdx.x] += part[threadIdx.x + half];
      __syncthreads();
    }
    if (threadIdx.x == 0) acc += part[0];
    // part is rewritten by the next image.
    __syncthreads();
  }
  if (threadIdx.x == 0) reinterpret_cast<T*>(p.bias_grad)[c] = acc;
}

}  // namespace stheno::convt

extern "C" {
__global__ void __launch_bounds__(stheno::convt::kThreads) conv_transpose_epilogue_f32(stheno::convt::ConvTransposeEpilogueParams p) {
  stheno::convt::epilogue<float>(p);
}
__global__ void __launch_bounds__(stheno::convt::kThreads) conv_transpose_epilogue_f64(stheno::convt::ConvTransposeEpilogueParams p) {
  stheno::convt::epilogue<double>(p);
}
__global__ void __launch_bounds__(stheno::convt::kThreads) conv_transpose_bias_grad_f32(stheno::convt::ConvTransposeBiasGradParams p) {
  stheno::convt::bias_grad<float>(p);
}
__global__ void __launch_bounds__(stheno::convt::kThreads) conv_transpose_bias_grad_f64(stheno::convt::ConvTransposeBiasGradParams p) {
  stheno::convt::bias_grad<double>(p);
}
}
