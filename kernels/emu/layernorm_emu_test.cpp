// Emulated runs (see emu.h) of kernels/layernorm.cu: every kernel (the
// forward, bwd_dx and bwd_params of the warp kernels row1k and row4k and of
// the block kernels v16b and scalar, and colsum) on small shapes, C = 1, 3,
// 32, 256 (DETR's d_model), 512, 1030 and 1032, 13 rows (not a multiple of
// a warp kernel's 8) and 1, float32 and float64, with and without gamma and
// beta, and a row holding a NaN, against a double-precision reference with
// autograd's TolForward32 / TolForward64. Also, bit for bit, what the
// kernels promise each other: the grid does not change a result (the
// grid-stride loops), row1k and row4k and a one-warp block kernel add in the
// same order, and rows that are not 16-byte aligned (read element by
// element) give the aligned rows' results. Exits non-zero on a failure.
#include "emu.h"
#include "harness.h"
// clang-format off
#include "../layernorm.cu"
// clang-format on
#include <random>
#include <string>

using stheno::ln::ColSumParams;
using stheno::ln::kColSumWarps;
using stheno::ln::kWarps;
using stheno::ln::LayerNormParams;

using namespace harness;

// The double-precision reference of a case.
struct Ref {
  std::vector<double> y, dx, dgamma, dbeta;
};

template <class T>
Ref reference(int rows, int c, double eps, const std::vector<T>& x, const T* gamma, const T* beta,
              const std::vector<T>& dy) {
  Ref r;
  r.y.resize(size_t(rows) * c), r.dx.resize(size_t(rows) * c);
  r.dgamma.assign(c, 0), r.dbeta.assign(c, 0);
  for (int i = 0; i < rows; ++i) {
    const T* xr = &x[size_t(i) * c];
    const T* dr = &dy[size_t(i) * c];
    double mean = 0, var = 0;
    for (int j = 0; j < c; ++j) mean += xr[j];
    mean /= c;
    for (int j = 0; j < c; ++j) var += (xr[j] - mean) * (xr[j] - mean);
    var /= c;
    // eps as the kernels add it: rounded to T first.
    const double rstd = 1 / std::sqrt(var + double(T(eps)));
    double a = 0, b = 0;
    std::vector<double> xh(c), g(c);
    for (int j = 0; j < c; ++j) {
      xh[j] = (xr[j] - mean) * rstd;
      g[j] = gamma ? double(dr[j]) * gamma[j] : dr[j];
      a += g[j], b += g[j] * xh[j];
      r.y[size_t(i) * c + j] = xh[j] * (gamma ? double(gamma[j]) : 1.0) + (beta ? double(beta[j]) : 0.0);
      r.dgamma[j] += dr[j] * xh[j];
      r.dbeta[j] += dr[j];
    }
    for (int j = 0; j < c; ++j) r.dx[size_t(i) * c + j] = rstd * (g[j] - a / c - xh[j] * (b / c));
  }
  return r;
}

template <class T>
using RowKernel = void (*)(LayerNormParams);

// The kernels of one design, for T.
template <class T>
struct Design {
  const char* name;
  RowKernel<T> fwd, dx, params;
  bool warp;        // a warp per row (blocks of kWarps warps)
  int row_bytes;    // warp kernels: the longest row
  bool vec;         // units of a 16-byte chunk
};

