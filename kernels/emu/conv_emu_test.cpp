// Emulated runs of kernels/conv.cu and conv_bn.cu (see emu.h) against double
// references, with the tolerances of autograd/tolerance.go: the TF32 kernels
// TolTF32, the full-float32 ones (conv_*_fma_m64_i64_f32) TolGemm32, the
// float64 ones TolForward64, BatchNorm and the other float32 sums
// TolForward32 or, where the GPU tests compare with the CPU twin,
// TolParity32. The cp.async kernels (conv_fprop_mma_m128_s3_f32,
// _m256_s4_f32, _m128_s3_t128_f32, conv_dgrad_ and conv_wgrad_mma_m128_s3_f32)
// are also compared bit for bit with conv_gemm's (conv_*_mma_m128_i64_f32),
// which do the same MMAs in the same order.
// `conv_emu_test quick` runs a few cases only. Exits non-zero on a failure.
#include "emu.h"
#include "harness.h"
// clang-format off
#include "../conv.cu"
#include "../conv_bn.cu"
// clang-format on
#include <chrono>
#include <random>
#include <type_traits>

using stheno::ConvGemmParams;
using stheno::FastDiv;

using namespace harness;

static FastDiv fastdiv(int d) {
  FastDiv f{d, 0, 0, 0};
  if (d == 1) return f;
  int l = 0;
  while ((1ll << l) < d) ++l;
  const int p = 31 + l;
  const uint64_t m = ((1ull << p) + d - 1) / d;
  f.mul = static_cast<uint32_t>(m);
  f.shr = p - 32;
  return f;
}

struct Geom {
  int n, cin, h, w, cout, kh, kw, sh, sw, ph, pw, dh, dw;
  int oh() const { return (h + 2 * ph - dh * (kh - 1) - 1) / sh + 1; }
  int ow() const { return (w + 2 * pw - dw * (kw - 1) - 1) / sw + 1; }
};

static Rng rng(7);

template <class T>
uint64_t ptr(const std::vector<T>& v) {
  return v.empty() ? 0 : reinterpret_cast<uint64_t>(v.data());
}

static ConvGemmParams common(const Geom& g) {
  ConvGemmParams p;
  memset(&p, 0, sizeof p);
  p.n = g.n, p.cin = g.cin, p.h = g.h, p.w = g.w, p.cout = g.cout, p.kh = g.kh, p.kw = g.kw;
  p.stride_h = g.sh, p.stride_w = g.sw, p.pad_h = g.ph, p.pad_w = g.pw, p.dil_h = g.dh, p.dil_w = g.dw;
  p.out_h = g.oh(), p.out_w = g.ow();
  p.div_kk = fastdiv(g.kh * g.kw);
  p.div_kw = fastdiv(g.kw);
  p.div_sh = fastdiv(g.sh);
  p.div_sw = fastdiv(g.sw);
  p.div_img = fastdiv(1);
  p.div_row = fastdiv(1);
  p.div_q = fastdiv(1);
  p.div_qw = fastdiv(1);
  return p;
}

// The float32 forward kernels: conv_gemm's, and conv_pipe's by their tiles.
enum FpropKernel { kGemm, kPipeM128S3, kPipeM256S4, kPipeM128S3T128 };

// conv_gemm's kernels by dtype and math (kMma: TF32; kFma: the CUDA cores).
template <class T, int kMode, int kMath>
void (*gemm_kernel())(ConvGemmParams) {
  if constexpr (std::is_same<T, double>::value)
    return kMode == stheno::kFprop ? conv_fprop_fma_m64_i64_f64
           : kMode == stheno::kDgrad ? conv_dgrad_fma_m64_i64_f64
                                     : conv_wgrad_fma_m64_i64_f64;
  else if constexpr (kMath == stheno::kFma)
    return kMode == stheno::kFprop ? conv_fprop_fma_m64_i64_f32
           : kMode == stheno::kDgrad ? conv_dgrad_fma_m64_i64_f32
                                     : conv_wgrad_fma_m64_i64_f32;
  else
    return kMode == stheno::kFprop ? conv_fprop_mma_m128_i64_f32
           : kMode == stheno::kDgrad ? conv_dgrad_mma_m128_i64_f32
                                     : conv_wgrad_mma_m128_i64_f32;
}

template <class T, int kMode, int kMath = stheno::kDefaultMath<T>>
void run(ConvGemmParams p, int splits_wanted, FpropKernel fprop = kGemm) {
  using S = stheno::GemmShape<T, kMode, kMath>;
  const int tiles_m = (p.m + S::BM - 1) / S::BM, tiles_n = (p.ncols + S::BN - 1) / S::BN;
  const int kt = (p.k + S::BK - 1) / S::BK;
  const int kps = (kt + splits_wanted - 1) / splits_wanted;
  const int splits = (kt + kps - 1) / kps;
  p.tiles_m = tiles_m;
  p.k_tiles_per_split = kps;
  void (*k)(ConvGemmParams) = gemm_kernel<T, kMode, kMath>();
  if (splits != splits_wanted) printf("  (splits %d -> %d)\n", splits_wanted, splits);
  if (fprop == kPipeM128S3) {
    emu::launch(conv_fprop_mma_m128_s3_f32, dim3(tiles_m * tiles_n, 1, splits), dim3(S::NT),
                stheno::PipeM128S3::kSmemBytes, p);
    return;
  }
  if (fprop == kPipeM256S4) {
    using V = stheno::PipeM256S4;
    const int tm = (p.m + V::BM - 1) / V::BM, tn = (p.ncols + V::BN - 1) / V::BN;
    p.tiles_m = tm;
    emu::launch(conv_fprop_mma_m256_s4_f32, dim3(tm * tn), dim3(V::NT), V::kSmemBytes, p);
    return;
  }
  if (fprop == kPipeM128S3T128) {
    using V = stheno::PipeM128S3T128;
    const int tm = (p.m + V::BM - 1) / V::BM, tn = (p.ncols + V::BN - 1) / V::BN;
    p.tiles_m = tm;
    emu::launch(conv_fprop_mma_m128_s3_t128_f32, dim3(tm * tn), dim3(V::NT), V::kSmemBytes, p);
    return;
  }
  emu::launch(k, dim3(tiles_m * tiles_n, 1, splits), dim3(S::NT), S::kSmemBytes, p);
}

