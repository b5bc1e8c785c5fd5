// Emulated runs (see emu.h) of the kernels of kernels/roialign.cu, float32
// and float64, the defaults and the variants (the emulator builds them all),
// launched as ops launches them:
// - every forward (roialign_fwd_nhwc_taps and _sep channels-last, and for
//   float32 with C % 4 == 0 _sep_vec4 with 16-byte loads; from NCHW,
//   roialign_fwd_nchw_bin_c4 and _c8 with 4 and 8 channels per thread, and
//   roialign_fwd_nchw_cols, lanes on sample columns, where the ratio allows
//   it) against a double reference of torchvision's roi_align, and against
//   the tap-by-tap kernel;
// - both backwards (roialign_bwd_nhwc_taps_atomic and _sep_atomic and, for
//   float32 with C % 4 == 0, roialign_sm90a.cu's vector-reduction ones,
//   _taps_red4 and _sep_red4) against the double reference's adjoint, and
//   the others against the tap-by-tap one;
// - roialign_sort_rois (a permutation sorted by image; the blocks that zero
//   the backward's gradient alongside) and the kernels that take the RoIs
//   in its order; transpose_planes (NCHW <-> NHWC) exactly;
// - the status word for a RoI with a bad batch index;
// - legacy mode's NaN boxes (a NaN width or height pools zeros);
// - the level filter of MultiLevelRoIAlign (level_case), and
//   MultiLevelRoIAlign's launches as ops makes them (pyramid_case).
// Tolerances (autograd/tolerance.go): TolParity32/64 between kernels and,
// for float32 against the double reference, TolParity32 (the kernels
// compute the sample positions in float32, as the CPU twin does);
// TolForward64 for float64 against it. Exits non-zero on a failure.
#include "emu.h"
#include "harness.h"
// clang-format off
#include "../roialign.cu"
#include "../roialign_sm90a.cu"
// clang-format on
#include <random>
#include <string>
#include <tuple>

using namespace harness;

static Rng rng(11);

// torchvision's roi_align in double from the T-valued inputs (x NCHW),
// forward (out [K,C,PH,PW]) and its adjoint (gx += d out/d x * gy).
template <class T>
void reference(const std::vector<T>& x, const std::vector<T>& rois, int n, int c, int h, int w, int k, int ph, int pw,
               double scale, int sampling, bool aligned, const std::vector<T>& gy, std::vector<double>& out,
               std::vector<double>& gx) {
  out.assign(size_t(k) * c * ph * pw, 0);
  gx.assign(x.size(), 0);
  for (int r = 0; r < k; ++r) {
    const T* roi = &rois[r * 5];
    const double b = roi[0];
    if (!(b > -1 && b < n)) continue;  // bad RoI: zero outputs
    const int img = int(b);
    const double off = aligned ? 0.5 : 0;
    const double sx = double(roi[1]) * scale - off, sy = double(roi[2]) * scale - off;
    double rw = double(roi[3]) * scale - off - sx, rh = double(roi[4]) * scale - off - sy;
    if (!aligned) rw = std::max(rw, 1.0), rh = std::max(rh, 1.0);
    const double bh = rh / ph, bw = rw / pw;
    auto grid = [&](double bin) {
      const double cl = std::ceil(bin);
      return sampling > 0 ? sampling : (!(cl > 0) || std::isinf(cl)) ? 0 : int(cl);
    };
    const int gh = grid(bh), gw = grid(bw);
    const double count = std::max(gh * gw, 1);
    for (int a = 0; a < ph; ++a)
      for (int bb = 0; bb < pw; ++bb)
        for (int iy = 0; iy < gh; ++iy)
          for (int ix = 0; ix < gw; ++ix) {
            double y = sy + a * bh + (iy + 0.5) * bh / gh, xx = sx + bb * bw + (ix + 0.5) * bw / gw;
            if (!(y >= -1 && y <= h && xx >= -1 && xx <= w)) continue;
            y = std::min(std::max(y, 0.0), double(h - 1));
            xx = std::min(std::max(xx, 0.0), double(w - 1));
            const int y0 = int(std::floor(y)), x0 = int(std::floor(xx));
            const double ly = y - y0, lx = xx - x0;
            const double wt[4] = {(1 - ly) * (1 - lx), (1 - ly) * lx, ly * (1 - lx), ly * lx};
            for (int i = 0; i < 4; ++i) {
              const int yy = y0 + (i >> 1), xi = x0 + (i & 1);
              if (yy >= h || xi >= w) continue;
              for (int ch = 0; ch < c; ++ch) {
                const size_t xi_ = ((size_t(img) * c + ch) * h + yy) * w + xi;
                const size_t oi = ((size_t(r) * c + ch) * ph + a) * pw + bb;
                out[oi] += wt[i] * double(x[xi_]) / count;
                gx[xi_] += wt[i] * double(gy[oi]) / count;
              }
            }
          }
  }
}

template <class T>
void transpose(const std::vector<T>& in, std::vector<T>& out, int n, int a, int b) {
  stheno::TransposeParams tp{reinterpret_cast<uint64_t>(in.data()), reinterpret_cast<uint64_t>(out.data()), a, b};
  const int tb = sizeof(T) == 4 ? stheno::kTransposeTileColsF32 : stheno::kTransposeTileColsF64;
  const int rows = stheno::kTransposeTileRows;
  emu::launch(sizeof(T) == 4 ? (void (*)(stheno::TransposeParams))transpose_planes_f32 : transpose_planes_f64,
              dim3((b + tb - 1) / tb, (a + rows - 1) / rows, n), dim3(rows, stheno::kTransposeBlockY), 0, tp);
}

