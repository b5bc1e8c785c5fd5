// Multi-scale deformable attention (Deformable-DETR's MSDeformAttn), forward
// and backward: the CUDA twins of kernels/msdeform.go.
//
// A group of lanes works on one (n, q, m). Consecutive groups are consecutive
// queries of the same head, so the blocks of a launch sample neighbouring
// places of one head's maps and share their cache lines (in the encoder,
// neighbouring queries are neighbouring pixels). Where the queries come in
// no such order, the forward's _sorted kernels take them sorted by where
// they sample (the msdeform_sort_* launches before them).
//
// Forward: each lane owns V consecutive channels (a float4 or double2 when D
// allows), so one load instruction of a group reads whole 16-byte pieces of a
// pixel's channels, and points are taken U at a time so that their 4*U
// corner loads are in flight together: the kernel is bound by the latency of
// gathers, and this is what hides it.
//
// Backward: channels spread over the lanes, so that the grad_value atomics
// of a group hit consecutive addresses (CUDA 11.8 cannot assemble vector
// atomics; msdeform_sm90a.cu's _red4 kernels, built around that, add 4
// channels with one 16-byte reduction instead). The gradients
// of the location and the attention weight are sums over channels: the group
// reduces them with warp shuffles and one lane writes them, with no atomics
// and no shared memory.
#include "atomics.cuh"
#include "bilinear.cuh"
#include "params_gen.cuh"

namespace stheno {

// Threads per block of every kernel here but msdeform_sort_scan's.
// stheno:const MSDeformBlock
constexpr int kBlock = 256;

// Levels whose table travels inside the launch parameters; more are
// uploaded.
// stheno:const MSDeformInlineLevels
constexpr int kInlineLevels = 16;

// Launch parameters, passed by value.
struct MSDeformParams {
  uint64_t value;        // [N,S,M,D]
  uint64_t loc;          // [N,Lq,M,L,P,2] normalised (x, y)
  uint64_t weight;       // [N,Lq,M,L,P]
  uint64_t out;          // forward: [N,Lq,M*D]
  uint64_t grad_out;     // backward: [N,Lq,M*D]
  uint64_t grad_value;   // backward: [N,S,M,D], zeroed by the caller, scattered into
  uint64_t grad_loc;     // backward: [N,Lq,M,L,P,2], written
  uint64_t grad_weight;  // backward: [N,Lq,M,L,P], written
  uint64_t levels;       // int32 [L][3]: H, W, first pixel of the level in S; 0: use inline_levels
  int32_t n, s, m, d, lq, l, p;
  int32_t group;         // lanes per (n, q, m), a power of two <= 32
  // The level table itself when L <= kInlineLevels: passed with the launch,
  // it needs no upload and is read from the constant bank.
  int32_t inline_levels[3 * kInlineLevels];
  // int32 [N,Lq]: the query each position of an image takes
  // (msdeform_sort_place; _sorted kernels only). Last, so that the other
  // fields' offsets, and the code of the kernels that ignore it, are as
  // they were before it.
  uint64_t order;
};
STHENO_PARAMS(MSDeformParams);

struct Level {
  int h, w, start;
};

__device__ __forceinline__ Level level_of(const MSDeformParams& p, int l) {
  if (p.levels == 0) return Level{p.inline_levels[3 * l], p.inline_levels[3 * l + 1], p.inline_levels[3 * l + 2]};
  const int* lv = reinterpret_cast<const int*>(p.levels) + 3 * l;
  return Level{__ldg(lv), __ldg(lv + 1), __ldg(lv + 2)};
}

// Sum of v over the lanes of a group; every lane gets the sum. All 32 lanes
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
  const T x = pixel_coord(loc[0], lv.w);
  const T y = pixel_coord(loc[1], lv.h);
  return grid_taps(y, x, lv.h, lv.w, t);
}

// (n, q, m) of group gid: with queries fastest (kHeads false), neighbouring
// groups sample neighbouring places of one head's map and share cache lines;
// with heads fastest they touch different heads' channels, which keeps
// concurrent atomics off the same addresses.
struct Query {
  int n, q, m;
  int64_t qm;  // index of (n, q, m) in the [N,Lq,M] layouts of loc, weight and out
};

// kOrdered (the forward's _sorted kernels): position q of image n works on
// query p.order[n*Lq + q] instead of q, the same work in an order where
// neighbouring groups sample neighbouring places (see msdeform_sort_cells).
// A template flag rather than a test of p.order in every kernel: the lookup
// costs registers, and the capped kernels, forward and backward, spilled
// more with it and ran slower.
template <bool kHeads, bool kOrdered = false>
__device__ __forceinline__ Query query_of(const MSDeformParams& p, int64_t gid) {
  Query r;
  if (kHeads) {
    r.m = static_cast<int>(gid % p.m);
    const int64_t nq = gid / p.m;
    r.q = static_cast<int>(nq % p.lq);
    r.n = static_cast<int>(nq / p.lq);
    r.qm = gid;
  } else {
    r.q = static_cast<int>(gid % p.lq);
    const int64_t nm = gid / p.lq;
    r.m = static_cast<int>(nm % p.m);
    r.n = static_cast<int>(nm / p.m);
    r.qm = (static_cast<int64_t>(r.n) * p.lq + r.q) * p.m + r.m;
  }
  if (kOrdered) {
    r.q = __ldg(reinterpret_cast<const int*>(p.order) + static_cast<int64_t>(r.n) * p.lq + r.q);
    r.qm = (static_cast<int64_t>(r.n) * p.lq + r.q) * p.m + r.m;
  }
  return r;
}

// V consecutive elements loaded and stored as one vector.
template <typename T, int V>
struct Pack {
  T v[V];
};

template <typename T, int V>
__device__ __forceinline__ Pack<T, V> load_pack(const T* p) {
  Pack<T, V> r;
  if constexpr (V == 4 && sizeof(T) == 4) {
    const float4 f = __ldg(reinterpret_cast<const float4*>(p));
    r.v[0] = f.x, r.v[1] = f.y, r.v[2] = f.z, r.v[3] = f.w;
  } else if constexpr (V == 2 && sizeof(T) == 8) {
    const double2 f = __ldg(reinterpret_cast<const double2*>(p));
    r.v[0] = f.x, r.v[1] = f.y;
  } else {
#pragma unroll
    for (int i = 0; i < V; ++i) r.v[i] = __ldg(p + i);
  }
  return r;
}