// conv_pipe's forward kernels against the reference and, bit for bit,
// against conv_fprop_mma_m128_i64_f32 (same MMAs in the same order): with
// the launch p of its run (bias, ReLU, stats), then with scale, shift,
// residual and ReLU.
template <class T>
void fprop_pipe_vs_gemm(const Geom& g, ConvGemmParams p, const std::vector<double>& y, const std::vector<T>& y1,
                    const std::vector<double>& stats1, Tol tol) {
  auto scale = rng.uniform<float>(g.cout, 0.5, 1.5), shift = rng.uniform<float>(g.cout, -0.5, 0.5);
  auto res = rng.uniform<float>(y1.size());
  std::vector<float> y1f(y1.begin(), y1.end());
  std::vector<float> ya(y1.size(), NAN);
  std::vector<double> sa(stats1.size(), NAN);
  ConvGemmParams q = p;
  q.scale = ptr(scale), q.shift = ptr(shift), q.residual = ptr(res), q.relu = 1;
  q.out = ptr(ya), q.stats = ptr(sa);
  run<float, stheno::kFprop>(q, 1, kGemm);
  const std::pair<FpropKernel, const char*> pipes[] = {
      {kPipeM128S3, "m128_s3"}, {kPipeM256S4, "m256_s4"}, {kPipeM128S3T128, "m128_s3_t128"}};
  for (auto [v, name] : pipes) {
    char what[64];
    std::vector<float> y2(y1.size(), NAN);
    std::vector<double> stats2(stats1.size(), NAN);
    p.out = ptr(y2);
    p.stats = ptr(stats2);
    const long c16 = emu_cp16_count;
    run<float, stheno::kFprop>(p, 1, v);
    printf("  (%s: %ld copies of 16 bytes)\n", name, emu_cp16_count - c16);
    snprintf(what, sizeof what, "fprop %s", name);
    check(what, y, y2, tol);
    int bad = bits_differ(y1f, y2) + bits_differ(stats1, stats2);
    snprintf(what, sizeof what, "fprop %s == i64 (y, stats)", name);
    expect_none(what, bad);
    // Scale, shift, residual and ReLU.
    std::vector<float> yb(y1.size(), NAN);
    std::vector<double> sb(stats1.size(), NAN);
    q.out = ptr(yb), q.stats = ptr(sb);
    run<float, stheno::kFprop>(q, 1, v);
    bad = bits_differ(ya, yb) + bits_differ(sa, sb);
    int nans = 0;
    for (float x : yb) nans += std::isnan(x);
    snprintf(what, sizeof what, "%s == i64 scale/res/relu", name);
    printf("  %-28s %d differ, %d NaN %s\n", what, bad, nans, bad == 0 && nans == 0 ? "ok" : "FAIL");
    count(bad == 0 && nans == 0);
  }
}

// dy' = dy masked by y > 0, by conv_bn.cu's relu_mask_f32 as ops does for
// the cp.async backward kernels, or dy itself without a ReLU.
static std::vector<float> masked_dy(const std::vector<float>& dy, const std::vector<float>& y, bool relu) {
  if (!relu) return dy;
  std::vector<float> out(dy.size(), NAN);
  stheno::MaskParams mp{ptr(y), ptr(dy), ptr(out), int64_t(dy.size())};
  emu::launch(relu_mask_f32, dim3(3), dim3(64), 0, mp);
  return out;
}

// Which passes a case runs: the largest cases exist for one side's tiling
// (and cost most of the emulator's time on the other).
enum { kFwd = 1, kBwd = 2, kBoth = 3 };

