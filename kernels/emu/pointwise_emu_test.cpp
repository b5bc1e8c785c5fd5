// Emulated runs (see emu.h) of kernels/pointwise.cu: the map kernels (by
// element and v16b, with a tail of n % 4 elements) and the bcast kernels
// (by element and v16b) for every opcode, float32 and float64, on
// broadcasts of a trailing vector, of ones on either side and of a middle
// dim; the sums: rows warp (rows of 1, 7, 300 and 1024), rows block (by
// element and v16b, one part and several, then the warp pass over the
// parts) and cols (one part and several, then the cols pass over the
// parts, columns fewer than a block's and more), against double-precision
// references with autograd's TolForward32 / TolForward64. Also, bit for
// bit: v16b gives the element kernels' results (the same order of
// additions), and a launch of fewer blocks than work (the grid-stride
// loops) the same as of enough. Exits non-zero on a failure.
#include "emu.h"
#include "harness.h"
// clang-format off
#include "../pointwise.cu"
// clang-format on
#include <random>
#include <string>

using stheno::pw::PointwiseParams;
using stheno::pw::ReduceParams;
namespace pw = stheno::pw;

using namespace harness;

static const char* kNames[] = {"scale", "relu", "sigmoid", "inverse_sigmoid", "exp", "log", "sqrt", "square",
                               "fill", "add", "sub", "mul", "div", "neg_div", "relu_grad", "sigmoid_grad",
                               "sqrt_grad", "square_grad", "inverse_sigmoid_grad"};
static_assert(sizeof(kNames) / sizeof(kNames[0]) == pw::kOps, "a name per opcode");

static int arity(int op) { return op == pw::kFill ? 0 : op < pw::kAdd ? 1 : 2; }

// The op in double, on operands rounded to T (alpha too).
static double reference(int op, double a, double b, double alpha) {
  switch (op) {
    case pw::kScale: return a * alpha;
    case pw::kReLU: return a <= 0 ? 0 : a;
    case pw::kSigmoid: return 1 / (1 + std::exp(-a));
    case pw::kInverseSigmoid: {
      const double c = std::min(std::max(a, 0.0), 1.0);
      return std::log(std::max(c, alpha) / std::max(1 - c, alpha));
    }
    case pw::kExp: return std::exp(a);
    case pw::kLog: return std::log(a);
    case pw::kSqrt: return std::sqrt(a);
    case pw::kSquare: return a * a;
    case pw::kFill: return alpha;
    case pw::kAdd: return a + b;
    case pw::kSub: return a - b;
    case pw::kMul: return a * b;
    case pw::kDiv: return a / b;
    case pw::kNegDiv: return -(a / b);
    case pw::kReLUGrad: return a <= 0 ? 0 : b;
    case pw::kSigmoidGrad: return b * (1 - a) * a;
    case pw::kSqrtGrad: return b / (2 * a);
    case pw::kSquareGrad: return b * 2 * a;
    case pw::kInverseSigmoidGrad: {
      // Inside (eps, 1 - eps), where the harness draws x: dy / (x (1 - x)).
      return b / (a * (1 - a));
    }
  }
  abort();
}

// Operands the op is defined and smooth on: a in (0, 1) for the logs,
// roots and sigmoid's inverse, signed elsewhere; b away from 0.
template <class T>
void draw(int op, std::mt19937_64& rng, std::vector<T>& a, std::vector<T>& b) {
  std::uniform_int_distribution<int> k(1, 15), sign(0, 1), kb(8, 32);
  const bool positive = op == pw::kLog || op == pw::kSqrt || op == pw::kSqrtGrad || op == pw::kInverseSigmoid ||
                        op == pw::kInverseSigmoidGrad || op == pw::kSigmoidGrad;
  for (auto& v : a) v = T(k(rng) / 16.0 * (positive || sign(rng) ? 1 : -1));
  for (auto& v : b) v = T(kb(rng) / 16.0 * (sign(rng) ? 1 : -1));
}

template <class T>
using PwKernel = void (*)(PointwiseParams);

