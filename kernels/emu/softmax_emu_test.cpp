// Emulated runs (see emu.h) of the kernels of kernels/softmax.cu, float32
// and float64, softmax and log-softmax, forward and backward, against a
// double-precision reference computed from the same inputs. Every kernel
// that can run a shape runs it, with the launch ops would give its design
// (launch_of below mirrors softmaxPlanFor in ops/softmax_device.go): the warp
// kernels (element by element, and with 16-byte vectors where the rows
// allow them; with the lanes per row ops picks and with a whole warp), the
// lane kernels on rows of up to 32 vectors (bit for bit the warp's), the
// block kernels (on long rows, and on short ones too) and the inner
// kernels (on lines of stride inner > 1, and of stride 1). Shapes [rows, n,
// inner] cover n = 1, odd and short rows, rows of 16 (several rows a
// warp), rows at the warp kernels' limit, long rows, inner > 1 with a
// short and a long axis; some rows hold -inf, NaN or +inf, or only -inf.
// The outputs start as NaN and carry a guard zone past their end: every
// element must be written, and nothing past them; `make emu-test` also runs
// the harness under AddressSanitizer, which sees reads past the inputs.
// Tolerances (autograd/tolerance.go): TolForward32 for float32 and
// TolForward64 for float64 against the reference; a NaN must be where the
// reference has one. Exits non-zero on a failure.
#include "emu.h"
#include "harness.h"
// clang-format off
#include "../softmax.cu"
// clang-format on
#include <random>
#include <string>

using namespace harness;

static Rng rng(26);

static int next_pow2(int64_t v) {
  int p = 1;
  while (p < v) p *= 2;
  return p;
}

// A kernel and its launch.
struct Launch {
  void (*k)(stheno::SoftmaxParams);
  dim3 grid, block;
  size_t smem;
  int lanes;
  std::string name;
};

enum Design { kWarp, kBlock, kInner, kLane };

template <class T>
struct Kernels;
template <>
struct Kernels<float> {
  static constexpr void (*fwd[4][2])(stheno::SoftmaxParams) = {
      {softmax_fwd_warp_f32, softmax_fwd_warp_v16b_f32},
      {softmax_fwd_block_f32, softmax_fwd_block_v16b_f32},
      {softmax_fwd_inner_f32, softmax_fwd_inner_f32},
      {softmax_fwd_lane_f32, softmax_fwd_lane_v16b_f32}};
  static constexpr void (*bwd[4][2])(stheno::SoftmaxParams) = {
      {softmax_bwd_warp_f32, softmax_bwd_warp_v16b_f32},
      {softmax_bwd_block_f32, softmax_bwd_block_v16b_f32},
      {softmax_bwd_inner_f32, softmax_bwd_inner_f32},
      {softmax_bwd_lane_f32, softmax_bwd_lane_v16b_f32}};
};
template <>
struct Kernels<double> {
  static constexpr void (*fwd[4][2])(stheno::SoftmaxParams) = {
      {softmax_fwd_warp_f64, softmax_fwd_warp_v16b_f64},
      {softmax_fwd_block_f64, softmax_fwd_block_v16b_f64},
      {softmax_fwd_inner_f64, softmax_fwd_inner_f64},
      {softmax_fwd_lane_f64, softmax_fwd_lane_v16b_f64}};
  static constexpr void (*bwd[4][2])(stheno::SoftmaxParams) = {
      {softmax_bwd_warp_f64, softmax_bwd_warp_v16b_f64},
      {softmax_bwd_block_f64, softmax_bwd_block_v16b_f64},
      {softmax_bwd_inner_f64, softmax_bwd_inner_f64},
      {softmax_bwd_lane_f64, softmax_bwd_lane_v16b_f64}};
};

