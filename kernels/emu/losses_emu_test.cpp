// Emulated runs (see emu.h) of kernels/losses.cu, float32 and float64:
// every loss's forward (loss_fwd_<kind>, then loss_sum over its partial
// sums) and backward (loss_bwd_<kind>), loss_add, and the four box
// kernels, against references written here in double from the losses'
// definitions (torchvision's and PyTorch's), not from the kernels' steps.
// The forward grids stride: 3 blocks of kLossThreads over up to 2,000
// items, so threads take several items and blocks end mid-way; a fifth of
// the weights are 0 and their x holds inf or NaN, which must touch neither
// the loss nor dx. Backward outputs start as NaN: every element must be
// written. References: the forward's double definition; float64's backward
// against central differences of it (TolGrad, relative to the largest
// gradient), float32's against float64's kernel (TolParity32); the box
// maps exactly. Exits non-zero on a failure.
#include "emu.h"
#include "harness.h"
// clang-format off
#include "../losses.cu"
// clang-format on
#include <functional>
#include <random>
#include <string>

using namespace stheno::loss;

using namespace harness;

static Rng rng(26);

// A loss case: n items (elements; rows of c logits; boxes), parameters.
struct Case {
  std::string name;
  int kind;
  int n, c;
  double beta, alpha, gamma;
  std::vector<double> x, t, w;
};

// Item i's term, in double, from the definitions.
static double ref_term(const Case& k, const std::vector<double>& x, int i) {
  const double* t = k.t.data();
  switch (k.kind) {
    case kBCE: {
      const double s = 1 / (1 + exp(-x[i]));
      return -(t[i] * log(s) + (1 - t[i]) * log(1 - s));
    }
    case kSmoothL1: {
      const double d = fabs(x[i] - t[i]);
      return d < k.beta ? 0.5 * d * d / k.beta : d - 0.5 * k.beta;
    }
    case kL1:
      return fabs(x[i] - t[i]);
    case kFocal: {
      const double p = 1 / (1 + exp(-x[i]));
      const double ce = -(t[i] * log(p) + (1 - t[i]) * log(1 - p));
      const double pt = p * t[i] + (1 - p) * (1 - t[i]);
      double l = ce * pow(1 - pt, k.gamma);
      if (k.alpha >= 0) l *= k.alpha * t[i] + (1 - k.alpha) * (1 - t[i]);
      return l;
    }
    case kCE: {
      double s = 0;
      for (int j = 0; j < k.c; ++j) s += exp(x[i * k.c + j]);
      return log(s) - x[i * k.c + int(t[i])];
    }
    default: {  // GIoU
      const double *a = &x[4 * i], *b = &t[4 * i];
      const double iw = std::min(a[2], b[2]) - std::max(a[0], b[0]);
      const double ih = std::min(a[3], b[3]) - std::max(a[1], b[1]);
      const double inter = iw > 0 && ih > 0 ? iw * ih : 0;
      const double uni = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter;
      const double cw = std::max(a[2], b[2]) - std::min(a[0], b[0]);
      const double ch = std::max(a[3], b[3]) - std::min(a[1], b[1]);
      const double area = cw * ch;
      return 1 - (inter / (uni + 1e-7) - (area - uni) / (area + 1e-7));
    }
  }
}

static int per_item(const Case& k) { return k.kind == kCE ? k.c : k.kind == kGIoU ? 4 : 1; }

static double ref_loss(const Case& k, const std::vector<double>& x) {
  double s = 0;
  for (int i = 0; i < k.n; ++i)
    if (k.w[i] != 0) s += k.w[i] * ref_term(k, x, i);
  return s;
}

// d(ref_loss)/dx by central differences; items of weight 0 are 0.
static std::vector<double> ref_grad(const Case& k) {
  const int m = per_item(k);
  std::vector<double> g(k.x.size(), 0), x = k.x;
  for (int i = 0; i < k.n; ++i) {
    if (k.w[i] == 0) continue;
    for (int e = 0; e < m; ++e) {
      const size_t j = size_t(i) * m + e;
      const double h = 1e-6, v = x[j];
      x[j] = v + h;
      const double up = k.w[i] * ref_term(k, x, i);
      x[j] = v - h;
      const double down = k.w[i] * ref_term(k, x, i);
      x[j] = v;
      g[j] = (up - down) / (2 * h);
    }
  }
  return g;
}

template <class T>
struct Kernels {
  using L = void (*)(LossParams);
  L fwd, bwd;
};