template <class T>
void run_case(const char* name, int n, int c, int h, int w, int k, int ph, int pw, double scale, int sampling,
              bool aligned, double img, bool bad_roi = false, double min_side = 0.5, double gscale = 1,
              bool f32_vs_ref = true) {
  const bool f = sizeof(T) == 4;
  printf("%s %s\n", name, f ? "f32" : "f64");
  const Tol parity = f ? TolParity32 : TolParity64, vs_ref = f ? TolParity32 : TolForward64;
  // Against the double reference; float32 kernels only where their float32
  // sample positions are within TolParity32 of it (not at coordinates of
  // hundreds of pixels: there they are checked against each other).
  auto check_ref = [&](const char* what, const auto& want, const auto& got) {
    if (f && !f32_vs_ref) {
      printf("  %-40s skipped: float32 positions at this scale\n", what);
      return;
    }
    check(what, want, got, vs_ref);
  };
  std::vector<T> x(size_t(n) * c * h * w), rois(k * 5);
  for (auto& v : x) v = rng.U(-1, 1);
  for (int i = 0; i < k; ++i) {
    double x1 = rng.U(-0.1 * img, img), y1 = rng.U(-0.1 * img, img);
    double s = exp(rng.U(log(min_side), log(img))), a = exp(rng.U(-0.7, 0.7));
    rois[i * 5] = T(i % n), rois[i * 5 + 1] = x1, rois[i * 5 + 2] = y1;
    rois[i * 5 + 3] = x1 + s * a, rois[i * 5 + 4] = y1 + s / a;
    if (i % 5 == 4) std::swap(rois[i * 5 + 1], rois[i * 5 + 3]);  // a negative width (aligned keeps it)
  }
  if (bad_roi) rois[5 * (k / 2)] = T(n);  // batch index out of range
  if (!aligned) {
    // A NaN height and a NaN width: legacy mode keeps them NaN (the RoIs
    // pool zeros), not 1x1.
    rois[5 * 1 + 4] = T(NAN);
    rois[5 * 3 + 3] = T(NAN);
  }
  // NHWC by the kernel, checked against a host transpose; and back.
  std::vector<T> xt(x.size(), T(NAN)), xt_host(x.size()), back(x.size(), T(NAN));
  transpose(x, xt, n, c, h * w);
  for (int i = 0; i < n; ++i)
    for (int ch = 0; ch < c; ++ch)
      for (int q = 0; q < h * w; ++q) xt_host[(size_t(i) * h * w + q) * c + ch] = x[(size_t(i) * c + ch) * h * w + q];
  transpose(xt, back, n, h * w, c);
  expect_line("transpose to NHWC and back, exact", xt == xt_host && back == x);

  const size_t outn = size_t(k) * c * ph * pw;
  std::vector<T> gy(outn);
  for (auto& v : gy) v = rng.U(-gscale, gscale);
  std::vector<double> ref, gref;
  reference(x, rois, n, c, h, w, k, ph, pw, scale, sampling, aligned, gy, ref, gref);
  std::vector<double> gref_t(gref.size());  // NHWC, as the channels-last backward leaves it
  for (int i = 0; i < n; ++i)
    for (int ch = 0; ch < c; ++ch)
      for (int q = 0; q < h * w; ++q) gref_t[(size_t(i) * h * w + q) * c + ch] = gref[(size_t(i) * c + ch) * h * w + q];

  int status = 0;
  stheno::RoIAlignParams p{};
  p.rois = (uint64_t)rois.data(), p.status = (uint64_t)&status, p.spatial_scale = scale;
  p.n = n, p.c = c, p.h = h, p.w = w, p.k = k, p.pooled_h = ph, p.pooled_w = pw, p.sampling_ratio = sampling;
  p.aligned = aligned, p.max_adaptive_grid = 1024;
  const int bins = ph * pw, tile = stheno::tile_bins<T>();
  const dim3 cl_grid(k, (bins + tile - 1) / tile), cl_block(stheno::kThreads);
  using K = void (*)(stheno::RoIAlignParams);
  const K fwd = f ? (K)roialign_fwd_nhwc_taps_f32 : (K)roialign_fwd_nhwc_taps_f64;
  const K fwd_sep = f ? (K)roialign_fwd_nhwc_sep_f32 : (K)roialign_fwd_nhwc_sep_f64;
  const K bwd = f ? (K)roialign_bwd_nhwc_taps_atomic_f32 : (K)roialign_bwd_nhwc_taps_atomic_f64;
  const K bwd_sep = f ? (K)roialign_bwd_nhwc_sep_atomic_f32 : (K)roialign_bwd_nhwc_sep_atomic_f64;
  // The default (float32: registers capped, the same code) and 8 channels a thread.
  const K nchw4 = f ? (K)roialign_fwd_nchw_bin_c4_occ4_f32 : (K)roialign_fwd_nchw_bin_c4_f64;
  const K nchw8 = f ? (K)roialign_fwd_nchw_bin_c8_f32 : (K)roialign_fwd_nchw_bin_c8_f64;
  auto forward_nchw = [&](K kern, int cpt, std::vector<T>& out) {
    const int phases = std::max(1, stheno::kThreads / bins),
              threads = std::min((bins * phases + 31) / 32 * 32, stheno::kThreads);
    p.feat = (uint64_t)x.data(), p.pooled = (uint64_t)out.data();
    emu::launch(kern, dim3(k, (c + phases * cpt - 1) / (phases * cpt)), dim3(threads), 0, p);
  };

  std::vector<T> taps(outn, T(NAN)), sep(outn, T(NAN)), n4(outn, T(NAN)), n8(outn, T(NAN));
  p.feat = (uint64_t)xt.data();
  p.pooled = (uint64_t)taps.data();
  emu::launch(fwd, cl_grid, cl_block, 0, p);
  p.pooled = (uint64_t)sep.data();
  emu::launch(fwd_sep, cl_grid, cl_block, 0, p);
  forward_nchw(nchw4, 4, n4);
  forward_nchw(nchw8, 8, n8);
  check_ref("forward taps vs reference", ref, taps);
  check_ref("forward sep vs reference", ref, sep);
  check_ref("forward bin c4 vs reference", ref, n4);
  check_ref("forward bin c8 vs reference", ref, n8);
  check("forward sep vs taps", taps, sep, parity);
  check("forward bin c4 vs taps", taps, n4, parity);
  check("forward bin c8 vs taps", taps, n8, parity);
  if constexpr (sizeof(T) == 4) {
    std::vector<T> n4u(outn, T(NAN));
    forward_nchw(roialign_fwd_nchw_bin_c4_f32, 4, n4u);
    expect_line("forward bin c4 (registers uncapped) == c4 occ4", n4u == n4);
  }
  if (sampling > 0 && sampling <= stheno::kColsMaxS && pw * sampling <= 32) {
    // roialign_fwd_nchw_cols: lanes on sample columns; the channels in 1, 2,
    // 3 or 8 slices (grid y), blocks of 8 or 2 warps (runs of items that
    // cross bin rows, or not).
    // The kernels for this ratio, row- and channel-major.
    const K by_ratio[2][4] = {{roialign_fwd_nchw_cols_s1_f32, roialign_fwd_nchw_cols_s2_f32, roialign_fwd_nchw_cols_s3_f32,
                               roialign_fwd_nchw_cols_s4_f32},
                              {(K)roialign_fwd_nchw_cols_s1_f64, (K)roialign_fwd_nchw_cols_s2_f64,
                               (K)roialign_fwd_nchw_cols_s3_f64, (K)roialign_fwd_nchw_cols_s4_f64}};
    const K by_ratio_cm[2][4] = {
        {roialign_fwd_nchw_cols_s1_cmajor_f32, roialign_fwd_nchw_cols_s2_cmajor_f32, roialign_fwd_nchw_cols_s3_cmajor_f32,
         roialign_fwd_nchw_cols_s4_cmajor_f32},
        {(K)roialign_fwd_nchw_cols_s1_cmajor_f64, (K)roialign_fwd_nchw_cols_s2_cmajor_f64, (K)roialign_fwd_nchw_cols_s3_cmajor_f64,
         (K)roialign_fwd_nchw_cols_s4_cmajor_f64}};
    std::vector<std::pair<std::string, K>> kerns = {{"cols", by_ratio[f ? 0 : 1][sampling - 1]},
                                                    {"cols cmajor", by_ratio_cm[f ? 0 : 1][sampling - 1]}};
    // A kernel launched for another ratio writes nothing (ops never does).
    {
      std::vector<T> q(outn, T(NAN));
      p.feat = (uint64_t)x.data(), p.pooled = (uint64_t)q.data();
      emu::launch(by_ratio[f ? 0 : 1][sampling % 4], dim3(k, 1), dim3(64), 0, p);
      expect_line("forward cols for another ratio writes nothing",
             std::all_of(q.begin(), q.end(), [](T v) { return std::isnan(v); }));
    }
    for (const auto& [name, kern] : kerns) {
      // Slices and threads: runs of items that cross bin rows or not.
      for (auto [gy, threads] : {std::pair{1u, 256u}, {2u, 256u}, {3u, 64u}, {8u, 256u}, {1u, 64u}, {1u, 32u}}) {
        std::vector<T> q(outn, T(NAN));
        p.feat = (uint64_t)x.data(), p.pooled = (uint64_t)q.data();
        emu::launch(kern, dim3(k, gy), dim3(threads), 0, p);
        const std::string what =
            "forward " + name + ", " + std::to_string(gy) + " slices, " + std::to_string(threads) + " threads";
        check_ref((what + " vs reference").c_str(), ref, q);
        check((what + " vs taps").c_str(), taps, q, parity);
      }
    }
  }
  if constexpr (sizeof(T) == 4) {
    if (c % 4 == 0) {
      // roialign_fwd_nhwc_sep_vec4: float4 loads, a bin's rows shared by
      // the warp's 4 lane groups; the bins in as many chunks as tiles, in 3 chunks, one bin a block, and (with
      // channel slices: warps splitting a chunk's bins) the whole RoI; the
      // channels in 1, 2, 3 or 8 slices.
      const std::pair<std::string, K> quads[] = {{"forward sep vec4", roialign_fwd_nhwc_sep_vec4_f32},
                                                 {"forward sep vec4 occ4", roialign_fwd_nhwc_sep_vec4_occ4_f32}};
      for (const auto& [name, kern] : quads) {
        for (auto [gy, gz] : {std::pair{cl_grid.y, 1u}, {3u, 1u}, {unsigned(bins), 1u}, {3u, 2u}, {cl_grid.y, 3u}, {1u, 2u}, {1u, 8u}}) {
          std::vector<T> q(outn, T(NAN));
          p.feat = (uint64_t)xt.data();
          p.pooled = (uint64_t)q.data();
          emu::launch(kern, dim3(k, gy, gz), cl_block, 0, p);
          const std::string what = name + ", " + std::to_string(gy) + " chunks, " + std::to_string(gz) + " slices";
          check_ref((what + " vs reference").c_str(), ref, q);
          check((what + " vs sep").c_str(), sep, q, parity);
        }
      }
    }
  }

  std::vector<T> g1(x.size(), T(0)), g2(x.size(), T(0));
  p.pooled = (uint64_t)gy.data();
  p.feat = (uint64_t)g1.data();
  emu::launch(bwd, cl_grid, cl_block, 0, p);
  p.feat = (uint64_t)g2.data();
  emu::launch(bwd_sep, cl_grid, cl_block, 0, p);
  check_ref("backward taps vs reference", gref_t, g1);
  check_ref("backward sep vs reference", gref_t, g2);
  check("backward sep vs taps", g1, g2, parity);
  // Channel slices (grid z): 2 and 3 (the last one empty when C <= 64).
  for (unsigned z : {2u, 3u}) {
    std::vector<T> gz(x.size(), T(0)), gzs(x.size(), T(0));
    p.feat = (uint64_t)gz.data();
    emu::launch(bwd, dim3(cl_grid.x, cl_grid.y, z), cl_block, 0, p);
    p.feat = (uint64_t)gzs.data();
    emu::launch(bwd_sep, dim3(cl_grid.x, cl_grid.y, z), cl_block, 0, p);
    check(z == 2 ? "backward taps, 2 slices vs taps" : "backward taps, 3 slices vs taps", g1, gz, parity);
    check(z == 2 ? "backward sep, 2 slices vs sep" : "backward sep, 3 slices vs sep", g2, gzs, parity);
  }
  if constexpr (sizeof(T) == 4) {
    if (c % 4 == 0) {
      std::vector<T> gq(x.size(), T(0));
      p.feat = (uint64_t)gq.data();
      emu::launch(roialign_bwd_nhwc_taps_red4_f32, cl_grid, cl_block, 0, p);
      check_ref("backward taps red4 vs reference", gref_t, gq);
      check("backward taps red4 vs taps", g1, gq, parity);
      std::vector<T> gq2(x.size(), T(0));
      p.feat = (uint64_t)gq2.data();
      emu::launch(roialign_bwd_nhwc_taps_red4_f32, dim3(cl_grid.x, cl_grid.y, 2), cl_block, 0, p);
      check("backward taps red4, 2 slices vs red4", gq, gq2, parity);
      std::vector<T> gsq(x.size(), T(0));
      p.feat = (uint64_t)gsq.data();
      emu::launch(roialign_bwd_nhwc_sep_red4_f32, cl_grid, cl_block, 0, p);
      check_ref("backward sep red4 vs reference", gref_t, gsq);
      check("backward sep red4 vs sep", g2, gsq, parity);
    }
  }

  // Spatial order: the same results with the blocks permuted.
  std::vector<int> order(k, -1);
  stheno::RoIOrderParams op{(uint64_t)rois.data(), (uint64_t)order.data(), scale, k, 0};
  emu::launch(f ? (void (*)(stheno::RoIOrderParams))roialign_sort_rois_f32 : roialign_sort_rois_f64, dim3(1), dim3(stheno::kOrderThreads), 0, op);
  std::vector<int> seen(k, 0);
  bool perm = true;
  for (int i = 0; i < k; ++i)
    if (order[i] < 0 || order[i] >= k || seen[order[i]]++) perm = false;
  expect_line("sort_rois is a permutation", perm);
  bool by_image = perm;
  for (int i = 0; perm && i + 1 < k; ++i) {
    auto img_of = [&](int r) { return std::min(255.0, std::max(0.0, double(rois[r * 5]))); };
    if (int(img_of(order[i])) > int(img_of(order[i + 1]))) by_image = false;
  }
  expect_line("sort_rois sorts by image", by_image);
  // The same launch with 3 more blocks that zero 247 of 250 int4s.
  {
    std::vector<int> order2(k, -1);
    std::vector<int4> z(250, make_int4(-1, -1, -1, -1));
    stheno::RoIOrderParams oz{(uint64_t)rois.data(), (uint64_t)order2.data(), scale, k, 0, (uint64_t)z.data(), 247 * 16};
    emu::launch(f ? (void (*)(stheno::RoIOrderParams))roialign_sort_rois_f32 : roialign_sort_rois_f64, dim3(4), dim3(stheno::kOrderThreads), 0, oz);
    bool zeroed = true;
    for (int i = 0; i < 250; ++i) zeroed = zeroed && (z[i].x == 0) == (i < 247) && (z[i].w == 0) == (i < 247);
    expect_line("sort_rois zeroing: same order, exactly its range zeroed", order2 == order && zeroed);
  }
  if (perm) {
    p.order = (uint64_t)order.data();
    std::vector<T> o1(outn, T(NAN)), o2(outn, T(NAN)), g3(x.size(), T(0)), g4(x.size(), T(0));
    p.feat = (uint64_t)xt.data();
    p.pooled = (uint64_t)o1.data();
    emu::launch(fwd, cl_grid, cl_block, 0, p);
    p.pooled = (uint64_t)o2.data();
    emu::launch(fwd_sep, cl_grid, cl_block, 0, p);
    p.pooled = (uint64_t)gy.data();
    p.feat = (uint64_t)g3.data();
    emu::launch(bwd, cl_grid, cl_block, 0, p);
    p.feat = (uint64_t)g4.data();
    emu::launch(bwd_sep, cl_grid, cl_block, 0, p);
    expect_line("ordered forward taps, sep == unordered", o1 == taps && o2 == sep);
    check("ordered backward taps vs taps", g1, g3, parity);
    check("ordered backward sep vs taps", g1, g4, parity);
    p.order = 0;
  }
  expect_line(bad_roi ? "status: bad batch index" : "status: ok", status == (bad_roi ? stheno::kStatusBadBatchIndex : 0));
}