// The launch of design d (vec: 16-byte vectors), as ops' softmaxPlanFor
// gives it: warp, lanes per row the power of two that covers the row's
// vectors (lanes <= 0), kWarpThreads threads; block, a thread per 4
// vectors (a power of two, 128 to kMaxThreads); inner, threadIdx.y
// splitting the axis while the grid is small, up to 16.
template <class T>
Launch launch_of(Design d, bool vec, bool backward, int64_t rows, int n, int64_t inner, int lanes = 0) {
  const int esize = sizeof(T), v = vec ? 16 / esize : 1, nv = n / v;
  auto k = (backward ? Kernels<T>::bwd : Kernels<T>::fwd)[d][vec ? 1 : 0];
  const char* pass = backward ? "bwd" : "fwd";
  const char* vs = vec ? "_v16b" : "";
  char name[96];
  if (d == kWarp || d == kLane) {
    if (lanes <= 0) lanes = std::min(32, next_pow2(nv));
    const int64_t per_block = stheno::kWarpThreads / 32 * (32 / lanes);
    snprintf(name, sizeof name, "%s_%s%s lanes=%d", pass, d == kLane ? "lane" : "warp", vs, lanes);
    return Launch{k, dim3(unsigned((rows + per_block - 1) / per_block)), dim3(stheno::kWarpThreads), 0, lanes, name};
  }
  if (d == kBlock) {
    const int threads = std::min(stheno::kMaxThreads, std::max(128, next_pow2((nv + 3) / 4)));
    snprintf(name, sizeof name, "%s_block%s threads=%d", pass, vs, threads);
    return Launch{k, dim3(unsigned(rows)), dim3(threads), size_t(32 * esize), 0, name};
  }
  const int64_t lines = rows * inner;
  int by = 1;
  while (by < 16 && 2 * by <= n && lines * by < (int64_t(1) << 18)) by *= 2;
  int bx = std::max(32, 256 / by);
  bx = std::min(bx, std::max(32, next_pow2(lines)));
  snprintf(name, sizeof name, "%s_inner %dx%d", pass, bx, by);
  return Launch{k, dim3(unsigned((lines + bx - 1) / bx)), dim3(bx, by), size_t(bx * by * esize), 0, name};
}

// The reference in double: y from x (forward), dx from y and dy
// (backward), line by line, NaN kept by the max as the kernels keep it.
static void reference(const std::vector<double>& x, std::vector<double>& y, int64_t rows, int n, int64_t inner,
                      bool log) {
  y.assign(x.size(), 0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < inner; ++i) {
      const int64_t f = r * n * inner + i;
      double m = -INFINITY, s = 0;
      for (int k = 0; k < n; ++k) {
        const double v = x[f + k * inner];
        m = v > m || v != v ? v : m;
      }
      for (int k = 0; k < n; ++k) s += std::exp(x[f + k * inner] - m);
      for (int k = 0; k < n; ++k) {
        const double d = x[f + k * inner] - m;
        y[f + k * inner] = log ? d - std::log(s) : std::exp(d) / s;
      }
    }
}
static void reference_grad(const std::vector<double>& y, const std::vector<double>& dy, std::vector<double>& dx,
                           int64_t rows, int n, int64_t inner, bool log) {
  dx.assign(y.size(), 0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < inner; ++i) {
      const int64_t f = r * n * inner + i;
      double s = 0;
      for (int k = 0; k < n; ++k) s += log ? dy[f + k * inner] : dy[f + k * inner] * y[f + k * inner];
      for (int k = 0; k < n; ++k) {
        const int64_t j = f + k * inner;
        dx[j] = log ? dy[j] - std::exp(y[j]) * s : y[j] * (dy[j] - s);
      }
    }
}

// Values of T, as doubles.
template <class T>
std::vector<double> rounded(const std::vector<double>& v) {
  std::vector<double> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = double(T(v[i]));
  return r;
}

// Runs l on the inputs (x, or y and dy) and checks its output against
// want, and that it wrote no element past the output's end. Returns the
// output.
template <class T>
std::vector<double> run(const Launch& l, const std::string& label, bool backward, const std::vector<double>& a,
         const std::vector<double>& b, const std::vector<double>& want, int64_t rows, int n, int64_t inner, bool log) {
  constexpr size_t kGuard = 64;
  const size_t total = a.size();
  std::vector<T> ta(a.begin(), a.end()), tb(b.begin(), b.end());
  std::vector<T> out(total + kGuard, std::numeric_limits<T>::quiet_NaN());
  for (size_t i = total; i < out.size(); ++i) out[i] = T(12345);
  stheno::SoftmaxParams p{};
  p.x = reinterpret_cast<uint64_t>(ta.data());
  p.dy = backward ? reinterpret_cast<uint64_t>(tb.data()) : 0;
  p.out = reinterpret_cast<uint64_t>(out.data());
  p.rows = rows, p.inner = inner, p.n = n, p.log = log ? 1 : 0, p.lanes = l.lanes;
  emu::launch(l.k, l.grid, l.block, l.smem, p);
  std::vector<double> got(out.begin(), out.begin() + total);
  check(label + " " + l.name, want, got, TolForward<T>);
  bool guard = true;
  for (size_t i = total; i < out.size(); ++i) guard = guard && out[i] == T(12345);
  if (!guard) expect_line(label + " " + l.name + ": nothing written past the end", false);
  return got;
}