template <typename T, int V>
__device__ __forceinline__ void store_pack(T* p, const Pack<T, V>& r) {
  if constexpr (V == 4 && sizeof(T) == 4) {
    *reinterpret_cast<float4*>(p) = make_float4(r.v[0], r.v[1], r.v[2], r.v[3]);
  } else if constexpr (V == 2 && sizeof(T) == 8) {
    *reinterpret_cast<double2*>(p) = make_double2(r.v[0], r.v[1]);
  } else {
#pragma unroll
    for (int i = 0; i < V; ++i) p[i] = r.v[i];
  }
}

// Forward. V channels per lane; the caller guarantees D % V == 0 and that
// value and out are 16-byte aligned when V > 1. U points at a time.
template <typename T, int V, int U, bool kHeads>
__device__ void msdeform_forward(const MSDeformParams& p) {
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t gid = tid / p.group;
  const int lane = static_cast<int>(tid % p.group);
  if (gid >= static_cast<int64_t>(p.n) * p.lq * p.m) return;  // no shuffles here
  const Query qr = query_of<kHeads>(p, gid);
  const int lp = p.l * p.p;
  const T* loc = reinterpret_cast<const T*>(p.loc) + qr.qm * lp * 2;
  const T* wgt = reinterpret_cast<const T*>(p.weight) + qr.qm * lp;
  const T* value = reinterpret_cast<const T*>(p.value);
  T* out = reinterpret_cast<T*>(p.out) + qr.qm * p.d;
  const int64_t pix_stride = static_cast<int64_t>(p.m) * p.d;  // between pixels in value
  for (int d0 = lane * V; d0 < p.d; d0 += p.group * V) {
    Pack<T, V> acc;
#pragma unroll
    for (int i = 0; i < V; ++i) acc.v[i] = T(0);
    for (int l = 0; l < p.l; ++l) {
      const Level lv = level_of(p, l);
      const T* base = value + ((static_cast<int64_t>(qr.n) * p.s + lv.start) * p.m + qr.m) * p.d + d0;
      for (int pt0 = 0; pt0 < p.p; pt0 += U) {
        Taps<T> t[U];
        bool ok[U];
        T a[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const int i = l * p.p + pt0 + u;
          ok[u] = pt0 + u < p.p && level_taps(loc + 2 * i, lv, &t[u]);
          a[u] = ok[u] ? __ldg(wgt + i) : T(0);
        }
        // All corner loads first, then the arithmetic: they overlap.
        Pack<T, V> v[U][4];
#pragma unroll
        for (int u = 0; u < U; ++u) {
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            // Corners outside the map read 0, not value*0: a non-finite
            // value at the offset-0 pixel must not leak into samples that
            // skip it.
            if (ok[u] && t[u].in[c]) {
              v[u][c] = load_pack<T, V>(base + t[u].off[c] * pix_stride);
            } else {
#pragma unroll
              for (int i = 0; i < V; ++i) v[u][c].v[i] = T(0);
            }
          }
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
          if (!ok[u]) continue;  // adds nothing, not even weight*0
#pragma unroll
          for (int i = 0; i < V; ++i) {
            acc.v[i] += a[u] * (t[u].w[0] * v[u][0].v[i] + t[u].w[1] * v[u][1].v[i] +
                                t[u].w[2] * v[u][2].v[i] + t[u].w[3] * v[u][3].v[i]);
          }
        }
      }
    }
    store_pack<T, V>(out + d0, acc);
  }
}

// One channel's terms of a point's gradients, added to *dw (of the
// attention weight: g times the sample) and *dx, *dy (tx and ty times
// d(sample)/dx and /dy, in pixels, corners outside the map being 0). v holds
// the four corners' values of the channel, 0 outside.
template <typename T>
__device__ __forceinline__ void channel_grads(const Taps<T>& t, const T (&v)[4], T g, T tx, T ty, T* dw, T* dx,
                                              T* dy) {
  const T hy = T(1) - t.ly, hx = T(1) - t.lx;
  *dw += g * (t.w[0] * v[0] + t.w[1] * v[1] + t.w[2] * v[2] + t.w[3] * v[3]);
  *dx += tx * (hy * (v[1] - v[0]) + t.ly * (v[3] - v[2]));
  *dy += ty * (hx * (v[2] - v[0]) + t.lx * (v[3] - v[1]));
}

template <typename T, int U, bool kHeads>
__device__ void msdeform_backward(const MSDeformParams& p) {
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t groups = static_cast<int64_t>(p.n) * p.lq * p.m;
  // Lanes past the end stay to take part in the shuffles, doing no memory work.
  const bool valid = tid / p.group < groups;
  const int64_t gid = valid ? tid / p.group : groups - 1;
  const int lane = static_cast<int>(tid % p.group);
  const Query qr = query_of<kHeads>(p, gid);
  const int lp = p.l * p.p;
  const T* loc = reinterpret_cast<const T*>(p.loc) + qr.qm * lp * 2;
  const T* wgt = reinterpret_cast<const T*>(p.weight) + qr.qm * lp;
  const T* gout = reinterpret_cast<const T*>(p.grad_out) + qr.qm * p.d;
  const T* value = reinterpret_cast<const T*>(p.value);
  T* gvalue = reinterpret_cast<T*>(p.grad_value);
  T* gloc = reinterpret_cast<T*>(p.grad_loc) + qr.qm * lp * 2;
  T* gwgt = reinterpret_cast<T*>(p.grad_weight) + qr.qm * lp;
  const int64_t pix_stride = static_cast<int64_t>(p.m) * p.d;
  for (int l = 0; l < p.l; ++l) {
    const Level lv = level_of(p, l);
    const int64_t base_off = ((static_cast<int64_t>(qr.n) * p.s + lv.start) * p.m + qr.m) * p.d;
    for (int pt0 = 0; pt0 < p.p; pt0 += U) {
      Taps<T> t[U];
      bool ok[U];
      T a[U], dw[U], dx[U], dy[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int i = l * p.p + pt0 + u;
        // The same for every lane of the group.
        ok[u] = valid && pt0 + u < p.p && level_taps(loc + 2 * i, lv, &t[u]);
        a[u] = ok[u] ? wgt[i] : T(0);
        dw[u] = dx[u] = dy[u] = T(0);
      }
      for (int d = lane; d < p.d; d += p.group) {
        const T g = valid ? __ldg(gout + d) : T(0);
        T v[U][4];
#pragma unroll
        for (int u = 0; u < U; ++u) {
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            v[u][c] = ok[u] && t[u].in[c] ? __ldg(value + base_off + d + t[u].off[c] * pix_stride) : T(0);
          }
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
          if (!ok[u]) continue;
          const T tg = g * a[u];
          channel_grads(t[u], v[u], g, tg, tg, &dw[u], &dx[u], &dy[u]);
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            if (t[u].in[c]) atomicAdd(gvalue + base_off + d + t[u].off[c] * pix_stride, t[u].w[c] * tg);
          }
        }
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const T sw = group_sum(dw[u], p.group);
        const T sx = group_sum(dx[u], p.group);
        const T sy = group_sum(dy[u], p.group);
        const int i = l * p.p + pt0 + u;
        if (valid && lane == 0 && pt0 + u < p.p) {
          gwgt[i] = sw;
          // x = loc_x*W - 0.5, so d/dloc_x = W * d/dx.
          gloc[2 * i] = static_cast<T>(lv.w) * sx;
          gloc[2 * i + 1] = static_cast<T>(lv.h) * sy;
        }
      }
    }
  }
}

