// Emulated runs (see emu.h) of kernels/adamw.cu: the gradient norm
// (norm_partial, norm_finalize) and the step, float32 and float64, on
// tensors of odd lengths around the chunks' edges (1, 3, 5, 130, a chunk,
// a chunk and one, two chunks and a bit), in two parameter groups, for
// three steps each with clipping that bites, clipping that does not, and
// none, against a double-precision reference with autograd's TolForward32
// / TolForward64 (each step from the kernels' own state before it). Also,
// bit for bit: tensors that are not 16-byte aligned (read element by
// element) give the aligned ones' results; the gradients are zeroed when
// asked and kept when not; a NaN gradient makes the norm and every
// parameter NaN (torch's clip_grad_norm_ with error_if_nonfinite=False).
// Exits non-zero on a failure.
#include "emu.h"
#include "harness.h"
// clang-format off
#include "../adamw.cu"
// clang-format on
#include <random>
#include <string>

using stheno::adamw::AdamWNormParams;
using stheno::adamw::AdamWStepParams;
using stheno::adamw::kChunkElems;
using stheno::adamw::kTensorWords;
using stheno::adamw::kThreads;

using namespace harness;

struct Group {
  double lr, wd;
};

// One tensor's buffers: param, grad, m, v, each starting `skew` elements
// into its vector (1: not 16-byte aligned).
template <class T>
struct Buf {
  int n, group, skew;
  std::vector<T> p, g, m, v;
  T* P() { return p.data() + skew; }
  T* G() { return g.data() + skew; }
  T* M() { return m.data() + skew; }
  T* V() { return v.data() + skew; }
};

template <class T>
std::vector<Buf<T>> make_tensors(const std::vector<int>& sizes, int skew_every, std::mt19937_64 rng) {
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<Buf<T>> ts;
  for (size_t i = 0; i < sizes.size(); ++i) {
    Buf<T> b;
    b.n = sizes[i], b.group = int(i % 2), b.skew = skew_every > 0 && i % skew_every == 1 ? 1 : 0;
    // The element before a skewed tensor is NaN: a kernel that reads it
    // shows.
    const size_t len = size_t(b.n) + b.skew;
    b.p.assign(len, T(NAN)), b.g.assign(len, T(NAN)), b.m.assign(len, T(NAN)), b.v.assign(len, T(NAN));
    for (int j = 0; j < b.n; ++j) {
      b.P()[j] = T(u(rng)), b.M()[j] = T(0.1 * u(rng)), b.V()[j] = T(0.01 * std::fabs(u(rng)));
    }
    ts.push_back(std::move(b));
  }
  return ts;
}

template <class T>
void new_grads(std::vector<Buf<T>>& ts, std::mt19937_64& rng, double scale) {
  std::uniform_real_distribution<double> u(-1, 1);
  for (auto& b : ts)
    for (int j = 0; j < b.n; ++j) b.G()[j] = T(scale * u(rng));
}

// The table as ops packs it: the tensors' rows, then the chunk words.
template <class T>
std::vector<int64_t> table_of(std::vector<Buf<T>>& ts, int* chunks) {
  std::vector<int64_t> tab;
  for (auto& b : ts) {
    int64_t row[kTensorWords] = {int64_t(addr(b.P())), int64_t(addr(b.G())), int64_t(addr(b.M())),
                                 int64_t(addr(b.V())), b.n, b.group};
    tab.insert(tab.end(), row, row + kTensorWords);
  }
  *chunks = 0;
  for (size_t t = 0; t < ts.size(); ++t)
    for (int64_t c = 0; c * kChunkElems < ts[t].n; ++c) tab.push_back(c << 32 | int64_t(t)), ++*chunks;
  return tab;
}

struct Config {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double max_norm = 0;  // 0: no clipping
  bool zero_grad = true;
};

