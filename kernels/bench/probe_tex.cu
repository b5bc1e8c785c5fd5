// Probe (not part of the library): does a texture gather (tld4: the 2x2 of
// a bilinear sample in one instruction) beat roialign_fwd_nchw_cols' four
// global loads per sample row? Standalone, for the GPU machine, which has
// nvcc but no Go:
//
//   nvcc -O3 -std=c++17 -arch=sm_90 -I kernels kernels/bench/probe_tex.cu -o probe_tex && ./probe_tex
//
// It times roialign_fwd_nchw_cols_s2[_cmajor]_f32 (the defaults) and the texture
// variants below on TARGETS.md's fixed-ratio cases (CUDA events, median of
// 30 after 5 warm-ups), and checks that the outputs are equal bit for bit.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "roialign.cu"

namespace stheno {

struct TexRow {
  int y;  // first pixel row of the 2x2 (moved up at the last row)
  float top, bottom;
};

// roialign_forward_cols<float, kS, kCM> with each sample row's four loads
// replaced by one tex2Dgather from a pitch-linear texture of the image's
// channel maps stacked vertically ([C*H rows][W]). Same weights, same sum
// order as the global-load kernel.
template <int kS, bool kCM, int kMode>
__device__ void cols_tex(const RoIAlignParams& p, cudaTextureObject_t t0, cudaTextureObject_t t1) {
  constexpr int kU = 2;
  if (p.sampling_ratio != kS || p.pooled_w * kS > 32 || p.pooled_h * kS > kColsMaxRows) return;
  const int64_t roi = blockIdx.x;
  const int cols = p.pooled_w * kS, slots = 32 / cols;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const int slot = lane / cols, sc = lane - slot * cols;
  const bool active = slot < slots;
  const int bins = p.pooled_h * p.pooled_w;
  const int chunk = (p.c + gridDim.y - 1) / gridDim.y;
  const int c_begin = blockIdx.y * chunk, c_end = min(p.c, c_begin + chunk);
  const int groups = c_end > c_begin ? (c_end - c_begin + slots - 1) / slots : 0;
  const int items = p.pooled_h * groups, per = (items + warps - 1) / warps;
  const int it_end = min(items, (warp + 1) * per);
  RoIGeom<float> g;
  roi_geometry(p, reinterpret_cast<const float*>(p.rois) + roi * 5, &g);
  const cudaTextureObject_t tex = g.batch == 1 ? t1 : t0;
  float* out = reinterpret_cast<float*>(p.pooled) + roi * p.c * bins;
  int x0 = 0;
  float lx = 0.f;
  const bool col_ok =
      active && g.grid_w > 0 && roi_axis(sample_coord(g.start_x, sc / kS, g.bin_w, sc % kS, kS), p.w, &x0, &lx);
  const float hx = 1.f - lx;
  const int left = x0 + 1 >= p.w ? 1 : 0;
  const float wl = col_ok ? (left ? 0.f : hx) : 0.f, wr = col_ok ? (left ? hx : lx) : 0.f;
  const float u = static_cast<float>(col_ok ? x0 - left : 0) + 1.f;  // gather's 2x2: columns u-1, u
  const bool leader = active && sc % kS == 0;
  const int bin_col = sc / kS;
  const float* x = reinterpret_cast<const float*>(p.feat) + static_cast<int64_t>(max(g.batch, 0)) * p.c * p.h * p.w;
  const int64_t row_bytes = static_cast<int64_t>(p.w) * 4;
  const int xl = col_ok ? x0 - left : 0;
  const bool odd = xl & 1;
  const int even_off = (xl & ~1) * 4;
  auto put = [&](int c, int br, float acc) {
    float sum = acc;
#pragma unroll
    for (int j = 1; j < kS; ++j) sum += __shfl_down_sync(0xffffffffu, acc, j);
    const float avg = sum * (1.f / float(kS * kS));
    if (leader && c < c_end) out[static_cast<int64_t>(c) * bins + br * p.pooled_w + bin_col] = avg;
  };
  __shared__ TexRow rows[kColsMaxRows];
  for (int r = threadIdx.x; r < p.pooled_h * kS; r += blockDim.x) {
    int y0 = 0;
    float ly = 0.f;
    const bool ok = g.grid_h > 0 && roi_axis(sample_coord(g.start_y, r / kS, g.bin_h, r % kS, kS), p.h, &y0, &ly);
    const float hy = 1.f - ly;
    const bool up = y0 + 1 >= p.h;
    rows[r] = TexRow{ok ? y0 - up : 0, ok ? (up ? 0.f : hy) : 0.f, ok ? (up ? hy : ly) : 0.f};
  }
  __syncthreads();
  auto gather = [&](int c, int br) {
    float acc = 0.f;
#pragma unroll
    for (int sr = 0; sr < kS; ++sr) {
      const TexRow e = rows[br * kS + sr];
      // Texels (u-1, v-1) .. (u, v): .w top-left, .z top-right, .x
      // bottom-left, .y bottom-right.
      float t00, t01, t10, t11;
      if constexpr (kMode == 0) {
        const float4 q = tex2Dgather<float4>(tex, u, static_cast<float>(c * p.h + e.y) + 1.f, 0);
        t00 = q.w, t01 = q.z, t10 = q.x, t11 = q.y;
      } else {
        // One 8-byte load at the even column at or left of the 2x2's, and
        // for a lane whose 2x2 starts at an odd column a 4-byte load of its
        // right column: the lane's parity is fixed for the RoI.
        const char* r0 = reinterpret_cast<const char*>(x) + (static_cast<int64_t>(c) * p.h + e.y) * row_bytes;
        const char* r1 = r0 + row_bytes;
        const float2 a = __ldg(reinterpret_cast<const float2*>(r0 + even_off));
        const float2 b = __ldg(reinterpret_cast<const float2*>(r1 + even_off));
        float a2 = 0.f, b2 = 0.f;
        if (odd) {
          a2 = __ldg(reinterpret_cast<const float*>(r0 + even_off + 8));
          b2 = __ldg(reinterpret_cast<const float*>(r1 + even_off + 8));
        }
        t00 = odd ? a.y : a.x, t01 = odd ? a2 : a.y, t10 = odd ? b.y : b.x, t11 = odd ? b2 : b.y;
      }
      const float s = e.top * wl * t00 + e.top * wr * t01 + e.bottom * wl * t10 + e.bottom * wr * t11;
      acc = sr == 0 ? s : acc + s;
    }
    return acc;
  };
  if constexpr (kCM) {
    const int ph = p.pooled_h;
    for (int it = warp * per; it < it_end;) {
      const int gi = it / ph, b0 = it - gi * ph, b1 = min(ph, b0 + (it_end - it));
      it += b1 - b0;
      const int c = c_begin + gi * slots + slot;
      const int cc = c < c_end ? c : c_begin;
      for (int br = b0; br < b1; br += kU) {
        float acc[kU];
#pragma unroll
        for (int uu = 0; uu < kU; ++uu) acc[uu] = gather(cc, min(br + uu, b1 - 1));
#pragma unroll
        for (int uu = 0; uu < kU; ++uu)
          if (br + uu < b1) put(c, br + uu, acc[uu]);
      }
    }
  } else {
    for (int it = warp * per; it < it_end;) {
      const int br = it / groups, g0 = it - br * groups, g1 = min(groups, g0 + (it_end - it));
      it += g1 - g0;
      for (int gi = g0; gi < g1; gi += kU) {
        float acc[kU];
#pragma unroll
        for (int uu = 0; uu < kU; ++uu) {
          const int c = c_begin + (gi + uu) * slots + slot;
          acc[uu] = gather(gi + uu < g1 && c < c_end ? c : c_begin, br);
        }
#pragma unroll
        for (int uu = 0; uu < kU; ++uu)
          if (gi + uu < g1) put(c_begin + (gi + uu) * slots + slot, br, acc[uu]);
      }
    }
  }
}

}  // namespace stheno