// Byte offset of pixel pix, rows of bytes bytes apart: both are non-negative
// ints, so one 32x32->64-bit multiply.
__device__ __forceinline__ uint64_t pixel_bytes(int pix, int bytes) {
  return static_cast<uint64_t>(static_cast<uint32_t>(pix)) * static_cast<uint32_t>(bytes);
}

// The reduce-scatter of msdeform_backward_scatter: a lane's sums of two
// blocks of points, older and newer, become its share of the sum over the
// lanes that differ in lane bit o: a lane with that bit set keeps the newer
// block's sums and sends the older block's to its partner, which keeps the
// older. Three shuffles, result in newer.
template <typename T>
__device__ __forceinline__ void scatter_merge(const T (&older)[3], T (&newer)[3], int lane, int o) {
  const bool keep_newer = (lane & o) != 0;
#pragma unroll
  for (int j = 0; j < 3; ++j) {
    const T send = keep_newer ? older[j] : newer[j];
    const T keep = keep_newer ? newer[j] : older[j];
    newer[j] = keep + __shfl_xor_sync(0xffffffffu, send, o);
  }
}

// Backward with the channel sums reduce-scattered: channels spread over the
// lanes (coalesced atomics) and per-lane taps as in msdeform_backward, but instead
// of reducing each point's three channel sums (weight, x and y gradients)
// over the group with a butterfly (3*log2(kG) shuffles per point), the group
// reduce-scatters the sums of kK points (kK <= kG) over its lanes: point k
// ends up with the kG/kK lanes whose index divided by kG/kK is k, and each
// of those lanes writes it. The scatter is a binary tree over the points,
// merged as they are computed (scatter_merge: lane bit (kG/kK)<<t decides
// which of two blocks of 2^t points a lane keeps), so a lane holds the sums
// of at most log2(kK)+1 blocks, not of all kK points: 3*(kK-1) shuffles for
// the tree and 3*log2(kG/kK) for the butterfly over the lanes left holding
// the same point. For kK = 16 and 32 lanes, 48 shuffles per 16 points
// instead of 240. kG is the group size (p.group).
//
// A lane takes kV channels, kG apart (lane, lane+kG, ...; then further
// passes of kG channels while D has more): each atomic instruction of a
// group still adds to kG consecutive floats (whole 32-byte sectors from 8
// lanes up), and the taps, level lookups, loads of the location and weight
// and the reduce-scatter, the same for every channel, are paid once per kV
// channels: with D = 32, kV = 4 makes groups of 8 lanes, 4 per warp.
//
// kQuad (float, kV = 4, D % 4 == 0, 16-byte aligned rows; sm_90 only, from
// msdeform_sm90a.cu): a lane's 4 channels are consecutive instead, read as
// one 16-byte load per corner and added to grad_value with one vector
// reduction (red.global.v4.f32.add, PTX ISA 8.1) per corner: a quarter of
// the atomic instructions, each a whole 16 bytes, so a group's covers 128
// contiguous bytes of a pixel instead of one 32-byte sector.
template <typename T, int kK, int kV, int kG, bool kHeads, bool kQuad = false>
__device__ __forceinline__ void msdeform_backward_scatter_group(const MSDeformParams& p) {
  static_assert(!kQuad || (kV == 4 && sizeof(T) == 4), "kQuad: float, 4 channels per lane");
  static_assert(kK > 0 && (kK & (kK - 1)) == 0 && kK <= kG, "kK: a power of two, at most the group");
  constexpr int kCopies = kG / kK;  // lanes left holding each point's sums
  constexpr int kLevels = kK == 1 ? 0 : kK == 2 ? 1 : kK == 4 ? 2 : kK == 8 ? 3 : kK == 16 ? 4 : 5;
  static_assert(1 << kLevels == kK, "kK up to 32");
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t groups = static_cast<int64_t>(p.n) * p.lq * p.m;
  // Lanes past the end stay to take part in the shuffles, doing no memory work.
  const bool valid = tid / kG < groups;
  const int64_t gid = valid ? tid / kG : groups - 1;
  const int lane = static_cast<int>(tid % kG);
  const Query qr = query_of<kHeads>(p, gid);
  const int lp = p.l * p.p;
  const T* loc = reinterpret_cast<const T*>(p.loc) + qr.qm * lp * 2;
  const T* wgt = reinterpret_cast<const T*>(p.weight) + qr.qm * lp;
  const T* gout = reinterpret_cast<const T*>(p.grad_out) + qr.qm * p.d;
  T* gloc = reinterpret_cast<T*>(p.grad_loc) + qr.qm * lp * 2;
  T* gwgt = reinterpret_cast<T*>(p.grad_weight) + qr.qm * lp;
  // Addresses in bytes, so that a corner's costs one 32x32->64-bit
  // multiply-add (pixel_bytes): bytes between pixels (ops checks that they
  // fit an int), and the lane's first channel of pixel 0 of this image and
  // head, with its output gradient.
  const int pix_bytes = p.m * p.d * static_cast<int>(sizeof(T));
  // The lane's first channel: lane (then lane+kG, ...) or, kQuad, 4*lane.
  const int ch0 = kQuad ? lane * kV : lane;
  // Channels between the lane's successive channels, and between passes.
  constexpr int kStep = kQuad ? 1 : kG, kPass = kV * kG;
  const int64_t head0 = ((static_cast<int64_t>(qr.n) * p.s * p.m + qr.m) * p.d + ch0) * static_cast<int64_t>(sizeof(T));
  const char* value = reinterpret_cast<const char*>(p.value) + head0;
  char* gvalue = reinterpret_cast<char*>(p.grad_value) + head0;
  // The output gradients of the lane's first kV channels, read once.
  T g_lane[kV];
#pragma unroll
  for (int v = 0; v < kV; ++v) g_lane[v] = valid && ch0 + v * kStep < p.d ? __ldg(gout + ch0 + v * kStep) : T(0);
  // Every lane of the warp runs the same chunks and points (lp is the
  // launch's), so the shuffles below are convergent.
  for (int i0 = 0; i0 < lp; i0 += kK) {
    // tree[t]: the lane's share of the sums of the last complete block of
    // 2^t points, while one is pending.
    T tree[kLevels > 0 ? kLevels : 1][3];
    T top[3];  // the whole chunk's, once its last point is in
    int l = i0 / p.p, pt = i0 - l * p.p;
    Level lv;
#pragma unroll
    for (int k = 0; k < kK; ++k) {
      const int i = i0 + k;
      // (Past the last point, l is past the last level: no lookup.)
      if ((k == 0 || pt == 0) && i < lp) lv = level_of(p, l);
      // This lane's channels' terms of the weight, x and y gradients of
      // point i.
      T cur[3] = {T(0), T(0), T(0)};
      Taps<T> t;
      // The same for every lane of the group.
      if (valid && i < lp && level_taps(loc + 2 * i, lv, &t)) {
        const T a = __ldg(wgt + i);
        // x = loc_x*W - 0.5, so d/dloc_x = W * d/dx.
        const T aw = a * static_cast<T>(lv.w), ah = a * static_cast<T>(lv.h);
        // Each corner's offset from pixel 0; 0 (pixel 0 of the level, never
        // read or written) outside the map.
        uint64_t off[4];
#pragma unroll
        for (int c = 0; c < 4; ++c) off[c] = pixel_bytes(lv.start + t.off[c], pix_bytes);
        if constexpr (kQuad) {
          // Channels ch0+dd .. ch0+dd+3, whose output gradients are g.
          auto quad = [&](int dd, const T (&g)[4]) {
            const char* vd = value + dd * static_cast<int64_t>(sizeof(T));
            char* gd = gvalue + dd * static_cast<int64_t>(sizeof(T));
            float4 v4[4];
#pragma unroll
            for (int c = 0; c < 4; ++c) {
              v4[c] = t.in[c] ? __ldg(reinterpret_cast<const float4*>(vd + off[c])) : make_float4(0.f, 0.f, 0.f, 0.f);
            }
            const T v[4][4] = {{v4[0].x, v4[1].x, v4[2].x, v4[3].x},
                               {v4[0].y, v4[1].y, v4[2].y, v4[3].y},
                               {v4[0].z, v4[1].z, v4[2].z, v4[3].z},
                               {v4[0].w, v4[1].w, v4[2].w, v4[3].w}};
#pragma unroll
            for (int j = 0; j < 4; ++j) channel_grads(t, v[j], g[j], g[j] * aw, g[j] * ah, &cur[0], &cur[1], &cur[2]);
            const T tg[4] = {g[0] * a, g[1] * a, g[2] * a, g[3] * a};
#pragma unroll
            for (int c = 0; c < 4; ++c) {
              if (t.in[c]) {
                red_add_v4(reinterpret_cast<float*>(gd + off[c]), t.w[c] * tg[0], t.w[c] * tg[1], t.w[c] * tg[2],
                           t.w[c] * tg[3]);
              }
            }
          };
          if (ch0 < p.d) quad(0, g_lane);
          for (int dd = kPass; ch0 + dd < p.d; dd += kPass) {
            const T g[4] = {__ldg(gout + ch0 + dd), __ldg(gout + ch0 + dd + 1), __ldg(gout + ch0 + dd + 2),
                            __ldg(gout + ch0 + dd + 3)};
            quad(dd, g);
          }
        } else {
          // Channel lane + dd, whose output gradient is g.
          auto channel = [&](int dd, T g) {
            const char* vd = value + dd * static_cast<int64_t>(sizeof(T));
            char* gd = gvalue + dd * static_cast<int64_t>(sizeof(T));
            T v[4];
#pragma unroll
            for (int c = 0; c < 4; ++c) v[c] = t.in[c] ? __ldg(reinterpret_cast<const T*>(vd + off[c])) : T(0);
            channel_grads(t, v, g, g * aw, g * ah, &cur[0], &cur[1], &cur[2]);
            const T tg = g * a;
#pragma unroll
            for (int c = 0; c < 4; ++c) {
              T* dst = reinterpret_cast<T*>(gd + off[c]);
              if (t.in[c]) atomicAdd(dst, t.w[c] * tg);
            }
          };
#pragma unroll
          for (int v = 0; v < kV; ++v) {
            if (lane + v * kG < p.d) channel(v * kG, g_lane[v]);
          }
          for (int dd = kPass; lane + dd < p.d; dd += kG) channel(dd, __ldg(gout + lane + dd));
        }
      }
      if (++pt == p.p) pt = 0, ++l;
      // Merge cur up the tree for every trailing 1 bit of k (k is a
      // constant here: the tree indices and lane bits are too).
      bool placed = false;
#pragma unroll
      for (int lvl = 0; lvl < kLevels; ++lvl) {
        if (!placed) {
          if ((k >> lvl) & 1) {
            scatter_merge(tree[lvl], cur, lane, kCopies << lvl);
          } else {
#pragma unroll
            for (int j = 0; j < 3; ++j) tree[lvl][j] = cur[j];
            placed = true;
          }
        }
      }
      if (!placed) {
#pragma unroll
        for (int j = 0; j < 3; ++j) top[j] = cur[j];
      }
    }
    // The lanes holding the same point's sums add them up.
#pragma unroll
    for (int o = kCopies >> 1; o > 0; o >>= 1) {
#pragma unroll
      for (int j = 0; j < 3; ++j) top[j] += __shfl_xor_sync(0xffffffffu, top[j], o);
    }
    const int i = i0 + lane / kCopies;
    // Points that sample nothing get 0, like every lane's share of them.
    if (valid && i < lp) {
      const int copy = lane % kCopies;
      if (copy == 0) gwgt[i] = top[0];
      if (copy == kCopies - 1) gloc[2 * i] = top[1], gloc[2 * i + 1] = top[2];
    }
  }
}

