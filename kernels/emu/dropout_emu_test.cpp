// Emulated runs (see emu.h) of kernels/dropout.cu: philox4x32_10 against
// the known answers published with Random123, and the dropout kernels
// (element by element and _v16b, float32 and float64) against a reference
// written from the definition (element i kept when word i%4 of Philox of
// (i/4, stream, step lo, step hi) under (seed lo, seed hi) is below keep;
// y = x * scale or x * 0), bit for bit: lengths that are and are not
// multiples of four, a grid of one warp and a full one, steps above 2^32,
// p = 0 (keep everything, draw nothing), NaN and infinities in x. Also the
// keep rate of 2^20 elements within 6 standard deviations of 1-p. Exits
// non-zero on a failure.
#include "emu.h"
#include "harness.h"
// clang-format off
#include "../dropout.cu"
// clang-format on
#include <random>
#include <string>
#include <vector>

using stheno::DropoutParams;
using stheno::kDropoutThreads;
using stheno::Philox4;

using namespace harness;

void test_kat() {
  printf("philox4x32_10\n");
  struct {
    uint32_t ctr[4], key[2], want[4];
  } kat[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
      {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
       {0xffffffff, 0xffffffff},
       {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
      {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
       {0xa4093822, 0x299f31d0},
       {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
  };
  for (auto& k : kat) {
    const Philox4 r = stheno::philox4x32_10(Philox4{{k.ctr[0], k.ctr[1], k.ctr[2], k.ctr[3]}}, k.key[0], k.key[1]);
    char b[128];
    snprintf(b, sizeof b, "got %08x %08x %08x %08x", r.v[0], r.v[1], r.v[2], r.v[3]);
    expect("known answer", memcmp(r.v, k.want, 16) == 0, b);
  }
}

// The reference: y = x * (keep ? scale : 0), the mask from philox4x32_10
// as the definition states it.
template <class T>
std::vector<double> reference(const DropoutParams& p, const T* x) {
  std::vector<double> want(p.n);
  for (int64_t i = 0; i < p.n; ++i) {
    bool keep = true;
    if (uint64_t(p.keep) < (uint64_t(1) << 32)) {
      const uint64_t step = uint64_t(p.step), seed = uint64_t(p.seed);
      const Philox4 r = stheno::philox4x32_10(Philox4{{uint32_t(i / 4), p.stream, uint32_t(step), uint32_t(step >> 32)}},
                                              uint32_t(seed), uint32_t(seed >> 32));
      keep = r.v[i % 4] < uint64_t(p.keep);
    }
    want[i] = double(x[i] * (keep ? T(p.scale) : T(0)));
  }
  return want;
}

template <class T>
void test_dropout(const char* name) {
  printf("%s\n", name);
  const int before = failures;
  std::mt19937_64 rng(26);
  std::uniform_real_distribution<double> u(-2, 2);
  for (int64_t n : {1, 3, 4, 5, 1021, 4096}) {
    for (double drop : {0.0, 0.1, 0.5}) {
      for (uint64_t step : {uint64_t(0), uint64_t(5) << 32 | 9}) {
        // Vectors' data are 16-byte aligned: skew 0 is aligned, skew 1
        // (the scalar kernels only) is not.
        for (int skew : {0, 1}) {
          std::vector<T> x(n + 1);
          for (auto& v : x) v = T(u(rng));
          if (n > 3) x[skew + 1] = T(NAN), x[skew + 2] = std::numeric_limits<T>::infinity();
          DropoutParams p{};
          p.n = n, p.seed = int64_t(0xfedcba9876543210ull), p.step = int64_t(step), p.stream = 2;
          p.keep = drop == 0 ? int64_t(1) << 32 : int64_t(std::llround((1 - drop) * 4294967296.0));
          p.scale = drop == 0 ? 1.0 : double(T(1) / T(1 - drop));
          const std::vector<double> want = reference(p, x.data() + skew);
          for (bool vec : {false, true}) {
            if (vec && skew) continue;
            for (bool small : {false, true}) {
              std::vector<T> y(n + 1, T(-7));
              p.x = addr(x.data() + skew), p.out = addr(y.data() + skew);
              auto k = vec ? (sizeof(T) == 4 ? dropout_v16b_f32 : dropout_v16b_f64)
                           : (sizeof(T) == 4 ? dropout_f32 : dropout_f64);
              const unsigned threads = small ? 32 : kDropoutThreads;
              const unsigned groups = unsigned((n + 3) / 4);
              emu::launch(k, dim3(small ? 1 : (groups + threads - 1) / threads), dim3(threads), 0, p);
              char what[160];
              snprintf(what, sizeof what, "n=%ld p=%g step=%#lx skew=%d vec=%d small=%d", long(n), drop,
                       (unsigned long)step, skew, int(vec), int(small));
              std::string e;
              for (int64_t i = 0; i < n && e.empty(); ++i) {
                const double g = y[skew + i];
                if (!(g == want[i] || (std::isnan(g) && std::isnan(want[i])))) {
                  char b[128];
                  snprintf(b, sizeof b, "element %ld: got %.17g, want %.17g", long(i), g, want[i]);
                  e = b;
                }
              }
              // Nothing written outside y.
              if (e.empty() && (y[skew ? 0 : n] != T(-7))) e = "wrote outside y";
              expect(what, e.empty(), e);
            }
          }
        }
      }
    }
  }
  // The keep rate: Binomial(n, 1-p), 6 standard deviations.
  for (double drop : {0.1, 0.5, 0.9}) {
    const int64_t n = 1 << 20;
    std::vector<T> x(n, T(1)), y(n);
    DropoutParams p{};
    p.x = addr(x.data()), p.out = addr(y.data()), p.n = n, p.seed = 42, p.stream = 0, p.step = 0;
    p.keep = int64_t(std::llround((1 - drop) * 4294967296.0)), p.scale = 1;
    emu::launch(sizeof(T) == 4 ? dropout_v16b_f32 : dropout_v16b_f64, dim3(256), dim3(kDropoutThreads), 0, p);
    int64_t kept = 0;
    for (T v : y) kept += v != 0;
    const double sd = std::sqrt(n * drop * (1 - drop)), d = kept - n * (1 - drop);
    char b[128];
    snprintf(b, sizeof b, "p=%g: %ld of %ld kept, %.1f sd", drop, long(kept), long(n), d / sd);
    expect("keep rate", std::fabs(d) <= 6 * sd, b);
  }
  printf("  %s\n", failures == before ? "ok" : "FAIL");
}

int main() {
  test_kat();
  test_dropout<float>("dropout f32");
  test_dropout<double>("dropout f64");
  return finish("dropout_emu_test");
}