__global__ void __launch_bounds__(256) tex_cm(stheno::RoIAlignParams p, cudaTextureObject_t t0, cudaTextureObject_t t1) {
  stheno::cols_tex<2, true, 0>(p, t0, t1);
}
__global__ void __launch_bounds__(256) pair_cm(stheno::RoIAlignParams p, cudaTextureObject_t t0, cudaTextureObject_t t1) {
  stheno::cols_tex<2, true, 1>(p, t0, t1);
}
__global__ void __launch_bounds__(256) pair_rm(stheno::RoIAlignParams p, cudaTextureObject_t t0, cudaTextureObject_t t1) {
  stheno::cols_tex<2, false, 1>(p, t0, t1);
}
__global__ void __launch_bounds__(256) tex_rm(stheno::RoIAlignParams p, cudaTextureObject_t t0, cudaTextureObject_t t1) {
  stheno::cols_tex<2, false, 0>(p, t0, t1);
}

#define CK(x)                                                                               \
  do {                                                                                      \
    cudaError_t e_ = (x);                                                                   \
    if (e_ != cudaSuccess) {                                                                \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      exit(1);                                                                              \
    }                                                                                       \
  } while (0)

struct Case {
  const char* name;
  int n, c, h, w, k, pooled;
  double scale;
  double img_h, img_w;
};

