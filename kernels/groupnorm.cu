// GroupNorm (torch.nn.functional.group_norm): the CUDA twins of
// kernels/groupnorm.go, over x [n, c, hw] (NCHW with hw = H*W, or any rank
// >= 2 with the dimensions after the channels flattened), c split into
// `groups` groups of cpg = c/groups channels. Row r = (sample, group) is the
// contiguous run of cpg*hw elements of planes r*cpg, ..., r*cpg + cpg - 1;
// per row, with its mean and biased variance var, rstd = 1/sqrt(var + eps):
//
//   fwd:      y = (x - mean)*(rstd*gamma[ch]) + beta[ch]      (gamma, beta optional)
//   bwd_dx:   dx = rstd*(g - mean(g) - xhat*mean(g*xhat)),    g = dy*gamma[ch] (or dy)
//   bwd_params: dgamma[ch] = sum over samples and hw of dy*xhat, dbeta[ch] = of dy
//
// Tiles. A row is long (Mask R-CNN's FPN: 8 channels of 200x200, 320k
// elements) and there are few of them (64), so every pass splits each plane
// into tiles of kTile elements, one block per (plane, tile), and the
// partial sums of the tiles are added in a second step in a fixed order:
//
//   stats (forward):  per tile, the sums of d = x - K and of d*d, where K is
//                     the row's first element (a shift that keeps d*d free
//                     of the cancellation of E[x^2] - E[x]^2 when the mean
//                     is large next to the deviation);
//   stats_rows:       for rows of many tile sums, mean and rstd per row;
//   fwd:              each block adds its row's tile sums (one warp, fixed
//                     order) to mean and rstd, or reads stats_rows', then
//                     writes its tile of y;
//   bwd_reduce:       per tile, the sums of d, d*d, dy and dy*d;
//   bwd_finalize:     per row (one warp): mean and rstd as fwd has them,
//                     and per plane sum(dy) and sum(dy*xhat); their gamma
//                     weighted sums over the row give mean(g), mean(g*xhat);
//   bwd_dx:           each block reads its tile of x and dy, writes dx;
//   bwd_params:       dgamma, dbeta: the per-plane sums added over samples.
//
// fwd and bwd_dx take the tiles in the reverse of the order in which stats
// and bwd_reduce read them: their first blocks then read the tiles read
// last, which the L2 still holds (Mask R-CNN's largest FPN level is 82 MB
// of float32 a tensor, the H100's L2 50 MB). No sum crosses their blocks,
// so the order changes no result.
//
// Memory traffic: the forward reads x twice and writes y (3 passes), the
// backward reads x and dy twice and writes dx (5): what any normalisation
// that does not hold a whole row on chip costs. The statistics are not
// saved by the forward: bwd_reduce reads x anyway for sum(dy*xhat), and
// works them out again from the same tile sums in the same order, bit for
// bit the forward's, for the price of two more sums per element, where
// saving them would make the forward's one output a packed [y | stats]
// that the graph would have to slice y out of (a copy of y).
//
// Precision and determinism: every sum, and all the arithmetic on the
// statistics, is in double for float32 and float64 alike (the kernels are
// bound by memory traffic: an H100 adds and multiplies doubles at half its
// float rate and converts float to double at 16 a clock per SM, several
// times what 4 to 12 bytes of traffic per element allow), each product, sum
// and difference rounded on its own (__dmul_rn, __dadd_rn, __dsub_rn: never
// contracted into a fused multiply-add), divisions and square roots IEEE's,
// and every sum runs in an order fixed by the shape alone: thread t of a
// tile adds its units t, t+kThreads, ... in order from zero, each unit's
// elements in turn; a butterfly over each warp's lanes, then over the
// warps' sums; the tiles' sums of a row in lane order (lane l adds partials
// l, l+32, ... then a butterfly). No atomics. The CPU twin adds in the same
// orders and rounds as the kernels do, so the two agree bit for bit; the
// per-element results are worked out in double and rounded to T once, and
// what bwd_finalize hands bwd_dx and bwd_params keeps double's precision
// as pairs of T (split, join).
//
// Words in the kernels' names: v16b, for planes of a whole number of 16-byte
// chunks (hw a multiple of 4 floats, 2 doubles): a thread's unit is a chunk,
// read with one 16-byte load when the tensors are 16-byte aligned and
// element by element otherwise (the same elements, added in the same
// order); scalar: a unit is one element, for any hw.
#include <stdint.h>

