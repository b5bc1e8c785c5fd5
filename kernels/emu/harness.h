// What the emulator's harnesses (kernels/emu/*_emu_test.cpp) share: the
// count of checks and failures and the summary line that ends a run,
// autograd's tolerance table, the comparison of a kernel's output with a
// double-precision reference (reporting the worst element), bit-for-bit
// comparison, and a seeded source of uniform numbers. Header-only; a harness
// includes it after emu.h and says `using namespace harness;`.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace harness {

// autograd.Tolerance: |got - want| <= abs + rel*|want|, element by element.
struct Tol {
  double abs, rel;
};

// The tolerance table of autograd/tolerance.go, the one source of these
// values (its comments say where each one's error comes from): copied here
// by name, one a line, and compared with it by autograd's
// TestEmuHarnessTolerances (tolerance_emu_test.go), which fails when they
// differ. Change them there first.
inline constexpr Tol TolForward64{.abs = 1e-12, .rel = 1e-10};
inline constexpr Tol TolForward32{.abs = 1e-6, .rel = 1e-5};
inline constexpr Tol TolGrad{.abs = 1e-8, .rel = 1e-6};
inline constexpr Tol TolParity64{.abs = 1e-12, .rel = 1e-10};
inline constexpr Tol TolParity32{.abs = 1e-5, .rel = 1e-4};
inline constexpr Tol TolTF32{.abs = 1e-2, .rel = 1e-3};
inline constexpr Tol TolGemm32{.abs = 4e-5, .rel = 1e-5};
inline constexpr Tol TolTraining{.abs = 1e-3, .rel = 0.1};

// TolForward32/64 and TolParity32/64 for a kernel computing in T.
template <class T>
inline constexpr Tol TolForward = sizeof(T) == 4 ? TolForward32 : TolForward64;
template <class T>
inline constexpr Tol TolParity = sizeof(T) == 4 ? TolParity32 : TolParity64;

// Equal values (NaN where the reference has NaN): for results that are exact.
inline constexpr Tol kExact{0, 0};

// The run's counts, which finish reports.
inline int checks = 0, failures = 0;

// Counts a check that passed if ok; returns ok.
inline bool count(bool ok) {
  ++checks;
  if (!ok) ++failures;
  return ok;
}

// Counts a check, printing a line only when it fails: what and detail.
inline void expect(const std::string& what, bool ok, const std::string& detail = "") {
  if (!count(ok)) printf("  FAIL %s %s\n", what.c_str(), detail.c_str());
}

// The width of the label column of the lines expect_line and check print.
inline int width = 40;

// Counts a check and prints its line: what, then ok or FAIL.
inline bool expect_line(const std::string& what, bool ok) {
  printf("  %-*s %s\n", width, what.c_str(), ok ? "ok" : "FAIL");
  return count(ok);
}

// Counts a check that n things (bits that differ, say) are none, printing
// its line: what, n and noun, then ok or FAIL.
inline bool expect_none(const std::string& what, long n, const char* noun = "differ") {
  printf("  %-*s %ld %s %s\n", width, what.c_str(), n, noun, n == 0 ? "ok" : "FAIL");
  return count(n == 0);
}

// How far a result is from its reference.
struct Err {
  double abs = 0;    // the largest |got - want|
  double scale = 0;  // the largest |want|
  // The largest |got - want| / (tol.abs + tol.rel*|want|): at most 1 passes.
  // Infinite for a NaN on one side only, and for lengths that differ.
  double worst = 0;
  size_t at = SIZE_MAX;  // the element of worst; SIZE_MAX when none or the lengths differ
  bool ok() const { return worst <= 1; }
};

// Compares got[0:n] with want[0:n] as autograd's Tolerance.Compare does:
// NaN must be where want has NaN, equal values (infinities too) pass, and
// the others must be within tol. With scale >= 0 the relative term is
// tol.rel*scale for every element instead (autograd's TolGrad, against the
// largest entry of a gradient).
template <class G, class W>
Err measure(const G* got, const W* want, size_t n, Tol tol, double scale = -1) {
  Err e;
  for (size_t i = 0; i < n; ++i) {
    const double g = double(got[i]), w = double(want[i]);
    if (std::isnan(g) || std::isnan(w)) {
      if (std::isnan(g) != std::isnan(w) && e.worst != INFINITY) e.worst = INFINITY, e.at = i;
      continue;
    }
    e.scale = std::max(e.scale, std::fabs(w));
    if (g == w) continue;
    const double d = std::fabs(g - w);
    double r = d / (tol.abs + tol.rel * (scale >= 0 ? scale : std::fabs(w)));
    if (std::isnan(r)) r = INFINITY;  // infinities of opposite signs
    e.abs = std::max(e.abs, d);
    if (r > e.worst) e.worst = r, e.at = i;
  }
  return e;
}
template <class G, class W>
Err measure(const std::vector<G>& got, const std::vector<W>& want, Tol tol, double scale = -1) {
  if (got.size() != want.size()) return Err{.worst = INFINITY};
  return measure(got.data(), want.data(), want.size(), tol, scale);
}

