// Emulated runs (see emu.h) of every kernel of kernels/msdeform.cu (and
// msdeform_sm90a.cu) against
// double-precision references of MSDeformAttn's forward and backward, as
// kernels/msdeform.go defines them, on small cases chosen to reach each
// kernel's edge paths (group sizes 1-32, D not a multiple of the group or
// of the vector width, several passes over D, more than 16 levels, NaN
// locations). Tolerances: autograd's TolForward32/64 for the forward,
// TolParity32/64 for the backward (its float32 atomics add in another order),
// with location gradients in pixel units as that table says.
// `msdeform_emu_test NAME...` runs the kernels whose name contains a NAME.
// Exits non-zero on a failure.
#include "emu.h"
#include "harness.h"
// clang-format off
#include "../msdeform.cu"
#include "../msdeform_sm90a.cu"
// clang-format on
#include <cmath>
#include <functional>
#include <random>
#include <string>

using stheno::MSDeformParams;

struct Case {
  std::string name;
  int n, lq, m, d;
  std::vector<std::pair<int, int>> levels;  // (H, W)
  int p;
  double lo, hi;
  bool nan_loc;
};

using namespace harness;

static Rng rng(11);

// The pixel coordinate loc*size - 0.5 as a kernel computing in T does: the
// product rounded to T, then the difference (pixel_coord in bilinear.cuh,
// taps in msdeform.go). The reference takes its coordinates from here, so
// that it picks the kernel's cell and weights; everything after it is done
// in double. Rounded in double instead, a coordinate moves by up to half an
// ulp of size, which moves each bilinear weight by about size*2^-24 (the
// "wide maps" case's forward: 1.1e-5, 10x TolForward32; see also
// TestMSDeformAttnFloat32MatchesFloat64 in ops) and, once in a few hundred
// thousand coordinates on maps as wide as Deformable-DETR's, across a
// cell's edge: that is the input's rounding, not the kernel's arithmetic,
// which is what this test checks.
template <class T>
static double coord_as(double loc, int size) {
  const T product = static_cast<T>(loc) * static_cast<T>(size);
  const T coord = product - static_cast<T>(0.5);
  return coord;
}

// Reference: the backward of grid_sample(bilinear, zeros, align_corners=False)
// weighted and summed, as kernels/msdeform.go defines it, in double, from
// coordinates rounded as T rounds them (coord_as).
template <class T>
static void reference(const Case& c, int s, const std::vector<int>& start, const std::vector<double>& value,
                      const std::vector<double>& loc, const std::vector<double>& wgt, const std::vector<double>& gout,
                      std::vector<double>& gv, std::vector<double>& gl, std::vector<double>& gw) {
  const int L = c.levels.size(), P = c.p, M = c.m, D = c.d;
  gv.assign(value.size(), 0);
  gl.assign(loc.size(), 0);
  gw.assign(wgt.size(), 0);
  for (int n = 0; n < c.n; ++n)
    for (int q = 0; q < c.lq; ++q)
      for (int m = 0; m < M; ++m)
        for (int l = 0; l < L; ++l)
          for (int pt = 0; pt < P; ++pt) {
            const int h = c.levels[l].first, w = c.levels[l].second;
            const size_t i = ((((size_t)n * c.lq + q) * M + m) * L + l) * P + pt;
            const double x = coord_as<T>(loc[2 * i], w), y = coord_as<T>(loc[2 * i + 1], h);
            if (!(y > -1 && y < h && x > -1 && x < w)) continue;
            const int y0 = (int)std::floor(y), x0 = (int)std::floor(x);
            const double ly = y - y0, lx = x - x0, hy = 1 - ly, hx = 1 - lx;
            const double ws[4] = {hy * hx, hy * lx, ly * hx, ly * lx};
            long off[4];
            bool in[4];
            for (int k = 0; k < 4; ++k) {
              const int yy = y0 + (k >> 1), xx = x0 + (k & 1);
              in[k] = yy >= 0 && yy < h && xx >= 0 && xx < w;
              off[k] = (((long)n * s + start[l] + yy * w + xx) * M + m) * D;
            }
            const double a = wgt[i];
            double dw = 0, dx = 0, dy = 0;
            for (int d = 0; d < D; ++d) {
              const double g = gout[(((size_t)n * c.lq + q) * M + m) * D + d];
              double v[4];
              for (int k = 0; k < 4; ++k) v[k] = in[k] ? value[off[k] + d] : 0;
              dw += g * (ws[0] * v[0] + ws[1] * v[1] + ws[2] * v[2] + ws[3] * v[3]);
              dx += g * a * (hy * (v[1] - v[0]) + ly * (v[3] - v[2]));
              dy += g * a * (hx * (v[2] - v[0]) + lx * (v[3] - v[1]));
              for (int k = 0; k < 4; ++k)
                if (in[k]) gv[off[k] + d] += ws[k] * a * g;
            }
            gw[i] = dw;
            gl[2 * i] = dx * w;
            gl[2 * i + 1] = dy * h;
          }
}

