// Emulated runs (see emu.h) of kernels/maxpool.cu: maxpool_fwd and
// maxpool_bwd, float32 and float64, on small shapes (the ResNet stem's
// kernel 3, stride 2, padding 1; FPN P6's kernel 1, stride 2; overlapping,
// disjoint and rectangular windows; a window as large as the padded input),
// against a double-precision reference of PyTorch's rule: windows scanned
// row by row, a pixel winning when greater than the best so far or NaN;
// each dy going to its window's winner. Values are small integers with
// NaN and -inf planted, so ties are common and every result is exact: the
// comparison is bit for bit (NaN where the reference has NaN). Both
// backward kernels (the tiled ones where the windows and their pixels fit
// in shared memory: not for the 12x12 window nor the 1x1 ones; _k3 for
// 3x3 windows), on planes of several tiles. Each case runs on
// a full grid and on one block of one warp, which the grid-stride loops
// must make no different. Exits non-zero on a failure.
#include "emu.h"
#include "harness.h"
// clang-format off
#include "../maxpool.cu"
// clang-format on
#include <random>
#include <string>
#include <vector>

using stheno::kMaxPoolThreads;
using stheno::kTileH;
using stheno::kTileRegion;
using stheno::kTileW;
using stheno::kTileWindows;
using stheno::MaxPool2dParams;

using namespace harness;

struct Case {
  int planes, h, w, kh, kw, sh, sw, ph, pw;
};

template <class T>
void run_case(const Case& c, bool special, std::mt19937_64& rng) {
  MaxPool2dParams p{};
  p.planes = c.planes, p.h = c.h, p.w = c.w, p.kh = c.kh, p.kw = c.kw;
  p.stride_h = c.sh, p.stride_w = c.sw, p.pad_h = c.ph, p.pad_w = c.pw;
  p.out_h = (c.h + 2 * c.ph - c.kh) / c.sh + 1, p.out_w = (c.w + 2 * c.pw - c.kw) / c.sw + 1;
  const size_t nx = size_t(c.planes) * c.h * c.w, ny = size_t(c.planes) * p.out_h * p.out_w;
  std::vector<T> x(nx), dy(ny);
  for (auto& v : x) {
    v = T(rng() % 4);
    if (special) {
      const int r = int(rng() % 12);
      if (r == 0) v = T(NAN);
      if (r >= 1 && r <= 3) v = -std::numeric_limits<T>::infinity();
    }
  }
  for (auto& v : dy) v = T(1 + rng() % 8);
  // The reference.
  std::vector<double> y_ref(ny), dx_ref(nx, 0);
  for (int pl = 0; pl < c.planes; ++pl)
    for (int oh = 0; oh < p.out_h; ++oh)
      for (int ow = 0; ow < p.out_w; ++ow) {
        double best = -INFINITY;
        long arg = -1;
        for (int a = 0; a < c.kh; ++a)
          for (int b = 0; b < c.kw; ++b) {
            const int ih = oh * c.sh - c.ph + a, iw = ow * c.sw - c.pw + b;
            if (ih < 0 || ih >= c.h || iw < 0 || iw >= c.w) continue;
            const long i = (long(pl) * c.h + ih) * c.w + iw;
            if (arg < 0) arg = i;
            const double v = x[i];
            if (v > best || std::isnan(v)) best = v, arg = i;
          }
        const size_t o = (size_t(pl) * p.out_h + oh) * p.out_w + ow;
        y_ref[o] = best;
        dx_ref[arg] += dy[o];
      }
  char what[160];
  snprintf(what, sizeof what, "%s planes=%d %dx%d k=%dx%d s=%dx%d pad=%dx%d special=%d", sizeof(T) == 4 ? "f32" : "f64",
           c.planes, c.h, c.w, c.kh, c.kw, c.sh, c.sw, c.ph, c.pw, int(special));
  auto fwd = sizeof(T) == 4 ? maxpool_fwd_f32 : maxpool_fwd_f64;
  auto bwd = sizeof(T) == 4 ? maxpool_bwd_f32 : maxpool_bwd_f64;
  auto tiled = sizeof(T) == 4 ? maxpool_bwd_tiled_f32 : maxpool_bwd_tiled_f64;
  auto tiled3 = sizeof(T) == 4 ? maxpool_bwd_tiled_k3_f32 : maxpool_bwd_tiled_k3_f64;
  // The tiled kernel where its windows fit, as ops launches it.
  const int wr = (kTileH + c.kh - 2) / c.sh + 1, wc = (kTileW + c.kw - 2) / c.sw + 1;
  const bool fits = c.kh * c.kw > 1 && wr * wc <= kTileWindows &&
                    ((wr - 1) * c.sh + c.kh) * ((wc - 1) * c.sw + c.kw) <= kTileRegion;
  const long tiles = long(c.planes) * ((c.h + kTileH - 1) / kTileH) * ((c.w + kTileW - 1) / kTileW);
  for (bool small : {false, true}) {
    std::vector<T> y(ny, T(NAN)), dx(nx, T(NAN)), dxt(nx, T(NAN));
    p.x = addr(x.data()), p.dy = 0, p.out = addr(y.data());
    const unsigned threads = small ? 32 : kMaxPoolThreads;
    emu::launch(fwd, dim3(small ? 1 : unsigned((ny + threads - 1) / threads)), dim3(threads), 0, p);
    p.dy = addr(dy.data()), p.out = addr(dx.data());
    emu::launch(bwd, dim3(small ? 1 : unsigned((nx + threads - 1) / threads)), dim3(threads), 0, p);
    expect_within(std::string(what) + (small ? " one warp" : "") + " y", y, y_ref, kExact);
    expect_within(std::string(what) + (small ? " one warp" : "") + " dx", dx, dx_ref, kExact);
    if (fits) {
      // One block of one warp goes through every tile in turn.
      p.out = addr(dxt.data());
      emu::launch(tiled, dim3(small ? 1 : unsigned(tiles)), dim3(threads), 0, p);
      expect_within(std::string(what) + (small ? " one warp" : "") + " dx tiled", dxt, dx_ref, kExact);
      if (c.kh == 3 && c.kw == 3) {
        std::fill(dxt.begin(), dxt.end(), T(NAN));
        emu::launch(tiled3, dim3(small ? 1 : unsigned(tiles)), dim3(threads), 0, p);
        expect_within(std::string(what) + (small ? " one warp" : "") + " dx tiled k3", dxt, dx_ref, kExact);
      }
    }
  }
}