// Chunks of kK points, fewer for groups of fewer lanes.
template <typename T, int kK, int kV, bool kHeads, bool kQuad = false>
__device__ void msdeform_backward_scatter(const MSDeformParams& p) {
  switch (p.group) {
    case 32: msdeform_backward_scatter_group<T, (kK < 32 ? kK : 32), kV, 32, kHeads, kQuad>(p); break;
    case 16: msdeform_backward_scatter_group<T, (kK < 16 ? kK : 16), kV, 16, kHeads, kQuad>(p); break;
    case 8: msdeform_backward_scatter_group<T, (kK < 8 ? kK : 8), kV, 8, kHeads, kQuad>(p); break;
    case 4: msdeform_backward_scatter_group<T, (kK < 4 ? kK : 4), kV, 4, kHeads, kQuad>(p); break;
    case 2: msdeform_backward_scatter_group<T, (kK < 2 ? kK : 2), kV, 2, kHeads, kQuad>(p); break;
    default: msdeform_backward_scatter_group<T, 1, kV, 1, kHeads, kQuad>(p); break;
  }
}

// A point's taps as one lane computes them for its whole group: pixel
// indices within the image's S (-1 for a corner outside the map), weights,
// the attention weight, and the fractional parts. A point that samples
// nothing has a == 0, zero weights and no corners, so adding it changes
// nothing and reads nothing.
template <typename T>
struct PointTaps {
  int pix[4];
  T w[4];
  T a, ly, lx;
};

