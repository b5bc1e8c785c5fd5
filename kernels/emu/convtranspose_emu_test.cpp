// Emulated runs (see emu.h) of kernels/convtranspose.cu, float32 and
// float64:
// - conv_transpose_epilogue: depth to space by (fh, fw) = (2, 2) (Mask
//   R-CNN's mask head), (3, 2), (1, 4) and (1, 1) (in place, as after the
//   strided data-gradient GEMM), with and without a bias and a ReLU, on z
//   with NaN, -0 and values either side of zero planted, against a
//   reference that moves each element by the definition and adds the bias
//   in T: bit for bit (NaN where it has NaN; a ReLU gives 0 for NaN). A
//   full grid, and one block of one warp (the grid-stride loop).
// - conv_transpose_bias_grad: the channel sums of dy, planes of fewer and
//   more pixels than a block's threads, not a multiple of them, with blocks
//   of 256 and 32 threads: with dy of multiples of 1/8 (every sum exact)
//   against the double sums, bit for bit; with uniform dy within
//   TolForward of them, relative to the sum of the magnitudes.
// Exits non-zero on a failure.
#include "emu.h"
#include "harness.h"
// clang-format off
#include "../convtranspose.cu"
// clang-format on
#include <string>
#include <vector>

using stheno::convt::ConvTransposeBiasGradParams;
using stheno::convt::ConvTransposeEpilogueParams;
using stheno::convt::kThreads;

using namespace harness;

static Rng rng(32);

struct EpilogueCase {
  int n, c, h, w, fh, fw;
};

template <class T>
void epilogue_case(const EpilogueCase& e, bool bias, bool relu) {
  const int oh = e.h * e.fh, ow = e.w * e.fw;
  const size_t ny = size_t(e.n) * e.c * oh * ow;
  std::vector<T> z(ny), b(e.c);
  for (auto& v : z) {
    const int r = int(rng() % 16);
    v = r == 0 ? T(NAN) : r == 1 ? T(-0.0) : T(rng.U(-1, 1));
  }
  for (auto& v : b) v = T(rng.U(-0.5, 0.5));
  // The reference: y[n, c, i*fh + a, j*fw + b] = z[n, c*fh*fw + a*fw + b, i, j].
  std::vector<double> want(ny);
  for (int n = 0; n < e.n; ++n)
    for (int c = 0; c < e.c; ++c)
      for (int yr = 0; yr < oh; ++yr)
        for (int yc = 0; yc < ow; ++yc) {
          const int i = yr / e.fh, a = yr % e.fh, j = yc / e.fw, bb = yc % e.fw;
          const size_t zc = (size_t(n) * e.c + c) * e.fh * e.fw + a * e.fw + bb;
          T v = z[(zc * e.h + i) * e.w + j];
          if (bias || relu) {
            v += bias ? b[c] : T(0);
            if (relu && !(v > T(0))) v = T(0);
          }
          want[((size_t(n) * e.c + c) * oh + yr) * ow + yc] = v;
        }
  std::vector<T> want_t(ny);
  for (size_t i = 0; i < ny; ++i) want_t[i] = T(want[i]);
  ConvTransposeEpilogueParams p{};
  p.bias = bias ? addr(b.data()) : 0;
  p.planes = int64_t(e.n) * e.c, p.c = e.c, p.h = e.h, p.w = e.w, p.factor_h = e.fh, p.factor_w = e.fw;
  p.relu = relu;
  char what[160];
  snprintf(what, sizeof what, "%s epilogue n=%d c=%d %dx%d by %dx%d bias=%d relu=%d", sizeof(T) == 4 ? "f32" : "f64",
           e.n, e.c, e.h, e.w, e.fh, e.fw, int(bias), int(relu));
  auto kern = sizeof(T) == 4 ? conv_transpose_epilogue_f32 : conv_transpose_epilogue_f64;
  for (bool small : {false, true}) {
    std::vector<T> y(ny, T(-7));
    std::vector<T> zin(z);
    const bool in_place = e.fh == 1 && e.fw == 1;
    p.z = addr(zin.data()), p.y = in_place ? addr(zin.data()) : addr(y.data());
    const unsigned threads = small ? 32 : kThreads;
    emu::launch(kern, dim3(small ? 1 : unsigned((ny + threads - 1) / threads)), dim3(threads), 0, p);
    const std::string label = std::string(what) + (in_place ? " in place" : "") + (small ? " one warp" : "");
    expect_within(label, in_place ? zin : y, want, kExact);
    // -0 stays -0 without a bias or a ReLU (a copy), as in the CPU twin.
    if (!bias && !relu) expect(label + " copies bits", same_bits(in_place ? zin : y, want_t));
  }
}

