// Emulated runs (see emu.h) of the kernels of kernels/attention.cu, float32
// and float64, against double references on small shapes: scale_mask with
// and without a mask (with -inf in it), head_mean and head_mean_bwd, with
// grids smaller than the work (the threads stride). Outputs start as a
// poison value with a guard zone past their end. Tolerances as
// autograd.TolForward32/64. Exits non-zero on a failure.
#include "emu.h"
#include "harness.h"
// clang-format off
#include "../attention.cu"
// clang-format on
#include <random>
#include <string>
#include <vector>

using namespace stheno::attn;

using namespace harness;

static Rng rng(26);

// got: want's values within TolForward<T>, then a guard zone of 16
// elements that still hold the poison -7.
template <class T>
static void check_guarded(const std::string& what, const std::vector<double>& want, const std::vector<T>& got) {
  bool ok = got.size() == want.size() + 16 && measure(got.data(), want.data(), want.size(), TolForward<T>).ok();
  for (size_t i = want.size(); ok && i < got.size(); ++i) ok = got[i] == T(-7);
  expect_line(what, ok);
}

template <class T>
void run(int n, int h, int l, int s) {
  const int64_t total = int64_t(n) * h * l * s, ls = int64_t(l) * s;
  std::vector<T> x(total), mask(n * s), dy(n * ls);
  for (auto& v : x) v = T(rng.U(-3, 3));
  for (auto& v : dy) v = T(rng.U(-3, 3));
  for (int i = 0; i < n * s; ++i) mask[i] = i % 3 == 1 ? -INFINITY : T(0);
  const std::string label = std::to_string(n) + "x" + std::to_string(h) + "x" + std::to_string(l) + "x" +
                            std::to_string(s) + (sizeof(T) == 4 ? " f32" : " f64");
  const double scale = 1 / std::sqrt(8.0);
  auto* sm = sizeof(T) == 4 ? (void (*)(ScaleMaskParams))attention_scale_mask_f32 : attention_scale_mask_f64;
  for (int masked = 0; masked < 2; ++masked) {
    std::vector<double> want(total);
    for (int64_t i = 0; i < total; ++i) {
      want[i] = double(T(scale)) * double(x[i]);
      if (masked) want[i] += double(mask[(i / ls / h) * s + i % s]);
    }
    std::vector<T> out(total + 16, T(-7));
    ScaleMaskParams p{reinterpret_cast<uint64_t>(x.data()), masked ? reinterpret_cast<uint64_t>(mask.data()) : 0,
                      reinterpret_cast<uint64_t>(out.data()), total, ls, s, h, scale};
    emu::launch(sm, dim3(2), dim3(kThreads), 0, p);
    check_guarded(label + (masked ? " scale_mask, masked" : " scale_mask"), want, out);
  }
  std::vector<double> mean(n * ls), back(total);
  for (int64_t i = 0; i < n * ls; ++i) {
    double sum = 0;
    for (int k = 0; k < h; ++k) sum += double(x[(i / ls * h + k) * ls + i % ls]);
    mean[i] = sum / h;
  }
  for (int64_t i = 0; i < total; ++i) back[i] = double(dy[(i / ls / h) * ls + i % ls]) / h;
  auto* hm = sizeof(T) == 4 ? (void (*)(HeadMeanParams))attention_head_mean_f32 : attention_head_mean_f64;
  auto* hb = sizeof(T) == 4 ? (void (*)(HeadMeanParams))attention_head_mean_bwd_f32 : attention_head_mean_bwd_f64;
  std::vector<T> y(n * ls + 16, T(-7)), dx(total + 16, T(-7));
  emu::launch(hm, dim3(1), dim3(kThreads), 0, HeadMeanParams{reinterpret_cast<uint64_t>(x.data()), reinterpret_cast<uint64_t>(y.data()), n * ls, ls, h});
  check_guarded(label + " head_mean", mean, y);
  emu::launch(hb, dim3(1), dim3(kThreads), 0, HeadMeanParams{reinterpret_cast<uint64_t>(dy.data()), reinterpret_cast<uint64_t>(dx.data()), total, ls, h});
  check_guarded(label + " head_mean_bwd", back, dx);
}

int main() {
  width = 60;
  run<float>(2, 3, 5, 7);
  run<float>(1, 1, 1, 1);
  run<float>(2, 8, 30, 11);
  run<double>(2, 3, 5, 7);
  run<double>(3, 2, 4, 40);
  return finish("attention_emu_test");
}