template <class T>
PwKernel<T> map_kernel(bool vec) {
  if (sizeof(T) == 4) return (PwKernel<T>)(vec ? pointwise_map_v16b_f32 : pointwise_map_f32);
  return (PwKernel<T>)(vec ? pointwise_map_v16b_f64 : pointwise_map_f64);
}
template <class T>
PwKernel<T> bcast_kernel(bool vec) {
  if (sizeof(T) == 4) return (PwKernel<T>)(vec ? pointwise_bcast_v16b_f32 : pointwise_bcast_f32);
  return (PwKernel<T>)(vec ? pointwise_bcast_v16b_f64 : pointwise_bcast_f64);
}

template <class T>
void check_map(int op, int n) {
  const char* tn = sizeof(T) == 4 ? "f32" : "f64";
  constexpr int V = 16 / sizeof(T);
  std::mt19937_64 rng(op * 131 + n);
  std::vector<T> a(n), b(n);
  draw(op, rng, a, b);
  const double alpha = op == pw::kInverseSigmoid || op == pw::kInverseSigmoidGrad ? 1e-5 : -1.5;
  std::vector<double> want(n);
  for (int i = 0; i < n; ++i) want[i] = reference(op, a[i], b[i], double(T(alpha)));
  std::vector<T> first;
  for (int vec = 0; vec < 2; ++vec) {
    for (int grid : {1, 1000}) {
      std::vector<T> out(n, T(NAN));
      PointwiseParams p{};
      p.a = arity(op) >= 1 ? addr(a.data()) : 0, p.b = arity(op) >= 2 ? addr(b.data()) : 0;
      p.out = addr(out.data()), p.n = n, p.alpha = alpha, p.op = op, p.rank = 1;
      const int work = vec ? n / V : n;
      emu::launch(map_kernel<T>(vec), dim3(std::min(grid, std::max(1, (work + 63) / 64))), dim3(64), 0, p);
      char what[96];
      snprintf(what, sizeof what, "map%s %s %s n=%d grid=%d", vec ? "_v16b" : "", kNames[op], tn, n, grid);
      expect_within(what, out, want, TolForward<T>);
      if (first.empty()) {
        first = out;
      } else {
        expect(std::string(what) + " bits", same_bits(first, out));
      }
    }
  }
}

// A broadcast of out (dims outermost first, up to 6) from a and b of the
// same rank with ones where broadcast, collapsed as NewBroadcastParams
// does not bother to here: the kernels take any shape and strides.
struct Bcast {
  std::vector<int> out, a, b;
};

template <class T>
void check_bcast(int op, const Bcast& c) {
  const char* tn = sizeof(T) == 4 ? "f32" : "f64";
  constexpr int V = 16 / sizeof(T);
  const int r = int(c.out.size());
  auto count = [](const std::vector<int>& s) {
    int n = 1;
    for (int d : s) n *= d;
    return n;
  };
  auto strides = [&](const std::vector<int>& s) {
    std::vector<int64_t> st(r);
    int64_t acc = 1;
    for (int i = r - 1; i >= 0; --i) st[i] = s[i] == 1 ? 0 : acc, acc *= s[i];
    return st;
  };
  const int n = count(c.out);
  std::mt19937_64 rng(op * 7 + n);
  std::vector<T> a(count(c.a)), b(count(c.b));
  draw(op, rng, a, b);
  const auto sa = strides(c.a), sb = strides(c.b);
  const double alpha = op == pw::kInverseSigmoid || op == pw::kInverseSigmoidGrad ? 1e-5 : 0.75;
  std::vector<double> want(n);
  for (int i = 0; i < n; ++i) {
    int64_t oa = 0, ob = 0, rem = i;
    for (int d = r - 1; d >= 0; --d) {
      const int64_t k = rem % c.out[d];
      rem /= c.out[d];
      oa += k * sa[d], ob += k * sb[d];
    }
    want[i] = reference(op, a[oa], b[ob], double(T(alpha)));
  }
  PointwiseParams p{};
  p.a = arity(op) >= 1 ? addr(a.data()) : 0, p.b = arity(op) >= 2 ? addr(b.data()) : 0;
  p.n = n, p.alpha = alpha, p.op = op, p.rank = r;
  for (int d = 0; d < r; ++d) p.shape[d] = c.out[d], p.stride_a[d] = sa[d], p.stride_b[d] = sb[d];
  // v16b when the innermost dim holds whole vectors and each operand's
  // innermost stride is 0 or 1 with its other strides whole vectors.
  bool vec_ok = c.out[r - 1] % V == 0;
  for (const auto* st : {&sa, &sb}) {
    if ((*st)[r - 1] == 1) {
      for (int d = 0; d < r - 1; ++d) vec_ok = vec_ok && (*st)[d] % V == 0;
    }
  }
  std::vector<T> first;
  for (int vec = 0; vec < 1 + vec_ok; ++vec) {
    std::vector<T> out(n, T(NAN));
    p.out = addr(out.data());
    const int work = vec ? n / V : n;
    emu::launch(bcast_kernel<T>(vec), dim3(std::max(1, std::min(3, (work + 63) / 64))), dim3(64), 0, p);
    std::string what = std::string("bcast") + (vec ? "_v16b " : " ") + kNames[op] + " " + tn + " out=[";
    for (int d : c.out) what += std::to_string(d) + ",";
    what += "]";
    expect_within(what, out, want, TolForward<T>);
    if (first.empty()) {
      first = out;
    } else {
      expect(what + " bits", same_bits(first, out));
    }
  }
}

