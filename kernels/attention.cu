// The two small element-wise steps of multi-head attention that are not a
// GEMM, a softmax or a layout op (ops/attention.go composes the rest): the
// CUDA twins of kernels/attention.go.
//
// - scale_mask: y = scale*x + mask[n, s] over scores x [N*H, L, S] (batch
//   index b = n*H + h, as torch.nn.MultiheadAttention lays out its heads),
//   mask [N, S] additive (0 to keep a key, -inf to ignore it) or absent.
//   Without a mask it is also its own backward: dx = scale*dy.
// - head_mean: y[n, j] = (sum over h of x[n*H + h, j]) / H, j over L*S,
//   the heads summed in increasing h (the head-averaged attention weights);
//   head_mean_bwd: dx[n*H + h, j] = dy[n, j] / H.
//
// A thread per output element, grid-striding; offsets are 64-bit.
#include <stdint.h>

#include "params_gen.cuh"

namespace stheno::attn {

// stheno:const AttentionThreads
// The threads of every block of attention.cu.
constexpr int kThreads = 256;

struct ScaleMaskParams {
  uint64_t x;
  uint64_t mask;  // [N, S], or 0: none
  uint64_t out;
  int64_t total;  // elements of x: N*H*L*S
  int64_t ls;     // L*S
  int64_t s;
  int64_t heads;
  double scale;
};
STHENO_PARAMS(ScaleMaskParams);

struct HeadMeanParams {
  uint64_t x;    // forward: [N*H, L*S]; backward: dy [N, L*S]
  uint64_t out;  // forward: [N, L*S]; backward: dx [N*H, L*S]
  int64_t total; // elements of out
  int64_t ls;    // L*S
  int64_t heads;
};
STHENO_PARAMS(HeadMeanParams);

template <typename T>
__device__ __forceinline__ void scale_mask(const ScaleMaskParams& p) {
  const T* __restrict__ x = reinterpret_cast<const T*>(p.x);
  const T* __restrict__ mask = reinterpret_cast<const T*>(p.mask);
  T* __restrict__ out = reinterpret_cast<T*>(p.out);
  const T scale = static_cast<T>(p.scale);
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < p.total; i += step) {
    T v = scale * x[i];
    if (mask != nullptr) {
      const int64_t b = i / p.ls, n = b / p.heads, col = i % p.s;
      v += mask[n * p.s + col];
    }
    out[i] = v;
  }
}

template <typename T>
__device__ __forceinline__ void head_mean(const HeadMeanParams& p) {
  const T* __restrict__ x = reinterpret_cast<const T*>(p.x);
  T* __restrict__ out = reinterpret_cast<T*>(p.out);
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < p.total; i += step) {
    const int64_t n = i / p.ls, j = i - n * p.ls;
    const T* src = x + n * p.heads * p.ls + j;
    T sum = src[0];
    for (int64_t h = 1; h < p.heads; ++h) sum += src[h * p.ls];
    out[i] = sum / static_cast<T>(p.heads);
  }
}

template <typename T>
__device__ __forceinline__ void head_mean_bwd(const HeadMeanParams& p) {
  const T* __restrict__ dy = reinterpret_cast<const T*>(p.x);
  T* __restrict__ dx = reinterpret_cast<T*>(p.out);
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < p.total; i += step) {
    const int64_t b = i / p.ls, j = i - b * p.ls;
    dx[i] = dy[(b / p.heads) * p.ls + j] / static_cast<T>(p.heads);
  }
}

}  // namespace stheno::attn

extern "C" {
__global__ void __launch_bounds__(stheno::attn::kThreads) attention_scale_mask_f32(stheno::attn::ScaleMaskParams p) { stheno::attn::scale_mask<float>(p); }
__global__ void __launch_bounds__(stheno::attn::kThreads) attention_scale_mask_f64(stheno::attn::ScaleMaskParams p) { stheno::attn::scale_mask<double>(p); }
__global__ void __launch_bounds__(stheno::attn::kThreads) attention_head_mean_f32(stheno::attn::HeadMeanParams p) { stheno::attn::head_mean<float>(p); }
__global__ void __launch_bounds__(stheno::attn::kThreads) attention_head_mean_f64(stheno::attn::HeadMeanParams p) { stheno::attn::head_mean<double>(p); }
__global__ void __launch_bounds__(stheno::attn::kThreads) attention_head_mean_bwd_f32(stheno::attn::HeadMeanParams p) { stheno::attn::head_mean_bwd<float>(p); }
__global__ void __launch_bounds__(stheno::attn::kThreads) attention_head_mean_bwd_f64(stheno::attn::HeadMeanParams p) { stheno::attn::head_mean_bwd<double>(p); }
}
