// Layout ops: the CUDA twins of kernels/layout.go. Nothing here does
// arithmetic except the gather's backward sum; the rest moves elements, so
// the copies work on units of 4, 8 or 16 bytes whatever the dtype.
//
// - permute_copy (Permute where the innermost axis stays innermost, after
//   the launcher has dropped axes of size one and merged axes that stay
//   neighbours): a thread per unit of the output, written in order, read
//   from rows of the input that are contiguous too, so both sides coalesce.
//   A unit is 16 bytes where the innermost run's bytes allow (every input
//   stride is a multiple of that run). _i32: index arithmetic in 32 bits,
//   where the tensor allows it (64-bit divisions cost more than the copy).
// - permute_tile (the innermost axis moves, [N, C, HW] -> [N, HW, C]): 32x32
//   tiles through shared memory, read along the input's innermost axis and
//   written along the output's, so both sides coalesce; the other axes are
//   a batch walked by grid z.
// - copy_rows: rows of a strided 2-D region to another (Concat's inputs into
//   slices of its output, Slice, the gradient of Slice into zeros, Reshape
//   and Detach on the device).
// - gather_rows: out[i] = x[idx[i]] for rows of d units; an index outside
//   [0, n) writes a zero row and raises the device's status word
//   (kLayoutStatusBadIndex), which the next synchronisation reports.
// - gather_link and gather_scatter: the gradient of gather_rows, dx[idx[i]]
//   += dy[i], without atomics and in a fixed order. gather_link gives each
//   i the next j > i with the same index (a chain per destination row) and
//   marks the chain's first; gather_scatter has a thread per (first i,
//   column) walk its chain in increasing i and write the sum once. dx is
//   zeroed before. The sum per destination row runs in increasing i, as the
//   CPU twin adds. gather_link costs O(k^2) comparisons, one thread per i:
//   meant for the few thousand rows of query selection and top-k.
//
// Element offsets are 64-bit except in the _i32 copies.
#include <stdint.h>

#include "params_gen.cuh"

