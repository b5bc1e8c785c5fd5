// Emulated runs (see emu.h) of kernels/upsample.cu: upsample_nearest_fwd
// and upsample_nearest_bwd, float32 and float64, with factors 1 to 4 (and
// the _x2_vec2 kernels for factor 2), on small shapes: rows of one pixel,
// odd and even widths, several planes. Against double-precision
// references: the forward's copies and, with inputs of multiples of 1/8
// (every sum exact), the backward's block sums, bit for bit; with
// uniform inputs, the backward against a reference that adds in T in the
// order the kernels promise (each row of the block from zero, then the
// row sums from zero), bit for bit, and against the double sums within
// TolForward; a block of -0 sums to +0 as that order gives. Each case runs
// on a full grid and on one block of one warp, which the grid-stride loops
// must make no different. Exits non-zero on a failure.
#include "emu.h"
#include "harness.h"
// clang-format off
#include "../upsample.cu"
// clang-format on
#include <string>
#include <vector>

using stheno::upsample::kThreads;
using stheno::upsample::UpsampleParams;

using namespace harness;

struct Case {
  int planes, h, w, f;
};

using Kernel = void (*)(UpsampleParams);

// Runs kernel over p (its in and out set by the caller) on a full grid or
// on one block of one warp.
void run(Kernel k, const UpsampleParams& p, bool small) {
  const long n = p.rows * p.w;
  const unsigned threads = small ? 32 : kThreads;
  emu::launch(k, dim3(small ? 1 : unsigned((n + threads - 1) / threads)), dim3(threads), 0, p);
}

template <class T>
void run_case(const Case& c, Rng& rng) {
  UpsampleParams p{};
  p.rows = long(c.planes) * c.h, p.w = c.w, p.factor = c.f;
  const long ow = long(c.w) * c.f;
  const size_t nx = size_t(p.rows) * c.w, ny = nx * c.f * c.f;
  char what[120];
  snprintf(what, sizeof what, "%s planes=%d %dx%d factor=%d", sizeof(T) == 4 ? "f32" : "f64", c.planes, c.h, c.w,
           c.f);
  const bool f32 = sizeof(T) == 4;
  std::vector<Kernel> fwds{f32 ? upsample_nearest_fwd_f32 : upsample_nearest_fwd_f64};
  std::vector<Kernel> bwds{f32 ? upsample_nearest_bwd_f32 : upsample_nearest_bwd_f64};
  if (c.f == 2) {
    fwds.push_back(f32 ? upsample_nearest_fwd_x2_vec2_f32 : upsample_nearest_fwd_x2_vec2_f64);
    bwds.push_back(f32 ? upsample_nearest_bwd_x2_vec2_f32 : upsample_nearest_bwd_x2_vec2_f64);
  }
  // Multiples of 1/8 in [-4, 4]: every block sum is exact in T.
  std::vector<T> x(nx), dy_exact(ny);
  for (auto& v : x) v = T(double(long(rng() % 65) - 32) / 8);
  for (auto& v : dy_exact) v = T(double(long(rng() % 65) - 32) / 8);
  const std::vector<T> dy_uniform = rng.uniform<T>(ny);
  // The references: y, the exact block sums in double, and the block sums
  // added in T in the kernels' order.
  std::vector<double> y_ref(ny), dx_exact(nx), dx_double(nx), dx_order(nx);
  for (long row = 0; row < p.rows; ++row)
    for (int col = 0; col < c.w; ++col) {
      const size_t i = size_t(row) * c.w + col;
      double se = 0, sd = 0;
      T so = T(0);
      for (int r = 0; r < c.f; ++r) {
        T rs = T(0);
        for (int cc = 0; cc < c.f; ++cc) {
          const size_t o = size_t((row * c.f + r) * ow + long(col) * c.f + cc);
          y_ref[o] = x[i];
          se += dy_exact[o];
          sd += dy_uniform[o];
          rs += dy_uniform[o];
        }
        so += rs;
      }
      dx_exact[i] = se, dx_double[i] = sd, dx_order[i] = so;
    }
  for (size_t k = 0; k < fwds.size(); ++k) {
    const std::string name = std::string(what) + (k == 1 ? " x2_vec2" : "");
    for (bool small : {false, true}) {
      const std::string label = name + (small ? " one warp" : "");
      std::vector<T> y(ny, T(NAN)), dx(nx, T(NAN));
      p.in = addr(x.data()), p.out = addr(y.data());
      run(fwds[k], p, small);
      expect_within(label + " y", y, y_ref, kExact);
      p.in = addr(dy_exact.data()), p.out = addr(dx.data());
      run(bwds[k], p, small);
      expect_within(label + " dx (exact sums)", dx, dx_exact, kExact);
      std::fill(dx.begin(), dx.end(), T(NAN));
      p.in = addr(dy_uniform.data());
      run(bwds[k], p, small);
      expect_within(label + " dx (the kernels' order, in T)", dx, dx_order, kExact);
      expect_within(label + " dx (double sums)", dx, dx_double, TolForward<T>);
      // -0 everywhere: the sums start from +0, and +0 + -0 is +0.
      const std::vector<T> negzero(ny, T(-0.0));
      p.in = addr(negzero.data());
      run(bwds[k], p, small);
      long negative = 0;
      for (T v : dx) negative += std::signbit(v) || v != T(0);
      expect(label + " dx of -0 is +0", negative == 0, std::to_string(negative) + " elements are not +0");
    }
  }
}

template <class T>
void test_all(const char* name) {
  printf("%s\n", name);
  const int before = failures;
  Rng rng(32);
  const Case cases[] = {
      {1, 1, 1, 1}, {2, 3, 5, 1}, {1, 1, 1, 2}, {2, 3, 5, 2}, {3, 4, 8, 2}, {1, 17, 33, 2}, {2, 5, 1, 2},
      {2, 3, 4, 3}, {1, 7, 9, 3}, {2, 2, 3, 4}, {1, 9, 40, 4},
  };
  for (const Case& c : cases) run_case<T>(c, rng);
  printf("  %s\n", failures == before ? "ok" : "FAIL");
}

int main() {
  test_all<float>("upsample f32");
  test_all<double>("upsample f64");
  return finish("upsample_emu_test");
}