#include "params_gen.cuh"

namespace stheno::gn {

// One params struct for all of GroupNorm's kernels.
struct GroupNormParams {
  uint64_t x;        // [n, c, hw]
  uint64_t gamma;    // [c] scale, or 0: none
  uint64_t beta;     // [c] shift, or 0: none (fwd only)
  uint64_t dy;       // backward: the output's gradient [n, c, hw]
  uint64_t partial;  // tile sums, double: stats/fwd [n*c, tiles, 2]; bwd_reduce/bwd_finalize [n*c, tiles, 4]
  // The backward's sums, T pairs [n*groups, 4, 2] then [n*c, 2, 2], which
  // bwd_finalize writes and bwd_dx and bwd_params read; in the forward,
  // stats_rows' means and rstds, double [n*groups, 2], or 0: fwd adds the
  // tile sums itself.
  uint64_t sums;
  uint64_t out;      // fwd: y; bwd_dx: dx; bwd_params: [dgamma | dbeta]
  int64_t hw;        // elements of a plane
  double eps;
  int32_t n;
  int32_t c;
  int32_t groups;
  int32_t tiles;   // tiles of a plane: ceil(hw / GroupNormTile)
  int32_t dgamma;  // bwd_params: write dgamma into out[0, c)
  int32_t dbeta;   // bwd_params: write dbeta after dgamma (at out[0, c) without it)
};
STHENO_PARAMS(GroupNormParams);

// stheno:const GroupNormThreads
// Threads of the tile kernels' blocks (8 warps).
constexpr int kThreads = 256;

// stheno:const GroupNormTile
// Elements of a plane a tile kernel's block takes: 16 a thread, so that each
// thread has four 16-byte float loads (eight double ones) in flight.
constexpr int kTile = 4096;

// stheno:const GroupNormRowStats
// Values per row of the sums bwd_finalize writes: mean, rstd, mean(g) and
// mean(g*xhat), before the two values per plane, sum(dy) and sum(dy*xhat).
// Each value is a pair of T (split), so that float32 carries the double's
// precision to bwd_dx: rounded to float32, mean(g) alone would leave dx
// of a group of equal values (rstd = 1/sqrt(eps)) at 1e-5 from 0.
constexpr int kRowStats = 4;

// A double as the pair (hi, lo) of T: hi = T(v), lo = T(v - hi); join adds
// them back, exactly for float32 (48 bits of the pair fit in a double's
// 53), and as v itself for float64 (lo = 0). A value past T's range comes
// back NaN.
template <typename T>
__device__ __forceinline__ void split(double v, T* out) {
  const T hi = static_cast<T>(v);
  out[0] = hi;
  out[1] = static_cast<T>(__dsub_rn(v, static_cast<double>(hi)));
}
template <typename T>
__device__ __forceinline__ double join(const T* in) {
  return __dadd_rn(static_cast<double>(in[0]), static_cast<double>(in[1]));
}

// stheno:const GroupNormInlineRowPartials
// The most tile sums a row may have for fwd's blocks to add them each
// (reading them from L2); beyond, stats_rows adds them once per row first.
// Every block re-reading its row's cpg*tiles sums costs the L2 about
// cpg/1024 of the data's bytes: nothing for 32 groups of 256 or 512
// channels, a quarter and more for one group of 256.
constexpr int kInlineRowPartials = 256;
static_assert(kInlineRowPartials % 32 == 0, "row_stats' lanes take the tile sums 32 at a time");

// Elements per 16-byte chunk.
template <typename T>
constexpr int kChunk = 16 / static_cast<int>(sizeof(T));

// Arithmetic rounded step by step: nvcc never fuses these intrinsics into
// fused multiply-adds, so the results are the CPU twin's.
__device__ __forceinline__ double add_rn(double a, double b) { return __dadd_rn(a, b); }
__device__ __forceinline__ double sub_rn(double a, double b) { return __dsub_rn(a, b); }
__device__ __forceinline__ double mul_rn(double a, double b) { return __dmul_rn(a, b); }

// The sum of v over the warp, the same in every lane: a butterfly, in which
// lanes l and l^off add the same two values (addition commutes).
__device__ __forceinline__ double warp_sum(double v) {
#pragma unroll
  for (int off = 16; off > 0; off /= 2) v = add_rn(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}

// The sums of v[0..kN) over the block of kThreads threads, in thread 0: a
// butterfly over each warp, then one over the warps' sums (zeros past the
// last warp) by warp 0. scratch holds 8*kN doubles of shared memory, free
// again when it returns.
template <int kN>
__device__ __forceinline__ void block_sums(double (&v)[kN], double* scratch) {
  constexpr int kWarps = kThreads / 32;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int i = 0; i < kN; ++i) v[i] = warp_sum(v[i]);
  if (lane == 0) {
#pragma unroll
    for (int i = 0; i < kN; ++i) scratch[warp * kN + i] = v[i];
  }
  __syncthreads();
  if (warp == 0) {
#pragma unroll
    for (int i = 0; i < kN; ++i) v[i] = warp_sum(lane < kWarps ? scratch[lane * kN + i] : 0.0);
  }
  __syncthreads();
}

template <typename T>
__device__ __forceinline__ const T* ptr(uint64_t a) {
  return reinterpret_cast<const T*>(a);
}

// Whether every one of these addresses is 16-byte aligned (0: absent).
__device__ __forceinline__ bool aligned16(uint64_t a, uint64_t b, uint64_t c = 0) { return ((a | b | c) & 15) == 0; }

// A unit of kV elements at p into v: one 16-byte load when vec, else element
// by element.
template <typename T, int kV>
__device__ __forceinline__ void load_unit(const T* p, bool vec, T* v) {
  if constexpr (kV == 4) {
    if (vec) {
      const float4 q = *reinterpret_cast<const float4*>(p);
      v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
      return;
    }
  } else if constexpr (kV == 2) {
    if (vec) {
      const double2 q = *reinterpret_cast<const double2*>(p);
      v[0] = q.x, v[1] = q.y;
      return;
    }
  }
#pragma unroll
  for (int e = 0; e < kV; ++e) v[e] = p[e];
}
template <typename T, int kV>
__device__ __forceinline__ void store_unit(T* p, bool vec, const T* v) {
  if constexpr (kV == 4) {
    if (vec) {
      *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
      return;
    }
  } else if constexpr (kV == 2) {
    if (vec) {
      *reinterpret_cast<double2*>(p) = make_double2(v[0], v[1]);
      return;
    }
  }
#pragma unroll
  for (int e = 0; e < kV; ++e) p[e] = v[e];
}

// A block's tile: plane `plane`, tile `tile` of it. Thread t's unit i is
// the plane's unit tile*kTile/kV + t + i*kThreads, present when below
// hw/kV.
template <typename T, int kV>
struct Tile {
  static constexpr int kItems = kTile / kThreads / kV;  // units a thread holds
  int64_t plane;
  int64_t first;  // the plane's unit that is thread 0's unit 0
  int64_t units;  // the plane's units
  __device__ __forceinline__ Tile(const GroupNormParams& p, int64_t b) {
    plane = b / p.tiles;
    first = (b - plane * p.tiles) * (kTile / kV);
    units = p.hw / kV;
  }
  // The plane's unit that is the thread's unit i, or -1 past the plane.
  __device__ __forceinline__ int64_t unit(int i) const {
    const int64_t u = first + threadIdx.x + static_cast<int64_t>(i) * kThreads;
    return u < units ? u : -1;
  }
  // The thread's units of the plane that starts at a, into v.
  __device__ __forceinline__ void load(const T* a, bool vec, T (&v)[kItems * kV]) const {
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      const int64_t u = unit(i);
      if (u >= 0) load_unit<T, kV>(a + u * kV, vec, &v[i * kV]);
    }
  }
};