// The level filter (MultiLevelRoIAlign): every kernel launched with
// level_filter on all the RoIs, for the finest, a middle and the coarsest
// of three levels of sizes, against the reference of the level's RoIs
// alone. Forward: the level's rows as the reference's, the others' left
// as they were (NaN); backward: the reference's adjoint of the level's
// rows of gy only. The three levels' launches together write every row
// once, and their gradients add up to the unfiltered one. RoIs include an
// empty, an inverted, a NaN and an infinite box (the finest, finest,
// finest and coarsest levels) and a bad batch index, which raises the
// status word in its level's launch only.
template <class T>
void level_case(const char* name, int n, int c, int h, int w, int k, int ph, int pw, double scale, int sampling,
                double img) {
  const bool f = sizeof(T) == 4;
  printf("%s %s\n", name, f ? "f32" : "f64");
  const Tol parity = f ? TolParity32 : TolParity64, vs_ref = f ? TolParity32 : TolForward64;
  std::vector<T> x(size_t(n) * c * h * w), rois(k * 5);
  for (auto& v : x) v = rng.U(-1, 1);
  for (int i = 0; i < k; ++i) {
    const double x1 = rng.U(-0.1 * img, img), y1 = rng.U(-0.1 * img, img);
    const double side = exp(rng.U(log(1.0), log(img))), a = exp(rng.U(-0.7, 0.7));
    rois[i * 5] = T(i % n), rois[i * 5 + 1] = x1, rois[i * 5 + 2] = y1;
    rois[i * 5 + 3] = x1 + side * a, rois[i * 5 + 4] = y1 + side / a;
  }
  rois[1 * 5 + 3] = rois[1 * 5 + 1];                                                      // empty
  std::swap(rois[2 * 5 + 2], rois[2 * 5 + 4]);                                            // inverted
  rois[3 * 5 + 3] = T(NAN);                                                               // NaN
  rois[4 * 5 + 1] = 0, rois[4 * 5 + 3] = std::numeric_limits<T>::infinity();              // infinite
  const int bad = k - 2;
  rois[bad * 5] = T(n);  // batch index out of range
  // The sizes, as roi_level_size: sqrt(w*h), -inf for a box without area,
  // at most the largest double; the levels' bounds at the 40th and 75th
  // percentile of the finite ones.
  std::vector<double> size(k), finite;
  for (int i = 0; i < k; ++i) {
    const double bw = double(rois[i * 5 + 3]) - double(rois[i * 5 + 1]);
    const double bh = double(rois[i * 5 + 4]) - double(rois[i * 5 + 2]);
    size[i] = !(bw > 0 && bh > 0) ? -INFINITY : std::min(std::sqrt(bw * bh), std::numeric_limits<double>::max());
    if (std::isfinite(size[i])) finite.push_back(size[i]);
  }
  std::sort(finite.begin(), finite.end());
  const double b1 = finite[finite.size() * 2 / 5], b2 = finite[finite.size() * 3 / 4];
  const double bounds[3][2] = {{-INFINITY, b1}, {b1, b2}, {b2, INFINITY}};

  std::vector<T> xt(x.size());
  transpose(x, xt, n, c, h * w);
  const size_t outn = size_t(k) * c * ph * pw, per = size_t(c) * ph * pw;
  std::vector<T> gy(outn);
  for (auto& v : gy) v = rng.U(-1, 1);
  auto nhwc = [&](const std::vector<double>& g) {
    std::vector<double> t(g.size());
    for (int i = 0; i < n; ++i)
      for (int ch = 0; ch < c; ++ch)
        for (int q = 0; q < h * w; ++q) t[(size_t(i) * h * w + q) * c + ch] = g[(size_t(i) * c + ch) * h * w + q];
    return t;
  };
  std::vector<double> ref_all, gref_all;
  reference(x, rois, n, c, h, w, k, ph, pw, scale, sampling, true, gy, ref_all, gref_all);

  using K = void (*)(stheno::RoIAlignParams);
  const int bins = ph * pw, tile = stheno::tile_bins<T>();
  const dim3 cl_grid(k, (bins + tile - 1) / tile), cl_block(stheno::kThreads);
  struct Launch {
    std::string name;
    K kern;
    bool nchw;  // reads NCHW x; else channels-last
    dim3 grid, block;
  };
  const int phases = std::max(1, stheno::kThreads / bins),
            nthreads = std::min((bins * phases + 31) / 32 * 32, stheno::kThreads);
  std::vector<Launch> fwds = {
      {"taps", f ? (K)roialign_fwd_nhwc_taps_f32 : (K)roialign_fwd_nhwc_taps_f64, false, cl_grid, cl_block},
      {"sep", f ? (K)roialign_fwd_nhwc_sep_f32 : (K)roialign_fwd_nhwc_sep_f64, false, cl_grid, cl_block},
      {"bin c4", f ? (K)roialign_fwd_nchw_bin_c4_occ4_f32 : (K)roialign_fwd_nchw_bin_c4_f64, true,
       dim3(k, (c + phases * 4 - 1) / (phases * 4)), dim3(nthreads)},
  };
  if (sampling > 0 && sampling <= stheno::kColsMaxS && pw * sampling <= 32) {
    const K cols[2][4] = {{roialign_fwd_nchw_cols_s1_f32, roialign_fwd_nchw_cols_s2_f32, roialign_fwd_nchw_cols_s3_f32,
                           roialign_fwd_nchw_cols_s4_f32},
                          {(K)roialign_fwd_nchw_cols_s1_f64, (K)roialign_fwd_nchw_cols_s2_f64,
                           (K)roialign_fwd_nchw_cols_s3_f64, (K)roialign_fwd_nchw_cols_s4_f64}};
    const K cols_cm[2][4] = {{roialign_fwd_nchw_cols_s1_cmajor_f32, roialign_fwd_nchw_cols_s2_cmajor_f32,
                              roialign_fwd_nchw_cols_s3_cmajor_f32, roialign_fwd_nchw_cols_s4_cmajor_f32},
                             {(K)roialign_fwd_nchw_cols_s1_cmajor_f64, (K)roialign_fwd_nchw_cols_s2_cmajor_f64,
                              (K)roialign_fwd_nchw_cols_s3_cmajor_f64, (K)roialign_fwd_nchw_cols_s4_cmajor_f64}};
    fwds.push_back({"cols", cols[f ? 0 : 1][sampling - 1], true, dim3(k, 2), dim3(256)});
    fwds.push_back({"cols cmajor", cols_cm[f ? 0 : 1][sampling - 1], true, dim3(k, 2), dim3(256)});
  }
  std::vector<Launch> bwds = {
      {"taps atomic", f ? (K)roialign_bwd_nhwc_taps_atomic_f32 : (K)roialign_bwd_nhwc_taps_atomic_f64, false, cl_grid,
       cl_block},
      {"sep atomic", f ? (K)roialign_bwd_nhwc_sep_atomic_f32 : (K)roialign_bwd_nhwc_sep_atomic_f64, false, cl_grid,
       cl_block},
  };
  if constexpr (sizeof(T) == 4) {
    if (c % 4 == 0) {
      fwds.push_back({"sep vec4 occ4", roialign_fwd_nhwc_sep_vec4_occ4_f32, false, dim3(k, 3, 2), cl_block});
      bwds.push_back({"taps red4", roialign_bwd_nhwc_taps_red4_f32, false, cl_grid, cl_block});
      bwds.push_back({"sep red4", roialign_bwd_nhwc_sep_red4_f32, false, cl_grid, cl_block});
    }
  }
  // The spatial order, for the channels-last kernels once more.
  std::vector<int> order(k, -1);
  stheno::RoIOrderParams op{(uint64_t)rois.data(), (uint64_t)order.data(), scale, k, 0};
  emu::launch(f ? (void (*)(stheno::RoIOrderParams))roialign_sort_rois_f32 : roialign_sort_rois_f64, dim3(1),
              dim3(stheno::kOrderThreads), 0, op);

  int status = 0;
  stheno::RoIAlignParams p{};
  p.rois = (uint64_t)rois.data(), p.status = (uint64_t)&status, p.spatial_scale = scale;
  p.n = n, p.c = c, p.h = h, p.w = w, p.k = k, p.pooled_h = ph, p.pooled_w = pw, p.sampling_ratio = sampling;
  p.aligned = 1, p.max_adaptive_grid = 1024, p.level_filter = 1;
  for (const Launch& l : fwds) {
    for (bool ordered : {false, true}) {
      if (ordered && l.nchw) continue;
      p.order = ordered ? (uint64_t)order.data() : 0;
      std::vector<T> all(outn, T(NAN));
      for (int lv = 0; lv < 3; ++lv) {
        p.level_lo = bounds[lv][0], p.level_hi = bounds[lv][1];
        std::vector<T> out(outn, T(NAN));
        std::vector<double> want(outn, NAN);
        bool has_bad = false;
        for (int i = 0; i < k; ++i) {
          if (!(size[i] >= bounds[lv][0] && size[i] < bounds[lv][1])) continue;
          std::copy(ref_all.begin() + i * per, ref_all.begin() + (i + 1) * per, want.begin() + i * per);
          has_bad = has_bad || i == bad;
        }
        status = 0;
        p.feat = l.nchw ? (uint64_t)x.data() : (uint64_t)xt.data();
        p.pooled = (uint64_t)out.data();
        emu::launch(l.kern, l.grid, l.block, 0, p);
        const std::string what = "level " + std::to_string(lv) + " forward " + l.name + (ordered ? " ordered" : "");
        check(what + " vs reference", want, out, vs_ref);
        expect_line(what + " status", status == (has_bad ? stheno::kStatusBadBatchIndex : 0));
        p.pooled = (uint64_t)all.data();
        emu::launch(l.kern, l.grid, l.block, 0, p);
      }
      check(std::string("all levels forward ") + l.name + (ordered ? " ordered" : "") + " vs reference", ref_all, all,
            vs_ref);
    }
  }
  p.order = 0;
  const std::vector<double> gref_t = nhwc(gref_all);
  for (const Launch& l : bwds) {
    std::vector<double> sum(x.size(), 0);
    for (int lv = 0; lv < 3; ++lv) {
      p.level_lo = bounds[lv][0], p.level_hi = bounds[lv][1];
      std::vector<T> gmask(gy);
      for (int i = 0; i < k; ++i)
        if (!(size[i] >= bounds[lv][0] && size[i] < bounds[lv][1]))
          std::fill(gmask.begin() + i * per, gmask.begin() + (i + 1) * per, T(0));
      std::vector<double> unused, gref_lv;
      reference(x, rois, n, c, h, w, k, ph, pw, scale, sampling, true, gmask, unused, gref_lv);
      std::vector<T> g(x.size(), T(0));
      p.feat = (uint64_t)g.data();
      p.pooled = (uint64_t)gy.data();
      emu::launch(l.kern, l.grid, l.block, 0, p);
      check("level " + std::to_string(lv) + " backward " + l.name + " vs reference", nhwc(gref_lv), g, vs_ref);
      for (size_t i = 0; i < g.size(); ++i) sum[i] += g[i];
    }
    check(std::string("all levels backward ") + l.name + " vs unfiltered reference", gref_t, sum, parity);
  }
}