template <typename T, bool kHeads>
__device__ __forceinline__ PointTaps<T> point_taps(const MSDeformParams& p, const Query& qr, int i, bool has) {
  PointTaps<T> pt;
  pt.a = pt.ly = pt.lx = T(0);
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    pt.pix[c] = -1;
    pt.w[c] = T(0);
  }
  if (!has) return pt;
  const int lp = p.l * p.p;
  const T* loc = reinterpret_cast<const T*>(p.loc) + qr.qm * lp * 2 + 2 * i;
  const Level lv = level_of(p, i / p.p);
  Taps<T> t;
  if (!level_taps(loc, lv, &t)) return pt;
  pt.a = __ldg(reinterpret_cast<const T*>(p.weight) + qr.qm * lp + i);
  pt.ly = t.ly;
  pt.lx = t.lx;
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    pt.pix[c] = t.in[c] ? lv.start + t.off[c] : -1;
    pt.w[c] = t.w[c];
  }
  return pt;
}

// pt as lane src of the group holds it.
template <typename T>
__device__ __forceinline__ PointTaps<T> shfl_taps(const PointTaps<T>& pt, int src, int group, bool fractions) {
  PointTaps<T> r;
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    r.pix[c] = __shfl_sync(0xffffffffu, pt.pix[c], src, group);
    r.w[c] = __shfl_sync(0xffffffffu, pt.w[c], src, group);
  }
  r.a = __shfl_sync(0xffffffffu, pt.a, src, group);
  if (fractions) {
    r.ly = __shfl_sync(0xffffffffu, pt.ly, src, group);
    r.lx = __shfl_sync(0xffffffffu, pt.lx, src, group);
  } else {
    r.ly = r.lx = T(0);
  }
  return r;
}

// Forward with shared taps: the lanes of a group compute the taps of
// different points, one each, and pass them round with shuffles, instead of
// every lane computing every point's taps (the address and interpolation
// arithmetic was what bound the kernel, not memory). kOrdered: see query_of.
template <typename T, int V, bool kHeads, bool kOrdered = false>
__device__ void msdeform_forward_shared(const MSDeformParams& p) {
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t groups = static_cast<int64_t>(p.n) * p.lq * p.m;
  // Lanes past the end stay to take part in the shuffles, doing no memory work.
  const bool valid = tid / p.group < groups;
  const int64_t gid = valid ? tid / p.group : groups - 1;
  const int lane = static_cast<int>(tid % p.group);
  const Query qr = query_of<kHeads, kOrdered>(p, gid);
  const int lp = p.l * p.p;
  const T* value = reinterpret_cast<const T*>(p.value);
  // Element of channel 0 of pixel 0 of this image and head.
  const int64_t head0 = static_cast<int64_t>(qr.n) * p.s * p.m * p.d + static_cast<int64_t>(qr.m) * p.d;
  const int64_t pix_stride = static_cast<int64_t>(p.m) * p.d;
  T* out = reinterpret_cast<T*>(p.out) + qr.qm * p.d;
  for (int dbase = 0; dbase < p.d; dbase += p.group * V) {
    const int d0 = dbase + lane * V;
    const bool mine = valid && d0 < p.d;
    Pack<T, V> acc;
#pragma unroll
    for (int i = 0; i < V; ++i) acc.v[i] = T(0);
    for (int r0 = 0; r0 < lp; r0 += p.group) {
      const PointTaps<T> own = point_taps<T, kHeads>(p, qr, r0 + lane, valid && r0 + lane < lp);
      const int n = min(p.group, lp - r0);
      for (int j = 0; j < n; ++j) {
        const PointTaps<T> t = shfl_taps(own, j, p.group, false);
        Pack<T, V> v[4];
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          // Corners outside the map read 0, not value*0: a non-finite value
          // there must not leak into samples that skip it.
          if (mine && t.pix[c] >= 0) {
            v[c] = load_pack<T, V>(value + head0 + t.pix[c] * pix_stride + d0);
          } else {
#pragma unroll
            for (int i = 0; i < V; ++i) v[c].v[i] = T(0);
          }
        }
#pragma unroll
        for (int i = 0; i < V; ++i) {
          acc.v[i] += t.a * (t.w[0] * v[0].v[i] + t.w[1] * v[1].v[i] + t.w[2] * v[2].v[i] + t.w[3] * v[3].v[i]);
        }
      }
    }
    if (mine) store_pack<T, V>(out + d0, acc);
  }
}