// Reference forward: out[n,q,m,:] = sum over levels and points of the
// attention weight times the bilinear sample (zeros outside the map), in
// double from coordinates rounded as T rounds them.
template <class T>
static void reference_forward(const Case& c, int s, const std::vector<int>& start, const std::vector<double>& value,
                              const std::vector<double>& loc, const std::vector<double>& wgt, std::vector<double>& out) {
  const int L = c.levels.size(), P = c.p, M = c.m, D = c.d;
  out.assign((size_t)c.n * c.lq * M * D, 0);
  for (int n = 0; n < c.n; ++n)
    for (int q = 0; q < c.lq; ++q)
      for (int m = 0; m < M; ++m)
        for (int l = 0; l < L; ++l)
          for (int pt = 0; pt < P; ++pt) {
            const int h = c.levels[l].first, w = c.levels[l].second;
            const size_t i = ((((size_t)n * c.lq + q) * M + m) * L + l) * P + pt;
            const double x = coord_as<T>(loc[2 * i], w), y = coord_as<T>(loc[2 * i + 1], h);
            if (!(y > -1 && y < h && x > -1 && x < w)) continue;
            const int y0 = (int)std::floor(y), x0 = (int)std::floor(x);
            const double ly = y - y0, lx = x - x0, hy = 1 - ly, hx = 1 - lx;
            const double ws[4] = {hy * hx, hy * lx, ly * hx, ly * lx};
            for (int k = 0; k < 4; ++k) {
              const int yy = y0 + (k >> 1), xx = x0 + (k & 1);
              if (yy < 0 || yy >= h || xx < 0 || xx >= w) continue;
              const long off = (((long)n * s + start[l] + yy * w + xx) * M + m) * D;
              for (int d = 0; d < D; ++d)
                out[(((size_t)n * c.lq + q) * M + m) * D + d] += wgt[i] * ws[k] * value[off + d];
            }
          }
}