template <class T>
std::vector<Design<T>> designs() {
  constexpr bool f = sizeof(T) == 4;
  return {
      {"warp_row1k", f ? (RowKernel<T>)layernorm_fwd_warp_row1k_f32 : (RowKernel<T>)layernorm_fwd_warp_row1k_f64,
       f ? (RowKernel<T>)layernorm_bwd_dx_warp_row1k_f32 : (RowKernel<T>)layernorm_bwd_dx_warp_row1k_f64,
       f ? (RowKernel<T>)layernorm_bwd_params_warp_row1k_f32 : (RowKernel<T>)layernorm_bwd_params_warp_row1k_f64, true,
       stheno::ln::kRow1kBytes, true},
      {"warp_row4k", f ? (RowKernel<T>)layernorm_fwd_warp_row4k_f32 : (RowKernel<T>)layernorm_fwd_warp_row4k_f64,
       f ? (RowKernel<T>)layernorm_bwd_dx_warp_row4k_f32 : (RowKernel<T>)layernorm_bwd_dx_warp_row4k_f64,
       f ? (RowKernel<T>)layernorm_bwd_params_warp_row4k_f32 : (RowKernel<T>)layernorm_bwd_params_warp_row4k_f64, true,
       stheno::ln::kWarpRowBytes, true},
      {"block_v16b", f ? (RowKernel<T>)layernorm_fwd_block_v16b_f32 : (RowKernel<T>)layernorm_fwd_block_v16b_f64,
       f ? (RowKernel<T>)layernorm_bwd_dx_block_v16b_f32 : (RowKernel<T>)layernorm_bwd_dx_block_v16b_f64,
       f ? (RowKernel<T>)layernorm_bwd_params_block_v16b_f32 : (RowKernel<T>)layernorm_bwd_params_block_v16b_f64,
       false, 0, true},
      {"block", f ? (RowKernel<T>)layernorm_fwd_block_f32 : (RowKernel<T>)layernorm_fwd_block_f64,
       f ? (RowKernel<T>)layernorm_bwd_dx_block_f32 : (RowKernel<T>)layernorm_bwd_dx_block_f64,
       f ? (RowKernel<T>)layernorm_bwd_params_block_f32 : (RowKernel<T>)layernorm_bwd_params_block_f64, false, 0,
       false},
  };
}

template <class T>
void (*colsum_kernel())(ColSumParams) {
  return sizeof(T) == 4 ? (void (*)(ColSumParams))layernorm_colsum_f32 : (void (*)(ColSumParams))layernorm_colsum_f64;
}

// A launch of a design: its grid for the row kernels (rows per block) and
// the block's threads.
struct Launch {
  int threads;  // the block kernels' block
  int grid;     // fwd and dx: blocks (the grid-stride loops take the rest)
  int blocks;   // bwd_params: the partial rows
};

// The block kernels' threads as kernels.NewLayerNormParams chooses them.
static int default_threads(int units) { return 32 * std::min(std::max((units + 127) / 128, 1), 32); }

template <class T>
struct Outputs {
  std::vector<T> y, dx, dgamma, dbeta;
};

// Runs design d's kernels on x, dy with gamma, beta (either may be null),
// with the launch l; x, dy, y and dx start at element `skew` of their
// buffers (1: rows not 16-byte aligned).
template <class T>
Outputs<T> run(const Design<T>& d, const Launch& l, int rows, int c, double eps, const std::vector<T>& x,
               const T* gamma, const T* beta, const std::vector<T>& dy, int skew) {
  const size_t n = size_t(rows) * c;
  std::vector<T> xb(n + skew), dyb(n + skew), yb(n + skew, T(NAN)), dxb(n + skew, T(NAN));
  std::copy(x.begin(), x.end(), xb.begin() + skew);
  std::copy(dy.begin(), dy.end(), dyb.begin() + skew);
  const dim3 block(d.warp ? kWarps * 32 : l.threads);
  LayerNormParams p{};
  p.x = addr(xb.data() + skew), p.gamma = addr(gamma), p.beta = addr(beta), p.dy = addr(dyb.data() + skew);
  p.rows = rows, p.eps = eps, p.c = c;
  p.out = addr(yb.data() + skew);
  emu::launch(d.fwd, dim3(l.grid), block, 0, p);
  p.out = addr(dxb.data() + skew);
  emu::launch(d.dx, dim3(l.grid), block, 0, p);
  Outputs<T> o;
  o.y.assign(yb.begin() + skew, yb.end()), o.dx.assign(dxb.begin() + skew, dxb.end());
  p.dgamma = gamma != nullptr, p.dbeta = beta != nullptr;
  const int sums = p.dgamma + p.dbeta;
  if (sums > 0) {
    std::vector<T> partial(size_t(l.blocks) * sums * c, T(NAN)), out(size_t(sums) * c, T(NAN));
    p.out = addr(partial.data());
    emu::launch(d.params, dim3(l.blocks), block, 0, p);
    ColSumParams cp{addr(partial.data()), addr(out.data()), l.blocks, sums * c, 0};
    emu::launch(colsum_kernel<T>(), dim3((sums * c + 31) / 32), dim3(kColSumWarps * 32), 0, cp);
    if (gamma) o.dgamma.assign(out.begin(), out.begin() + c);
    if (beta) o.dbeta.assign(out.end() - c, out.end());
  }
  return o;
}

