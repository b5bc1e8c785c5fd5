// Emulated runs (see emu.h) of kernels/groupnorm.cu: the forward (stats,
// stats_rows and fwd) and the backward (bwd_reduce, bwd_finalize, bwd_dx,
// bwd_params) of the v16b and scalar kernels on small shapes (planes of one element, of a
// few, of more than a tile with a partial last tile; groups of one channel,
// of all of them, of more than a warp's 32), float32 and float64, with and
// without gamma and beta, and a row holding a NaN, against a
// double-precision reference with autograd's TolForward32 / TolForward64.
// Also, bit for bit, what the kernels promise: the grid does not change a
// result (the grid-stride loops), fwd's row statistics are stats_rows' (the
// same order of summation), and tensors that are not 16-byte aligned
// (read element by element) give the aligned tensors' results. Exits
// non-zero on a failure.
#include "emu.h"
#include "harness.h"
// clang-format off
#include "../groupnorm.cu"
// clang-format on
#include <random>
#include <string>

using stheno::gn::GroupNormParams;
using stheno::gn::kRowStats;
using stheno::gn::kThreads;
using stheno::gn::kTile;

using namespace harness;

struct Shape {
  int n, c, groups;
  int64_t hw;
};

// The double-precision reference: three passes per row.
struct Ref {
  std::vector<double> y, dx, dgamma, dbeta;
};

template <class T>
Ref reference(const Shape& s, double eps, const std::vector<T>& x, const T* gamma, const T* beta,
              const std::vector<T>& dy) {
  const int cpg = s.c / s.groups;
  const int64_t len = cpg * s.hw;
  Ref r;
  r.y.resize(x.size()), r.dx.resize(x.size());
  r.dgamma.assign(s.c, 0), r.dbeta.assign(s.c, 0);
  for (int64_t row = 0; row < int64_t(s.n) * s.groups; ++row) {
    const int64_t o = row * len;
    // The mean, then its correction by the mean deviation from it: a
    // plain sum of a long row of values far from zero is off by more than
    // float64's tolerance.
    double mean = 0, var = 0, fix = 0;
    for (int64_t j = 0; j < len; ++j) mean += x[o + j];
    mean /= double(len);
    for (int64_t j = 0; j < len; ++j) fix += x[o + j] - mean;
    mean += fix / double(len);
    for (int64_t j = 0; j < len; ++j) var += (x[o + j] - mean) * (x[o + j] - mean);
    var /= double(len);
    const double rstd = 1 / std::sqrt(var + eps);
    double a = 0, b = 0;
    std::vector<double> xh(len), g(len);
    for (int64_t j = 0; j < len; ++j) {
      const int ch = int((row * cpg + j / s.hw) % s.c);
      xh[j] = (x[o + j] - mean) * rstd;
      g[j] = gamma ? double(dy[o + j]) * gamma[ch] : dy[o + j];
      a += g[j], b += g[j] * xh[j];
      r.y[o + j] = xh[j] * (gamma ? double(gamma[ch]) : 1.0) + (beta ? double(beta[ch]) : 0.0);
      r.dgamma[ch] += dy[o + j] * xh[j];
      r.dbeta[ch] += dy[o + j];
    }
    for (int64_t j = 0; j < len; ++j) r.dx[o + j] = rstd * (g[j] - a / len - xh[j] * (b / len));
  }
  return r;
}

template <class T>
using Kernel = void (*)(GroupNormParams);

// The tile kernels of one design, for T.
template <class T>
struct Design {
  const char* name;
  Kernel<T> stats, fwd, reduce, dx;
  int vec;  // elements of a unit
};

template <class T>
Design<T> design(bool v16b) {
  constexpr bool f = sizeof(T) == 4;
  if (v16b) {
    return {"v16b", f ? (Kernel<T>)groupnorm_stats_v16b_f32 : (Kernel<T>)groupnorm_stats_v16b_f64,
            f ? (Kernel<T>)groupnorm_fwd_v16b_f32 : (Kernel<T>)groupnorm_fwd_v16b_f64,
            f ? (Kernel<T>)groupnorm_bwd_reduce_v16b_f32 : (Kernel<T>)groupnorm_bwd_reduce_v16b_f64,
            f ? (Kernel<T>)groupnorm_bwd_dx_v16b_f32 : (Kernel<T>)groupnorm_bwd_dx_v16b_f64, 16 / int(sizeof(T))};
  }
  return {"scalar", f ? (Kernel<T>)groupnorm_stats_scalar_f32 : (Kernel<T>)groupnorm_stats_scalar_f64,
          f ? (Kernel<T>)groupnorm_fwd_scalar_f32 : (Kernel<T>)groupnorm_fwd_scalar_f64,
          f ? (Kernel<T>)groupnorm_bwd_reduce_scalar_f32 : (Kernel<T>)groupnorm_bwd_reduce_scalar_f64,
          f ? (Kernel<T>)groupnorm_bwd_dx_scalar_f32 : (Kernel<T>)groupnorm_bwd_dx_scalar_f64, 1};
}