template <class T>
void test_all(const char* name) {
  printf("%s\n", name);
  const int before = failures;
  std::mt19937_64 rng(26);
  const Case cases[] = {
      {3, 9, 12, 3, 3, 2, 2, 1, 1}, {2, 8, 8, 1, 1, 2, 2, 0, 0}, {2, 7, 5, 1, 1, 2, 2, 0, 0},
      {4, 6, 7, 2, 2, 2, 2, 0, 0},  {2, 6, 6, 3, 3, 1, 1, 1, 1}, {1, 5, 5, 5, 5, 1, 1, 2, 2},
      {2, 9, 9, 4, 4, 3, 3, 2, 2},  {3, 7, 9, 3, 2, 1, 3, 1, 1}, {2, 40, 61, 3, 3, 2, 2, 1, 1},
      {2, 40, 70, 1, 1, 2, 2, 0, 0}, {1, 20, 40, 3, 3, 1, 1, 1, 1}, {1, 33, 65, 4, 5, 3, 2, 2, 2},
      {2, 70, 45, 3, 3, 2, 2, 1, 1},  {1, 66, 67, 2, 2, 2, 2, 1, 1}, {1, 40, 50, 7, 7, 1, 1, 3, 3},
      {1, 12, 12, 12, 12, 1, 1, 6, 6},
  };
  for (const Case& c : cases)
    for (bool special : {false, true}) run_case<T>(c, special, rng);
  printf("  %s\n", failures == before ? "ok" : "FAIL");
}

int main() {
  test_all<float>("maxpool f32");
  test_all<double>("maxpool f64");
  return finish("maxpool_emu_test");
}
