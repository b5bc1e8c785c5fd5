// Emulated runs (see emu.h) of kernels/elementwise.cu: fill, add (with a
// broadcast or scalar second operand, accumulating, in place) and axpy,
// compared exactly with the same arithmetic on the host, over a grid whose
// grid-stride loops take several turns and end mid-block. Exits non-zero on
// a failure.
#include "emu.h"
#include "harness.h"
// clang-format off
#include "../elementwise.cu"
// clang-format on
#include <random>

using namespace harness;

static const dim3 kGrid(3), kBlock(64);  // 192 threads over n = 1000: several turns

template <class T>
void test_add_axpy(const char* name) {
  printf("%s\n", name);
  Rng rng(5);
  const int n = 1000;
  std::vector<T> a(n), b(n), out0(n);
  for (int i = 0; i < n; ++i) a[i] = T(rng.U(-1, 1)), b[i] = T(rng.U(-1, 1)), out0[i] = T(rng.U(-1, 1));
  const bool f = sizeof(T) == 4;
  using K = void (*)(AddParams);
  const K add_k = f ? (K)add_f32 : (K)add_f64, acc_k = f ? (K)add_acc_f32 : (K)add_acc_f64;
  const double scalar = double(T(0.375));
  for (int acc = 0; acc < 2; ++acc)
    for (int mode = 0; mode < 3; ++mode) {  // b elementwise, b broadcast (stride 0), scalar
      std::vector<T> out = out0, want(n);
      for (int i = 0; i < n; ++i) {
        const T bv = mode == 0 ? b[i] : mode == 1 ? b[0] : T(scalar);
        const T v = a[i] + bv;
        want[i] = acc ? T(out0[i] + v) : v;
      }
      AddParams p{out.data(), a.data(), mode == 2 ? nullptr : b.data(), n, mode == 0 ? 1 : 0, scalar};
      emu::launch(acc ? acc_k : add_k, kGrid, kBlock, 0, p);
      char what[64];
      snprintf(what, sizeof what, "add%s, %s", acc ? " accumulate" : "",
               mode == 0 ? "elementwise" : mode == 1 ? "broadcast" : "scalar");
      expect_line(what, out == want);
    }
  {
    // In place: out aliases a.
    std::vector<T> x = a, want(n);
    for (int i = 0; i < n; ++i) want[i] = a[i] + b[i];
    AddParams p{x.data(), x.data(), b.data(), n, 1, 0};
    emu::launch(add_k, kGrid, kBlock, 0, p);
    expect_line("add in place (out == a)", x == want);
  }
  {
    std::vector<T> y = out0, want(n);
    const T alpha = T(-1.25);
    for (int i = 0; i < n; ++i) want[i] = out0[i] + alpha * a[i];
    AxpyParams p{y.data(), a.data(), n, double(alpha)};
    emu::launch(f ? (void (*)(AxpyParams))axpy_f32 : axpy_f64, kGrid, kBlock, 0, p);
    expect_line("axpy", y == want);
  }
}

int main() {
  width = 44;
  printf("fill_u64\n");
  std::vector<uint64_t> v(1000, 0);
  FillParams fp{v.data(), 999, 0x3ff8000000000000ull};
  emu::launch(fill_u64, kGrid, kBlock, 0, fp);
  bool ok = v[999] == 0;
  for (int i = 0; i < 999; ++i) ok = ok && v[i] == fp.value;
  expect_line("fill_u64 fills n elements, no more", ok);
  test_add_axpy<float>("add, axpy f32");
  test_add_axpy<double>("add, axpy f64");
  return finish("elementwise_emu_test");
}