template <class T>
Kernel<T> finalize_kernel() {
  return sizeof(T) == 4 ? (Kernel<T>)groupnorm_bwd_finalize_f32 : (Kernel<T>)groupnorm_bwd_finalize_f64;
}
template <class T>
Kernel<T> stats_rows_kernel() {
  return sizeof(T) == 4 ? (Kernel<T>)groupnorm_stats_rows_f32 : (Kernel<T>)groupnorm_stats_rows_f64;
}
template <class T>
Kernel<T> params_kernel() {
  return sizeof(T) == 4 ? (Kernel<T>)groupnorm_bwd_params_f32 : (Kernel<T>)groupnorm_bwd_params_f64;
}

template <class T>
struct Outputs {
  std::vector<T> y, dx, dgamma, dbeta;
};

// Runs design d's kernels on x, dy with gamma, beta (either may be null),
// the tile kernels on grid blocks (0: one per tile) and bwd_finalize on
// rgrid, the forward's row statistics by stats_rows first when rows_first;
// x, dy, y and dx start at element `skew` of their buffers (1: not 16-byte
// aligned).
template <class T>
Outputs<T> run(const Design<T>& d, const Shape& s, double eps, const std::vector<T>& x, const T* gamma,
               const T* beta, const std::vector<T>& dy, int64_t grid, int rgrid, int skew, bool rows_first = false) {
  const size_t n = x.size();
  std::vector<T> xb(n + skew), dyb(n + skew), yb(n + skew, T(NAN)), dxb(n + skew, T(NAN));
  std::copy(x.begin(), x.end(), xb.begin() + skew);
  std::copy(dy.begin(), dy.end(), dyb.begin() + skew);
  GroupNormParams p{};
  p.n = s.n, p.c = s.c, p.groups = s.groups, p.hw = s.hw, p.eps = eps;
  p.tiles = int((s.hw + kTile - 1) / kTile);
  const int64_t blocks = int64_t(s.n) * s.c * p.tiles;
  if (grid == 0) grid = blocks;
  const int64_t rows = int64_t(s.n) * s.groups;
  std::vector<double> partial(size_t(blocks) * 4, NAN);
  std::vector<T> sums(size_t(rows) * kRowStats * 2 + size_t(s.n) * s.c * 4, T(NAN));
  p.x = addr(xb.data() + skew), p.gamma = addr(gamma), p.beta = addr(beta), p.dy = addr(dyb.data() + skew);
  p.partial = addr(partial.data()), p.sums = 0;
  p.out = addr(yb.data() + skew);
  emu::launch(d.stats, dim3(unsigned(grid)), dim3(kThreads), 0, p);
  std::vector<double> row_stats(size_t(rows) * 2, NAN);
  if (rows_first) {
    p.sums = addr(row_stats.data());
    emu::launch(stats_rows_kernel<T>(), dim3(rgrid), dim3(32), 0, p);
  }
  emu::launch(d.fwd, dim3(unsigned(grid)), dim3(kThreads), 0, p);
  p.sums = addr(sums.data());
  std::fill(partial.begin(), partial.end(), NAN);
  emu::launch(d.reduce, dim3(unsigned(grid)), dim3(kThreads), 0, p);
  emu::launch(finalize_kernel<T>(), dim3(rgrid), dim3(32), 0, p);
  p.out = addr(dxb.data() + skew);
  emu::launch(d.dx, dim3(unsigned(grid)), dim3(kThreads), 0, p);
  Outputs<T> o;
  o.y.assign(yb.begin() + skew, yb.end()), o.dx.assign(dxb.begin() + skew, dxb.end());
  p.dgamma = gamma != nullptr, p.dbeta = beta != nullptr;
  const int nsums = p.dgamma + p.dbeta;
  if (nsums > 0) {
    std::vector<T> out(size_t(nsums) * s.c, T(NAN));
    p.out = addr(out.data());
    emu::launch(params_kernel<T>(), dim3((s.c + kThreads - 1) / kThreads), dim3(kThreads), 0, p);
    if (gamma) o.dgamma.assign(out.begin(), out.begin() + s.c);
    if (beta) o.dbeta.assign(out.end() - s.c, out.end());
  }
  return o;
}