namespace stheno::layout {

// stheno:const LayoutMaxRank
// The most axes a permutation has once size-one axes are dropped and
// neighbours that stay neighbours merged.
constexpr int kMaxRank = 8;

// stheno:const LayoutTile
// permute_tile's tiles: kTile x kTile elements, blocks of kTile x
// kTileRowsPerPass threads.
constexpr int kTile = 32;
// stheno:const LayoutTileRowsPerPass
constexpr int kTileRowsPerPass = 8;

// stheno:const LayoutThreads
// The threads of a permute_copy, copy_rows or gather block.
constexpr int kThreads = 256;

// stheno:const LayoutStatusBadIndex
// The status word's code for a gather index outside [0, n) (the codes of
// bilinear.cuh's Status are smaller).
constexpr int kStatusBadIndex = 16;

// The parameters of permute_copy and permute_tile: the output's axes,
// outermost first, their sizes and the strides (in units) of the input and
// of the output along them. copy: in_strides[rank-1] == 1 and dims[rank-1]
// counts units; tile: in_strides[tile_axis] == 1, out_strides[rank-1] == 1.
struct PermuteParams {
  uint64_t in;
  uint64_t out;
  int64_t dims[kMaxRank];
  int64_t in_strides[kMaxRank];
  int64_t out_strides[kMaxRank];
  int64_t total;  // units of the output
  int64_t batch;  // tile: the product of the axes other than tile_axis and rank-1
  int32_t rank;
  int32_t tile_axis;
};
STHENO_PARAMS(PermuteParams);

// rows x cols units from src (a row every src_stride units) to dst (every
// dst_stride units).
struct CopyRowsParams {
  uint64_t src;
  uint64_t dst;
  int64_t rows;
  int64_t cols;
  int64_t src_stride;
  int64_t dst_stride;
};
STHENO_PARAMS(CopyRowsParams);

// x [n, d], idx [k] (int64), out [k, d]; backward: dy [k, d] in x, dx
// [n, d] in out, link [k] (int32).
struct GatherParams {
  uint64_t x;
  uint64_t idx;
  uint64_t out;
  uint64_t link;
  uint64_t status;
  int64_t n;
  int64_t k;
  int64_t d;  // units of a row (forward), elements (backward)
};
STHENO_PARAMS(GatherParams);

// Units of 4, 8 and 16 bytes, moved as one access each.
struct alignas(16) Bytes16 {
  uint32_t w[4];
};

template <typename U, typename I>
__device__ __forceinline__ void permute_copy(const PermuteParams& p) {
  const U* __restrict__ in = reinterpret_cast<const U*>(p.in);
  U* __restrict__ out = reinterpret_cast<U*>(p.out);
  const int last = p.rank - 1;
  const I total = static_cast<I>(p.total), inner = static_cast<I>(p.dims[last]);
  const I step = static_cast<I>(gridDim.x) * blockDim.x;
  for (I o = static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x; o < total; o += step) {
    I rest = o / inner;
    I off = o - rest * inner;
    for (int k = last - 1; k > 0; --k) {
      const I d = static_cast<I>(p.dims[k]);
      const I q = rest / d;
      off += (rest - q * d) * static_cast<I>(p.in_strides[k]);
      rest = q;
    }
    if (last > 0) off += rest * static_cast<I>(p.in_strides[0]);
    out[o] = in[off];
  }
}

template <typename U>
__device__ __forceinline__ void permute_tile(const PermuteParams& p) {
  __shared__ U tile[kTile][kTile + 1];  // +1: the transposed reads hit distinct banks
  const U* __restrict__ in = reinterpret_cast<const U*>(p.in);
  U* __restrict__ out = reinterpret_cast<U*>(p.out);
  const int last = p.rank - 1, a = p.tile_axis;
  const int64_t na = p.dims[a], nc = p.dims[last];
  const int64_t a_out = p.out_strides[a], c_in = p.in_strides[last];
  const int64_t a0 = static_cast<int64_t>(blockIdx.y) * kTile, c0 = static_cast<int64_t>(blockIdx.x) * kTile;
  for (int64_t b = blockIdx.z; b < p.batch; b += gridDim.z) {
    int64_t rest = b, in_off = 0, out_off = 0;
    for (int k = last - 1; k >= 0; --k) {
      if (k == a) continue;
      const int64_t q = rest / p.dims[k], c = rest - q * p.dims[k];
      in_off += c * p.in_strides[k];
      out_off += c * p.out_strides[k];
      rest = q;
    }
    // Lanes along the input's innermost axis (a) to read...
    for (int j = threadIdx.y; j < kTile; j += blockDim.y) {
      const int64_t ia = a0 + threadIdx.x, ic = c0 + j;
      if (ia < na && ic < nc) tile[j][threadIdx.x] = in[in_off + ia + ic * c_in];
    }
    __syncthreads();
    // ...and along the output's (c) to write.
    for (int j = threadIdx.y; j < kTile; j += blockDim.y) {
      const int64_t ia = a0 + j, ic = c0 + threadIdx.x;
      if (ia < na && ic < nc) out[out_off + ia * a_out + ic] = tile[threadIdx.x][j];
    }
    __syncthreads();
  }
}

// Blocks of blockDim.y rows by blockDim.x columns, grid x over the columns
// and grid y striding over the rows.
template <typename U>
__device__ __forceinline__ void copy_rows(const CopyRowsParams& p) {
  const U* __restrict__ src = reinterpret_cast<const U*>(p.src);
  U* __restrict__ dst = reinterpret_cast<U*>(p.dst);
  const int64_t col = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (col >= p.cols) return;
  for (int64_t r = static_cast<int64_t>(blockIdx.y) * blockDim.y + threadIdx.y; r < p.rows;
       r += static_cast<int64_t>(gridDim.y) * blockDim.y) {
    dst[r * p.dst_stride + col] = src[r * p.src_stride + col];
  }
}

// out's row r is x's row idx[r], blocks as copy_rows'.
template <typename U>
__device__ __forceinline__ void gather_rows(const GatherParams& p) {
  const U* __restrict__ x = reinterpret_cast<const U*>(p.x);
  const int64_t* __restrict__ idx = reinterpret_cast<const int64_t*>(p.idx);
  U* __restrict__ out = reinterpret_cast<U*>(p.out);
  const int64_t col = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (col >= p.d) return;
  for (int64_t r = static_cast<int64_t>(blockIdx.y) * blockDim.y + threadIdx.y; r < p.k;
       r += static_cast<int64_t>(gridDim.y) * blockDim.y) {
    const int64_t s = idx[r];
    if (s >= 0 && s < p.n) {
      out[r * p.d + col] = x[s * p.d + col];
    } else {
      out[r * p.d + col] = U{};
      if (col == 0) atomicMax(reinterpret_cast<int*>(p.status), kStatusBadIndex);
    }
  }
}

// link[i] for each i: the next j > i with idx[j] == idx[i] (k if none),
// stored as is when i is the first of its index, as -1 - next otherwise.
__device__ __forceinline__ void gather_link(const GatherParams& p) {
  const int64_t* __restrict__ idx = reinterpret_cast<const int64_t*>(p.idx);
  int32_t* __restrict__ link = reinterpret_cast<int32_t*>(p.link);
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= p.k) return;
  const int64_t v = idx[i];
  bool first = true;
  for (int64_t j = 0; j < i && first; ++j) first = idx[j] != v;
  int64_t next = p.k;
  for (int64_t j = i + 1; j < p.k; ++j) {
    if (idx[j] == v) {
      next = j;
      break;
    }
  }
  link[i] = static_cast<int32_t>(first ? next : -1 - next);
}