// The convolution's three GEMMs by conv_gemm's kernels of T and kMath (in
// float32, kMma: TF32, with conv_pipe's kernels compared bit for bit;
// kFma: full float32, which must hold TolGemm32, a bound TF32's rounding
// does not fit), against double references.
template <class T, int kMath = stheno::kDefaultMath<T>>
void test_conv(const char* name, Geom g, bool bias, bool relu, int splits, int passes = kBoth) {
  constexpr bool kTF32 = std::is_same<T, float>::value && kMath == stheno::kMma;
  printf("%s %s\n", name, sizeof(T) == 8 ? "f64" : kTF32 ? "f32" : "f32 fma (full float32)");
  struct Timer {
    std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
    ~Timer() { printf("  (%.1f s)\n", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()); }
  } timer;
  const int oh = g.oh(), ow = g.ow(), P = oh * ow, KK = g.kh * g.kw, K = g.cin * KK;
  auto x = rng.uniform<T>(size_t(g.n) * g.cin * g.h * g.w);
  auto w = rng.uniform<T>(size_t(g.cout) * K, -0.5, 0.5);
  auto b = bias ? rng.uniform<T>(g.cout, -0.5, 0.5) : std::vector<T>();
  auto dy = rng.uniform<T>(size_t(g.n) * g.cout * P);
  // Reference forward (double), pre-activation z and y.
  std::vector<double> z(size_t(g.n) * g.cout * P), y(z.size());
  auto X = [&](int n, int c, int ih, int iw) -> double {
    if (ih < 0 || ih >= g.h || iw < 0 || iw >= g.w) return 0;
    return x[((size_t(n) * g.cin + c) * g.h + ih) * g.w + iw];
  };
  for (int n = 0; n < g.n; ++n)
    for (int co = 0; co < g.cout; ++co)
      for (int a = 0; a < oh; ++a)
        for (int bb = 0; bb < ow; ++bb) {
          double s = bias ? double(b[co]) : 0;
          for (int ci = 0; ci < g.cin; ++ci)
            for (int kh = 0; kh < g.kh; ++kh)
              for (int kw = 0; kw < g.kw; ++kw)
                s += double(w[((size_t(co) * g.cin + ci) * g.kh + kh) * g.kw + kw]) *
                     X(n, ci, a * g.sh - g.ph + kh * g.dh, bb * g.sw - g.pw + kw * g.dw);
          const size_t i = ((size_t(n) * g.cout + co) * oh + a) * ow + bb;
          z[i] = s;
          y[i] = relu && s < 0 ? 0 : s;
        }
  const Tol tol = sizeof(T) == 8 ? TolForward64 : kTF32 ? TolTF32 : TolGemm32;
  // fprop
  std::vector<T> yg(y.size(), T(NAN));
  std::vector<double> stats;
  if (passes & kFwd) {
    ConvGemmParams p = common(g);
    p.a = ptr(w), p.b = ptr(x), p.out = ptr(yg), p.shift = ptr(b), p.relu = relu;
    p.m = g.cout, p.ncols = g.n * P, p.k = K;
    p.div_img = fastdiv(P), p.div_row = fastdiv(ow);
    using S = stheno::GemmShape<T, stheno::kFprop, kMath>;
    const int tiles_n = (p.ncols + S::BN - 1) / S::BN;
    stats.assign(size_t(tiles_n) * g.cout * 3, NAN);
    p.stats = ptr(stats);
    run<T, stheno::kFprop, kMath>(p, 1);
    check("fprop", y, yg, tol);
    if constexpr (kTF32) fprop_pipe_vs_gemm(g, p, y, yg, stats, tol);
    // Stats: each (column tile, channel) record holds the count, sum and M2
    // (about the tile's mean) of the kernel's own outputs, summed in T.
    std::vector<double> sref(stats.size()), sgot(stats.begin(), stats.end());
    for (int t = 0; t < tiles_n; ++t)
      for (int co = 0; co < g.cout; ++co) {
        double cnt = 0, sum = 0, m2 = 0;
        const int c0 = t * S::BN, c1 = std::min(p.ncols, c0 + S::BN);
        auto at = [&](int c) { return double(yg[(size_t(c / P) * g.cout + co) * P + c % P]); };
        for (int c = c0; c < c1; ++c) cnt += 1, sum += at(c);
        for (int c = c0; c < c1; ++c) m2 += (at(c) - sum / cnt) * (at(c) - sum / cnt);
        double* r = &sref[(size_t(t) * g.cout + co) * 3];
        r[0] = cnt, r[1] = sum, r[2] = m2;
      }
    check("fprop stats (count,sum,M2)", sref, sgot, sizeof(T) == 4 ? TolParity32 : TolParity64);
  }
  // dgrad with the ReLU mask of y (masked where y <= 0), and wgrad.
  std::vector<double> dyp(dy.size());
  for (size_t i = 0; i < dy.size(); ++i) dyp[i] = relu ? (y[i] > 0 ? double(dy[i]) : 0) : double(dy[i]);
  std::vector<T> ymask(y.begin(), y.end());
  if (passes & kBwd) {
    std::vector<double> dx(x.size(), 0);
    for (int n = 0; n < g.n; ++n)
      for (int co = 0; co < g.cout; ++co)
        for (int a = 0; a < oh; ++a)
          for (int bb = 0; bb < ow; ++bb) {
            const double d = dyp[((size_t(n) * g.cout + co) * oh + a) * ow + bb];
            for (int ci = 0; ci < g.cin; ++ci)
              for (int kh = 0; kh < g.kh; ++kh)
                for (int kw = 0; kw < g.kw; ++kw) {
                  const int ih = a * g.sh - g.ph + kh * g.dh, iw = bb * g.sw - g.pw + kw * g.dw;
                  if (ih < 0 || ih >= g.h || iw < 0 || iw >= g.w) continue;
                  dx[((size_t(n) * g.cin + ci) * g.h + ih) * g.w + iw] +=
                      d * double(w[((size_t(co) * g.cin + ci) * g.kh + kh) * g.kw + kw]);
                }
          }
    // Transposed weights, as conv_transpose_weights makes them.
    std::vector<T> wt(w.size());
    stheno::WeightTParams tp{ptr(w), ptr(wt), int64_t(w.size()), g.cout, g.cin, KK, 0};
    emu::launch(std::is_same<T, float>::value ? (void (*)(stheno::WeightTParams))conv_transpose_weights_f32
                                              : (void (*)(stheno::WeightTParams))conv_transpose_weights_f64,
                dim3(2), dim3(64), 0, tp);
    std::vector<T> dxg(x.size(), T(NAN));
    ConvGemmParams p = common(g);
    p.a = ptr(wt), p.b = ptr(dy), p.mask = relu ? ptr(ymask) : 0, p.out = ptr(dxg);
    p.m = g.cin, p.ncols = g.n * g.h * g.w, p.k = g.cout * KK;
    p.div_img = fastdiv(g.h * g.w), p.div_row = fastdiv(g.w);
    run<T, stheno::kDgrad, kMath>(p, 1);
    check("dgrad", dx, dxg, tol);
    if constexpr (kTF32) {
      if (g.sh == 1 && g.sw == 1) {
        // conv_dgrad_mma_m128_s3_f32 on dy' (no mask): the reference, and
        // conv_dgrad_mma_m128_i64_f32 bit for bit.
        auto dym = masked_dy(dy, ymask, relu);
        std::vector<float> dx2(x.size(), NAN);
        ConvGemmParams q = p;
        q.b = ptr(dym), q.mask = 0, q.out = ptr(dx2);
        using V = stheno::DgradPipeM128S3;
        q.tiles_m = (q.m + V::BM - 1) / V::BM;
        q.k_tiles_per_split = (q.k + V::BK - 1) / V::BK;
        const long c16 = emu_cp16_count;
        emu::launch(conv_dgrad_mma_m128_s3_f32, dim3(q.tiles_m * ((q.ncols + V::BN - 1) / V::BN)), dim3(V::NT),
                    V::kSmemBytes, q);
        printf("  (dgrad m128_s3: %ld copies of 16 bytes)\n", emu_cp16_count - c16);
        check("dgrad m128_s3", dx, dx2, tol);
        expect_none("dgrad m128_s3 == i64", bits_differ(dxg, dx2));
      } else {
        printf("  (dgrad m128_s3: stride, not applicable)\n");
      }
    }
  }
  if (passes & kBwd) {
    std::vector<double> dw(w.size(), 0), db(g.cout, 0);
    for (int n = 0; n < g.n; ++n)
      for (int co = 0; co < g.cout; ++co)
        for (int a = 0; a < oh; ++a)
          for (int bb = 0; bb < ow; ++bb) {
            const double d = dyp[((size_t(n) * g.cout + co) * oh + a) * ow + bb];
            db[co] += d;
            for (int ci = 0; ci < g.cin; ++ci)
              for (int kh = 0; kh < g.kh; ++kh)
                for (int kw = 0; kw < g.kw; ++kw)
                  dw[((size_t(co) * g.cin + ci) * g.kh + kh) * g.kw + kw] +=
                      d * X(n, ci, a * g.sh - g.ph + kh * g.dh, bb * g.sw - g.pw + kw * g.dw);
          }
    using S = stheno::GemmShape<T, stheno::kWgrad, kMath>;
    const int kt = (g.n * P + S::BK - 1) / S::BK;
    const int kps = (kt + splits - 1) / splits;
    const int sp = (kt + kps - 1) / kps;
    std::vector<T> ws(size_t(sp) * dw.size(), T(NAN)), bws(size_t(sp) * g.cout, T(NAN));
    std::vector<T> out(dw.size() + g.cout, T(NAN));
    ConvGemmParams p = common(g);
    p.a = ptr(dy), p.b = ptr(x), p.mask = relu ? ptr(ymask) : 0;
    p.out = sp > 1 ? ptr(ws) : ptr(out);
    p.bias_grad = sp > 1 ? ptr(bws) : reinterpret_cast<uint64_t>(out.data() + dw.size());
    p.m = g.cout, p.ncols = K, p.k = g.n * P;
    p.div_q = fastdiv(P), p.div_qw = fastdiv(ow);
    run<T, stheno::kWgrad, kMath>(p, splits);
    if (sp > 1) {
      stheno::SplitKParams sk{ptr(ws), ptr(out), ptr(bws), reinterpret_cast<uint64_t>(out.data() + dw.size()),
                              int64_t(dw.size()), g.cout, sp};
      emu::launch(std::is_same<T, float>::value ? (void (*)(stheno::SplitKParams))conv_splitk_reduce_f32
                                                : (void (*)(stheno::SplitKParams))conv_splitk_reduce_f64,
                  dim3(3), dim3(64), 0, sk);
    }
    std::vector<T> dwg(out.begin(), out.begin() + dw.size()), dbg(out.begin() + dw.size(), out.end());
    check("wgrad dw", dw, dwg, tol);
    check("wgrad db", db, dbg, sizeof(T) == 4 ? TolForward32 : TolForward64);
    if constexpr (kTF32) {
      if (P % 4 == 0) {
        // conv_wgrad_mma_m128_s3_f32 on dy' (no mask), same splits: the
        // reference, and dw bit for bit with conv_wgrad_mma_m128_i64_f32's
        // (the bias sums go in another order).
        auto dym = masked_dy(dy, ymask, relu);
        using V = stheno::WgradPipeM128S3;
        std::vector<float> ws2(ws.size(), NAN), bws2(bws.size(), NAN), out2(out.size(), NAN);
        ConvGemmParams q = p;
        q.a = ptr(dym), q.mask = 0;
        q.out = sp > 1 ? ptr(ws2) : ptr(out2);
        q.bias_grad = sp > 1 ? ptr(bws2) : reinterpret_cast<uint64_t>(out2.data() + dw.size());
        q.tiles_m = (q.m + V::BM - 1) / V::BM;
        q.k_tiles_per_split = kps;
        const long c16 = emu_cp16_count;
        emu::launch(conv_wgrad_mma_m128_s3_f32, dim3(q.tiles_m * ((q.ncols + V::BN - 1) / V::BN), 1, sp), dim3(V::NT),
                    V::kSmemBytes, q);
        printf("  (wgrad m128_s3: %d splits, %ld copies of 16 bytes)\n", sp, emu_cp16_count - c16);
        if (sp > 1) {
          stheno::SplitKParams sk{ptr(ws2), ptr(out2), ptr(bws2), reinterpret_cast<uint64_t>(out2.data() + dw.size()),
                                  int64_t(dw.size()), g.cout, sp};
          emu::launch(conv_splitk_reduce_f32, dim3(3), dim3(64), 0, sk);
        }
        std::vector<float> dw2(out2.begin(), out2.begin() + dw.size()), db2(out2.begin() + dw.size(), out2.end());
        check("wgrad m128_s3 dw", dw, dw2, tol);
        check("wgrad m128_s3 db", db, db2, TolForward32);
        std::vector<float> dw1(dwg.begin(), dwg.end());
        expect_none("wgrad m128_s3 dw == i64", bits_differ(dw1, dw2));
      } else {
        printf("  (wgrad m128_s3: OutH*OutW %% 4 != 0, not applicable)\n");
      }
    }
  }
}