template <class T>
bool same(const Outputs<T>& a, const Outputs<T>& b) {
  return same_bits(a.y, b.y) && same_bits(a.dx, b.dx) && same_bits(a.dgamma, b.dgamma) &&
         same_bits(a.dbeta, b.dbeta);
}

template <class T>
void test_shape(const Shape& s, bool nan_row, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> u(-1, 1);
  const double eps = 1e-5;
  const size_t n = size_t(s.n) * s.c * s.hw;
  std::vector<T> x(n), dy(n), gamma(s.c), beta(s.c);
  // Rows of different means and spreads; in float64, means far from zero
  // against the spread (what an unshifted one-pass variance gets wrong).
  const int64_t len = s.c / s.groups * s.hw;
  const double far = sizeof(T) == 8 ? 1e3 : 2;
  for (int64_t row = 0; row < int64_t(s.n) * s.groups; ++row) {
    const double off = far * u(rng), scale = 0.5 + 0.5 * std::fabs(u(rng));
    for (int64_t j = 0; j < len; ++j) x[row * len + j] = T(off + scale * u(rng));
  }
  for (auto& v : dy) v = T(u(rng));
  for (auto& v : gamma) v = T(1 + 0.5 * u(rng));
  for (auto& v : beta) v = T(u(rng));
  if (nan_row) x[len + len / 2] = T(NAN);  // row 1
  const bool v16b_ok = s.hw % (16 / int(sizeof(T))) == 0;
  for (int g = 0; g < 4; ++g) {
    const T* gm = (g & 1) ? gamma.data() : nullptr;
    const T* bt = (g & 2) ? beta.data() : nullptr;
    const Ref ref = reference(s, eps, x, gm, bt, dy);
    for (bool v16b : {true, false}) {
      if (v16b && !v16b_ok) continue;
      const Design<T> d = design<T>(v16b);
      char tag[160];
      snprintf(tag, sizeof tag, "%s n=%d c=%d groups=%d hw=%lld gamma=%d beta=%d%s", d.name, s.n, s.c, s.groups,
               (long long)s.hw, gm != nullptr, bt != nullptr, nan_row ? " nan" : "");
      const int before = failures;
      const Outputs<T> o = run(d, s, eps, x, gm, bt, dy, 0, int(s.n * s.groups), 0);
      expect_within(std::string(tag) + ": y", o.y, ref.y, TolForward<T>);
      expect_within(std::string(tag) + ": dx", o.dx, ref.dx, TolForward<T>);
      if (gm) expect_within(std::string(tag) + ": dgamma", o.dgamma, ref.dgamma, TolForward<T>);
      if (bt) expect_within(std::string(tag) + ": dbeta", o.dbeta, ref.dbeta, TolForward<T>);
      // Fewer blocks than tiles (the grid-stride loops), one block for
      // bwd_finalize, and unaligned tensors: the same bits.
      const Outputs<T> small = run(d, s, eps, x, gm, bt, dy, 3, 1, 0);
      expect(std::string(tag) + ": grid=3 bit for bit", same(o, small));
      // The forward's row statistics from stats_rows: the same bits.
      const Outputs<T> rows_first = run(d, s, eps, x, gm, bt, dy, 0, 2, 0, true);
      expect(std::string(tag) + ": stats_rows bit for bit", same(o, rows_first));
      if (v16b) {
        const Outputs<T> skew = run(d, s, eps, x, gm, bt, dy, 0, int(s.n * s.groups), 1);
        expect(std::string(tag) + ": unaligned bit for bit", same(o, skew));
      }
      printf("  %-64s %s\n", tag, failures == before ? "ok" : "FAIL");
    }
  }
}

template <class T>
void test_all(const char* name) {
  printf("%s\n", name);
  std::mt19937_64 rng(26);
  const Shape shapes[] = {
      {2, 6, 3, 5},      // scalar only: odd planes
      {2, 4, 2, 12},     // v16b in both dtypes
      {1, 4, 4, 1},      // one element a plane, a channel a group
      {3, 8, 1, 6},      // one group: all channels
      {1, 70, 2, 2},     // 35 channels a group: more than a warp's lanes
      {2, 2, 1, 4100},   // two tiles a plane, the second 4 elements
      {1, 3, 3, 4097},   // scalar, a tile and one element
  };
  for (const Shape& s : shapes) test_shape<T>(s, false, rng);
  test_shape<T>({2, 4, 2, 12}, true, rng);
  test_shape<T>({2, 6, 3, 5}, true, rng);
}

int main() {
  test_all<float>("groupnorm f32");
  test_all<double>("groupnorm f64");
  return finish("groupnorm_emu_test");
}