// Special values in some lines: line 0 gets a -inf, line 1 a NaN, line 2
// only -inf, line 3 a +inf and a -inf (where the lines exist and have
// room: a line of one element takes only the first).
static void specials(std::vector<double>& x, int64_t rows, int n, int64_t inner) {
  const int64_t lines = rows * inner;
  auto at = [&](int64_t line, int k) -> double& {
    const int64_t r = line / inner, i = line % inner;
    return x[r * n * inner + i + int64_t(k) * inner];
  };
  if (lines > 4 && n > 1) at(0, n / 2) = -INFINITY;
  if (lines > 4) at(1, n - 1) = NAN;
  if (lines > 4)
    for (int k = 0; k < n; ++k) at(2, k) = -INFINITY;
  if (lines > 4 && n > 2) at(3, 1) = INFINITY, at(3, 0) = -INFINITY;
}

template <class T>
void run_case(int64_t rows, int n, int64_t inner, bool special) {
  const int esize = sizeof(T), v16 = 16 / esize;
  printf("[%lld, %d, %lld] %s%s\n", (long long)rows, n, (long long)inner, sizeof(T) == 4 ? "f32" : "f64",
         special ? ", with -inf, NaN, +inf" : "");
  const size_t total = size_t(rows) * n * inner;
  std::vector<double> x(total), dy(total);
  for (auto& e : x) e = rng.U(-6, 6);
  for (auto& e : dy) e = rng.U(-1, 1);
  if (special) specials(x, rows, n, inner);
  x = rounded<T>(x), dy = rounded<T>(dy);
  // Which kernels can run the shape: warp and block on rows (inner == 1;
  // warp up to its register capacity, lane up to 32 vectors), inner on any; vectors where every
  // row starts 16-byte aligned.
  std::vector<std::pair<Design, bool>> designs;
  if (inner == 1) {
    for (int vec = 0; vec < 2; ++vec) {
      if (vec && n % v16 != 0) continue;
      if (int64_t(n) * esize <= 32 * stheno::kLaneBytes) designs.push_back({kWarp, vec == 1});
      if (n / (vec ? v16 : 1) <= 32) designs.push_back({kLane, vec == 1});
      designs.push_back({kBlock, vec == 1});
    }
  }
  designs.push_back({kInner, false});
  for (int log = 0; log < 2; ++log) {
    const std::string op = log ? "log_softmax" : "softmax";
    std::pair<std::vector<double>, std::vector<double>> warp_out[4];
    std::vector<double> y, yT, dx;
    reference(x, y, rows, n, inner, log);
    // The backward's inputs: the forward's output in T, and dy.
    yT = rounded<T>(y);
    reference_grad(yT, dy, dx, rows, n, inner, log);
    for (auto [d, vec] : designs) {
      for (int backward = 0; backward < 2; ++backward) {
        const auto& want = backward ? dx : y;
        const auto& a = backward ? yT : x;
        Launch l = launch_of<T>(d, vec, backward, rows, n, inner);
        std::vector<double> got = run<T>(l, op, backward, a, dy, want, rows, n, inner, log);
        std::vector<double> got32;
        if ((d == kWarp || d == kLane) && l.lanes != 32) {
          got32 = run<T>(launch_of<T>(d, vec, backward, rows, n, inner, 32), op, backward, a, dy, want, rows, n,
                         inner, log);
        }
        // The lane kernels promise the warp kernels' bits: the same values,
        // NaN where the other has NaN.
        const int key = vec * 2 + backward;
        if (d == kWarp) warp_out[key] = {got, got32};
        if (d == kLane) {
          const auto& [warp, warp32] = warp_out[key];
          expect_line(op + " " + l.name + ": the warp kernel's bits", measure(got, warp, kExact).ok());
          expect_line(op + " " + l.name + " lanes=32: the warp kernel's bits", measure(got32, warp32, kExact).ok());
        }
      }
    }
  }
}

template <class T>
void cases() {
  run_case<T>(5, 1, 1, false);      // n = 1: y = 1 (log: 0), dx = 0
  run_case<T>(7, 3, 1, true);       // odd and short: 2 lanes a row, 16 rows a warp
  run_case<T>(37, 16, 1, true);     // 16: 4 lanes of one float4 (f64: 8 of a double2), rows past the last warp's
  run_case<T>(9, 300, 1, true);     // attention's rows
  run_case<T>(6, 301, 1, true);     // odd: element by element
  run_case<T>(3, 1024, 1, false);   // float32's warp limit; float64: block kernels
  run_case<T>(3, 1023, 1, false);
  run_case<T>(5, 2000, 1, true);    // long rows: block kernels, vectors
  run_case<T>(2, 4099, 1, false);   // long and odd
  run_case<T>(6, 5, 7, true);       // inner > 1
  run_case<T>(4, 1, 9, false);      // n = 1, inner > 1
  run_case<T>(2, 64, 300, true);    // large inner: threadIdx.y splits the axis
  run_case<T>(1, 3000, 2, false);   // long axis, two lines
}

int main() {
  width = 58;
  cases<float>();
  cases<double>();
  return finish("softmax_emu_test");
}