// BatchNorm: training forward through bn_reduce + finalize + apply, and the
// backward, against double references.
template <class T>
void test_bn(int n, int c, int hw, int chunk, bool relu, bool residual, bool training) {
  printf("bn n=%d c=%d hw=%d chunk=%d relu=%d res=%d train=%d %s\n", n, c, hw, chunk, relu, residual, training,
         sizeof(T) == 4 ? "f32" : "f64");
  const size_t total = size_t(n) * c * hw;
  auto z = rng.uniform<T>(total, 2, 4);  // a mean far from zero
  auto gamma = rng.uniform<T>(c, 0.5, 1.5), beta = rng.uniform<T>(c, -0.5, 0.5);
  auto res = residual ? rng.uniform<T>(total) : std::vector<T>();
  auto rm = rng.uniform<T>(c, -0.5, 0.5), rv = rng.uniform<T>(c, 0.5, 2);
  auto rm0 = rm, rv0 = rv;
  const double eps = 1e-3, mom = 0.2;
  const int chunks = (hw + chunk - 1) / chunk;
  std::vector<double> part(size_t(n) * chunks * c * 3, NAN);
  std::vector<T> coef(size_t(c) * 8, T(NAN)), out(total, T(NAN)), bstats(2 * c, T(NAN));
  stheno::BNParams p;
  memset(&p, 0, sizeof p);
  p.z = ptr(z), p.residual = ptr(res), p.out = ptr(out), p.partial = ptr(part), p.gamma = ptr(gamma), p.beta = ptr(beta);
  p.run_mean = ptr(rm), p.run_var = ptr(rv), p.batch_stats = ptr(bstats), p.coef = ptr(coef);
  p.eps = eps, p.momentum = mom, p.n = n, p.c = c, p.hw = hw, p.slots = n * chunks, p.rec = 3, p.chunk = chunk;
  p.training = training, p.relu = relu;
  const bool f = std::is_same<T, float>::value;
  if (training) emu::launch(f ? bn_reduce_f32 : bn_reduce_f64, dim3(chunks, n, c), dim3(64), stheno::kBNScratchBytes, p);
  emu::launch(f ? bn_finalize_f32 : bn_finalize_f64, dim3(c), dim3(64), stheno::kBNScratchBytes, p);
  if (!training) {
    // Elements whose output before the ReLU is within a few ulps of 0, on
    // both sides (inference: the constants do not depend on z), where the
    // backward's mask, recomputed from z, must still be the forward's y > 0.
    for (int j = 0; j < hw && j < 16; ++j) {
      const int ch = j % c;
      const size_t k = size_t(ch) * hw + j;
      const T* cf = &coef[size_t(ch) * 8];
      T root = cf[0] + (-(residual ? res[k] : T(0)) - cf[2]) / cf[1];
      for (int u = 0; u < j % 8; ++u) root = std::nextafter(root, j < 8 ? T(INFINITY) : T(-INFINITY));
      z[k] = root;
    }
  }
  emu::launch(f ? bn_apply_f32 : bn_apply_f64, dim3(n * c, 2), dim3(32), 0, p);
  // reference
  std::vector<double> mean(c), var(c), yref(total);
  for (int ch = 0; ch < c; ++ch) {
    double s = 0, m = double(n) * hw;
    for (int i = 0; i < n; ++i)
      for (int q = 0; q < hw; ++q) s += z[(size_t(i) * c + ch) * hw + q];
    mean[ch] = s / m;
    double ss = 0;
    for (int i = 0; i < n; ++i)
      for (int q = 0; q < hw; ++q) ss += pow(z[(size_t(i) * c + ch) * hw + q] - mean[ch], 2);
    var[ch] = ss / m;
  }
  for (int i = 0; i < n; ++i)
    for (int ch = 0; ch < c; ++ch)
      for (int q = 0; q < hw; ++q) {
        const size_t k = (size_t(i) * c + ch) * hw + q;
        double mu = training ? mean[ch] : double(rm0[ch]), va = training ? var[ch] : double(rv0[ch]);
        double v = (z[k] - mu) / sqrt(va + eps) * gamma[ch] + beta[ch] + (residual ? double(res[k]) : 0);
        yref[k] = relu && v < 0 ? 0 : v;
      }
  const Tol tol = f ? TolForward32 : TolForward64;
  check("bn forward", yref, out, tol);
  if constexpr (std::is_same<T, float>::value) {
    if (hw % 4 == 0) {
      // The float4 apply that ops picks for aligned planes of whole float4s:
      // the reference, and bn_apply_f32 bit for bit.
      std::vector<float> out4(total, NAN);
      p.out = ptr(out4);
      emu::launch(bn_apply_vec4_f32, dim3(n * c, 2), dim3(32), 0, p);
      p.out = ptr(out);
      check("bn forward vec4", yref, out4, tol);
      expect_none("bn forward vec4 == f32", bits_differ(out, out4));
    }
  }
  if (training) {
    std::vector<double> rmr(c), rvr(c);
    for (int ch = 0; ch < c; ++ch) {
      rmr[ch] = (1 - mom) * rm0[ch] + mom * mean[ch];
      rvr[ch] = (1 - mom) * rv0[ch] + mom * var[ch] * (double(n) * hw) / (double(n) * hw - 1);
    }
    check("running mean", rmr, rm, tol);
    check("running var", rvr, rv, tol);
  }
  // Backward, from the forward's constants (the reference masks dy with the
  // forward's y itself; the kernels recompute the mask from z).
  auto dy = rng.uniform<T>(total);
  const std::vector<T> fcoef(coef);
  std::vector<T> dz(total, T(NAN)), dg(c, T(NAN)), dbt(c, T(NAN));
  std::fill(part.begin(), part.end(), NAN);
  p.dy = ptr(dy), p.fcoef = ptr(fcoef), p.out = ptr(dz), p.rec = 2, p.dgamma = ptr(dg), p.dbeta = ptr(dbt);
  p.run_mean = 0, p.run_var = 0, p.batch_stats = 0;
  emu::launch(f ? bn_grad_reduce_f32 : bn_grad_reduce_f64, dim3(chunks, n, c), dim3(64), stheno::kBNScratchBytes, p);
  emu::launch(f ? bn_finalize_f32 : bn_finalize_f64, dim3(c), dim3(64), stheno::kBNScratchBytes, p);
  emu::launch(f ? bn_backward_apply_f32 : bn_backward_apply_f64, dim3(n * c, 3), dim3(32), 0, p);
  std::vector<double> dzr(total), dgr(c), dbr(c);
  for (int ch = 0; ch < c; ++ch) {
    const double mu = training ? mean[ch] : double(rm0[ch]);
    const double is = 1 / sqrt((training ? var[ch] : double(rv0[ch])) + eps), m = double(n) * hw;
    double sg = 0, sgx = 0;
    for (int i = 0; i < n; ++i)
      for (int q = 0; q < hw; ++q) {
        const size_t k = (size_t(i) * c + ch) * hw + q;
        const double gg = relu && !(out[k] > 0) ? 0 : double(dy[k]);
        sg += gg;
        sgx += gg * (z[k] - mu) * is;
      }
    dgr[ch] = sgx, dbr[ch] = sg;
    for (int i = 0; i < n; ++i)
      for (int q = 0; q < hw; ++q) {
        const size_t k = (size_t(i) * c + ch) * hw + q;
        const double gg = relu && !(out[k] > 0) ? 0 : double(dy[k]);
        const double xh = (z[k] - mu) * is;
        dzr[k] = training ? gamma[ch] * is * (gg - sg / m - xh * sgx / m) : gamma[ch] * is * gg;
      }
  }
  check("bn dz", dzr, dz, f ? TolForward32 : TolForward64);
  check("bn dgamma", dgr, dg, f ? TolForward32 : TolForward64);
  check("bn dbeta", dbr, dbt, f ? TolForward32 : TolForward64);
  if constexpr (std::is_same<T, float>::value) {
    // dz for the TF32 GEMMs is bn_backward_apply_f32's rounded to TF32, bit
    // for bit; the float4 variants are the scalar ones, bit for bit.
    std::vector<float> want(dz), dzt(total, NAN);
    for (auto& v : want) v = bits_to_float(emu_to_tf32(v));
    p.out = ptr(dzt);
    emu::launch(bn_backward_apply_tf32_f32, dim3(n * c, 3), dim3(32), 0, p);
    expect_none("bn dz tf32 == round(dz)", bits_differ(want, dzt));
    if (hw % 4 == 0) {
      std::vector<float> dz4(total, NAN), dzt4(total, NAN);
      p.out = ptr(dz4);
      emu::launch(bn_backward_apply_vec4_f32, dim3(n * c, 2), dim3(32), 0, p);
      p.out = ptr(dzt4);
      emu::launch(bn_backward_apply_tf32_vec4_f32, dim3(n * c, 2), dim3(32), 0, p);
      expect_none("bn dz vec4 == f32", bits_differ(dz, dz4) + bits_differ(dzt, dzt4));
    }
    p.out = ptr(dz);
  }
  // finalize leaves the coefficients the CPU twin does: 5 a channel, zeros
  // after them.
  int nonzero = 0;
  for (int ch = 0; ch < c; ++ch)
    for (int k = 5; k < 8; ++k) nonzero += coef[size_t(ch) * 8 + k] != T(0);
  expect_none("bn coef padding", nonzero, "non-zero");
}