// MultiLevelRoIAlign as ops launches it (ops/multiroialign.go and
// ops/roialign_device.go): a pyramid of maps of an image of side image at
// the given strides; each level's forward over all the RoIs, with its
// level's bounds (MultiLevelRoIAlignConfig.level), into the one output,
// which nothing writes beforehand (NaN here), and each level's backward
// into a zeroed channels-last gradient, then transposed back; the kernels,
// grids and slices roiAlignKernelFor and launchRoIAlign pick for the
// shapes (quad: a GPU that runs roialign_sm90a.cu), the RoIs in spatial
// order where ops sorts them. Against the reference of each RoI pooled
// from its own level and each level's adjoint of its own RoIs' rows, as
// the CPU twins (multiRoIForward, multiRoILevelBackward). The RoIs as
// TestGPUMultiLevelRoIAlignParity draws them: sides from 2 pixels to twice
// the image, none of level empty (halved until they are of another), and
// an empty, an inverted and a NaN box (x2 = x1, y1 and y2 swapped, y2 NaN:
// the finest level), and an infinite one unless the coarsest level is the
// empty one.
template <class T>
void pyramid_case(const char* name, int n, int c, int image, const std::vector<int>& strides, int k, int ph, int pw,
                  int sampling, bool aligned, double canonical, int k0, int empty) {
  const bool f = sizeof(T) == 4;
  printf("%s %s\n", name, f ? "f32" : "f64");
  const Tol vs_ref = f ? TolParity32 : TolForward64;
  const int levels = int(strides.size()), bins = ph * pw, tile = stheno::tile_bins<T>();
  const bool quad = true;
  // MultiLevelRoIAlignConfig.levelStart and Level; kernels.RoILevelSize.
  auto start = [&](int l) { return canonical * std::exp2(double(l - k0) - 1e-6); };
  auto size_of = [](double x1, double y1, double x2, double y2) {
    const double bw = x2 - x1, bh = y2 - y1;
    return !(bw > 0 && bh > 0) ? -INFINITY : std::min(std::sqrt(bw * bh), std::numeric_limits<double>::max());
  };
  auto level_of = [&](double s) {
    int l = 0;
    while (l + 1 < levels && s >= start(l + 1)) ++l;
    return l;
  };
  std::vector<T> rois(size_t(k) * 5);
  for (int i = 0; i < k; ++i) {
    const double side = std::exp(std::log(2.0) + rng.U(0, 1) * std::log(double(image)));
    const double a = std::exp(rng.U(0, 1) - 0.5);
    const double x = rng.U(-0.1, 1) * image, y = rng.U(-0.1, 1) * image;
    double w = side * a, h = side / a;
    while (empty >= 0 && level_of(size_of(x, y, x + w, y + h)) == empty) w /= 2, h /= 2;
    rois[i * 5] = T(int(rng.U(0, n))), rois[i * 5 + 1] = T(x), rois[i * 5 + 2] = T(y);
    rois[i * 5 + 3] = T(x + w), rois[i * 5 + 4] = T(y + h);
  }
  rois[1 * 5 + 3] = rois[1 * 5 + 1];            // empty
  std::swap(rois[2 * 5 + 2], rois[2 * 5 + 4]);  // inverted
  rois[3 * 5 + 4] = T(NAN);                     // NaN
  if (empty != levels - 1) rois[4 * 5 + 3] = std::numeric_limits<T>::infinity();
  std::vector<int> level(k);
  for (int i = 0; i < k; ++i)
    level[i] = level_of(size_of(rois[i * 5 + 1], rois[i * 5 + 2], rois[i * 5 + 3], rois[i * 5 + 4]));

  using K = void (*)(stheno::RoIAlignParams);
  const size_t per = size_t(c) * bins, outn = size_t(k) * per;
  std::vector<T> gy(outn);
  for (auto& v : gy) v = rng.U(-1, 1);
  std::vector<T> out(outn, T(NAN));
  std::vector<double> want(outn, NAN);
  int status = 0;
  for (int lv = 0; lv < levels; ++lv) {
    const int h = image / strides[lv], w = image / strides[lv];
    const double scale = 1.0 / strides[lv];
    std::vector<T> x(size_t(n) * c * h * w), xt(x.size());
    for (auto& v : x) v = rng.U(-1, 1);
    transpose(x, xt, n, c, h * w);
    std::vector<T> gmask(gy);
    for (int i = 0; i < k; ++i)
      if (level[i] != lv) std::fill(gmask.begin() + i * per, gmask.begin() + (i + 1) * per, T(0));
    std::vector<double> ref, gref;
    reference(x, rois, n, c, h, w, k, ph, pw, scale, sampling, aligned, gmask, ref, gref);
    for (int i = 0; i < k; ++i)
      if (level[i] == lv) std::copy(ref.begin() + i * per, ref.begin() + (i + 1) * per, want.begin() + i * per);

    stheno::RoIAlignParams p{};
    p.rois = addr(rois.data()), p.status = addr(&status), p.spatial_scale = scale;
    p.n = n, p.c = c, p.h = h, p.w = w, p.k = k, p.pooled_h = ph, p.pooled_w = pw, p.sampling_ratio = sampling;
    p.aligned = aligned, p.max_adaptive_grid = 1024, p.level_filter = 1;
    p.level_lo = lv > 0 ? start(lv) : -INFINITY, p.level_hi = lv + 1 < levels ? start(lv + 1) : INFINITY;
    // roiAlignKernelFor and launchRoIAlign's grids.
    const bool adaptive = sampling <= 0;
    const size_t bytes = size_t(n) * c * h * w * sizeof(T);
    K fwd;
    bool nchw = true;
    dim3 grid(k, (bins + tile - 1) / tile), block(stheno::kThreads);
    std::string fname;
    if (adaptive && f && c % 4 == 0) {
      const int groups = (c + 31) / 32;
      const size_t per_group = size_t(n) * h * w * 32 * sizeof(T);
      const int per_slice = std::max<int>(1, std::min<size_t>(groups, (24 << 20) / std::max<size_t>(per_group, 1)));
      const int chunk = std::min(bins, tile * std::max(1, stheno::kWarps / per_slice));
      fwd = (K)roialign_fwd_nhwc_sep_vec4_occ4_f32, nchw = false, fname = "sep vec4 occ4";
      grid = dim3(k, (bins + chunk - 1) / chunk, (groups + per_slice - 1) / per_slice);
    } else if (adaptive) {
      fwd = f ? (K)roialign_fwd_nhwc_sep_f32 : (K)roialign_fwd_nhwc_sep_f64, nchw = false, fname = "sep";
    } else if (f && sampling <= stheno::kColsMaxS && pw * sampling <= 32 && ph * sampling <= stheno::kColsMaxRows &&
               h >= 2 && w >= 2) {
      const K cols[4] = {roialign_fwd_nchw_cols_s1_f32, roialign_fwd_nchw_cols_s2_f32, roialign_fwd_nchw_cols_s3_f32,
                         roialign_fwd_nchw_cols_s4_f32};
      const K cols_cm[4] = {roialign_fwd_nchw_cols_s1_cmajor_f32, roialign_fwd_nchw_cols_s2_cmajor_f32,
                            roialign_fwd_nchw_cols_s3_cmajor_f32, roialign_fwd_nchw_cols_s4_cmajor_f32};
      const bool cm = bytes > (size_t(64) << 20);
      // colsSlices.
      const int slots = std::max(1, 32 / (pw * sampling)), groups = (c + slots - 1) / slots;
      int want_slices = (3072 + k - 1) / k;
      want_slices = cm ? std::max(want_slices, (groups * ph + 111) / 112)
                       : std::max<int>(want_slices, (bytes + (9 << 20) - 1) / (9 << 20));
      fwd = (cm ? cols_cm : cols)[sampling - 1], fname = cm ? "cols cmajor" : "cols";
      grid = dim3(k, std::max(1, std::min({want_slices, groups, 65535})));
    } else {
      const int phases = std::max(1, stheno::kThreads / bins);
      fwd = f ? (K)roialign_fwd_nchw_bin_c4_occ4_f32 : (K)roialign_fwd_nchw_bin_c4_f64, fname = "bin c4";
      grid = dim3(k, (c + phases * 4 - 1) / (phases * 4));
      block = dim3(std::min((bins * phases + 31) / 32 * 32, stheno::kThreads));
    }
    K bwd;
    std::string bname;
    if (quad && f && c % 4 == 0) {
      bwd = (K)roialign_bwd_nhwc_sep_red4_f32, bname = "sep red4";
    } else if (adaptive) {
      bwd = f ? (K)roialign_bwd_nhwc_sep_atomic_f32 : (K)roialign_bwd_nhwc_sep_atomic_f64, bname = "sep atomic";
    } else {
      bwd = f ? (K)roialign_bwd_nhwc_taps_atomic_f32 : (K)roialign_bwd_nhwc_taps_atomic_f64, bname = "taps atomic";
    }
    // The channels-last kernels take the RoIs in spatial order from 64 on.
    std::vector<int> order(k, -1);
    if (k >= 64 && k <= stheno::kMaxOrder) {
      stheno::RoIOrderParams op{addr(rois.data()), addr(order.data()), scale, k, 0};
      emu::launch(f ? (void (*)(stheno::RoIOrderParams))roialign_sort_rois_f32 : roialign_sort_rois_f64, dim3(1),
                  dim3(stheno::kOrderThreads), 0, op);
    }
    const uint64_t ordered = k >= 64 && k <= stheno::kMaxOrder ? addr(order.data()) : 0;

    p.order = nchw ? 0 : ordered;
    p.feat = nchw ? addr(x.data()) : addr(xt.data()), p.pooled = addr(out.data());
    emu::launch(fwd, grid, block, 0, p);
    std::vector<double> want_lv(outn, NAN);
    std::vector<T> out_lv(outn, T(NAN));
    for (int i = 0; i < k; ++i)
      if (level[i] == lv) {
        std::copy(ref.begin() + i * per, ref.begin() + (i + 1) * per, want_lv.begin() + i * per);
        std::copy(out.begin() + i * per, out.begin() + (i + 1) * per, out_lv.begin() + i * per);
      }
    check("level " + std::to_string(lv) + " forward " + fname + " vs reference", want_lv, out_lv, vs_ref);

    const int slices = std::max<int>(1, std::min<size_t>({(bytes + (size_t(96) << 20) - 1) / (size_t(96) << 20),
                                                          size_t(c + 31) / 32, size_t(65535)}));
    std::vector<T> gt(x.size(), T(0)), g(x.size(), T(NAN));
    p.order = ordered;
    p.feat = addr(gt.data()), p.pooled = addr(gy.data());
    emu::launch(bwd, dim3(k, (bins + tile - 1) / tile, slices), dim3(stheno::kThreads), 0, p);
    transpose(gt, g, n, h * w, c);
    check("level " + std::to_string(lv) + " backward " + bname + " vs reference", gref, g, vs_ref);
  }
  check("all levels forward vs reference", want, out, vs_ref);
  expect_line("status: ok", status == 0);
}

