// Emulated runs (see emu.h) of the kernels of kernels/layout.cu against
// plain references on small shapes: every permute_copy (units of 4, 8 and
// 16 bytes, 32- and 64-bit indices) and permute_tile (4 and 8 bytes) on
// permutations that keep or move the innermost axis, with tiles cut at the
// edges and batches past grid z (the launch caps grid z at 2 here, so the
// blocks stride); copy_rows as Concat and Slice use it; gather_rows with
// repeated indices and with a bad one (a zero row and the status word);
// gather_link and gather_scatter against the sum in increasing i, bit for
// bit (the kernels add in that order). The launches mirror
// ops/layout_device.go (permutePlanFor, copyRowsPlan, rowsLaunch); the
// canonical form mirrors kernels.NewPermuteParams. Outputs start as a
// poison value with a guard zone past their end. Exits non-zero on a
// failure.
#include "emu.h"
#include "harness.h"
// clang-format off
#include "../layout.cu"
// clang-format on
#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

using namespace stheno::layout;

using namespace harness;

static Rng rng(26);


// The canonical permutation (kernels.NewPermuteParams).
struct Canon {
  std::vector<int64_t> dims, in_strides, out_strides;
  int tile_axis = -1;
};
static Canon canon(const std::vector<int64_t>& shape, const std::vector<int>& perm) {
  std::vector<int> axes;
  for (int a : perm)
    if (shape[a] != 1) axes.push_back(a);
  Canon c;
  if (axes.empty()) {
    c.dims = {1}, c.in_strides = {1}, c.out_strides = {1};
    return c;
  }
  std::vector<int64_t> stride(shape.size());
  int64_t s = 1;
  for (int a = int(shape.size()) - 1; a >= 0; --a) stride[a] = s, s *= shape[a];
  std::vector<int> kept = axes;
  std::sort(kept.begin(), kept.end());
  auto succ = [&](int a) {
    for (size_t i = 0; i + 1 < kept.size(); ++i)
      if (kept[i] == a) return kept[i + 1];
    return -1;
  };
  for (size_t i = 0; i < axes.size(); ++i) {
    if (i > 0 && succ(axes[i - 1]) == axes[i]) {
      c.dims.back() *= shape[axes[i]];
      c.in_strides.back() = stride[axes[i]];
      continue;
    }
    c.dims.push_back(shape[axes[i]]);
    c.in_strides.push_back(stride[axes[i]]);
  }
  c.out_strides.resize(c.dims.size());
  s = 1;
  for (int k = int(c.dims.size()) - 1; k >= 0; --k) {
    c.out_strides[k] = s, s *= c.dims[k];
    if (c.in_strides[k] == 1 && k != int(c.dims.size()) - 1) c.tile_axis = k;
  }
  return c;
}

// The reference: out's element at output coordinates (over the permuted
// shape) is in's at the permuted coordinates.
template <class T>
std::vector<T> permute_ref(const std::vector<T>& in, const std::vector<int64_t>& shape, const std::vector<int>& perm) {
  const int r = int(shape.size());
  std::vector<int64_t> stride(r), oshape(r);
  int64_t s = 1;
  for (int a = r - 1; a >= 0; --a) stride[a] = s, s *= shape[a];
  for (int k = 0; k < r; ++k) oshape[k] = shape[perm[k]];
  std::vector<T> out(in.size());
  for (int64_t o = 0; o < int64_t(in.size()); ++o) {
    int64_t rest = o, off = 0;
    for (int k = r - 1; k >= 0; --k) off += (rest % oshape[k]) * stride[perm[k]], rest /= oshape[k];
    out[o] = in[off];
  }
  return out;
}

template <class T>
std::vector<T> ramp(size_t n) {
  std::vector<T> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = T(i + 1);
  return v;
}

constexpr size_t kGuard = 40;

template <class T>
bool same(const std::vector<T>& want, const std::vector<T>& got) {
  if (got.size() != want.size() + kGuard) return false;
  if (memcmp(want.data(), got.data(), want.size() * sizeof(T)) != 0) return false;
  for (size_t i = want.size(); i < got.size(); ++i)
    if (got[i] != T(-7)) return false;
  return true;
}