template <class T>
bool same(const Outputs<T>& a, const Outputs<T>& b, bool params) {
  bool ok = same_bits(a.y, b.y) && same_bits(a.dx, b.dx);
  if (params) ok = ok && same_bits(a.dgamma, b.dgamma) && same_bits(a.dbeta, b.dbeta);
  return ok;
}

template <class T>
void test_shape(int rows, int c, bool nan_row, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> u(-1, 1);
  const double eps = 1e-5;
  const size_t n = size_t(rows) * c;
  std::vector<T> x(n), dy(n), gamma(c), beta(c);
  // Rows of different means and spreads. In float64, means far from zero
  // against the spread (what a one-pass variance would get wrong); in
  // float32, values of order 1, for which TolForward32 is stated (the
  // rounding of a float32 mean alone moves xhat by ulp(mean)*rstd). Every
  // row of two values or more has a standard deviation of half its scale
  // at least, so that rstd, which multiplies every rounding error of a
  // row, stays small.
  const double far = sizeof(T) == 8 ? 4 : 0.5;
  for (int i = 0; i < rows; ++i) {
    const double off = far * u(rng), scale = sizeof(T) == 8 ? 0.25 + std::fabs(u(rng)) : 0.5 + 0.5 * std::fabs(u(rng));
    std::vector<double> v(c);
    for (double sd = 0; sd < 0.5;) {
      double m = 0, ss = 0;
      for (auto& e : v) e = u(rng), m += e;
      m /= c;
      for (double e : v) ss += (e - m) * (e - m);
      sd = c > 1 ? std::sqrt(ss / c) : 1;
    }
    for (int j = 0; j < c; ++j) x[size_t(i) * c + j] = T(off + scale * v[j]);
  }
  for (auto& v : dy) v = T(u(rng));
  for (auto& v : gamma) v = T(1 + 0.5 * u(rng));
  for (auto& v : beta) v = T(u(rng));
  if (nan_row) x[size_t(2) * c + c / 2] = T(NAN);
  constexpr int kN = 16 / sizeof(T);
  const Tol tol = TolForward<T>;
  Outputs<T> first_vec;  // the first vec design's outputs (gamma and beta), for the bit-for-bit checks
  bool have_vec = false;
  for (const Design<T>& d : designs<T>()) {
    if (d.vec && c % kN != 0) continue;
    if (d.warp && c * int(sizeof(T)) > d.row_bytes) continue;
    const int units = d.vec ? c / kN : c;
    std::vector<Launch> launches;
    if (d.warp) {
      const int grid = (rows + kWarps - 1) / kWarps;
      launches = {{0, grid, std::min(grid, 1024)}, {0, 1, 1}};
    } else {
      launches = {{default_threads(units), rows, std::min(rows, 1024)}, {64, 3, 3}, {32, 1, 1}};
    }
    char tag[96];
    snprintf(tag, sizeof tag, "%s %s rows=%d c=%d%s", sizeof(T) == 4 ? "f32" : "f64", d.name, rows, c,
             nan_row ? " NaN row" : "");
    int before = failures;
    for (int affine = 0; affine < 4; ++affine) {
      const T* g = affine & 1 ? gamma.data() : nullptr;
      const T* b = affine & 2 ? beta.data() : nullptr;
      const Ref ref = reference(rows, c, eps, x, g, b, dy);
      Outputs<T> base;
      for (size_t li = 0; li < launches.size(); ++li) {
        const Launch& l = launches[li];
        const Outputs<T> o = run(d, l, rows, c, eps, x, g, b, dy, 0);
        char what[160];
        snprintf(what, sizeof what, "%s gamma=%d beta=%d threads=%d grid=%d blocks=%d", tag, g != nullptr,
                 b != nullptr, d.warp ? 32 : l.threads, l.grid, l.blocks);
        expect_within(std::string(what) + ": y", o.y.data(), ref.y, tol);
        expect_within(std::string(what) + ": dx", o.dx.data(), ref.dx, tol);
        if (g) expect_within(std::string(what) + ": dgamma", o.dgamma.data(), ref.dgamma, tol);
        if (b) expect_within(std::string(what) + ": dbeta", o.dbeta.data(), ref.dbeta, tol);
        if (li == 0) {
          base = o;
        } else if (d.warp || l.threads == launches[0].threads) {
          // Another grid, the same threads per row: the same bits for y and
          // dx (the column sums' blocks differ).
          expect(std::string(what) + ": y and dx bit for bit as grid=" + std::to_string(launches[0].grid),
                 same(o, base, false));
        }
        if (li == 0 && d.vec) {
          // Rows that are not 16-byte aligned: the same chunks element by
          // element, the same bits.
          const Outputs<T> sk = run(d, l, rows, c, eps, x, g, b, dy, 1);
          expect(std::string(what) + ": misaligned rows bit for bit", same(sk, o, true));
        }
        // The warp kernels and a one-warp vec block kernel add in one
        // order: y and dx bit for bit.
        if (affine == 3 && d.vec && (d.warp || l.threads == 32)) {
          if (!have_vec) {
            first_vec = o, have_vec = true;
          } else {
            expect(std::string(what) + ": y and dx bit for bit as the first 32-thread order", same(o, first_vec, false));
          }
        }
      }
    }
    printf("  %-48s %s\n", tag, failures == before ? "ok" : "FAIL");
  }
}