template <class T>
void cases() {
  run_case<T>("sampling 2, 7x7, aligned", 2, 35, 20, 24, 12, 7, 7, 0.25, 2, true, 96);
  run_case<T>("adaptive, 7x7, legacy, a bad RoI", 2, 33, 17, 13, 10, 7, 7, 0.5, 0, false, 34, true);
  run_case<T>("adaptive, 3x5, aligned, big boxes", 1, 3, 30, 40, 6, 3, 5, 1.0, 0, true, 45);
  run_case<T>("sampling 1, 14x14", 1, 5, 9, 11, 5, 14, 14, 0.25, 1, true, 44);
  // C % 4 == 0 (the red4 backwards), a last warp of 4 channels, 9 samples a bin.
  run_case<T>("sampling 3, 5x4, C 36", 2, 36, 11, 13, 7, 5, 4, 0.5, 3, true, 40);
  // C % 4 == 0, bins from far below a pixel to a few: a bin's taps share
  // pixels; adaptive sampling, and bins of 400+ samples a side, too many
  // for the separable tables (the taps computed on the spot instead).
  run_case<T>("sampling 2, 7x7, C 72, small bins", 2, 72, 20, 24, 16, 7, 7, 0.25, 2, true, 96);
  run_case<T>("sampling 2, 14x14, C 8", 1, 8, 30, 30, 9, 14, 14, 0.5, 2, false, 60);
  run_case<T>("adaptive, 7x7, C 8", 2, 8, 17, 13, 10, 7, 7, 0.5, 0, true, 34);
  run_case<T>("adaptive, 7x7, C 8, legacy, a bad RoI", 2, 8, 17, 13, 10, 7, 7, 0.5, 0, false, 34, true);
  // 4x9 bins: the second chunk of 32 starts at an odd column (a bin pair
  // split across chunks).
  run_case<T>("sampling 2, 4x9, C 12, small bins", 1, 12, 16, 20, 9, 4, 9, 0.25, 2, true, 80);
  // Ratio 4, and a bad RoI with a fixed ratio (its outputs 0 in every kernel).
  run_case<T>("sampling 4, 6x7, C 8, a bad RoI", 2, 8, 18, 21, 11, 6, 7, 0.5, 4, true, 40, true);
  // (Output gradients of 1e5: a bin of 400x400 samples divides them by
  // 160000. At coordinates of 400 pixels float32 sample positions are off
  // by ~3e-5 pixels, about 4e-5 of a gradient: float32 is checked against
  // the float32 kernels, float64 against the reference.)
  run_case<T>("adaptive, 1x1, C 4, huge bins", 1, 4, 400, 400, 4, 1, 1, 1.0, 0, true, 500, false, 400, 1e5, false);
  // The level filter, a fixed ratio (the NCHW kernels) and adaptive
  // sampling (the separable ones), C % 4 == 0 (vec4, red4).
  level_case<T>("level filter, sampling 2, 4x4, C 8", 2, 8, 16, 20, 24, 4, 4, 0.25, 2, 80);
  level_case<T>("level filter, adaptive, 3x5, C 12", 2, 12, 15, 17, 20, 3, 5, 0.5, 0, 34);
  // MultiLevelRoIAlign's launches for TestGPUMultiLevelRoIAlignParity's
  // cases: legacy_empty_level as it is (legacy, its NaN box of the finest
  // level; float32 forward roialign_fwd_nchw_cols_s1), adaptive (90 RoIs:
  // the channels-last kernels in spatial order) and Mask R-CNN's four
  // levels with ratio 2, smaller.
  pyramid_case<T>("pyramid, legacy, sampling 1, 4x3, C 5, level 2 empty", 3, 5, 96, {4, 8, 16}, 30, 4, 3, 1, false,
                  24, 1, 2);
  pyramid_case<T>("pyramid, adaptive, 3x5, C 12", 2, 12, 64, {4, 8, 16}, 90, 3, 5, 0, true, 16, 1, -1);
  pyramid_case<T>("pyramid, sampling 2, 7x7, C 8", 2, 8, 64, {4, 8, 16, 32}, 40, 7, 7, 2, true, 56, 2, -1);
}

int main() {
  width = 40;
  cases<float>();
  cases<double>();
  return finish("roialign_emu_test");
}