// Runs step `step` (from 1) of the kernels on ts; returns [norm, coef] as
// norm_finalize wrote them (NaN when not clipping).
template <class T>
std::array<double, 2> run_step(std::vector<Buf<T>>& ts, const std::vector<Group>& groups, const Config& cfg, int step) {
  int chunks = 0;
  std::vector<int64_t> tab = table_of(ts, &chunks);
  std::vector<double> partial(chunks, NAN);
  std::array<double, 2> norm = {NAN, NAN};
  const bool f = sizeof(T) == 4;
  if (cfg.max_norm > 0) {
    AdamWNormParams np{};
    np.table = addr(tab.data()), np.partial = addr(partial.data()), np.norm = addr(norm.data());
    np.tensors = int64_t(ts.size()), np.max_norm = cfg.max_norm, np.chunks = chunks;
    emu::launch(f ? adamw_norm_partial_f32 : adamw_norm_partial_f64, dim3(chunks), dim3(kThreads), 0, np);
    emu::launch(adamw_norm_finalize, dim3(1), dim3(kThreads), 0, np);
  }
  AdamWStepParams sp{};
  sp.table = addr(tab.data()), sp.norm = addr(norm.data()), sp.tensors = int64_t(ts.size());
  sp.beta1 = cfg.beta1, sp.one_minus_beta1 = 1 - cfg.beta1, sp.beta2 = cfg.beta2, sp.one_minus_beta2 = 1 - cfg.beta2;
  sp.eps = cfg.eps, sp.bc2_sqrt = std::sqrt(1 - std::pow(cfg.beta2, step));
  for (size_t i = 0; i < groups.size(); ++i) {
    sp.decay[i] = 1 - groups[i].lr * groups[i].wd;
    sp.step_size[i] = groups[i].lr / (1 - std::pow(cfg.beta1, step));
  }
  sp.chunks = chunks, sp.clip = cfg.max_norm > 0, sp.zero_grad = cfg.zero_grad;
  emu::launch(f ? adamw_step_f32 : adamw_step_f64, dim3(chunks), dim3(kThreads), 0, sp);
  return norm;
}

// The step in double from the tensors' state: p, m, v of every tensor and
// the norm.
struct Ref {
  std::vector<std::vector<double>> p, m, v;
  double norm = 0;
};

template <class T>
Ref reference(std::vector<Buf<T>>& ts, const std::vector<Group>& groups, const Config& cfg, int step) {
  Ref r;
  double ss = 0;
  for (auto& b : ts)
    for (int j = 0; j < b.n; ++j) ss += double(b.G()[j]) * double(b.G()[j]);
  r.norm = std::sqrt(ss);
  const double coef = cfg.max_norm > 0 ? std::min(cfg.max_norm / (r.norm + 1e-6), 1.0) : 1.0;
  const double bc1 = 1 - std::pow(cfg.beta1, step), bc2 = 1 - std::pow(cfg.beta2, step);
  for (auto& b : ts) {
    const Group& gr = groups[b.group];
    std::vector<double> p(b.n), m(b.n), v(b.n);
    for (int j = 0; j < b.n; ++j) {
      const double g = double(b.G()[j]) * coef;
      m[j] = cfg.beta1 * b.M()[j] + (1 - cfg.beta1) * g;
      v[j] = cfg.beta2 * b.V()[j] + (1 - cfg.beta2) * g * g;
      p[j] = b.P()[j] * (1 - gr.lr * gr.wd) - gr.lr / bc1 * m[j] / (std::sqrt(v[j]) / std::sqrt(bc2) + cfg.eps);
    }
    r.p.push_back(p), r.m.push_back(m), r.v.push_back(v);
  }
  return r;
}

template <class T>
bool same_state(std::vector<Buf<T>>& a, std::vector<Buf<T>>& b) {
  for (size_t i = 0; i < a.size(); ++i) {
    const size_t n = size_t(a[i].n) * sizeof(T);
    if (memcmp(a[i].P(), b[i].P(), n) || memcmp(a[i].M(), b[i].M(), n) || memcmp(a[i].V(), b[i].V(), n) ||
        memcmp(a[i].G(), b[i].G(), n))
      return false;
  }
  return true;
}

