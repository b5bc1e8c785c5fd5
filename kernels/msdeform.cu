// Multi-scale deformable attention (Deformable-DETR's MSDeformAttn), forward
// and backward: the CUDA twins of kernels/msdeform.go.
//
// A group of G lanes (G a power of two <= 32, G <= D rounded up) works on one
// (n, q, m): lane i handles channels d = i, i+G, ... so that the value reads,
// the output writes and the grad_value atomics of a group touch consecutive
// addresses. Sampling positions and bilinear taps are computed by every lane
// of the group (they are cheap next to the memory traffic). In the backward
// pass the gradients of the location and the attention weight are sums over
// channels: the group reduces them with warp shuffles and one lane writes
// them, with no atomics and no shared memory.
#include "bilinear.cuh"

namespace stheno {

// Launch parameters, passed by value. Mirrors msDeformArgs in ops (Go); keep
// field order and types in step.
struct MSDeformParams {
  uint64_t value;        // [N,S,M,D]
  uint64_t loc;          // [N,Lq,M,L,P,2] normalised (x, y)
  uint64_t weight;       // [N,Lq,M,L,P]
  uint64_t out;          // forward: [N,Lq,M*D]
  uint64_t grad_out;     // backward: [N,Lq,M*D]
  uint64_t grad_value;   // backward: [N,S,M,D], zeroed by the caller, scattered into
  uint64_t grad_loc;     // backward: [N,Lq,M,L,P,2], written
  uint64_t grad_weight;  // backward: [N,Lq,M,L,P], written
  uint64_t levels;       // int32 [L][3]: H, W, first pixel of the level in S
  int32_t n, s, m, d, lq, l, p;
  int32_t group;         // lanes per (n, q, m)
};

struct Level {
  int h, w, start;
};

__device__ __forceinline__ Level level_of(const MSDeformParams& p, int l) {
  const int* lv = reinterpret_cast<const int*>(p.levels) + 3 * l;
  return Level{__ldg(lv), __ldg(lv + 1), __ldg(lv + 2)};
}

// Sum of v over the G lanes of a group; every lane gets the sum. All 32 lanes
// of the warp must call it (groups tile warps exactly).
template <typename T>
__device__ __forceinline__ T group_sum(T v, int group) {
  for (int off = group >> 1; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off, group);
  return v;
}

// The pixel position of a normalised location on a level:
// grid_sample(align_corners=False) maps loc to loc*size - 0.5.
template <typename T>
__device__ __forceinline__ bool level_taps(const T* loc, const Level& lv, Taps<T>* t) {
  const T x = loc[0] * static_cast<T>(lv.w) - T(0.5);
  const T y = loc[1] * static_cast<T>(lv.h) - T(0.5);
  return grid_taps(y, x, lv.h, lv.w, t);
}

template <typename T>
__device__ void msdeform_forward(const MSDeformParams& p) {
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t gid = tid / p.group;
  const int lane = static_cast<int>(tid % p.group);
  const int64_t groups = static_cast<int64_t>(p.n) * p.lq * p.m;
  if (gid >= groups) return;  // no shuffles in the forward pass
  const int m = static_cast<int>(gid % p.m);
  const int64_t nq = gid / p.m;  // n*Lq + q
  const int n = static_cast<int>(nq / p.lq);
  const int lp = p.l * p.p;
  const T* loc = reinterpret_cast<const T*>(p.loc) + gid * lp * 2;
  const T* wgt = reinterpret_cast<const T*>(p.weight) + gid * lp;
  const T* value = reinterpret_cast<const T*>(p.value);
  const int64_t pix_stride = static_cast<int64_t>(p.m) * p.d;  // between pixels in value
  T* out = reinterpret_cast<T*>(p.out) + gid * p.d;
  for (int d = lane; d < p.d; d += p.group) {
    T acc = T(0);
    for (int l = 0; l < p.l; ++l) {
      const Level lv = level_of(p, l);
      const T* base = value + ((static_cast<int64_t>(n) * p.s + lv.start) * p.m + m) * p.d + d;
      for (int pt = 0; pt < p.p; ++pt) {
        const int i = l * p.p + pt;
        Taps<T> t;
        if (!level_taps(loc + 2 * i, lv, &t)) continue;
        // Corners outside the map read 0, not value*0: a non-finite value
        // at the offset-0 pixel must not leak into samples that skip it.
        T v[4];
#pragma unroll
        for (int c = 0; c < 4; ++c) v[c] = t.in[c] ? __ldg(base + t.off[c] * pix_stride) : T(0);
        acc += __ldg(wgt + i) * (t.w[0] * v[0] + t.w[1] * v[1] + t.w[2] * v[2] + t.w[3] * v[3]);
      }
    }
    out[d] = acc;
  }
}

template <typename T>
__device__ void msdeform_backward(const MSDeformParams& p) {
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t groups = static_cast<int64_t>(p.n) * p.lq * p.m;
  // Lanes past the end stay to take part in the shuffles, doing no memory work.
  const bool valid = tid / p.group < groups;
  const int64_t gid = valid ? tid / p.group : groups - 1;
  const int lane = static_cast<int>(tid % p.group);
  const int m = static_cast<int>(gid % p.m);
  const int n = static_cast<int>(gid / p.m / p.lq);
  const int lp = p.l * p.p;
  const T* loc = reinterpret_cast<const T*>(p.loc) + gid * lp * 2;
  const T* wgt = reinterpret_cast<const T*>(p.weight) + gid * lp;
  const T* gout = reinterpret_cast<const T*>(p.grad_out) + gid * p.d;
  const T* value = reinterpret_cast<const T*>(p.value);
  T* gvalue = reinterpret_cast<T*>(p.grad_value);
  T* gloc = reinterpret_cast<T*>(p.grad_loc) + gid * lp * 2;
  T* gwgt = reinterpret_cast<T*>(p.grad_weight) + gid * lp;
  const int64_t pix_stride = static_cast<int64_t>(p.m) * p.d;
  for (int l = 0; l < p.l; ++l) {
    const Level lv = level_of(p, l);
    const int64_t base_off = ((static_cast<int64_t>(n) * p.s + lv.start) * p.m + m) * p.d;
    for (int pt = 0; pt < p.p; ++pt) {
      const int i = l * p.p + pt;
      Taps<T> t;
      const bool ok = level_taps(loc + 2 * i, lv, &t);  // same for every lane of the group
      const T a = wgt[i];
      T dw = T(0), dx = T(0), dy = T(0);
      if (ok && valid) {
        const T hy = T(1) - t.ly, hx = T(1) - t.lx;
        for (int d = lane; d < p.d; d += p.group) {
          const T g = __ldg(gout + d);
          const T* b = value + base_off + d;
          T v[4];
#pragma unroll
          for (int c = 0; c < 4; ++c) v[c] = t.in[c] ? __ldg(b + t.off[c] * pix_stride) : T(0);
          dw += g * (t.w[0] * v[0] + t.w[1] * v[1] + t.w[2] * v[2] + t.w[3] * v[3]);
          // d(sample)/dx and /dy of the bilinear form, corners outside being 0.
          dx += g * (hy * (v[1] - v[0]) + t.ly * (v[3] - v[2]));
          dy += g * (hx * (v[2] - v[0]) + t.lx * (v[3] - v[1]));
          const T ag = a * g;
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            if (t.in[c]) atomicAdd(gvalue + base_off + d + t.off[c] * pix_stride, t.w[c] * ag);
          }
        }
      }
      dw = group_sum(dw, p.group);
      dx = group_sum(dx, p.group);
      dy = group_sum(dy, p.group);
      if (valid && lane == 0) {
        gwgt[i] = dw;
        // x = loc_x*W - 0.5, so d/dloc_x = W * d/dx.
        gloc[2 * i] = a * dx * static_cast<T>(lv.w);
        gloc[2 * i + 1] = a * dy * static_cast<T>(lv.h);
      }
    }
  }
}

}  // namespace stheno

extern "C" {
__global__ void msdeform_forward_f32(stheno::MSDeformParams p) { stheno::msdeform_forward<float>(p); }
__global__ void msdeform_forward_f64(stheno::MSDeformParams p) { stheno::msdeform_forward<double>(p); }
__global__ void msdeform_backward_f32(stheno::MSDeformParams p) { stheno::msdeform_backward<float>(p); }
__global__ void msdeform_backward_f64(stheno::MSDeformParams p) { stheno::msdeform_backward<double>(p); }
}