// The first element of a row: the shift K of its sums.
template <typename T>
__device__ __forceinline__ double row_shift(const GroupNormParams& p, int64_t row) {
  const int64_t cpg = p.c / p.groups;
  return static_cast<double>(ptr<T>(p.x)[row * cpg * p.hw]);
}

// stats: partial[(plane*tiles + tile)*2 + {0, 1}] = the tile's sums of
// d = x - K and of d*d.
template <typename T, int kV>
__device__ __forceinline__ void stats(const GroupNormParams& p) {
  constexpr int kItems = Tile<T, kV>::kItems;
  __shared__ double scratch[2 * kThreads / 32];
  const bool vec = aligned16(p.x, 0);
  const int64_t blocks = static_cast<int64_t>(p.n) * p.c * p.tiles;
  for (int64_t b = blockIdx.x; b < blocks; b += gridDim.x) {
    const Tile<T, kV> tile(p, b);
    const int64_t row = tile.plane / (p.c / p.groups);
    const double k = row_shift<T>(p, row);
    T v[kItems * kV];
    tile.load(ptr<T>(p.x) + tile.plane * p.hw, vec, v);
    double s[2] = {0.0, 0.0};
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      if (tile.unit(i) < 0) continue;
#pragma unroll
      for (int e = 0; e < kV; ++e) {
        const double d = sub_rn(static_cast<double>(v[i * kV + e]), k);
        s[0] = add_rn(s[0], d);
        s[1] = add_rn(s[1], mul_rn(d, d));
      }
    }
    block_sums(s, scratch);
    if (threadIdx.x == 0) {
      double* out = reinterpret_cast<double*>(p.partial) + b * 2;
      out[0] = s[0], out[1] = s[1];
    }
  }
}