// With ordered (the forward's _sorted kernels), the launch takes each image's
// queries in a shuffled order (p.order): every output must still land where
// its query's belongs. Then, so that a kernel that ignores p.order cannot
// pass, again with every position taking query 0: only query 0's outputs
// may be written.
template <class T>
static bool run(const Case& c, const std::string& kname, void (*k)(MSDeformParams), int group, bool forward,
                bool ordered = false) {
  const int L = c.levels.size();
  std::vector<int> start;
  int s = 0;
  for (auto& lv : c.levels) start.push_back(s), s += lv.first * lv.second;
  const size_t nv = (size_t)c.n * s * c.m * c.d, nw = (size_t)c.n * c.lq * c.m * L * c.p,
               no = (size_t)c.n * c.lq * c.m * c.d;
  Rng saved = rng;
  rng.seed(std::hash<std::string>{}(c.name));
  std::vector<double> value = rng.uniform(nv, -1, 1), loc = rng.uniform(2 * nw, c.lo, c.hi),
                      wgt = rng.uniform(nw, 0, 1), gout = rng.uniform(no, -1, 1);
  rng = saved;
  if (c.nan_loc)
    for (size_t j = 0; j < loc.size(); j += 7) loc[j] = NAN;
  // Round the inputs to T first, so that the reference sees what the kernel sees.
  auto cast = [](std::vector<double>& v) {
    std::vector<T> r(v.size());
    for (size_t i = 0; i < v.size(); ++i) r[i] = static_cast<T>(v[i]), v[i] = r[i];
    return r;
  };
  std::vector<T> tv = cast(value), tl = cast(loc), tw = cast(wgt), tg = cast(gout);
  std::vector<double> gv, gl, gw, fo;
  if (forward)
    reference_forward<T>(c, s, start, value, loc, wgt, fo);
  else
    reference<T>(c, s, start, value, loc, wgt, gout, gv, gl, gw);
  // Outputs poisoned with NaN except grad_value (zeroed by the caller).
  std::vector<T> ov(nv, T(0)), ol(2 * nw, T(NAN)), ow(nw, T(NAN)), of(no, T(NAN));
  std::vector<int> table;
  for (int l = 0; l < L; ++l) table.insert(table.end(), {c.levels[l].first, c.levels[l].second, start[l]});
  MSDeformParams p;
  memset(&p, 0, sizeof p);
  p.value = (uint64_t)tv.data(), p.loc = (uint64_t)tl.data(), p.weight = (uint64_t)tw.data();
  p.grad_out = (uint64_t)tg.data(), p.grad_value = (uint64_t)ov.data(), p.grad_loc = (uint64_t)ol.data();
  p.grad_weight = (uint64_t)ow.data();
  p.out = (uint64_t)of.data();
  if (L <= stheno::kInlineLevels) {
    memcpy(p.inline_levels, table.data(), table.size() * sizeof(int));
  } else {
    // An exact-size copy, so that AddressSanitizer sees reads past the table.
    static std::vector<std::unique_ptr<int[]>> keep;
    keep.emplace_back(new int[table.size()]);
    memcpy(keep.back().get(), table.data(), table.size() * sizeof(int));
    p.levels = (uint64_t)keep.back().get();
  }
  p.n = c.n, p.s = s, p.m = c.m, p.d = c.d, p.lq = c.lq, p.l = L, p.p = c.p, p.group = group;
  std::vector<int> order;
  if (ordered) {
    std::mt19937_64 shuffle(c.lq);
    for (int n = 0; n < c.n; ++n) {
      std::vector<int> perm(c.lq);
      for (int q = 0; q < c.lq; ++q) perm[q] = q;
      std::shuffle(perm.begin(), perm.end(), shuffle);
      order.insert(order.end(), perm.begin(), perm.end());
    }
    p.order = (uint64_t)order.data();
  }
  const long threads = (long)c.n * c.lq * c.m * group;
  const unsigned blocks = (threads + stheno::kBlock - 1) / stheno::kBlock;
  emu::launch(k, dim3(blocks), dim3(stheno::kBlock), 0, p);
  bool ok;
  if (forward) {
    const Err eo = measure(of, fo, TolForward<T>);
    ok = eo.ok();
    if (ordered) {
      std::fill(order.begin(), order.end(), 0);
      std::fill(of.begin(), of.end(), T(NAN));
      emu::launch(k, dim3(blocks), dim3(stheno::kBlock), 0, p);
      for (int n = 0; n < c.n; ++n)
        for (int q = 0; q < c.lq; ++q)
          for (size_t j = 0; j < (size_t)c.m * c.d; ++j) {
            const size_t i = ((size_t)n * c.lq + q) * c.m * c.d + j;
            if (std::isnan(of[i]) != (q != 0)) ok = false;
          }
    }
    printf("%-4s %-28s %-47s maxabs out %.2e | worst/tol %.3f%s\n", ok ? "ok" : "FAIL", c.name.c_str(), kname.c_str(),
           eo.abs, eo.worst, ordered ? " (shuffled query order; all positions on query 0)" : "");
  } else {
    // Location gradients in pixel units (autograd's TolParity32 says why):
    // each is its level's width or height times a sum of terms of order 1.
    std::vector<double> olp(ol.begin(), ol.end()), glp = gl;
    for (size_t j = 0; j < olp.size(); j += 2) {
      const auto& lv = c.levels[(j / 2 / c.p) % L];
      olp[j] /= lv.second, glp[j] /= lv.second;
      olp[j + 1] /= lv.first, glp[j + 1] /= lv.first;
    }
    const Tol tol = TolParity<T>;
    const Err ev = measure(ov, gv, tol), el = measure(olp, glp, tol), ew = measure(ow, gw, tol);
    ok = ev.ok() && el.ok() && ew.ok();
    printf("%-4s %-28s %-47s maxabs value %.2e loc %.2e weight %.2e | worst/tol %.3f %.3f %.3f%s\n",
           ok ? "ok" : "FAIL", c.name.c_str(), kname.c_str(), ev.abs, el.abs, ew.abs, ev.worst, el.worst, ew.worst,
           ordered ? " (shuffled query order)" : "");
  }
  return ok;
}