// dx[idx[i], col] = the sum of dy[j, col] over the chain from i, for each
// first i of a valid index; dx was zeroed.
template <typename T>
__device__ __forceinline__ void gather_scatter(const GatherParams& p) {
  const T* __restrict__ dy = reinterpret_cast<const T*>(p.x);
  const int64_t* __restrict__ idx = reinterpret_cast<const int64_t*>(p.idx);
  const int32_t* __restrict__ link = reinterpret_cast<const int32_t*>(p.link);
  T* __restrict__ dx = reinterpret_cast<T*>(p.out);
  const int64_t col = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (col >= p.d) return;
  for (int64_t r = static_cast<int64_t>(blockIdx.y) * blockDim.y + threadIdx.y; r < p.k;
       r += static_cast<int64_t>(gridDim.y) * blockDim.y) {
    const int64_t s = idx[r];
    if (link[r] < 0 || !(s >= 0 && s < p.n)) continue;
    T sum = dy[r * p.d + col];
    for (int64_t j = link[r]; j < p.k;) {
      sum += dy[j * p.d + col];
      const int32_t l = link[j];
      j = l >= 0 ? l : -1 - static_cast<int64_t>(l);
    }
    dx[s * p.d + col] = sum;
  }
}

}  // namespace stheno::layout

extern "C" {
__global__ void __launch_bounds__(stheno::layout::kThreads) layout_permute_copy_b4(stheno::layout::PermuteParams p) { stheno::layout::permute_copy<uint32_t, int64_t>(p); }
__global__ void __launch_bounds__(stheno::layout::kThreads) layout_permute_copy_b8(stheno::layout::PermuteParams p) { stheno::layout::permute_copy<uint64_t, int64_t>(p); }
__global__ void __launch_bounds__(stheno::layout::kThreads) layout_permute_copy_b16(stheno::layout::PermuteParams p) { stheno::layout::permute_copy<stheno::layout::Bytes16, int64_t>(p); }
__global__ void __launch_bounds__(stheno::layout::kThreads) layout_permute_copy_b4_i32(stheno::layout::PermuteParams p) { stheno::layout::permute_copy<uint32_t, uint32_t>(p); }
__global__ void __launch_bounds__(stheno::layout::kThreads) layout_permute_copy_b8_i32(stheno::layout::PermuteParams p) { stheno::layout::permute_copy<uint64_t, uint32_t>(p); }
__global__ void __launch_bounds__(stheno::layout::kThreads) layout_permute_copy_b16_i32(stheno::layout::PermuteParams p) { stheno::layout::permute_copy<stheno::layout::Bytes16, uint32_t>(p); }
__global__ void __launch_bounds__(stheno::layout::kTile * stheno::layout::kTileRowsPerPass) layout_permute_tile_b4(stheno::layout::PermuteParams p) { stheno::layout::permute_tile<uint32_t>(p); }
__global__ void __launch_bounds__(stheno::layout::kTile * stheno::layout::kTileRowsPerPass) layout_permute_tile_b8(stheno::layout::PermuteParams p) { stheno::layout::permute_tile<uint64_t>(p); }
__global__ void __launch_bounds__(stheno::layout::kThreads) layout_copy_rows_b4(stheno::layout::CopyRowsParams p) { stheno::layout::copy_rows<uint32_t>(p); }
__global__ void __launch_bounds__(stheno::layout::kThreads) layout_copy_rows_b8(stheno::layout::CopyRowsParams p) { stheno::layout::copy_rows<uint64_t>(p); }
__global__ void __launch_bounds__(stheno::layout::kThreads) layout_copy_rows_b16(stheno::layout::CopyRowsParams p) { stheno::layout::copy_rows<stheno::layout::Bytes16>(p); }
__global__ void __launch_bounds__(stheno::layout::kThreads) layout_gather_rows_b4(stheno::layout::GatherParams p) { stheno::layout::gather_rows<uint32_t>(p); }
__global__ void __launch_bounds__(stheno::layout::kThreads) layout_gather_rows_b8(stheno::layout::GatherParams p) { stheno::layout::gather_rows<uint64_t>(p); }
__global__ void __launch_bounds__(stheno::layout::kThreads) layout_gather_rows_b16(stheno::layout::GatherParams p) { stheno::layout::gather_rows<stheno::layout::Bytes16>(p); }
__global__ void __launch_bounds__(stheno::layout::kThreads) layout_gather_link(stheno::layout::GatherParams p) { stheno::layout::gather_link(p); }
__global__ void __launch_bounds__(stheno::layout::kThreads) layout_gather_scatter_f32(stheno::layout::GatherParams p) { stheno::layout::gather_scatter<float>(p); }
__global__ void __launch_bounds__(stheno::layout::kThreads) layout_gather_scatter_f64(stheno::layout::GatherParams p) { stheno::layout::gather_scatter<double>(p); }
}