// A row's statistics from its tiles' sums (stride doubles apart, the sums
// of d and d*d first), worked out by one whole warp, the same in every
// lane: lane l adds the row's partials l, l+32, ... in order, then the
// butterfly; with L = cpg*hw, shifted mean ms = S1/L, var = S2/L - ms*ms
// (0 when rounding makes it negative), mean = K + ms.
struct RowStats {
  double mean, rstd, ms;
};
template <typename T>
__device__ __forceinline__ RowStats row_stats(const GroupNormParams& p, int64_t row, int stride) {
  const int lane = threadIdx.x & 31;
  const int64_t cpg = p.c / p.groups;
  const int64_t q = cpg * p.tiles;  // the row's partials
  const double* part = ptr<double>(p.partial) + row * q * stride;
  double s1 = 0.0, s2 = 0.0;
  for (int64_t i = lane; i < q; i += 32) {
    s1 = add_rn(s1, part[i * stride]);
    s2 = add_rn(s2, part[i * stride + 1]);
  }
  s1 = warp_sum(s1), s2 = warp_sum(s2);
  const double len = static_cast<double>(cpg * p.hw);
  RowStats r;
  r.ms = s1 / len;
  double var = sub_rn(s2 / len, mul_rn(r.ms, r.ms));
  if (var < 0.0) var = 0.0;  // NaN stays NaN
  r.mean = add_rn(row_shift<T>(p, row), r.ms);
  r.rstd = 1.0 / sqrt(add_rn(var, p.eps));
  return r;
}

// stats_rows, a warp per row (block b takes rows b, b + gridDim.x, ...):
// the row's mean and rstd as doubles into sums[row*2:], for fwd.
template <typename T>
__device__ __forceinline__ void stats_rows(const GroupNormParams& p) {
  const int64_t rows = static_cast<int64_t>(p.n) * p.groups;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const RowStats r = row_stats<T>(p, row, 2);
    if (threadIdx.x == 0) {
      double* o = reinterpret_cast<double*>(p.sums) + row * 2;
      o[0] = r.mean, o[1] = r.rstd;
    }
  }
}