template <class T>
Kernels<T> kernels_of(int kind) {
  constexpr bool f = sizeof(T) == 4;
  using L = void (*)(LossParams);
  switch (kind) {
    case kBCE:
      return {f ? (L)loss_fwd_bce_f32 : (L)loss_fwd_bce_f64, f ? (L)loss_bwd_bce_f32 : (L)loss_bwd_bce_f64};
    case kSmoothL1:
      return {f ? (L)loss_fwd_smoothl1_f32 : (L)loss_fwd_smoothl1_f64,
              f ? (L)loss_bwd_smoothl1_f32 : (L)loss_bwd_smoothl1_f64};
    case kL1:
      return {f ? (L)loss_fwd_l1_f32 : (L)loss_fwd_l1_f64, f ? (L)loss_bwd_l1_f32 : (L)loss_bwd_l1_f64};
    case kFocal:
      return {f ? (L)loss_fwd_focal_f32 : (L)loss_fwd_focal_f64, f ? (L)loss_bwd_focal_f32 : (L)loss_bwd_focal_f64};
    case kCE:
      return {f ? (L)loss_fwd_ce_f32 : (L)loss_fwd_ce_f64, f ? (L)loss_bwd_ce_f32 : (L)loss_bwd_ce_f64};
    default:
      return {f ? (L)loss_fwd_giou_f32 : (L)loss_fwd_giou_f64, f ? (L)loss_bwd_giou_f32 : (L)loss_bwd_giou_f64};
  }
}

template <class T>
static std::vector<T> as(const std::vector<double>& v) {
  return std::vector<T>(v.begin(), v.end());
}

// The case's loss and dx (gradient scale g) from the kernels of dtype T;
// with on_device, g reaches the backward as g/2 in the params times 2 read
// through dgrad.
template <class T>
std::pair<double, std::vector<double>> run(const Case& k, double g, int blocks, bool on_device = false) {
  std::vector<T> x = as<T>(k.x), t = as<T>(k.t), w = as<T>(k.w);
  // padding: a weight-0 item's x holds inf or NaN
  const int m = per_item(k);
  for (int i = 0; i < k.n; ++i)
    if (k.w[i] == 0) x[size_t(i) * m] = i % 2 ? std::numeric_limits<T>::infinity() : std::numeric_limits<T>::quiet_NaN();
  std::vector<double> partial(blocks, NAN);
  T loss = T(NAN);
  LossParams p{addr(x.data()), addr(t.data()), addr(w.data()), addr(partial.data()), 0, k.n, k.beta, k.alpha,
               k.gamma, 0, k.c, 0};
  const Kernels<T> ks = kernels_of<T>(k.kind);
  emu::launch(ks.fwd, dim3(blocks), dim3(kLossThreads), 0, p);
  LossSumParams sp{addr(partial.data()), addr(&loss), blocks, 0};
  emu::launch(sizeof(T) == 4 ? (void (*)(LossSumParams))loss_sum_f32 : loss_sum_f64, dim3(1), dim3(kLossThreads), 0,
              sp);
  std::vector<T> dx(x.size(), T(NAN));
  p.out = addr(dx.data());
  p.grad = g;
  const T two = T(2);
  if (on_device) p.grad = g / 2, p.dgrad = addr(&two);
  emu::launch(ks.bwd, dim3(2), dim3(kLossThreads), 0, p);
  return {double(loss), std::vector<double>(dx.begin(), dx.end())};
}

static Case make_case(const std::string& name, int kind, int n, int c = 0, double beta = 0, double alpha = 0,
                      double gamma = 0) {
  Case k{name, kind, n, c, beta, alpha, gamma, {}, {}, {}};
  const int m = kind == kCE ? c : kind == kGIoU ? 4 : 1;
  k.x.resize(size_t(n) * m);
  k.t.resize(kind == kCE ? n : size_t(n) * m);
  k.w.resize(n);
  for (int i = 0; i < n; ++i) {
    k.w[i] = i % 5 == 0 ? 0 : rng.U(0, 2);
    if (kind == kGIoU) {
      // boxes in general position: corners of thirds apart, no ties
      for (double* b : {&k.x[4 * i], &k.t[4 * i]}) {
        b[0] = rng.U(0, 4), b[1] = rng.U(0, 4);
        b[2] = b[0] + rng.U(0.5, 3), b[3] = b[1] + rng.U(0.5, 3);
      }
      continue;
    }
    for (int j = 0; j < m; ++j) k.x[size_t(i) * m + j] = rng.U(-4, 4);
    if (kind == kCE) {
      k.t[i] = double(int(rng.U(0, c)) % c);
    } else if (kind == kFocal && i % 2) {
      k.t[i] = rng.U(0, 1) < 0.5 ? 0 : 1;
    } else {
      k.t[i] = kind == kBCE || kind == kFocal ? rng.U(0, 1) : rng.U(-4, 4);
    }
  }
  return k;
}