template <class T>
void bias_grad_case(int n, int c, int hw) {
  const size_t total = size_t(n) * c * hw;
  std::vector<T> exact(total), uniform = rng.uniform<T>(total);
  for (auto& v : exact) v = T(double(long(rng() % 65) - 32) / 8);
  auto sums = [&](const std::vector<T>& dy, std::vector<double>& s, std::vector<double>& mag) {
    s.assign(c, 0), mag.assign(c, 0);
    for (int i = 0; i < n; ++i)
      for (int ch = 0; ch < c; ++ch)
        for (int q = 0; q < hw; ++q) {
          const double v = dy[(size_t(i) * c + ch) * hw + q];
          s[ch] += v, mag[ch] += std::fabs(v);
        }
  };
  std::vector<double> want_exact, want_uniform, mag;
  sums(exact, want_exact, mag);
  sums(uniform, want_uniform, mag);
  double scale = 0;
  for (double m : mag) scale = std::max(scale, m);
  auto kern = sizeof(T) == 4 ? conv_transpose_bias_grad_f32 : conv_transpose_bias_grad_f64;
  char what[120];
  snprintf(what, sizeof what, "%s bias grad n=%d c=%d hw=%d", sizeof(T) == 4 ? "f32" : "f64", n, c, hw);
  for (unsigned threads : {unsigned(kThreads), 32u}) {
    const std::string label = std::string(what) + ", " + std::to_string(threads) + " threads";
    std::vector<T> db(c, T(NAN));
    ConvTransposeBiasGradParams p{addr(exact.data()), addr(db.data()), hw, n, c};
    emu::launch(kern, dim3(c), dim3(threads), 0, p);
    expect_within(label + " (exact sums)", db, want_exact, kExact);
    std::fill(db.begin(), db.end(), T(NAN));
    p.dy = addr(uniform.data());
    emu::launch(kern, dim3(c), dim3(threads), 0, p);
    check(label + " (uniform, vs double)", want_uniform, db, TolForward<T>, scale);
  }
}

template <class T>
void test_all(const char* name) {
  printf("%s\n", name);
  const int before = failures;
  const EpilogueCase cases[] = {
      {2, 3, 4, 5, 2, 2}, {1, 4, 7, 3, 2, 2}, {2, 2, 3, 4, 3, 2}, {1, 3, 5, 2, 1, 4}, {2, 3, 5, 7, 1, 1}, {3, 1, 1, 1, 1, 1},
  };
  for (const EpilogueCase& e : cases)
    for (bool bias : {false, true})
      for (bool relu : {false, true}) epilogue_case<T>(e, bias, relu);
  bias_grad_case<T>(2, 3, 100);
  bias_grad_case<T>(3, 2, 784);
  bias_grad_case<T>(1, 5, 1);
  bias_grad_case<T>(2, 4, 256);
  printf("  %s\n", failures == before ? "ok" : "FAIL");
}

int main() {
  width = 60;
  test_all<float>("convtranspose f32");
  test_all<double>("convtranspose f64");
  return finish("convtranspose_emu_test");
}