// fwd: the block loads its tile of x, warp 0 works out the row's statistics
// meanwhile (or reads stats_rows' when p.sums is set), then y = T((x -
// mean)*s + beta) with s = rstd*gamma, in double.
template <typename T, int kV>
__device__ __forceinline__ void fwd(const GroupNormParams& p) {
  constexpr int kItems = Tile<T, kV>::kItems;
  __shared__ double shared_stats[2];
  const bool vec = aligned16(p.x, p.out);
  const T* gamma = ptr<T>(p.gamma);
  const T* beta = ptr<T>(p.beta);
  const int64_t blocks = static_cast<int64_t>(p.n) * p.c * p.tiles;
  for (int64_t b = blockIdx.x; b < blocks; b += gridDim.x) {
    const Tile<T, kV> tile(p, blocks - 1 - b);
    const int ch = static_cast<int>(tile.plane % p.c);
    const int64_t row = tile.plane / (p.c / p.groups);
    T v[kItems * kV];
    tile.load(ptr<T>(p.x) + tile.plane * p.hw, vec, v);
    if (p.sums != 0) {
      if (threadIdx.x < 2) shared_stats[threadIdx.x] = ptr<double>(p.sums)[row * 2 + threadIdx.x];
    } else if (threadIdx.x < 32) {
      const RowStats r = row_stats<T>(p, row, 2);
      if (threadIdx.x == 0) shared_stats[0] = r.mean, shared_stats[1] = r.rstd;
    }
    __syncthreads();
    const double mean = shared_stats[0];
    const double s = gamma != nullptr ? mul_rn(shared_stats[1], static_cast<double>(gamma[ch])) : shared_stats[1];
    const double sh = beta != nullptr ? static_cast<double>(beta[ch]) : 0.0;
    T* y = reinterpret_cast<T*>(p.out) + tile.plane * p.hw;
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      const int64_t u = tile.unit(i);
      if (u < 0) continue;
      T* w = &v[i * kV];
#pragma unroll
      for (int e = 0; e < kV; ++e) {
        double r = mul_rn(sub_rn(static_cast<double>(w[e]), mean), s);
        if (beta != nullptr) r = add_rn(r, sh);
        w[e] = static_cast<T>(r);
      }
      store_unit<T, kV>(y + u * kV, vec, w);
    }
    __syncthreads();  // shared_stats is the next tile's
  }
}

// bwd_reduce: partial[(plane*tiles + tile)*4 + {0, 1, 2, 3}] = the tile's
// sums of d = x - K, d*d, dy and dy*d (stats' first two, bit for bit).
template <typename T, int kV>
__device__ __forceinline__ void bwd_reduce(const GroupNormParams& p) {
  constexpr int kItems = Tile<T, kV>::kItems;
  __shared__ double scratch[4 * kThreads / 32];
  const bool vec = aligned16(p.x, p.dy);
  const int64_t blocks = static_cast<int64_t>(p.n) * p.c * p.tiles;
  for (int64_t b = blockIdx.x; b < blocks; b += gridDim.x) {
    const Tile<T, kV> tile(p, b);
    const int64_t row = tile.plane / (p.c / p.groups);
    const double k = row_shift<T>(p, row);
    T v[kItems * kV], g[kItems * kV];
    tile.load(ptr<T>(p.x) + tile.plane * p.hw, vec, v);
    tile.load(ptr<T>(p.dy) + tile.plane * p.hw, vec, g);
    double s[4] = {0.0, 0.0, 0.0, 0.0};
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      if (tile.unit(i) < 0) continue;
#pragma unroll
      for (int e = 0; e < kV; ++e) {
        const double d = sub_rn(static_cast<double>(v[i * kV + e]), k);
        const double dy = static_cast<double>(g[i * kV + e]);
        s[0] = add_rn(s[0], d);
        s[1] = add_rn(s[1], mul_rn(d, d));
        s[2] = add_rn(s[2], dy);
        s[3] = add_rn(s[3], mul_rn(dy, d));
      }
    }
    block_sums(s, scratch);
    if (threadIdx.x == 0) {
      double* out = reinterpret_cast<double*>(p.partial) + b * 4;
      out[0] = s[0], out[1] = s[1], out[2] = s[2], out[3] = s[3];
    }
  }
}