// relu_mask_sum_tf32_f32 (and its float4 variant), relu_mask_sum_f32 (and
// its float4 variant, for full-float32 GEMMs) and relu_mask_sum_f64: g = dy
// masked by y > 0 (or not masked), rounded to TF32 by the _tf32 ones, bit
// for bit against the host; the per-chunk sums of the unrounded g against
// double sums.
template <class T>
void test_mask_sum(int n, int c, int plane, int chunk, bool mask) {
  const bool f = std::is_same<T, float>::value;
  printf("mask_sum n=%d c=%d plane=%d chunk=%d mask=%d %s\n", n, c, plane, chunk, mask, f ? "f32" : "f64");
  const size_t total = size_t(n) * c * plane;
  const int chunks = (plane + chunk - 1) / chunk;
  auto y = rng.uniform<T>(total), dy = rng.uniform<T>(total);
  y[3] = T(NAN), y[5] = T(0);  // neither passes the gradient
  std::vector<T> want(total), want_tf32(total);
  std::vector<double> sums(size_t(n) * chunks * c, 0);
  for (int i = 0; i < n; ++i)
    for (int ch = 0; ch < c; ++ch)
      for (int q = 0; q < plane; ++q) {
        const size_t k = (size_t(i) * c + ch) * plane + q;
        const T g = mask && !(y[k] > T(0)) ? T(0) : dy[k];
        sums[(size_t(i) * chunks + q / chunk) * c + ch] += double(g);
        want[k] = g;
        if constexpr (std::is_same<T, float>::value) want_tf32[k] = bits_to_float(emu_to_tf32(g));
      }
  using K = void (*)(stheno::MaskSumParams);
  struct Case {
    const char* name;
    K kernel;
    bool tf32;
  };
  std::vector<Case> kernels;
  if constexpr (std::is_same<T, float>::value) {
    kernels.push_back({"relu_mask_sum_tf32_f32", relu_mask_sum_tf32_f32, true});
    kernels.push_back({"relu_mask_sum_f32", relu_mask_sum_f32, false});
    if (plane % 4 == 0) {
      kernels.push_back({"relu_mask_sum_tf32_vec4_f32", relu_mask_sum_tf32_vec4_f32, true});
      kernels.push_back({"relu_mask_sum_vec4_f32", relu_mask_sum_vec4_f32, false});
    }
  } else {
    kernels.push_back({"relu_mask_sum_f64", relu_mask_sum_f64, false});
  }
  for (auto [name, k, tf32] : kernels) {
    std::vector<T> g(total, T(NAN)), part(sums.size(), T(NAN));
    stheno::MaskSumParams mp{mask ? ptr(y) : 0, ptr(dy), ptr(g), ptr(part), c, plane, chunk, chunks};
    emu::launch(k, dim3(n * c * chunks), dim3(64), stheno::kMaskSumScratchBytes, mp);
    expect_none(name, bits_differ(tf32 ? want_tf32 : want, g));
    check("  chunk sums", sums, part, f ? TolForward32 : TolForward64);
  }
}