// The double sum of in [outer, r, inner] over r.
template <class T>
std::vector<double> sum_ref(const std::vector<T>& in, int outer, int r, int inner, double alpha) {
  std::vector<double> s(size_t(outer) * inner, 0);
  for (int o = 0; o < outer; ++o)
    for (int k = 0; k < r; ++k)
      for (int i = 0; i < inner; ++i) s[size_t(o) * inner + i] += in[(size_t(o) * r + k) * inner + i];
  for (auto& v : s) v *= alpha;
  return s;
}

template <class T>
using RedKernel = void (*)(ReduceParams);

template <class T>
RedKernel<T> rows_warp() {
  return sizeof(T) == 4 ? (RedKernel<T>)reduce_rows_warp_f32 : (RedKernel<T>)reduce_rows_warp_f64;
}
template <class T>
RedKernel<T> rows_block(bool vec) {
  if (sizeof(T) == 4) return (RedKernel<T>)(vec ? reduce_rows_block_v16b_f32 : reduce_rows_block_f32);
  return (RedKernel<T>)(vec ? reduce_rows_block_v16b_f64 : reduce_rows_block_f64);
}
template <class T>
RedKernel<T> cols_kernel() {
  return sizeof(T) == 4 ? (RedKernel<T>)reduce_cols_f32 : (RedKernel<T>)reduce_cols_f64;
}

static int next_pow2(int n) {
  int p = 1;
  while (p < n) p *= 2;
  return p;
}

// Rows [outer, r] summed: warp (r <= kReduceWarpRow) or block with parts
// of chunk elements and the warp pass over them.
template <class T>
void check_rows(int outer, int r, int chunk) {
  const char* tn = sizeof(T) == 4 ? "f32" : "f64";
  constexpr int V = 16 / sizeof(T);
  std::mt19937_64 rng(outer * 1000 + r);
  std::uniform_real_distribution<double> u(0, 1);
  std::vector<T> in(size_t(outer) * r);
  for (auto& v : in) v = T(u(rng));
  const double alpha = 0.5;
  const auto want = sum_ref(in, outer, r, 1, alpha);
  char what[96];
  if (r <= pw::kReduceWarpRow) {
    const int g = std::min(32, next_pow2(r));
    std::vector<T> out(outer, T(NAN));
    ReduceParams p{addr(in.data()), addr(out.data()), outer, r, 1, r, 1, alpha, g, 0};
    emu::launch(rows_warp<T>(), dim3((outer * g + pw::kReduceThreads - 1) / pw::kReduceThreads),
                dim3(pw::kReduceThreads), 0, p);
    snprintf(what, sizeof what, "rows_warp %s [%d %d] lanes=%d", tn, outer, r, g);
    expect_within(what, out, want, TolForward<T>);
    return;
  }
  const int parts = (r + chunk - 1) / chunk;
  std::vector<T> first;
  for (int vec = 0; vec < 1 + (r % V == 0 && chunk % V == 0); ++vec) {
    std::vector<T> partial(size_t(outer) * parts, T(NAN)), out(outer, T(NAN));
    ReduceParams p{addr(in.data()), addr(parts > 1 ? partial.data() : out.data()), outer, r, 1, chunk, parts,
                   parts > 1 ? 1.0 : alpha, 0, 0};
    emu::launch(rows_block<T>(vec), dim3(outer * parts), dim3(pw::kReduceThreads), 0, p);
    if (parts > 1) {
      const int g = std::min(32, next_pow2(parts));
      ReduceParams q{addr(partial.data()), addr(out.data()), outer, parts, 1, parts, 1, alpha, g, 0};
      emu::launch(rows_warp<T>(), dim3((outer * g + pw::kReduceThreads - 1) / pw::kReduceThreads),
                  dim3(pw::kReduceThreads), 0, q);
    }
    snprintf(what, sizeof what, "rows_block%s %s [%d %d] chunk=%d parts=%d", vec ? "_v16b" : "", tn, outer, r, chunk,
             parts);
    expect_within(what, out, want, TolForward<T>);
    if (first.empty()) {
      first = out;
    } else {
      expect(std::string(what) + " bits", same_bits(first, out));
    }
  }
}