// bwd_finalize, a warp per row (block b takes rows b, b + gridDim.x, ...):
// the row's mean and rstd as fwd works them out; per plane (lane l takes the
// row's planes l, l+32, ...) A = sum(dy) and B = sum(dy*xhat) =
// rstd*(sum(dy*d) - ms*sum(dy)), each the plane's tiles in order; and, with
// G the plane's gamma (1 without), mean(g) = sum(G*A)/L and mean(g*xhat) =
// sum(G*B)/L, lane sums in plane order then the butterfly. Writes, as
// pairs of T (split), mean, rstd, mean(g), mean(g*xhat) at sums[row*8:]
// and A, B at sums[n*groups*8 + plane*4:].
template <typename T>
__device__ __forceinline__ void bwd_finalize(const GroupNormParams& p) {
  const int lane = threadIdx.x & 31;
  const int cpg = p.c / p.groups;
  const int64_t rows = static_cast<int64_t>(p.n) * p.groups;
  const T* gamma = ptr<T>(p.gamma);
  const double* part = ptr<double>(p.partial);
  T* sums = reinterpret_cast<T*>(p.sums);
  T* planes = sums + rows * kRowStats * 2;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const RowStats r = row_stats<T>(p, row, 4);
    double ga = 0.0, gb = 0.0;
    for (int k = lane; k < cpg; k += 32) {
      const int64_t plane = row * cpg + k;
      double a = 0.0, bs = 0.0;
      for (int t = 0; t < p.tiles; ++t) {
        const double* q = part + (plane * p.tiles + t) * 4;
        a = add_rn(a, q[2]);
        bs = add_rn(bs, q[3]);
      }
      const double bh = mul_rn(r.rstd, sub_rn(bs, mul_rn(r.ms, a)));
      split(a, planes + plane * 4);
      split(bh, planes + plane * 4 + 2);
      if (gamma != nullptr) {
        const double gm = static_cast<double>(gamma[plane % p.c]);
        ga = add_rn(ga, mul_rn(gm, a));
        gb = add_rn(gb, mul_rn(gm, bh));
      } else {
        ga = add_rn(ga, a);
        gb = add_rn(gb, bh);
      }
    }
    ga = warp_sum(ga), gb = warp_sum(gb);
    if (lane == 0) {
      const double len = static_cast<double>(static_cast<int64_t>(cpg) * p.hw);
      T* o = sums + row * kRowStats * 2;
      split(r.mean, o), split(r.rstd, o + 2), split(ga / len, o + 4), split(gb / len, o + 6);
    }
  }
}

// bwd_dx: with the row's mean, rstd, mean(g) and mean(g*xhat) from sums
// (joined back to the doubles bwd_finalize worked out),
// dx = T(rstd*((g - mean(g)) - xhat*mean(g*xhat))), xhat = (x - mean)*rstd
// and g = dy*gamma, in double.
template <typename T, int kV>
__device__ __forceinline__ void bwd_dx(const GroupNormParams& p) {
  constexpr int kItems = Tile<T, kV>::kItems;
  const bool vec = aligned16(p.x, p.dy, p.out);
  const T* gamma = ptr<T>(p.gamma);
  const T* sums = ptr<T>(p.sums);
  const int64_t blocks = static_cast<int64_t>(p.n) * p.c * p.tiles;
  for (int64_t b = blockIdx.x; b < blocks; b += gridDim.x) {
    const Tile<T, kV> tile(p, blocks - 1 - b);
    const int ch = static_cast<int>(tile.plane % p.c);
    const int64_t row = tile.plane / (p.c / p.groups);
    T v[kItems * kV], g[kItems * kV];
    tile.load(ptr<T>(p.x) + tile.plane * p.hw, vec, v);
    tile.load(ptr<T>(p.dy) + tile.plane * p.hw, vec, g);
    const T* st = sums + row * kRowStats * 2;
    const double mean = join(st), rstd = join(st + 2), mg = join(st + 4), mgx = join(st + 6);
    const double gm = gamma != nullptr ? static_cast<double>(gamma[ch]) : 1.0;
    T* dx = reinterpret_cast<T*>(p.out) + tile.plane * p.hw;
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      const int64_t u = tile.unit(i);
      if (u < 0) continue;
      T* w = &g[i * kV];
#pragma unroll
      for (int e = 0; e < kV; ++e) {
        const double xh = mul_rn(sub_rn(static_cast<double>(v[i * kV + e]), mean), rstd);
        double gv = static_cast<double>(w[e]);
        if (gamma != nullptr) gv = mul_rn(gv, gm);
        w[e] = static_cast<T>(mul_rn(rstd, sub_rn(sub_rn(gv, mg), mul_rn(xh, mgx))));
      }
      store_unit<T, kV>(dx + u * kV, vec, w);
    }
  }
}

// bwd_params: thread j of the grid takes channel j: dgamma = the sum over
// samples s in order of the plane sums B[s, j], dbeta of A[s, j] (joined),
// in double, rounded to T.
template <typename T>
__device__ __forceinline__ void bwd_params(const GroupNormParams& p) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= p.c) return;
  const T* planes = ptr<T>(p.sums) + static_cast<int64_t>(p.n) * p.groups * kRowStats * 2;
  double a = 0.0, bs = 0.0;
  for (int s = 0; s < p.n; ++s) {
    const T* q = planes + (static_cast<int64_t>(s) * p.c + j) * 4;
    a = add_rn(a, join(q));
    bs = add_rn(bs, join(q + 2));
  }
  T* out = reinterpret_cast<T*>(p.out);
  if (p.dgamma != 0) out[j] = static_cast<T>(bs);
  if (p.dbeta != 0) out[(p.dgamma != 0 ? p.c : 0) + j] = static_cast<T>(a);
}

}  // namespace stheno::gn