int main(int argc, char** argv) {
  width = 28;
  const bool quick = argc > 1;
  // name, geometry {n,cin,h,w,cout,kh,kw,sh,sw,ph,pw,dh,dw}
  test_conv<double>("3x3 pad 1", Geom{2, 5, 7, 9, 11, 3, 3, 1, 1, 1, 1, 1, 1}, true, true, 1);
  test_conv<float>("3x3 pad 1", Geom{2, 5, 7, 9, 11, 3, 3, 1, 1, 1, 1, 1, 1}, true, true, 1);
  test_conv<float>("3x3 wgrad split 3", Geom{2, 3, 9, 11, 7, 3, 3, 1, 1, 1, 1, 1, 1}, false, true, 3);
  test_conv<double>("3x3 wgrad split 3", Geom{2, 3, 9, 11, 7, 3, 3, 1, 1, 1, 1, 1, 1}, false, true, 3);
  test_conv<float>("7x7 stride 2 pad 3", Geom{1, 3, 13, 11, 6, 7, 7, 2, 2, 3, 3, 1, 1}, true, false, 1);
  test_conv<double>("7x7 stride 2 pad 3", Geom{1, 3, 13, 11, 6, 7, 7, 2, 2, 3, 3, 1, 1}, true, false, 1);
  // Full float32: a bias and the ReLU's mask staged with dy, split-K, a
  // stride (dgrad's strided gather), several tiles of rows and columns.
  using stheno::kFma;
  test_conv<float, kFma>("3x3 pad 1", Geom{2, 5, 7, 9, 11, 3, 3, 1, 1, 1, 1, 1, 1}, true, true, 1);
  test_conv<float, kFma>("7x7 stride 2 pad 3", Geom{1, 3, 13, 11, 6, 7, 7, 2, 2, 3, 3, 1, 1}, true, false, 1);
  if (!quick) {
    test_conv<float, kFma>("3x3 wgrad split 3", Geom{2, 3, 9, 11, 7, 3, 3, 1, 1, 1, 1, 1, 1}, false, true, 3);
    test_conv<float, kFma>("2x3 s(2,1) p(0,1) d(1,2)", Geom{2, 2, 6, 7, 3, 2, 3, 2, 1, 0, 1, 1, 2}, false, true, 1);
    test_conv<float, kFma>("3x3 Cout 70 Cin 66 2x2 tiles", Geom{2, 66, 9, 10, 70, 3, 3, 1, 1, 1, 1, 1, 1}, true, true, 2);
    test_conv<float>("2x3 s(2,1) p(0,1) d(1,2)", Geom{2, 2, 6, 7, 3, 2, 3, 2, 1, 0, 1, 1, 2}, false, true, 1);
    test_conv<double>("2x3 s(2,1) p(0,1) d(1,2)", Geom{2, 2, 6, 7, 3, 2, 3, 2, 1, 0, 1, 1, 2}, false, true, 1);
    test_conv<float>("1x1 two M tiles", Geom{2, 9, 9, 10, 130, 1, 1, 1, 1, 0, 0, 1, 1}, true, true, 2);
    test_conv<double>("1x1 two M tiles", Geom{2, 9, 9, 10, 70, 1, 1, 1, 1, 0, 0, 1, 1}, true, true, 2);
    test_conv<float>("3x3 dil 2 pad 2", Geom{1, 4, 9, 8, 5, 3, 3, 1, 1, 2, 2, 2, 2}, true, true, 1);
    // K % 4 == 0 (16-byte weight copies in m128_s3), several k-, m- and n-tiles.
    test_conv<float>("3x3 K=144 2x2 tiles", Geom{2, 16, 10, 9, 130, 3, 3, 1, 1, 1, 1, 1, 1}, true, true, 1, kFwd);
    test_conv<float>("1x1 stride 2 K=64", Geom{3, 64, 11, 13, 40, 1, 1, 2, 2, 0, 0, 1, 1}, true, false, 1);
    test_conv<float>("5x5 pad 2 K=100 odd", Geom{1, 4, 7, 13, 9, 5, 5, 1, 1, 2, 2, 1, 1}, false, true, 1);
    // Two M tiles of m256_s4 (256 rows), several n-tiles, 7x7 (no tap masks) with K % 4 == 0.
    test_conv<float>("3x3 300 channels K=72", Geom{1, 8, 12, 13, 300, 3, 3, 1, 1, 1, 1, 1, 1}, true, true, 1, kFwd);
    test_conv<float>("7x7 s2 p3 K=196", Geom{2, 4, 15, 13, 10, 7, 7, 2, 2, 3, 3, 1, 1}, true, true, 1);
    // 1x1 stride 1 over images of a multiple of 4 pixels: 16-byte B copies.
    test_conv<float>("1x1 pointwise K=12", Geom{2, 12, 6, 10, 20, 1, 1, 1, 1, 0, 0, 1, 1}, true, true, 1);
    test_conv<float>("1x1 pointwise K=9 2 M tiles", Geom{3, 9, 8, 8, 140, 1, 1, 1, 1, 0, 0, 1, 1}, true, false, 1);
    // Backward m128_s3: OutH*OutW % 4 == 0 over odd sizes, two M tiles of wgrad
    // (Cout 130) and several of dgrad (Cin 150), split-K, pointwise with splits.
    test_conv<float>("3x3 odd 7x12 split 3", Geom{3, 5, 7, 12, 130, 3, 3, 1, 1, 1, 1, 1, 1}, true, true, 3);
    test_conv<float>("3x4 p(1,2) d(2,1) split 2", Geom{2, 6, 9, 7, 20, 3, 4, 1, 1, 1, 2, 2, 1}, false, true, 2);
    test_conv<float>("3x3 Cin 150 Cout 40 split 4", Geom{2, 150, 6, 10, 40, 3, 3, 1, 1, 1, 1, 1, 1}, true, true, 4, kBwd);
    test_conv<float>("1x1 pointwise split 4", Geom{3, 40, 6, 6, 36, 1, 1, 1, 1, 0, 0, 1, 1}, true, true, 4);
    test_conv<float>("5x5 p2 s1 11x4", Geom{1, 7, 11, 4, 9, 5, 5, 1, 1, 2, 2, 1, 1}, true, false, 2);
    test_conv<float>("7x7 s2 p3 out 8x8", Geom{2, 3, 16, 16, 10, 7, 7, 2, 2, 3, 3, 1, 1}, true, true, 2);
  }
  test_bn<double>(2, 3, 37, 16, true, true, true);
  test_bn<float>(2, 3, 37, 16, true, true, true);
  test_bn<double>(2, 3, 37, 64, false, false, false);
  test_bn<float>(3, 2, 20, 8, true, false, false);
  test_bn<float>(2, 3, 36, 16, false, true, true);
  test_bn<float>(2, 3, 36, 16, true, false, true);
  test_bn<double>(2, 3, 36, 16, true, false, false);
  test_bn<float>(2, 3, 36, 16, true, true, false);
  test_mask_sum<float>(2, 3, 37, 16, true);
  test_mask_sum<float>(2, 3, 36, 16, true);
  test_mask_sum<float>(1, 2, 40, 16, false);
  test_mask_sum<double>(2, 3, 37, 16, true);
  test_mask_sum<double>(1, 2, 40, 64, false);
  return finish(getenv("EMU_CP_EAGER") ? "conv_emu_test (cp.async eager)" : "conv_emu_test");
}