// msdeform_sort_cells, _scan and _place on nq queries per image (n images, stride elements
// apart, a bands x cols grid): each image's order must be a permutation of
// its queries whose cells, computed here as the kernel defines them, never
// decrease. Locations reach past [0,1] and some are NaN or infinite.
template <class T>
static bool run_order(int n, int nq, int stride, int bands, int cols) {
  std::mt19937_64 r(nq * 31 + bands);
  std::uniform_real_distribution<double> u(-0.2, 1.2);
  std::vector<T> loc((size_t)n * nq * stride);
  for (auto& x : loc) x = static_cast<T>(u(r));
  for (size_t j = 0; j < loc.size(); j += 13) loc[j] = NAN;
  for (size_t j = 5; j < loc.size(); j += 29) loc[j] = (j & 64) ? INFINITY : -INFINITY;
  std::vector<int> order((size_t)n * nq, -1), cells((size_t)n * nq, -1), starts((size_t)n * bands * cols, -1);
  stheno::MSDeformOrderParams p;
  memset(&p, 0, sizeof p);
  p.loc = (uint64_t)loc.data(), p.cells = (uint64_t)cells.data(), p.starts = (uint64_t)starts.data(), p.order = (uint64_t)order.data();
  p.n = n, p.lq = nq, p.stride = stride, p.bands = bands, p.cols = cols;
  constexpr int kB = stheno::kBlock;
  emu::launch(sizeof(T) == 4 ? (void (*)(stheno::MSDeformOrderParams))msdeform_sort_cells_f32 : msdeform_sort_cells_f64,
              dim3((n * nq + kB - 1) / kB), dim3(kB), 0, p);
  emu::launch(msdeform_sort_scan, dim3(n), dim3(stheno::kOrderThreads), 0, p);
  emu::launch(msdeform_sort_place, dim3((n * nq + kB - 1) / kB), dim3(kB), 0, p);
  auto cell = [&](int img, int q) {
    const T* l = &loc[((size_t)img * nq + q) * stride];
    const T x = l[0], y = l[1];
    const int b = y > T(0) ? (int)std::fmin(y * (T)bands, (T)(bands - 1)) : 0;
    const int c = x > T(0) ? (int)std::fmin(x * (T)cols, (T)(cols - 1)) : 0;
    return b * cols + c;
  };
  bool ok = true;
  for (int img = 0; img < n && ok; ++img) {
    std::vector<char> seen(nq, 0);
    for (int i = 0; i < nq && ok; ++i) {
      const int q = order[(size_t)img * nq + i];
      ok = q >= 0 && q < nq && !seen[q];
      if (ok) seen[q] = 1;
      if (ok && i > 0) ok = cell(img, order[(size_t)img * nq + i - 1]) <= cell(img, q);
    }
  }
  printf("%-4s msdeform_sort_{cells_%s,scan,place}: %d images of %d queries, %dx%d cells\n",
         ok ? "ok" : "FAIL", sizeof(T) == 4 ? "f32" : "f64", n, nq, bands, cols);
  return ok;
}