// The worst element of e, or "" when e passes.
template <class G, class W>
std::string describe(const Err& e, const G* got, const W* want) {
  if (e.ok()) return "";
  if (e.at == SIZE_MAX) return "lengths differ";
  char b[160];
  snprintf(b, sizeof b, "element %zu: got %.17g, want %.17g", e.at, double(got[e.at]), double(want[e.at]));
  return b;
}

// "" when got[0:want.size()] is within tol of want (as measure), else its
// worst element.
template <class G>
std::string compare(const G* got, const std::vector<double>& want, Tol tol) {
  return describe(measure(got, want.data(), want.size(), tol), got, want.data());
}
template <class G>
std::string compare(const std::vector<G>& got, const std::vector<double>& want, Tol tol) {
  return describe(measure(got, want, tol), got.data(), want.data());
}

// Counts a check that got is within tol of want (compare), printing a line
// only when it fails: what and the worst element.
template <class G>
void expect_within(const std::string& what, const G& got, const std::vector<double>& want, Tol tol) {
  const std::string e = compare(got, want, tol);
  expect(what, e.empty(), e);
}

// Counts a check of got against want (as measure) and prints its line:
// what, the largest error and |want|, the worst error over its bound, ok or
// FAIL, and on a failure the worst element.
template <class G, class W>
bool report(const std::string& what, const Err& e, const G* got, const W* want) {
  printf("  %-*s max|err| %.3g (scale %.3g, worst/tol %.3f) %s\n", width, what.c_str(), e.abs, e.scale, e.worst,
         e.ok() ? "ok" : "FAIL");
  if (!e.ok()) printf("    %s\n", describe(e, got, want).c_str());
  return count(e.ok());
}
template <class G, class W>
bool check(const std::string& what, const std::vector<W>& want, const std::vector<G>& got, Tol tol,
           double scale = -1) {
  return report(what, measure(got, want, tol, scale), got.data(), want.data());
}
// got[0:want.size()]: the rest of got is the caller's (a guard zone).
template <class G, class W>
bool check(const std::string& what, const std::vector<W>& want, const G* got, Tol tol, double scale = -1) {
  return report(what, measure(got, want.data(), want.size(), tol, scale), got, want.data());
}
// For references and results written as lists: check("loss", {want}, {got}, tol).
inline bool check(const std::string& what, const std::vector<double>& want, const std::vector<double>& got, Tol tol,
                  double scale = -1) {
  return report(what, measure(got, want, tol, scale), got.data(), want.data());
}

// How many elements of a and b differ in their bits (all of them when the
// lengths differ).
template <class T>
size_t bits_differ(const T* a, const T* b, size_t n) {
  size_t bad = 0;
  for (size_t i = 0; i < n; ++i) bad += memcmp(&a[i], &b[i], sizeof(T)) != 0;
  return bad;
}
template <class T>
size_t bits_differ(const std::vector<T>& a, const std::vector<T>& b) {
  if (a.size() != b.size()) return std::max(a.size(), b.size());
  return bits_differ(a.data(), b.data(), a.size());
}

// Whether a and b hold the same bits.
template <class T>
bool same_bits(const T* a, const T* b, size_t n) {
  return memcmp(a, b, n * sizeof(T)) == 0;
}
template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && same_bits(a.data(), b.data(), a.size());
}

// A pointer as a kernel's parameters carry it.
inline uint64_t addr(const void* p) { return reinterpret_cast<uint64_t>(p); }

// A seeded std::mt19937_64 (a harness's inputs are the same on every run)
// that also draws uniform numbers.
struct Rng : std::mt19937_64 {
  using std::mt19937_64::mt19937_64;
  // U(a, b), in double.
  double U(double a, double b) { return std::uniform_real_distribution<double>(a, b)(*this); }
  // n draws of U(a, b), each rounded to T.
  template <class T = double>
  std::vector<T> uniform(size_t n, double a = -1, double b = 1) {
    std::vector<T> v(n);
    for (auto& x : v) x = static_cast<T>(U(a, b));
    return v;
  }
};

// Prints the line that ends a harness's run, "NAME: N checks, M failures:
// ok" (FAIL instead of ok on a failure or when nothing was checked; NAME
// followed by "(AddressSanitizer)" in a build with it), and returns the
// exit status: non-zero on FAIL.
inline int finish(const std::string& name) {
#ifdef __SANITIZE_ADDRESS__
  const char* asan = " (AddressSanitizer)";
#else
  const char* asan = "";
#endif
  const bool ok = failures == 0 && checks > 0;
  printf("%s%s: %d checks, %d failures: %s\n", name.c_str(), asan, checks, failures, ok ? "ok" : "FAIL");
  return ok ? 0 : 1;
}

}  // namespace harness