extern "C" {
// clang-format off
__global__ void __launch_bounds__(256) groupnorm_stats_v16b_f32(stheno::gn::GroupNormParams p) { stheno::gn::stats<float, 4>(p); }
__global__ void __launch_bounds__(256) groupnorm_stats_v16b_f64(stheno::gn::GroupNormParams p) { stheno::gn::stats<double, 2>(p); }
__global__ void __launch_bounds__(256) groupnorm_stats_scalar_f32(stheno::gn::GroupNormParams p) { stheno::gn::stats<float, 1>(p); }
__global__ void __launch_bounds__(256) groupnorm_stats_scalar_f64(stheno::gn::GroupNormParams p) { stheno::gn::stats<double, 1>(p); }

__global__ void __launch_bounds__(32) groupnorm_stats_rows_f32(stheno::gn::GroupNormParams p) { stheno::gn::stats_rows<float>(p); }
__global__ void __launch_bounds__(32) groupnorm_stats_rows_f64(stheno::gn::GroupNormParams p) { stheno::gn::stats_rows<double>(p); }

__global__ void __launch_bounds__(256) groupnorm_fwd_v16b_f32(stheno::gn::GroupNormParams p) { stheno::gn::fwd<float, 4>(p); }
__global__ void __launch_bounds__(256) groupnorm_fwd_v16b_f64(stheno::gn::GroupNormParams p) { stheno::gn::fwd<double, 2>(p); }
__global__ void __launch_bounds__(256) groupnorm_fwd_scalar_f32(stheno::gn::GroupNormParams p) { stheno::gn::fwd<float, 1>(p); }
__global__ void __launch_bounds__(256) groupnorm_fwd_scalar_f64(stheno::gn::GroupNormParams p) { stheno::gn::fwd<double, 1>(p); }

__global__ void __launch_bounds__(256) groupnorm_bwd_reduce_v16b_f32(stheno::gn::GroupNormParams p) { stheno::gn::bwd_reduce<float, 4>(p); }
__global__ void __launch_bounds__(256) groupnorm_bwd_reduce_v16b_f64(stheno::gn::GroupNormParams p) { stheno::gn::bwd_reduce<double, 2>(p); }
__global__ void __launch_bounds__(256) groupnorm_bwd_reduce_scalar_f32(stheno::gn::GroupNormParams p) { stheno::gn::bwd_reduce<float, 1>(p); }
__global__ void __launch_bounds__(256) groupnorm_bwd_reduce_scalar_f64(stheno::gn::GroupNormParams p) { stheno::gn::bwd_reduce<double, 1>(p); }

__global__ void __launch_bounds__(256) groupnorm_bwd_dx_v16b_f32(stheno::gn::GroupNormParams p) { stheno::gn::bwd_dx<float, 4>(p); }
__global__ void __launch_bounds__(256) groupnorm_bwd_dx_v16b_f64(stheno::gn::GroupNormParams p) { stheno::gn::bwd_dx<double, 2>(p); }
__global__ void __launch_bounds__(256) groupnorm_bwd_dx_scalar_f32(stheno::gn::GroupNormParams p) { stheno::gn::bwd_dx<float, 1>(p); }
__global__ void __launch_bounds__(256) groupnorm_bwd_dx_scalar_f64(stheno::gn::GroupNormParams p) { stheno::gn::bwd_dx<double, 1>(p); }

__global__ void __launch_bounds__(32) groupnorm_bwd_finalize_f32(stheno::gn::GroupNormParams p) { stheno::gn::bwd_finalize<float>(p); }
__global__ void __launch_bounds__(32) groupnorm_bwd_finalize_f64(stheno::gn::GroupNormParams p) { stheno::gn::bwd_finalize<double>(p); }
__global__ void __launch_bounds__(256) groupnorm_bwd_params_f32(stheno::gn::GroupNormParams p) { stheno::gn::bwd_params<float>(p); }
__global__ void __launch_bounds__(256) groupnorm_bwd_params_f64(stheno::gn::GroupNormParams p) { stheno::gn::bwd_params<double>(p); }
// clang-format on
}