template <class T>
void test_all(const char* name) {
  printf("%s\n", name);
  std::mt19937_64 rng(26);
  for (int c : {1, 3, 32, 256, 512, 1030, 1032}) {
    test_shape<T>(13, c, false, rng);
    test_shape<T>(1, c, false, rng);
  }
  for (int c : {3, 256, 1030}) test_shape<T>(13, c, true, rng);
}

// colsum on its own: more rows than its warps, columns that are not a
// multiple of 32, against a sum in double.
template <class T>
void test_colsum(const char* name) {
  printf("%s\n", name);
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> u(-1, 1);
  const int before = failures;
  for (int rows : {1, 5, 8, 37}) {
    for (int cols : {1, 31, 70}) {
      std::vector<T> in(size_t(rows) * cols), out(cols, T(NAN));
      std::vector<double> want(cols, 0);
      for (int r = 0; r < rows; ++r)
        for (int j = 0; j < cols; ++j) {
          in[size_t(r) * cols + j] = T(u(rng));
          want[j] += in[size_t(r) * cols + j];
        }
      ColSumParams p{addr(in.data()), addr(out.data()), rows, cols, 0};
      emu::launch(colsum_kernel<T>(), dim3((cols + 31) / 32), dim3(kColSumWarps * 32), 0, p);
      char what[64];
      snprintf(what, sizeof what, "colsum rows=%d cols=%d", rows, cols);
      expect_within(what, out.data(), want, TolForward<T>);
    }
  }
  printf("  colsum %s\n", failures == before ? "ok" : "FAIL");
}

int main() {
  test_all<float>("layernorm f32");
  test_all<double>("layernorm f64");
  test_colsum<float>("colsum f32");
  test_colsum<double>("colsum f64");
  return finish("layernorm_emu_test");
}