template <class T>
void permute_case(const std::vector<int64_t>& shape, const std::vector<int>& perm, int force_unit = 0) {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  const auto in = ramp<T>(n);
  const auto want = permute_ref(in, shape, perm);
  const Canon c = canon(shape, perm);
  std::string label = "[";
  for (size_t i = 0; i < shape.size(); ++i) label += (i ? "," : "") + std::to_string(shape[i]);
  label += "] perm (";
  for (size_t i = 0; i < perm.size(); ++i) label += (i ? "," : "") + std::to_string(perm[i]);
  label += ") " + std::string(sizeof(T) == 4 ? "f32" : "f64");
  const int elem = sizeof(T), last = int(c.dims.size()) - 1;
  auto run = [&](void (*k)(PermuteParams), const PermuteParams& p, dim3 grid, dim3 block, const std::string& name) {
    std::vector<T> out(n + kGuard, T(-7));
    PermuteParams q = p;
    q.in = reinterpret_cast<uint64_t>(in.data());
    q.out = reinterpret_cast<uint64_t>(out.data());
    emu::launch(k, grid, block, 0, q);
    expect_line(label + " " + name, same(want, out));
  };
  PermuteParams p{};
  p.rank = int(c.dims.size());
  for (int k = 0; k <= last; ++k) p.dims[k] = c.dims[k], p.in_strides[k] = c.in_strides[k], p.out_strides[k] = c.out_strides[k];
  if (c.tile_axis < 0) {
    // Every unit that divides the innermost run's bytes (the vectors are
    // aligned here: std::vector's data is 16-byte aligned).
    for (int u : {4, 8, 16}) {
      if (u < elem || (c.dims[last] * elem) % u != 0) continue;
      if (force_unit && u != force_unit) continue;
      const int f = u / elem;
      PermuteParams q = p;
      q.dims[last] /= f;
      for (int k = 0; k < last; ++k) q.in_strides[k] /= f;
      q.total = n / f;
      // Few blocks, so that threads stride.
      const unsigned blocks = unsigned(std::min<int64_t>((q.total + kThreads - 1) / kThreads, 3));
      void (*k64)(PermuteParams) = u == 4 ? layout_permute_copy_b4 : u == 8 ? layout_permute_copy_b8 : layout_permute_copy_b16;
      void (*k32)(PermuteParams) = u == 4 ? layout_permute_copy_b4_i32 : u == 8 ? layout_permute_copy_b8_i32 : layout_permute_copy_b16_i32;
      run(k64, q, dim3(blocks), dim3(kThreads), "copy_b" + std::to_string(u));
      run(k32, q, dim3(blocks), dim3(kThreads), "copy_b" + std::to_string(u) + "_i32");
    }
    return;
  }
  p.tile_axis = c.tile_axis;
  p.total = n;
  p.batch = n / (c.dims[c.tile_axis] * c.dims[last]);
  const dim3 grid(unsigned((c.dims[last] + kTile - 1) / kTile), unsigned((c.dims[c.tile_axis] + kTile - 1) / kTile),
                  unsigned(std::min<int64_t>(p.batch, 2)));
  run(elem == 4 ? layout_permute_tile_b4 : layout_permute_tile_b8, p, grid, dim3(kTile, kTileRowsPerPass),
      std::string("tile_b") + std::to_string(elem) + " axis " + std::to_string(c.tile_axis));
}

static int next_pow2(int64_t v) {
  int p = 1;
  while (p < v) p *= 2;
  return p;
}

static dim3 rows_launch(int64_t cols, int64_t rows) {
  const int bx = std::min(kThreads, std::max(32, next_pow2(cols))), by = kThreads / bx;
  return dim3(unsigned((cols + bx - 1) / bx), unsigned(std::min<int64_t>((rows + by - 1) / by, 2)), 1);
}
static dim3 rows_block(int64_t cols) {
  const int bx = std::min(kThreads, std::max(32, next_pow2(cols)));
  return dim3(bx, kThreads / bx);
}

// Concat of [outer, w_i] pieces into [outer, sum w_i] with copy_rows, in
// units of 4 bytes (float) and of 16 where the widths allow.
static void concat_case(int64_t outer, const std::vector<int64_t>& widths) {
  int64_t total = 0;
  for (auto w : widths) total += w;
  std::vector<std::vector<float>> in;
  std::vector<float> want(outer * total);
  int64_t off = 0;
  for (size_t i = 0; i < widths.size(); ++i) {
    in.push_back(ramp<float>(outer * widths[i]));
    for (auto& v : in.back()) v += 1000.0f * i;
    for (int64_t r = 0; r < outer; ++r)
      for (int64_t c = 0; c < widths[i]; ++c) want[r * total + off + c] = in[i][r * widths[i] + c];
    off += widths[i];
  }
  for (int u : {4, 16}) {
    bool ok4 = true;
    for (auto w : widths) ok4 = ok4 && (w * 4) % u == 0;
    if (!ok4 || (total * 4) % u != 0) continue;
    const int f = u / 4;
    std::vector<float> out(outer * total + kGuard, -7.0f);
    off = 0;
    for (size_t i = 0; i < widths.size(); ++i) {
      CopyRowsParams p{reinterpret_cast<uint64_t>(in[i].data()), reinterpret_cast<uint64_t>(out.data() + off), outer,
                       widths[i] / f, widths[i] / f, total / f};
      emu::launch(u == 4 ? layout_copy_rows_b4 : layout_copy_rows_b16, rows_launch(p.cols, outer), rows_block(p.cols), 0, p);
      off += widths[i];
    }
    expect_line("concat " + std::to_string(outer) + " rows of " + std::to_string(widths.size()) + " pieces, copy_rows_b" + std::to_string(u),
           same(want, out));
  }
}