template <typename F>
static float median_ms(F f) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (int i = 0; i < 5; ++i) f();
  std::vector<float> t;
  for (int i = 0; i < 30; ++i) {
    CK(cudaEventRecord(a));
    f();
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    float ms;
    CK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms);
  }
  CK(cudaGetLastError());
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

int main() {
  int dev = 0, tex_h = 0, tex_w = 0, talign = 0, palign = 0;
  CK(cudaDeviceGetAttribute(&tex_h, cudaDevAttrMaxTexture2DLinearHeight, dev));
  CK(cudaDeviceGetAttribute(&tex_w, cudaDevAttrMaxTexture2DLinearWidth, dev));
  CK(cudaDeviceGetAttribute(&talign, cudaDevAttrTextureAlignment, dev));
  CK(cudaDeviceGetAttribute(&palign, cudaDevAttrTexturePitchAlignment, dev));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, dev));
  printf("gpu: %s; 2D linear texture max %d x %d, alignment %d, pitch alignment %d\n", prop.name, tex_w, tex_h,
         talign, palign);
  const Case cases[] = {
      {"box_head_P2", 2, 256, 200, 336, 1024, 7, 0.25, 800, 1344},
      {"mask_head_P2", 2, 256, 200, 336, 256, 14, 0.25, 800, 1344},
      {"infer_1000_P3", 1, 256, 100, 168, 1000, 7, 0.125, 800, 1344},
  };
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> uni(0, 1);
  for (const Case& cs : cases) {
    const size_t nx = size_t(cs.n) * cs.c * cs.h * cs.w, plane_img = size_t(cs.c) * cs.h * cs.w;
    std::vector<float> hx(nx), hr(size_t(cs.k) * 5);
    for (auto& v : hx) v = float(uni(rng) * 2 - 1);
    for (int i = 0; i < cs.k; ++i) {
      const double side = std::exp(std::log(16.0) + uni(rng) * (std::log(512.0) - std::log(16.0)));
      const double asp = std::exp(-0.7 + 1.4 * uni(rng));
      const double w = side * std::sqrt(asp), h = side / std::sqrt(asp);
      const double cx = uni(rng) * cs.img_w, cy = uni(rng) * cs.img_h;
      const int b = int(uni(rng) * cs.n);
      const double r[5] = {double(b), std::max(cx - w / 2, 0.0), std::max(cy - h / 2, 0.0),
                           std::min(cx + w / 2, cs.img_w), std::min(cy + h / 2, cs.img_h)};
      for (int j = 0; j < 5; ++j) hr[size_t(i) * 5 + j] = float(r[j]);
    }
    const size_t nout = size_t(cs.k) * cs.c * cs.pooled * cs.pooled;
    float *dx, *dr, *d0, *d1;
    int* dst;
    CK(cudaMalloc(&dx, nx * 4));
    CK(cudaMalloc(&dr, hr.size() * 4));
    CK(cudaMalloc(&d0, nout * 4));
    CK(cudaMalloc(&d1, nout * 4));
    CK(cudaMalloc(&dst, 4));
    CK(cudaMemset(dst, 0, 4));
    CK(cudaMemcpy(dx, hx.data(), nx * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dr, hr.data(), hr.size() * 4, cudaMemcpyHostToDevice));
    cudaTextureObject_t tex[2] = {0, 0};
    for (int b = 0; b < cs.n; ++b) {
      cudaResourceDesc rd;
      memset(&rd, 0, sizeof rd);
      rd.resType = cudaResourceTypePitch2D;
      rd.res.pitch2D.devPtr = dx + b * plane_img;
      rd.res.pitch2D.desc = cudaCreateChannelDesc<float>();
      rd.res.pitch2D.width = cs.w;
      rd.res.pitch2D.height = size_t(cs.c) * cs.h;
      rd.res.pitch2D.pitchInBytes = size_t(cs.w) * 4;
      cudaTextureDesc td;
      memset(&td, 0, sizeof td);
      td.addressMode[0] = td.addressMode[1] = cudaAddressModeClamp;
      td.filterMode = cudaFilterModePoint;
      td.readMode = cudaReadModeElementType;
      td.normalizedCoords = 0;
      CK(cudaCreateTextureObject(&tex[b], &rd, &td, nullptr));
    }
    if (cs.n == 1) tex[1] = tex[0];
    stheno::RoIAlignParams p{};
    p.feat = reinterpret_cast<uint64_t>(dx);
    p.rois = reinterpret_cast<uint64_t>(dr);
    p.status = reinterpret_cast<uint64_t>(dst);
    p.spatial_scale = cs.scale;
    p.n = cs.n, p.c = cs.c, p.h = cs.h, p.w = cs.w, p.k = cs.k;
    p.pooled_h = p.pooled_w = cs.pooled;
    p.sampling_ratio = 2, p.aligned = 1, p.max_adaptive_grid = 64;
    // colsSlices' rule (ops/roialign_device.go).
    const int slots = std::max(1, 32 / (cs.pooled * 2));
    const size_t bytes = nx * 4;
    const int want = std::max<int>((bytes + (9 << 20) - 1) / (9 << 20), (3072 + cs.k - 1) / cs.k);
    const int def_slices = std::max(1, std::min(want, (cs.c + slots - 1) / slots));
    struct V {
      const char* name;
      int kind;  // 0 cols_s2, 1 cols_s2_cm, 2 tex_rm, 3 tex_cm
    } vs[] = {{"cols_s2", 0}, {"cols_s2_cm", 1}, {"tex_rm", 2}, {"tex_cm", 3}, {"pair_rm", 4}, {"pair_cm", 5}};
    std::vector<float> ref(nout), got(nout);
    // PROBE_SWEEP=1: only the global-load kernels, over many slice counts.
    const bool sweep = getenv("PROBE_SWEEP") != nullptr;
    std::vector<int> slice_list = {def_slices, 8, 32};
    if (sweep) slice_list = {2, 3, 4, 5, 6, 7, 8, 10, 12, 15, 16, 20, 24, 28, 32, 40, 48, 64};
    for (int slices : slice_list) {
      for (const V& v : vs) {
        if (sweep && v.kind > 1) continue;
        p.pooled = reinterpret_cast<uint64_t>(v.kind == 0 ? d0 : d1);
        dim3 grid(cs.k, slices), block(256);
        auto launch = [&] {
          switch (v.kind) {
            case 0: roialign_fwd_nchw_cols_s2_f32<<<grid, block>>>(p); break;
            case 1: roialign_fwd_nchw_cols_s2_cmajor_f32<<<grid, block>>>(p); break;
            case 2: tex_rm<<<grid, block>>>(p, tex[0], tex[1]); break;
            case 3: tex_cm<<<grid, block>>>(p, tex[0], tex[1]); break;
            case 4: pair_rm<<<grid, block>>>(p, tex[0], tex[1]); break;
            case 5: pair_cm<<<grid, block>>>(p, tex[0], tex[1]); break;
          }
        };
        CK(cudaMemset(reinterpret_cast<void*>(p.pooled), 0xff, nout * 4));
        launch();
        CK(cudaDeviceSynchronize());
        const float ms = median_ms(launch);
        size_t diff = 0;
        if (v.kind == 0) {
          CK(cudaMemcpy(ref.data(), d0, nout * 4, cudaMemcpyDeviceToHost));
        } else {
          CK(cudaMemcpy(got.data(), d1, nout * 4, cudaMemcpyDeviceToHost));
          for (size_t i = 0; i < nout; ++i) diff += memcmp(&ref[i], &got[i], 4) != 0;
        }
        printf("%-14s slices=%-3d %-11s %.4f ms  outputs differing from cols_s2: %zu of %zu\n", cs.name, slices,
               v.name, ms, diff, nout);
      }
    }
    int st = 0;
    CK(cudaMemcpy(&st, dst, 4, cudaMemcpyDeviceToHost));
    printf("%s status %d\n", cs.name, st);
    for (int b = 0; b < cs.n; ++b) CK(cudaDestroyTextureObject(tex[b]));
    CK(cudaFree(dx));
    CK(cudaFree(dr));
    CK(cudaFree(d0));
    CK(cudaFree(d1));
    CK(cudaFree(dst));
  }
  return 0;
}