static void test_case(const Case& k) {
  printf("%s (n=%d)\n", k.name.c_str(), k.n);
  const int blocks = std::min((k.n + kLossThreads - 1) / kLossThreads, 3);
  const double g = 0.75;
  auto [l64, dx64] = run<double>(k, g, blocks);
  auto [l32, dx32] = run<float>(k, g, blocks);
  const double want = ref_loss(k, k.x);
  check("f64 loss vs the definition", {want}, {l64}, TolForward64);
  check("f32 loss vs the definition", {want}, {l32}, TolForward32);
  std::vector<double> fd = ref_grad(k);
  double scale = 0;
  for (double& v : fd) v *= g, scale = std::max(scale, fabs(v));
  check("f64 dx vs central differences", fd, dx64, TolGrad, scale);
  check("f32 dx vs f64's", dx64, dx32, TolParity32);
  check("f64 dx, the gradient through dgrad", dx64, run<double>(k, g, blocks, true).second, kExact);
}

// Boxes: each map and its backward, exactly as the arithmetic says.
template <class T>
void test_boxes(const char* name) {
  printf("%s\n", name);
  const int n = 700;
  std::vector<T> in(4 * n);
  for (auto& v : in) v = T(std::round(rng.U(-64, 64)) / 16);
  constexpr bool f = sizeof(T) == 4;
  using K = void (*)(BoxParams);
  const K ks[4] = {f ? (K)box_cxcywh_to_xyxy_f32 : (K)box_cxcywh_to_xyxy_f64,
                   f ? (K)box_cxcywh_to_xyxy_bwd_f32 : (K)box_cxcywh_to_xyxy_bwd_f64,
                   f ? (K)box_xyxy_to_cxcywh_f32 : (K)box_xyxy_to_cxcywh_f64,
                   f ? (K)box_xyxy_to_cxcywh_bwd_f32 : (K)box_xyxy_to_cxcywh_bwd_f64};
  const char* names[4] = {"cxcywh_to_xyxy", "cxcywh_to_xyxy_bwd", "xyxy_to_cxcywh", "xyxy_to_cxcywh_bwd"};
  for (int mode = 0; mode < 4; ++mode) {
    std::vector<T> out(4 * n + 4, T(NAN));
    BoxParams p{addr(in.data()), addr(out.data()), n};
    emu::launch(ks[mode], dim3(2), dim3(kLossThreads), 0, p);
    std::vector<double> want(4 * n), got(4 * n);
    for (int i = 0; i < n; ++i) {
      const double a = in[4 * i], b = in[4 * i + 1], c = in[4 * i + 2], d = in[4 * i + 3];
      double* o = &want[4 * i];
      switch (mode) {
        case 0: o[0] = a - c / 2, o[1] = b - d / 2, o[2] = a + c / 2, o[3] = b + d / 2; break;
        case 1: o[0] = a + c, o[1] = b + d, o[2] = (c - a) / 2, o[3] = (d - b) / 2; break;
        case 2: o[0] = (a + c) / 2, o[1] = (b + d) / 2, o[2] = c - a, o[3] = d - b; break;
        default: o[0] = a / 2 - c, o[1] = b / 2 - d, o[2] = a / 2 + c, o[3] = b / 2 + d;
      }
      for (int e = 0; e < 4; ++e) got[4 * i + e] = out[4 * i + e];
    }
    check(std::string(names[mode]) + " (exact: sixteenths)", want, got, kExact);
    expect_line("nothing written past the end", std::isnan(double(out[4 * n])));
  }
}

template <class T>
void test_add(const char* name) {
  printf("%s\n", name);
  T a = T(1.25), b = T(-0.5), out = T(NAN);
  LossAddParams p{addr(&a), addr(&b), addr(&out)};
  emu::launch(sizeof(T) == 4 ? (void (*)(LossAddParams))loss_add_f32 : loss_add_f64, dim3(1), dim3(32), 0, p);
  check("loss_add", {0.75}, {double(out)}, kExact);
}

int main() {
  width = 58;
  for (int n : {7, 2000}) {
    test_case(make_case("bce", kBCE, n));
    test_case(make_case("smoothl1 beta=1/9", kSmoothL1, n, 0, 1.0 / 9));
    test_case(make_case("smoothl1 beta=1", kSmoothL1, n, 0, 1));
    test_case(make_case("l1", kL1, n));
    test_case(make_case("focal alpha=0.25 gamma=2", kFocal, n, 0, 0, 0.25, 2));
    test_case(make_case("focal alpha=-1 gamma=1.5", kFocal, n, 0, 0, -1, 1.5));
    test_case(make_case("focal alpha=0.75 gamma=0", kFocal, n, 0, 0, 0.75, 0));
    test_case(make_case("giou", kGIoU, n));
  }
  test_case(make_case("ce c=5", kCE, 9, 5));
  test_case(make_case("ce c=91", kCE, 700, 91));
  test_boxes<float>("boxes f32");
  test_boxes<double>("boxes f64");
  test_add<float>("loss_add f32");
  test_add<double>("loss_add f64");
  return finish("losses_emu_test");
}