template <class T>
void gather_case(int64_t n, int64_t d, const std::vector<int64_t>& idx) {
  const int64_t k = int64_t(idx.size());
  const auto x = ramp<T>(n * d);
  std::vector<T> want(k * d, T(0));
  bool bad = false;
  for (int64_t i = 0; i < k; ++i) {
    if (idx[i] >= 0 && idx[i] < n) {
      for (int64_t c = 0; c < d; ++c) want[i * d + c] = x[idx[i] * d + c];
    } else {
      bad = true;
    }
  }
  const int elem = sizeof(T);
  const std::string label = "gather n=" + std::to_string(n) + " d=" + std::to_string(d) + " k=" + std::to_string(k) +
                            (sizeof(T) == 4 ? " f32" : " f64") + (bad ? " (bad index)" : "");
  for (int u : {4, 8, 16}) {
    if (u < elem || (d * elem) % u != 0) continue;
    std::vector<T> out(k * d + kGuard, T(-7));
    int status = 0;
    GatherParams p{};
    p.x = reinterpret_cast<uint64_t>(x.data()), p.idx = reinterpret_cast<uint64_t>(idx.data());
    p.out = reinterpret_cast<uint64_t>(out.data()), p.status = reinterpret_cast<uint64_t>(&status);
    p.n = n, p.k = k, p.d = d * elem / u;
    auto kern = u == 4 ? layout_gather_rows_b4 : u == 8 ? layout_gather_rows_b8 : layout_gather_rows_b16;
    emu::launch(kern, rows_launch(p.d, k), rows_block(p.d), 0, p);
    expect_line(label + " gather_rows_b" + std::to_string(u), same(want, out));
    expect_line(label + " gather_rows_b" + std::to_string(u) + " status", status == (bad ? kStatusBadIndex : 0));
  }
  // Backward: dy's rows summed onto dx's rows idx[i], in increasing i.
  std::vector<T> dy(k * d);
  for (auto& v : dy) v = T(rng.U(-1, 1));
  std::vector<T> dx_want(n * d, T(0));
  std::vector<bool> touched(n, false);
  for (int64_t i = 0; i < k; ++i) {
    if (!(idx[i] >= 0 && idx[i] < n)) continue;
    for (int64_t c = 0; c < d; ++c) {
      T& t = dx_want[idx[i] * d + c];
      t = touched[idx[i]] ? T(t + dy[i * d + c]) : dy[i * d + c];
    }
    touched[idx[i]] = true;
  }
  std::vector<int32_t> link(k, -99);
  std::vector<T> dx(n * d + kGuard, T(-7));
  std::fill(dx.begin(), dx.begin() + n * d, T(0));  // the launcher zeroes dx first
  GatherParams p{};
  p.x = reinterpret_cast<uint64_t>(dy.data()), p.idx = reinterpret_cast<uint64_t>(idx.data());
  p.out = reinterpret_cast<uint64_t>(dx.data()), p.link = reinterpret_cast<uint64_t>(link.data());
  p.n = n, p.k = k, p.d = d;
  emu::launch(layout_gather_link, dim3(unsigned((k + kThreads - 1) / kThreads)), dim3(kThreads), 0, p);
  emu::launch(sizeof(T) == 4 ? layout_gather_scatter_f32 : layout_gather_scatter_f64, rows_launch(d, k), rows_block(d), 0, p);
  expect_line(label + " gather_link + gather_scatter, bit for bit", same(dx_want, dx));
}

template <class T>
void cases() {
  permute_case<T>({2, 5, 3, 4}, {0, 2, 1, 3});      // heads: innermost stays
  permute_case<T>({2, 7, 3, 8}, {0, 2, 1, 3});      // rows of 8: 16-byte units
  permute_case<T>({2, 6, 40, 3}, {0, 3, 1, 2});     // NCHW-like -> ... innermost moves
  permute_case<T>({3, 37, 45}, {0, 2, 1});          // [N, C, HW] -> [N, HW, C], tiles cut at both edges
  permute_case<T>({2, 33, 5, 7}, {0, 2, 3, 1});     // NCHW -> NHWC: H, W merge
  permute_case<T>({5, 70}, {1, 0});                 // a plain transpose, batch 1
  permute_case<T>({2, 3, 4, 5, 6}, {4, 2, 0, 3, 1}); // everything moves
  permute_case<T>({4, 1, 6}, {2, 1, 0});            // an axis of one
  permute_case<T>({3, 4, 5}, {0, 1, 2});            // identity: one run
  permute_case<T>({1, 1}, {1, 0});                  // one element
  permute_case<T>({6, 2, 3, 5}, {1, 0, 2, 3});      // batch 4 over grid z of 2: 2-3 merge
  gather_case<T>(7, 5, {3, 0, 3, 6, 3, 1});
  gather_case<T>(9, 8, {8, 8, 2, 8, 0});
  gather_case<T>(5, 3, {1, 7, 2, -1, 1});
}

int main() {
  width = 70;
  cases<float>();
  cases<double>();
  concat_case(3, {5, 2, 9});
  concat_case(4, {8, 4, 12, 4});
  concat_case(1, {1000, 24});
  return finish("layout_emu_test");
}
