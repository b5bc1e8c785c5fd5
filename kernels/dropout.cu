// Dropout, forward and backward (one kernel: dx = dy * m is y = x * m of
// dy): the CUDA twin of kernels/dropout.go, with
// torch.nn.functional.dropout's semantics: y = x * m, m = scale = 1/(1-p)
// where the element is kept, 0 where it is dropped (x * 0, so a NaN or an
// infinity stays NaN when dropped, as in PyTorch).
//
// The mask is counter-based: element i is kept when word i%4 of
// Philox-4x32-10 of the counter (i/4, stream, step lo, step hi) under the
// key (seed lo, seed hi) is below keep. So it is a pure function of seed,
// stream, step and i: the same on every run, on the CPU twin and here, for
// any grid, and the backward draws the forward's mask again instead of
// reading a saved one. keep >= 2^32 keeps everything (p = 0, or evaluation)
// and draws nothing.
//
// Kernels: dropout_<dtype>[_v16b], a thread per group of four elements (one
// Philox call), grid-stride over 64-bit indices; _v16b loads and stores the
// group as 16-byte vectors (x and out 16-byte aligned), the last, partial
// group element by element.
#include <stdint.h>

#include "params_gen.cuh"

namespace stheno {

// The launch parameters of the dropout kernels, passed by value.
struct DropoutParams {
  uint64_t x;       // forward: x; backward: dy
  uint64_t out;     // forward: y; backward: dx
  int64_t n;        // elements, at most 2^34 (a group of four per counter word)
  // Philox's key, the training step (counter words 2 and 3), and the
  // threshold: an element is kept when its word is below keep (2^32: all).
  // Unsigned 64-bit values carried in int64_t (uint64_t fields are
  // addresses to the generator).
  int64_t seed;
  int64_t step;
  int64_t keep;
  double scale;     // the kept elements' factor, a value of the element type
  uint32_t stream;  // counter word 1: which dropout of the graph
  int32_t unused;
};
STHENO_PARAMS(DropoutParams);

// stheno:const DropoutThreads
// The threads of a dropout block.
constexpr int kDropoutThreads = 256;

struct Philox4 {
  uint32_t v[4];
};

// Philox-4x32-10 (Salmon et al., SC'11) of counter c under key (k0, k1):
// ten rounds of two 32x32->64 products, the key bumped by the Weyl
// increments between rounds.
__device__ __forceinline__ Philox4 philox4x32_10(Philox4 c, uint32_t k0, uint32_t k1) {
#pragma unroll
  for (int r = 0; r < 10; ++r) {
    if (r > 0) k0 += 0x9E3779B9u, k1 += 0xBB67AE85u;
    const uint32_t hi0 = __umulhi(0xD2511F53u, c.v[0]), lo0 = 0xD2511F53u * c.v[0];
    const uint32_t hi1 = __umulhi(0xCD9E8D57u, c.v[2]), lo1 = 0xCD9E8D57u * c.v[2];
    c = Philox4{{hi1 ^ c.v[1] ^ k0, lo1, hi0 ^ c.v[3] ^ k1, lo0}};
  }
  return c;
}

// V elements of T loaded or stored at once (one 16-byte vector when V*
// sizeof(T) is 16).
template <typename T, int V>
struct alignas(sizeof(T) * V) DropPack {
  T v[V];
};

template <typename T, bool kVec>
__device__ __forceinline__ void dropout(const DropoutParams& p) {
  const T* __restrict__ x = reinterpret_cast<const T*>(p.x);
  T* __restrict__ y = reinterpret_cast<T*>(p.out);
  const T scale = T(p.scale);
  const uint64_t seed = uint64_t(p.seed), step = uint64_t(p.step), keep = uint64_t(p.keep);
  const bool all = keep >= (uint64_t(1) << 32);
  const int64_t groups = (p.n + 3) / 4;
  for (int64_t g = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; g < groups; g += int64_t(gridDim.x) * blockDim.x) {
    Philox4 r{{0, 0, 0, 0}};
    if (!all) {
      r = philox4x32_10(Philox4{{uint32_t(g), p.stream, uint32_t(step), uint32_t(step >> 32)}}, uint32_t(seed),
                        uint32_t(seed >> 32));
    }
    T m[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) m[j] = all || r.v[j] < keep ? scale : T(0);
    const int64_t i0 = 4 * g;
    if (kVec && i0 + 4 <= p.n) {
      constexpr int V = 16 / sizeof(T);
      using P = DropPack<T, V>;
#pragma unroll
      for (int h = 0; h < 4 / V; ++h) {
        P v = reinterpret_cast<const P*>(x + i0)[h];
#pragma unroll
        for (int j = 0; j < V; ++j) v.v[j] = v.v[j] * m[h * V + j];
        reinterpret_cast<P*>(y + i0)[h] = v;
      }
    } else {
      for (int j = 0; j < 4 && i0 + j < p.n; ++j) y[i0 + j] = x[i0 + j] * m[j];
    }
  }
}

}  // namespace stheno

extern "C" {
__global__ void __launch_bounds__(stheno::kDropoutThreads) dropout_f32(stheno::DropoutParams p) {
  stheno::dropout<float, false>(p);
}
__global__ void __launch_bounds__(stheno::kDropoutThreads) dropout_f64(stheno::DropoutParams p) {
  stheno::dropout<double, false>(p);
}
__global__ void __launch_bounds__(stheno::kDropoutThreads) dropout_v16b_f32(stheno::DropoutParams p) {
  stheno::dropout<float, true>(p);
}
__global__ void __launch_bounds__(stheno::kDropoutThreads) dropout_v16b_f64(stheno::DropoutParams p) {
  stheno::dropout<double, true>(p);
}
}