// Backward with shared taps, one channel per lane (coalesced atomics). The
// lane that computed a point's taps also writes its location and weight
// gradients, reduced over channels with shuffles.
template <typename T, bool kHeads>
__device__ void msdeform_backward_shared(const MSDeformParams& p) {
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t groups = static_cast<int64_t>(p.n) * p.lq * p.m;
  const bool valid = tid / p.group < groups;
  const int64_t gid = valid ? tid / p.group : groups - 1;
  const int lane = static_cast<int>(tid % p.group);
  const Query qr = query_of<kHeads>(p, gid);
  const int lp = p.l * p.p;
  const T* value = reinterpret_cast<const T*>(p.value);
  T* gvalue = reinterpret_cast<T*>(p.grad_value);
  const T* gout = reinterpret_cast<const T*>(p.grad_out) + qr.qm * p.d;
  T* gloc = reinterpret_cast<T*>(p.grad_loc) + qr.qm * lp * 2;
  T* gwgt = reinterpret_cast<T*>(p.grad_weight) + qr.qm * lp;
  const int64_t head0 = static_cast<int64_t>(qr.n) * p.s * p.m * p.d + static_cast<int64_t>(qr.m) * p.d;
  const int64_t pix_stride = static_cast<int64_t>(p.m) * p.d;
  for (int r0 = 0; r0 < lp; r0 += p.group) {
    const int i_own = r0 + lane;
    const bool has = valid && i_own < lp;
    const PointTaps<T> own = point_taps<T, kHeads>(p, qr, i_own, has);
    T own_dw = T(0), own_dx = T(0), own_dy = T(0);
    const int n = min(p.group, lp - r0);
    for (int j = 0; j < n; ++j) {
      const PointTaps<T> t = shfl_taps(own, j, p.group, true);
      T dw = T(0), dx = T(0), dy = T(0);
      // A point that samples nothing has no corner and no gradient.
      const bool any = t.pix[0] >= 0 || t.pix[1] >= 0 || t.pix[2] >= 0 || t.pix[3] >= 0;
      if (valid && any) {
        const T hy = T(1) - t.ly, hx = T(1) - t.lx;
        for (int d = lane; d < p.d; d += p.group) {
          const T g = __ldg(gout + d);
          T v[4];
#pragma unroll
          for (int c = 0; c < 4; ++c) v[c] = t.pix[c] >= 0 ? __ldg(value + head0 + t.pix[c] * pix_stride + d) : T(0);
          const T tg = g * t.a;
          dw += g * (t.w[0] * v[0] + t.w[1] * v[1] + t.w[2] * v[2] + t.w[3] * v[3]);
          // d(sample)/dx and /dy of the bilinear form, corners outside being 0.
          dx += tg * (hy * (v[1] - v[0]) + t.ly * (v[3] - v[2]));
          dy += tg * (hx * (v[2] - v[0]) + t.lx * (v[3] - v[1]));
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            if (t.pix[c] >= 0) atomicAdd(gvalue + head0 + t.pix[c] * pix_stride + d, t.w[c] * tg);
          }
        }
      }
      dw = group_sum(dw, p.group);
      dx = group_sum(dx, p.group);
      dy = group_sum(dy, p.group);
      if (lane == j) own_dw = dw, own_dx = dx, own_dy = dy;
    }
    if (has) {
      const Level lv = level_of(p, i_own / p.p);
      gwgt[i_own] = own_dw;
      // x = loc_x*W - 0.5, so d/dloc_x = W * d/dx.
      gloc[2 * i_own] = static_cast<T>(lv.w) * own_dx;
      gloc[2 * i_own + 1] = static_cast<T>(lv.h) * own_dy;
    }
  }
}

// Queries in spatial order, for the forward: with queries as drawn (say,
// reference points uniform over the map), the queries of a block sample
// unrelated places and miss in L1; sorted, neighbouring groups share cache
// lines. A counting sort of each image's queries by the cell of their first
// location (head 0, level 0, point 0) in a grid of bands x cols over the
// unit square, row-major, which ops sizes from level 0 (at most kOrderCells
// cells), in three launches:
// - msdeform_sort_cells, a thread per query: its cell;
// - msdeform_sort_scan, one block of kOrderThreads per image: the count of
//   each cell, scanned into the cell's first position;
// - msdeform_sort_place, a thread per query: the next free position of its
//   cell takes it.
// The order of queries within a cell depends on the atomics'; the forward's
// results do not, as every query's sum is its own.
//
// Only the scan is left to one block per image, because it is the only
// step whose memory accesses are coalesced: a query's location is 1 KB from
// the next one's, and its position anywhere in the image, so the other two
// steps touch a cache line per query, and one block per image would queue
// them all at a few SMs' L1s (one block per image for all three steps, or
// for the last two, measured several times slower than the three launches).
// stheno:const MSDeformOrderCells
constexpr int kOrderCells = 8192;
// stheno:const MSDeformOrderThreads
constexpr int kOrderThreads = 1024;
constexpr int kOrderUnroll = 4;  // cells a thread of msdeform_sort_scan has in flight

struct MSDeformOrderParams {
  uint64_t loc;     // [N,Lq,M,L,P,2]
  uint64_t cells;   // int32 [N,Lq]: each query's cell
  uint64_t starts;  // int32 [N,bands*cols]: each cell's first position, then its next free one
  uint64_t order;   // int32 [N,Lq], written: the query at each position of its image
  int32_t n, lq;
  int32_t stride;   // elements between two queries' locations: M*L*P*2
  int32_t bands, cols, unused;
};
STHENO_PARAMS(MSDeformOrderParams);