// Columns [outer, r, inner] summed over r with bx threads across columns
// and parts of chunk rows, then the cols pass over the parts.
template <class T>
void check_cols(int outer, int r, int inner, int chunk) {
  const char* tn = sizeof(T) == 4 ? "f32" : "f64";
  std::mt19937_64 rng(outer * 1000 + r * 10 + inner);
  std::uniform_real_distribution<double> u(0, 1);
  std::vector<T> in(size_t(outer) * r * inner);
  for (auto& v : in) v = T(u(rng));
  const double alpha = 0.25;
  const auto want = sum_ref(in, outer, r, inner, alpha);
  const int bx = std::min(32, next_pow2(inner));
  const int parts = (r + chunk - 1) / chunk;
  const int cblocks = (inner + bx - 1) / bx;
  std::vector<T> partial(size_t(outer) * parts * inner, T(NAN)), out(size_t(outer) * inner, T(NAN));
  ReduceParams p{addr(in.data()), addr(parts > 1 ? partial.data() : out.data()), outer, r, inner, chunk, parts,
                 parts > 1 ? 1.0 : alpha, 0, bx};
  emu::launch(cols_kernel<T>(), dim3(outer * cblocks, parts), dim3(pw::kReduceThreads), 0, p);
  if (parts > 1) {
    ReduceParams q{addr(partial.data()), addr(out.data()), outer, parts, inner, parts, 1, alpha, 0, bx};
    emu::launch(cols_kernel<T>(), dim3(outer * cblocks, 1), dim3(pw::kReduceThreads), 0, q);
  }
  char what[96];
  snprintf(what, sizeof what, "cols %s [%d %d %d] bx=%d chunk=%d parts=%d", tn, outer, r, inner, bx, chunk, parts);
  expect_within(what, out, want, TolForward<T>);
}

template <class T>
void run_all() {
  for (int op = 0; op < pw::kOps; ++op) {
    for (int n : {1, 37, 1027}) check_map<T>(op, n);
    for (const Bcast& c : std::vector<Bcast>{
             {{6, 16}, {6, 16}, {1, 16}},             // a trailing vector (a bias)
             {{4, 5, 8}, {4, 1, 8}, {1, 5, 1}},       // ones on either side
             {{3, 1, 5}, {3, 1, 5}, {1, 1, 1}},       // one element
             {{2, 3, 4, 6}, {2, 1, 4, 6}, {2, 3, 1, 1}},
             {{5, 7}, {5, 1}, {1, 7}},                // an outer product, odd sizes
         }) {
      check_bcast<T>(op, c);
    }
  }
  for (int r : {1, 7, 300, 1024}) check_rows<T>(5, r, r);
  check_rows<T>(3, 5000, 5000);      // one part
  check_rows<T>(3, 5000, 1024);      // five parts
  check_rows<T>(2, 4099, 1028);      // rows not whole vectors: by element
  check_cols<T>(2, 50, 300, 50);     // one part
  check_cols<T>(1, 1000, 256, 63);   // parts
  check_cols<T>(3, 40, 5, 7);        // narrow columns, parts
}

int main() {
  run_all<float>();
  run_all<double>();
  return finish("pointwise_emu_test");
}