template <class T>
void test_case(const char* name, const std::vector<int>& sizes, const Config& cfg, double grad_scale) {
  const std::vector<Group> groups = {{1e-3, 0.05}, {1e-2, 0}};
  std::mt19937_64 seed(26);
  auto ts = make_tensors<T>(sizes, 3, seed);
  auto aligned = make_tensors<T>(sizes, 0, seed);  // the same values, every tensor aligned
  std::mt19937_64 rng(7), rng2(7);
  char tag[128];
  snprintf(tag, sizeof tag, "%s %s max_norm=%g zero_grad=%d", sizeof(T) == 4 ? "f32" : "f64", name, cfg.max_norm,
           cfg.zero_grad);
  const int before = failures;
  for (int step = 1; step <= 3; ++step) {
    new_grads(ts, rng, grad_scale);
    new_grads(aligned, rng2, grad_scale);
    std::vector<std::vector<T>> grads;
    for (auto& b : ts) grads.emplace_back(b.G(), b.G() + b.n);
    const Ref ref = reference(ts, groups, cfg, step);
    const auto norm = run_step(ts, groups, cfg, step);
    const auto norm2 = run_step(aligned, groups, cfg, step);
    const std::string what = std::string(tag) + " step " + std::to_string(step);
    if (cfg.max_norm > 0) {
      const std::string e = compare(&norm[0], {ref.norm}, TolForward<double>);
      expect(what + ": norm", e == "", e);
      const double coef = std::min(cfg.max_norm / (ref.norm + 1e-6), 1.0);
      expect(what + ": coef", compare(&norm[1], {coef}, TolForward<double>) == "", compare(&norm[1], {coef}, TolForward<double>));
      expect(what + ": norm bit for bit aligned and not", memcmp(&norm, &norm2, sizeof norm) == 0);
    }
    for (size_t i = 0; i < ts.size(); ++i) {
      const std::string t = what + " tensor " + std::to_string(i) + " (n=" + std::to_string(ts[i].n) + ")";
      for (auto [nm, got, want] : {std::tuple{"p", ts[i].P(), &ref.p[i]}, std::tuple{"m", ts[i].M(), &ref.m[i]},
                                   std::tuple{"v", ts[i].V(), &ref.v[i]}}) {
        const std::string e = compare(got, *want, TolForward<T>);
        expect(t + ": " + nm, e == "", e);
      }
      bool zeroed = true, kept = true;
      for (int j = 0; j < ts[i].n; ++j) {
        zeroed = zeroed && ts[i].G()[j] == T(0);
        kept = kept && (ts[i].G()[j] == grads[i][j] || (std::isnan(ts[i].G()[j]) && std::isnan(grads[i][j])));
      }
      expect(t + (cfg.zero_grad ? ": gradient zeroed" : ": gradient kept"), cfg.zero_grad ? zeroed : kept);
    }
    expect(what + ": bit for bit aligned and not", same_state(ts, aligned));
  }
  printf("  %-64s %s\n", tag, failures == before ? "ok" : "FAIL");
}

// A NaN among the gradients: the norm is NaN, and so is the coefficient,
// which makes every parameter NaN.
template <class T>
void test_nan() {
  const std::vector<Group> groups = {{1e-3, 0.05}, {1e-2, 0}};
  std::mt19937_64 seed(3), rng(4);
  auto ts = make_tensors<T>({5, 130}, 0, seed);
  new_grads(ts, rng, 1);
  ts[1].G()[17] = T(NAN);
  Config cfg;
  cfg.max_norm = 1;
  const auto norm = run_step(ts, groups, cfg, 1);
  const char* tag = sizeof(T) == 4 ? "f32 NaN gradient" : "f64 NaN gradient";
  expect(std::string(tag) + ": norm and coef NaN", std::isnan(norm[0]) && std::isnan(norm[1]));
  bool all = true;
  for (auto& b : ts)
    for (int j = 0; j < b.n; ++j) all = all && std::isnan(b.P()[j]);
  expect(std::string(tag) + ": every parameter NaN", all);
  printf("  %-64s %s\n", tag, all && std::isnan(norm[0]) ? "ok" : "FAIL");
}

template <class T>
void test_all(const char* name) {
  printf("%s\n", name);
  const int c = int(kChunkElems);
  const std::vector<int> odd = {1, 3, 5, 130, 7, 33};
  const std::vector<int> edges = {c, c + 1, 3, 2 * c + 37, c - 1, 130};
  for (const auto& [nm, sizes] : {std::pair{"odd", odd}, std::pair{"chunk edges", edges}}) {
    Config clip, loose, off, keep;
    clip.max_norm = 0.5;     // the norm is far above: coef < 1
    loose.max_norm = 1e6;    // coef = 1
    keep.max_norm = 0.5, keep.zero_grad = false;
    for (const Config& cfg : {clip, loose, off, keep}) test_case<T>(nm, sizes, cfg, 1);
  }
  // Gradients so small that eps matters.
  Config clip;
  clip.max_norm = 0.5;
  test_case<T>("tiny gradients", odd, clip, 1e-7);
  test_nan<T>();
}

int main() {
  test_all<float>("adamw f32");
  test_all<double>("adamw f64");
  return finish("adamw_emu_test");
}