// The cell of normalised location (x, y). Locations outside [0,1]^2 take
// the nearest edge cell, NaN the first row or column.
template <typename T>
__device__ __forceinline__ int order_cell(const T* loc, int bands, int cols) {
  const T x = loc[0], y = loc[1];
  const int b = y > T(0) ? static_cast<int>(fmin(y * static_cast<T>(bands), static_cast<T>(bands - 1))) : 0;
  const int c = x > T(0) ? static_cast<int>(fmin(x * static_cast<T>(cols), static_cast<T>(cols - 1))) : 0;
  return b * cols + c;
}

template <typename T>
__device__ void msdeform_sort_cells(const MSDeformOrderParams& p) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<int64_t>(p.n) * p.lq) return;
  reinterpret_cast<int*>(p.cells)[i] = order_cell(reinterpret_cast<const T*>(p.loc) + i * p.stride, p.bands, p.cols);
}

__device__ __forceinline__ void msdeform_sort_scan(const MSDeformOrderParams& p) {
  __shared__ int count[kOrderCells];
  __shared__ int warp_total[kOrderThreads / 32];
  const int ncells = p.bands * p.cols;
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int* cells = reinterpret_cast<const int*>(p.cells) + static_cast<int64_t>(blockIdx.x) * p.lq;
  int* starts = reinterpret_cast<int*>(p.starts) + static_cast<int64_t>(blockIdx.x) * ncells;
  for (int c = tid; c < ncells; c += kOrderThreads) count[c] = 0;
  __syncthreads();
  for (int q0 = tid; q0 < p.lq; q0 += kOrderUnroll * kOrderThreads) {
    int cell[kOrderUnroll];
#pragma unroll
    for (int u = 0; u < kOrderUnroll; ++u) cell[u] = q0 + u * kOrderThreads < p.lq ? cells[q0 + u * kOrderThreads] : -1;
#pragma unroll
    for (int u = 0; u < kOrderUnroll; ++u) {
      if (cell[u] >= 0) atomicAdd(&count[cell[u]], 1);
    }
  }
  __syncthreads();
  // Exclusive scan of the counts: each thread sums a run of consecutive
  // cells, the runs' sums are scanned across the block (warps, then the
  // warps' totals), and each thread writes its run's starts.
  const int per = (ncells + kOrderThreads - 1) / kOrderThreads;
  const int c0 = min(tid * per, ncells), c1 = min(c0 + per, ncells);
  int run = 0;
  for (int c = c0; c < c1; ++c) run += count[c];
  int incl = run;  // inclusive scan of the runs over the warp
#pragma unroll
  for (int o = 1; o < 32; o *= 2) {
    const int v = __shfl_sync(0xffffffffu, incl, (lane - o) & 31);
    if (lane >= o) incl += v;
  }
  if (lane == 31) warp_total[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    int t = warp_total[lane];
#pragma unroll
    for (int o = 1; o < 32; o *= 2) {
      const int v = __shfl_sync(0xffffffffu, t, (lane - o) & 31);
      if (lane >= o) t += v;
    }
    warp_total[lane] = t;  // inclusive: warps 0..lane
  }
  __syncthreads();
  int pos = incl - run + (warp > 0 ? warp_total[warp - 1] : 0);
  for (int c = c0; c < c1; ++c) {
    starts[c] = pos;
    pos += count[c];
  }
}

__device__ __forceinline__ void msdeform_sort_place(const MSDeformOrderParams& p) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<int64_t>(p.n) * p.lq) return;
  const int n = static_cast<int>(i / p.lq), q = static_cast<int>(i - static_cast<int64_t>(n) * p.lq);
  const int cell = reinterpret_cast<const int*>(p.cells)[i];
  int* starts = reinterpret_cast<int*>(p.starts) + static_cast<int64_t>(n) * p.bands * p.cols;
  reinterpret_cast<int*>(p.order)[static_cast<int64_t>(n) * p.lq + atomicAdd(&starts[cell], 1)] = q;
}

}  // namespace stheno

// msdeform_sm90a.cu includes this file for its templates with
// STHENO_MSDEFORM_TEMPLATES_ONLY, so that its module holds only its own kernels.
#ifndef STHENO_MSDEFORM_TEMPLATES_ONLY

// Kernels, named msdeform_<pass>_<design>_<dtype>:
// - fwd: a group of lanes per (n, q, m), queries fastest, each point's taps
//   computed by one lane and passed round the group (msdeform_forward_shared),
//   or by every lane (_lanetaps, msdeform_forward). _v16b: a lane loads 16
//   bytes of consecutive channels at once (4 floats, 2 doubles), _scalar
//   one channel. _sorted: the queries in p.order's order (ops launches the
//   msdeform_sort_* kernels first).
// - bwd: heads fastest (_qfast: queries fastest), every lane computing every
//   point's taps (_sharedtaps: one lane each, msdeform_backward_shared).
//   _atomic_c<V>: V channels per lane, a group apart, added to grad_value
//   with scalar atomics; _red4 (msdeform_sm90a.cu): 4 consecutive channels
//   per lane, added with one 16-byte vector reduction per corner. The
//   location and weight gradients' channel sums: _rs<K> reduce-scatters
//   those of K points at a time over the group (msdeform_backward_scatter),
//   _butterfly reduces each point's (msdeform_backward).
// - _occ<B>: registers capped so that B blocks of kBlock threads share an
//   SM.
// - sort: msdeform_sort_cells, _scan and _place, the query order (above).
// ops launches those outside #if STHENO_KERNEL_VARIANTS (msDeformKernelFor);
// the variants inside it are built for the benchmarks and for the tests
// against the defaults (make kernels VARIANTS=1; the emulator always).
#define STHENO_FWD(name, T, V, U, H) \
  __global__ void __launch_bounds__(stheno::kBlock) name(stheno::MSDeformParams p) { stheno::msdeform_forward<T, V, U, H>(p); }
#define STHENO_BWD(name, T, U, H) \
  __global__ void __launch_bounds__(stheno::kBlock) name(stheno::MSDeformParams p) { stheno::msdeform_backward<T, U, H>(p); }
#define STHENO_FWD_S(name, T, V, H) \
  __global__ void __launch_bounds__(stheno::kBlock) name(stheno::MSDeformParams p) { stheno::msdeform_forward_shared<T, V, H>(p); }
#define STHENO_BWD_S(name, T, H) \
  __global__ void __launch_bounds__(stheno::kBlock) name(stheno::MSDeformParams p) { stheno::msdeform_backward_shared<T, H>(p); }