int main(int argc, char** argv) {
  std::vector<Case> cases = {
      {"encoder-like D32 M8", 1, 3, 8, 32, {{7, 9}, {5, 3}, {3, 5}, {1, 2}}, 4, -0.2, 1.2, false},
      {"D=64 M2 L4 P4", 1, 3, 2, 64, {{9, 7}, {4, 5}, {3, 3}, {2, 1}}, 4, -0.3, 1.3, false},
      {"D=48 M2 (two passes)", 1, 5, 2, 48, {{4, 4}, {2, 3}}, 2, -0.5, 1.5, false},
      {"D=32 M2 P3 L3 (lp 9)", 1, 5, 2, 32, {{5, 6}, {3, 3}, {1, 4}}, 3, -0.2, 1.2, false},
      {"D=16 M8 L4 P4", 1, 4, 8, 16, {{7, 5}, {3, 4}, {2, 2}, {1, 1}}, 4, -0.2, 1.2, false},
      {"D=5 (groups of 8)", 1, 7, 3, 5, {{6, 4}}, 3, 0, 1, false},
      {"D=1", 2, 3, 1, 1, {{3, 3}}, 1, 0, 1, false},
      {"D=2 M4 L2 P5", 1, 9, 4, 2, {{3, 5}, {2, 2}}, 5, -0.2, 1.2, false},
      {"D=4 L4 P4", 1, 5, 2, 4, {{3, 5}, {2, 7}, {5, 1}, {2, 2}}, 4, -0.2, 1.2, false},
      {"NaN locations D8", 1, 9, 2, 8, {{5, 5}, {3, 2}}, 2, -0.2, 1.2, true},
      {"NaN locations D32", 1, 5, 2, 32, {{5, 5}, {3, 2}, {2, 2}, {1, 3}}, 4, -0.2, 1.2, true},
      {"17 levels D4", 1, 4, 2, 4, {}, 2, 0, 1, false},
      {"17 levels D32 P1 (lp 17)", 1, 3, 2, 32, {}, 1, -0.1, 1.1, false},
      {"lp 34 D32 P2 L17", 1, 2, 2, 32, {}, 2, -0.1, 1.1, false},
      {"D=256 M2 L2 P3", 1, 3, 2, 256, {{4, 5}, {2, 3}}, 3, -0.2, 1.2, false},
      {"D=100 M3 L3 P2", 1, 4, 3, 100, {{3, 5}, {2, 3}, {1, 1}}, 2, -0.2, 1.2, false},
      {"D=3 M5 L2 P4", 2, 5, 5, 3, {{3, 5}, {4, 3}}, 4, -0.2, 1.2, false},
      {"D=12 M8 L4 P4", 1, 6, 8, 12, {{7, 9}, {5, 3}, {3, 5}, {1, 2}}, 4, -0.2, 1.2, false},
      // Two images of 30 queries: blocks (of 4 queries x 8 heads for the
      // red4 kernels) that span both images.
      {"two images, Lq 30, D32 M8", 2, 30, 8, 32, {{6, 5}, {3, 3}, {2, 2}, {1, 2}}, 4, -0.1, 1.1, false},
      // Many samples on few pixels: many atomics on the same addresses.
      {"crowded D32 M2 2x2", 2, 20, 2, 32, {{2, 2}, {1, 3}}, 4, -0.3, 1.3, false},
      // Deformable-DETR's widest maps, where location gradients reach a few
      // hundred (the pixel-unit comparison's case).
      {"wide maps D32 M2", 1, 40, 2, 32, {{100, 167}, {13, 21}}, 4, -0.05, 1.05, false},
      // The most levels that travel with the launch, all 16x16.
      {"16 levels 16x16 D32 M1", 1, 10, 1, 32, {{16, 16}, {16, 16}, {16, 16}, {16, 16}, {16, 16}, {16, 16}, {16, 16}, {16, 16},
                                                {16, 16}, {16, 16}, {16, 16}, {16, 16}, {16, 16}, {16, 16}, {16, 16}, {16, 16}},
       2, -0.1, 1.1, false},
  };
  for (auto& c : cases)
    if (c.levels.empty())
      for (int i = 0; i < 17; ++i) c.levels.push_back({1 + i % 3, 2 + i % 2});
  using K = void (*)(MSDeformParams);
  // name, kernel, channels per lane (the caller guarantees D % V == 0 for the
  // forward's vector loads), forward.
  struct Kernel {
    const char* name;
    K k;
    int vec;
    bool fwd;
    bool whole;           // needs D % vec == 0 (ops picks another kernel otherwise)
    bool ordered = false;  // an _o kernel: takes the queries in p.order's order
  };
#define F(name, vec) {#name, name, vec, true, true}
#define FO(name, vec) {#name, name, vec, true, true, true}
#define B(name, vec) {#name, name, vec, false, false}
#define Q(name) {#name, name, 4, false, true}
  const std::vector<Kernel> f32 = {
      F(msdeform_fwd_v16b_lanetaps_f32, 4),        F(msdeform_fwd_scalar_f32, 1),
      F(msdeform_fwd_v16b_f32, 4),                 F(msdeform_fwd_v16b_occ5_f32, 4),
      FO(msdeform_fwd_v16b_sorted_f32, 4),         FO(msdeform_fwd_v16b_occ5_sorted_f32, 4),
      FO(msdeform_fwd_scalar_sorted_f32, 1),
      B(msdeform_bwd_atomic_c1_butterfly_f32, 1),  B(msdeform_bwd_atomic_c1_sharedtaps_butterfly_f32, 1),
      B(msdeform_bwd_atomic_c1_rs4_occ3_f32, 1),   B(msdeform_bwd_atomic_c1_rs8_occ3_f32, 1),
      B(msdeform_bwd_atomic_c1_rs16_occ3_f32, 1),  B(msdeform_bwd_atomic_c2_rs16_occ3_f32, 2),
      B(msdeform_bwd_atomic_c4_rs4_occ2_f32, 4),   B(msdeform_bwd_atomic_c4_rs4_occ3_f32, 4),
      B(msdeform_bwd_atomic_c4_rs8_f32, 4),        B(msdeform_bwd_atomic_c4_rs8_qfast_f32, 4),
      // msdeform_sm90a.cu's (vector reductions; D % 4 == 0 only).
      Q(msdeform_bwd_red4_rs4_occ2_f32),           Q(msdeform_bwd_red4_rs4_occ3_f32),
      Q(msdeform_bwd_red4_rs4_occ4_f32),           Q(msdeform_bwd_red4_rs8_occ3_f32),
  };
  const std::vector<Kernel> f64 = {
      F(msdeform_fwd_scalar_f64, 1),               F(msdeform_fwd_v16b_f64, 2),
      FO(msdeform_fwd_scalar_sorted_f64, 1),       FO(msdeform_fwd_v16b_sorted_f64, 2),
      B(msdeform_bwd_atomic_c1_butterfly_f64, 1),  B(msdeform_bwd_atomic_c1_rs4_f64, 1),
      B(msdeform_bwd_atomic_c1_rs8_f64, 1),        B(msdeform_bwd_atomic_c1_rs16_f64, 1),
      B(msdeform_bwd_atomic_c2_rs16_f64, 2),       B(msdeform_bwd_atomic_c4_rs4_f64, 4),
      B(msdeform_bwd_atomic_c4_rs8_f64, 4),        B(msdeform_bwd_atomic_c4_rs8_qfast_f64, 4),
  };
#undef F
#undef FO
#undef B
#undef Q
  // Arguments: run only the kernels whose name contains one of them.
  const std::vector<std::string> only(argv + 1, argv + argc);
  if (only.empty() || std::any_of(only.begin(), only.end(), [](const std::string& o) {
        return std::string("msdeform_sort_cells msdeform_sort_scan msdeform_sort_place").find(o) != std::string::npos;
      })) {
    // One query; fewer than the block's threads; more than one pass of
    // kOrderUnroll per thread; the most cells; one cell.
    const bool oks[] = {run_order<float>(1, 1, 2, 3, 4),      run_order<float>(2, 700, 4, 5, 7),
                        run_order<float>(2, 9000, 2, 23, 160), run_order<double>(1, 3000, 6, 64, 128),
                        run_order<double>(1, 2000, 2, 1, 1)};
    for (bool ok : oks) count(ok);
  }
  for (auto& c : cases) {
    for (const auto* set : {&f32, &f64})
      for (const auto& kv : *set) {
        if (!only.empty() && std::none_of(only.begin(), only.end(), [&](const std::string& o) {
              return std::string(kv.name).find(o) != std::string::npos;
            }))
          continue;
        if (kv.whole && c.d % kv.vec != 0) continue;  // ops picks another kernel then
        // msDeformGroup in ops: vec-channel pieces of D, rounded up to a power of two, at most 32.
        const int pieces = (c.d + kv.vec - 1) / kv.vec;
        int group = 1;
        while (group < pieces && group < 32) group *= 2;
        const bool ok = set == &f32 ? run<float>(c, kv.name, kv.k, group, kv.fwd, kv.ordered)
                                    : run<double>(c, kv.name, kv.k, group, kv.fwd, kv.ordered);
        count(ok);
      }
  }
  return finish("msdeform_emu_test");
}