// B: blocks of kBlock threads per SM that the registers must allow.
#define STHENO_FWD_SB(name, T, V, H, B) \
  __global__ void __launch_bounds__(stheno::kBlock, B) name(stheno::MSDeformParams p) { stheno::msdeform_forward_shared<T, V, H>(p); }
#define STHENO_FWD_SO(name, T, V)                                              \
  __global__ void __launch_bounds__(stheno::kBlock) name(stheno::MSDeformParams p) { \
    stheno::msdeform_forward_shared<T, V, false, true>(p);                       \
  }
#define STHENO_FWD_SBO(name, T, V, B)                                             \
  __global__ void __launch_bounds__(stheno::kBlock, B) name(stheno::MSDeformParams p) { \
    stheno::msdeform_forward_shared<T, V, false, true>(p);                          \
  }
#define STHENO_BWD_R(name, T, K, V, H, B) \
  __global__ void __launch_bounds__(stheno::kBlock, B) name(stheno::MSDeformParams p) { stheno::msdeform_backward_scatter<T, K, V, H>(p); }

extern "C" {
// Forward. The float32 default caps registers for 5 blocks per SM (48
// registers, a few spilled): on the H200 it was chosen on, it beat the
// uncapped msdeform_fwd_v16b_f32 on the TARGETS cases and a cap for 6
// blocks (BENCHMARKS.md has an H100 run where the uncapped kernel won). The
// sorted kernels are uncapped: with the order lookup, the capped one
// (msdeform_fwd_v16b_occ5_sorted_f32) was slower.
STHENO_FWD_SB(msdeform_fwd_v16b_occ5_f32, float, 4, false, 5)
STHENO_FWD_S(msdeform_fwd_v16b_f64, double, 2, false)
STHENO_FWD_S(msdeform_fwd_scalar_f32, float, 1, false)
STHENO_FWD_S(msdeform_fwd_scalar_f64, double, 1, false)
STHENO_FWD_SO(msdeform_fwd_v16b_sorted_f32, float, 4)
STHENO_FWD_SO(msdeform_fwd_v16b_sorted_f64, double, 2)
STHENO_FWD_SO(msdeform_fwd_scalar_sorted_f32, float, 1)
STHENO_FWD_SO(msdeform_fwd_scalar_sorted_f64, double, 1)

// The query order: msdeform_sort_cells and _place a thread per query,
// msdeform_sort_scan one block of kOrderThreads per image.
__global__ void __launch_bounds__(stheno::kBlock) msdeform_sort_cells_f32(stheno::MSDeformOrderParams p) {
  stheno::msdeform_sort_cells<float>(p);
}
__global__ void __launch_bounds__(stheno::kBlock) msdeform_sort_cells_f64(stheno::MSDeformOrderParams p) {
  stheno::msdeform_sort_cells<double>(p);
}
__global__ void __launch_bounds__(stheno::kOrderThreads) msdeform_sort_scan(stheno::MSDeformOrderParams p) {
  stheno::msdeform_sort_scan(p);
}
__global__ void __launch_bounds__(stheno::kBlock) msdeform_sort_place(stheno::MSDeformOrderParams p) {
  stheno::msdeform_sort_place(p);
}

// Backward (below compute capability 9.0 for float32: msdeform_sm90a.cu's
// _red4 kernel there). The float32 default caps registers for 3 blocks per
// SM (80, a few spilled): faster than the cap for 2, and a cap for 4 (64)
// spilled 1.5 KB and was slower.
STHENO_BWD_R(msdeform_bwd_atomic_c4_rs4_occ3_f32, float, 4, 4, true, 3)
STHENO_BWD_R(msdeform_bwd_atomic_c4_rs4_f64, double, 4, 4, true, 1)
}

#if STHENO_KERNEL_VARIANTS
extern "C" {
STHENO_FWD(msdeform_fwd_v16b_lanetaps_f32, float, 4, 1, false)
STHENO_FWD_S(msdeform_fwd_v16b_f32, float, 4, false)
STHENO_FWD_SBO(msdeform_fwd_v16b_occ5_sorted_f32, float, 4, 5)

STHENO_BWD(msdeform_bwd_atomic_c1_butterfly_f32, float, 1, true)
STHENO_BWD(msdeform_bwd_atomic_c1_butterfly_f64, double, 1, true)
STHENO_BWD_S(msdeform_bwd_atomic_c1_sharedtaps_butterfly_f32, float, true)
STHENO_BWD_R(msdeform_bwd_atomic_c1_rs4_occ3_f32, float, 4, 1, true, 3)
STHENO_BWD_R(msdeform_bwd_atomic_c1_rs8_occ3_f32, float, 8, 1, true, 3)
STHENO_BWD_R(msdeform_bwd_atomic_c1_rs16_occ3_f32, float, 16, 1, true, 3)
STHENO_BWD_R(msdeform_bwd_atomic_c2_rs16_occ3_f32, float, 16, 2, true, 3)
STHENO_BWD_R(msdeform_bwd_atomic_c4_rs4_occ2_f32, float, 4, 4, true, 2)
STHENO_BWD_R(msdeform_bwd_atomic_c4_rs8_f32, float, 8, 4, true, 1)
STHENO_BWD_R(msdeform_bwd_atomic_c4_rs8_qfast_f32, float, 8, 4, false, 1)
STHENO_BWD_R(msdeform_bwd_atomic_c1_rs4_f64, double, 4, 1, true, 1)
STHENO_BWD_R(msdeform_bwd_atomic_c1_rs8_f64, double, 8, 1, true, 1)
STHENO_BWD_R(msdeform_bwd_atomic_c1_rs16_f64, double, 16, 1, true, 1)
STHENO_BWD_R(msdeform_bwd_atomic_c2_rs16_f64, double, 16, 2, true, 1)
STHENO_BWD_R(msdeform_bwd_atomic_c4_rs8_f64, double, 8, 4, true, 1)
STHENO_BWD_R(msdeform_bwd_atomic_c4_rs8_qfast_f64, double, 8, 4, false, 1)
}
#endif  // STHENO_KERNEL_VARIANTS
#endif  // STHENO_MSDEFORM_TEMPLATES_ONLY
