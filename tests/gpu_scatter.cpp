// Scatter-add, embedding and embedding-bag on the GPU: both `scatter` variants (atomic, sorted)
// against the double reference on shapes that exercise the sorted kernels' corners (rows narrower
// and wider than a 64-column pass, runs crossing many 32-entry tiles, one index for everything,
// scalar rows, sizes that are not multiples of a tile); the sorted variant bit-identical over 10
// calls and across contexts, the atomic one shown to differ on heavy collisions; out-of-range
// indices and malformed offsets made visible as NaN; the manifest entries; and one DETERMINISM
// line per variant at a realistic embedding size (1M x 64 table, 4096 x 20 lookups).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>

#include "engine/context.h"
#include "engine/graph.h"
#include "engine/error.h"
#include "kernels/scatter.h"
#include "kernels/detail/scatter_cuda.h"
#include "kernels/scatter_ref.h"
#include "support.h"

using namespace ditto;

using test::us_per_call;

namespace {

const ScatterAlgo kAlgos[] = {ScatterAlgo::Atomic, ScatterAlgo::Sorted};

std::vector<int32_t> random_index(std::size_t m, int32_t lo, int32_t hi, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::uniform_int_distribution<int32_t> d(lo, hi);
  std::vector<int32_t> v(m);
  for (auto& i : v) i = d(g);
  return v;
}

// Tolerance for sums of float values taken in some order: row r of the result adds k_r values
// (each rounded once if scaled), so |got - exact| <= (k_r + 1) * 2^-24 * sum |values| in any order
// of additions (Higham's bound for recursive summation, (k-1)u, plus the rounding of the inputs'
// products). `abs_sum` and `count` are the reference's sums of |values| and of ones, row by row.
void check_sums(const std::vector<float>& got, const std::vector<double>& want, const std::vector<double>& abs_sum,
                const std::vector<double>& count, int64_t d) {
  REQUIRE(got.size() == want.size());
  std::size_t bad = 0, first = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double k = count[i / std::size_t(d)];
    const double tol = (k + 1) * std::ldexp(1.0, -24) * abs_sum[i];
    if (!(std::fabs(double(got[i]) - want[i]) <= tol)) {
      if (!bad) first = i;
      ++bad;
    }
  }
  INFO(bad << " elements outside the bound; first " << first << ": got " << (bad ? got[first] : 0.f) << ", want "
            << (bad ? want[first] : 0.0));
  CHECK(bad == 0);
}

struct ScatterCase {
  const char* what;
  int64_t m, d, rows;
  int32_t max_index;  // indices drawn from [0, max_index]
};

// A scatter along a dimension: an index of shape `is` into an output of shape `os` along `dim`.
struct DimGeometry {
  const char* what;
  Shape is, os;
  int dim;
};

// A random index for `sh` (values uniform over the output's extent along dim).
std::vector<int32_t> random_dim_values(std::mt19937_64& g, const DimGeometry& sh) {
  std::vector<int32_t> vals(static_cast<std::size_t>(shape_numel(sh.is)));
  for (auto& v : vals) v = int32_t(g() % uint64_t(sh.os[std::size_t(sh.dim)]));
  return vals;
}

// The same values as int64 (low, high) words, on the device.
Tensor wide_words(Context& gpu, const std::vector<int32_t>& v) {
  return gpu.from_host(test::int64_words(std::vector<int64_t>(v.begin(), v.end())), {2 * int64_t(v.size())});
}

// scatter_dim_add along dim 0 of {20000, 64} into {4096, 64} under layer "seg" of gpu: position 1's value
// out of range (4096; and 2^32 + 5 as int64 words, which narrowing would have made 5); each output must be
// all NaN.
void check_out_of_range_poison(Context& gpu, std::mt19937_64& g, uint64_t seed) {
  const DimGeometry sh = {"", {20000, 64}, {4096, 64}, 0};
  const std::vector<int32_t> vals = random_dim_values(g, sh);
  const Tensor src = gpu.from_host(test::random_vec(std::size_t(20000 * 64), seed), sh.is);
  const auto all_nan = [](const std::vector<float>& got) {
    std::size_t nans = 0;
    for (float v : got) nans += std::isnan(v);
    return nans == got.size();
  };
  std::vector<int32_t> v = vals;
  v[1] = 4096;
  CHECK(all_nan(scatter_dim_add(gpu, "seg", Var(src), gpu.from_host(v, sh.is), false, sh.is, 0, sh.os).value()
                    .to_host_f32()));
  std::vector<int64_t> w(vals.begin(), vals.end());
  w[1] = (int64_t(1) << 32) + 5;
  CHECK(all_nan(scatter_dim_add(gpu, "seg", Var(src), gpu.from_host(test::int64_words(w), {2 * 20000 * 64}), true,
                                sh.is, 0, sh.os)
                    .value()
                    .to_host_f32()));
}

}  // namespace

TEST_CASE("gpu scatter_add: both variants against the double reference on the sorted kernels' corners") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  const ScatterCase cases[] = {
      {"narrow rows, repeats", 1000, 15, 37, 36},
      {"rows wider than a pass (4 passes, the last 8 wide)", 777, 200, 50, 49},
      {"one index for everything: a run over 157 tiles", 5000, 33, 7, 0},
      {"scalar rows (TensorFlow's unsorted_segment_sum)", 100000, 1, 1000, 999},
      {"scalar rows, one index: a run over 313 tiles", 10000, 1, 3, 0},
      {"scalar rows, runs of about two entries", 5000, 1, 2500, 2499},
      {"scalar rows, m not a multiple of 32", 45, 1, 5, 4},
      {"m not a multiple of 32, one row", 45, 64, 1, 0},
      {"no indices", 0, 8, 5, 4},
      {"sparse: most rows untouched", 300, 64, 100000, 99999},
  };
  Context gpu(Device::cuda(0));
  for (const auto& c : cases) {
    INFO(c.what);
    auto index = random_index(std::size_t(c.m), 0, c.max_index, seed);
    auto src = test::random_vec(std::size_t(c.m * c.d), seed + 1);
    std::vector<double> srcd(src.begin(), src.end()), absd(src.size()), ones(std::size_t(c.m), 1.0);
    for (std::size_t i = 0; i < src.size(); ++i) absd[i] = std::fabs(srcd[i]);
    std::vector<double> want(std::size_t(c.rows * c.d)), abs_sum(want.size()), count(std::size_t(c.rows));
    ref::scatter_add_rows(srcd.data(), index.data(), want.data(), c.m, c.d, c.rows);
    ref::scatter_add_rows(absd.data(), index.data(), abs_sum.data(), c.m, c.d, c.rows);
    ref::scatter_add_rows(ones.data(), index.data(), count.data(), c.m, 1, c.rows);
    Tensor s = gpu.from_host(src, {c.m, c.d});
    Tensor idx = gpu.from_host(index, {c.m});
    for (ScatterAlgo a : kAlgos) {
      INFO("scatter=" << name_of(a));
      gpu.policy().pin("seg", a);
      Var out = scatter_add(gpu, "seg", Var(s), idx, c.rows);
      REQUIRE(out.shape() == Shape{c.rows, c.d});
      check_sums(out.value().to_host_f32(), want, abs_sum, count, c.d);
      const ManifestEntry* e = gpu.manifest().find("seg", "scatter");
      REQUIRE(e != nullptr);
      CHECK(e->variant == name_of(a));
      CHECK(e->op == "scatter_add");
      CHECK(e->device == "cuda:0");
      CHECK(e->deterministic == (a == ScatterAlgo::Sorted ? Determinism::Yes : Determinism::No));
      CHECK(e->guarantee == (a == ScatterAlgo::Sorted ? Guarantee::GpuToGpu : Guarantee::NotGuaranteed));
      CHECK((e->workspace_bytes > 0) == (a == ScatterAlgo::Sorted && c.m > 0));
    }
  }
}

namespace {

// The sorted variant's sums, in float on the host, in the order kernels/scatter.cu states: entries
// stably sorted by index, cut into tiles of 32; each run's piece in a tile summed from 0.0f in
// position order; a run over several tiles finished from its pieces (first tile's, then each
// following tile's) in eight groups, group g holding pieces g, g + 8, ... summed from 0.0f, then
// the group sums in group order. Untouched rows are 0.
std::vector<float> sorted_scatter_order(const std::vector<float>& src, const std::vector<int32_t>& index, int64_t d,
                                        int64_t rows) {
  const int64_t m = int64_t(index.size());
  std::vector<int64_t> order(static_cast<std::size_t>(m));
  for (int64_t j = 0; j < m; ++j) order[std::size_t(j)] = j;
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return index[std::size_t(a)] < index[std::size_t(b)]; });
  std::vector<float> out(std::size_t(rows * d), 0.f);
  for (int64_t c = 0; c < d; ++c) {
    int64_t i = 0;
    while (i < m) {
      const int32_t key = index[std::size_t(order[std::size_t(i)])];
      int64_t end = i;
      while (end < m && index[std::size_t(order[std::size_t(end)])] == key) ++end;
      std::vector<float> pieces;  // one per tile the run touches
      for (int64_t e = i; e < end;) {
        const int64_t tile_end = std::min(end, (e / 32 + 1) * 32);
        float acc = 0.f;
        for (; e < tile_end; ++e) acc += src[std::size_t(order[std::size_t(e)] * d + c)];
        pieces.push_back(acc);
      }
      float sum = pieces[0];
      if (pieces.size() > 1) {
        for (std::size_t g = 0; g < 8; ++g) {
          float group = 0.f;
          for (std::size_t q = g; q < pieces.size(); q += 8) group += pieces[q];
          sum = g == 0 ? group : sum + group;
        }
      }
      out[std::size_t(int64_t(key) * d + c)] = sum;
      i = end;
    }
  }
  return out;
}

}  // namespace

TEST_CASE("gpu scatter_add: the sorted variant's bits are the stated order's, computed on the host") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  struct Shape3 {
    const char* what;
    int64_t m, d, rows;
  };
  const Shape3 shapes[] = {
      {"runs of about 64 entries over tiles (op_noise's scatter_add, smaller)", 8192, 64, 128},
      {"one run over 313 tiles: every group of the fix-up", 10000, 3, 1},
      {"rows wider than a pass", 2000, 70, 50},
      {"mostly single entries", 3000, 16, 100000},
  };
  Context gpu(Device::cuda(0), Policy::parse({"seg.scatter=sorted"}));
  for (const auto& sh : shapes) {
    INFO(sh.what);
    auto index = random_index(std::size_t(sh.m), 0, int32_t(sh.rows - 1), seed);
    auto src = test::random_vec(std::size_t(sh.m * sh.d), seed + 1);
    Var out = scatter_add(gpu, "seg", Var(gpu.from_host(src, {sh.m, sh.d})), gpu.from_host(index, {sh.m}), sh.rows);
    const auto got = out.value().to_host_f32();
    const auto want = sorted_scatter_order(src, index, sh.d, sh.rows);
    REQUIRE(got.size() == want.size());
    CHECK(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) == 0);
  }
}

TEST_CASE("gpu scatter_add: the sorted scalar-row kernels repeat over 10 calls, bad indices give NaN") {
  // Rows of one float take their own tile and fix-up kernels (lanes over entries, a segmented scan).
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  Context gpu(Device::cuda(0), Policy::parse({"seg.scatter=sorted"}));
  const int64_t m = 200000, rows = 3000;
  auto index = random_index(std::size_t(m), 0, int32_t(rows) - 1, seed);
  const Tensor src = gpu.from_host(test::random_vec(std::size_t(m), seed + 1), {m, 1});
  const Tensor idx = gpu.from_host(index, {m});
  CHECK(test::distinct_results(10, [&] { return scatter_add(gpu, "seg", Var(src), idx, rows).value(); }) == 1);
  index[31] = int32_t(rows);  // past the end, at a tile's last entry
  index[32] = -1;
  Var y = scatter_add(gpu, "seg", Var(src), gpu.from_host(index, {m}), rows);
  std::size_t nans = 0;
  for (float v : y.value().to_host_f32()) nans += std::isnan(v);
  CHECK(nans == std::size_t(rows));
}

TEST_CASE("gpu scatter_dim_keys: the reference's offsets along each dimension, -1 outside the extent or int32") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  Context cpu, gpu(Device::cuda(0));
  std::mt19937_64 g(seed);
  for (int trial = 0; trial < 12; ++trial) {
    const int rank = 1 + trial % 4;
    Shape os(std::size_t(rank), 0), is(std::size_t(rank), 0);
    for (int d = 0; d < rank; ++d) {
      os[std::size_t(d)] = 1 + int64_t(g() % 37);
      is[std::size_t(d)] = 1 + int64_t(g() % uint64_t(os[std::size_t(d)]));
    }
    const int dim = int(g() % uint64_t(rank));
    is[std::size_t(dim)] = 1 + int64_t(g() % 50);  // along dim the index may be longer than the output
    const int64_t n = shape_numel(is), extent = os[std::size_t(dim)];
    INFO("trial " << trial << " index " << shape_str(is) << " into " << shape_str(os) << " along " << dim);
    // Values mostly in range, some just outside, some past int32 (wide only).
    std::vector<int64_t> v(static_cast<std::size_t>(n));
    for (auto& x : v) {
      const uint64_t r = g() % 20;
      x = r == 0 ? extent : r == 1 ? -1 : r == 2 ? (int64_t(1) << 32) + int64_t(g() % uint64_t(extent))
                                                  : int64_t(g() % uint64_t(extent));
    }
    std::vector<int32_t> want(static_cast<std::size_t>(n));
    ref::scatter_dim_keys(is, os, dim, [&](int64_t e) { return v[std::size_t(e)]; }, want.data());
    CHECK(scatter_dim_keys(gpu, gpu.from_host(test::int64_words(v), {2 * n}), true, is, dim, os).to_host_i32() == want);
    // Narrow: the same values cut to int32 (2^32 + k becomes k, in range: the narrow form has no such values).
    std::vector<int32_t> narrow(static_cast<std::size_t>(n));
    for (int64_t e = 0; e < n; ++e) narrow[std::size_t(e)] = int32_t(uint32_t(uint64_t(v[std::size_t(e)])));
    std::vector<int32_t> want_narrow(static_cast<std::size_t>(n));
    ref::scatter_dim_keys(is, os, dim, [&](int64_t e) { return int64_t(narrow[std::size_t(e)]); }, want_narrow.data());
    CHECK(scatter_dim_keys(gpu, gpu.from_host(narrow, is), false, is, dim, os).to_host_i32() == want_narrow);
  }
}

TEST_CASE("gpu scatter_dim_add: the flat scatter_add's bits, its keys' low bits sorted away; bad keys give NaN") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  const DimGeometry shapes[] = {
      {"dim 0, inner 64 (ditto.torch's scatter_add, fewer rows): runs over many tiles", {20000, 64}, {4096, 64}, 0},
      {"dim 1, inner 12: a period of 4", {3, 5000, 12}, {3, 37, 12}, 1},
      {"inner extents differ: no period", {100, 40, 6}, {100, 50, 8}, 1},
      {"rank 1: no period", {50000}, {700}, 0},
      {"period capped below the key's width: one bit sorted", {16, 1024}, {1, 1024}, 0},
      {"inner 2^12 over 3 rows", {40, 4096}, {3, 4096}, 0},
  };
  Context gpu(Device::cuda(0), Policy::parse({"seg.scatter=sorted"}));
  std::mt19937_64 g(seed);
  for (const auto& sh : shapes) {
    INFO(sh.what);
    const int64_t n = shape_numel(sh.is), total = shape_numel(sh.os);
    const std::vector<int32_t> vals = random_dim_values(g, sh);
    const Tensor index = gpu.from_host(vals, sh.is);
    const Tensor keys = scatter_dim_keys(gpu, index, false, sh.is, sh.dim, sh.os);
    const auto src = test::random_vec(std::size_t(n), seed + 1);
    const Var y = scatter_dim_add(gpu, "seg", Var(gpu.from_host(src, sh.is)), index, false, sh.is, sh.dim, sh.os);
    const Var flat = scatter_add(gpu, "seg", Var(gpu.from_host(src, {n, 1})), keys, total);
    CHECK(y.shape() == sh.os);
    const auto got = y.value().to_host_f32(), want = flat.value().to_host_f32();
    REQUIRE(got.size() == want.size());
    CHECK(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) == 0);
    std::size_t nans = 0;
    for (float v : got) nans += std::isnan(v);
    CHECK(nans == 0);
  }
  // Out-of-range values make the whole output NaN.
  check_out_of_range_poison(gpu, g, seed + 2);
  // Keys that break the period scatter_dim_add promises the sorted kernels (another inner column's key)
  // flag the problem rather than sum in another order: keys of {2000, 64} into {50, 64}, position 1 given
  // position 0's key.
  const DimGeometry sh = {"", {2000, 64}, {50, 64}, 0};
  std::vector<int32_t> k = scatter_dim_keys(gpu, gpu.from_host(random_dim_values(g, sh), sh.is), false, sh.is, 0, sh.os)
                               .to_host_i32();
  k[1] = k[0];
  const Tensor keys = gpu.from_host(k, {2000 * 64}), src = gpu.from_host(test::random_vec(2000 * 64, seed + 5), sh.is);
  Tensor out = gpu.empty(sh.os), bad = gpu.zeros({1}, DType::I32);
  cuda::ScatterRows p;
  p.src = src.f32();
  p.index = keys.i32();
  p.m = 2000 * 64;
  p.d = 1;
  p.rows = 50 * 64;
  p.key_period_log2 = 6;
  Tensor ws = gpu.empty({int64_t(cuda::scatter_sorted_workspace(p) / 4 + 1)});
  cuda::scatter_sorted(gpu, p, out.f32(), bad.i32(), ws.f32(), cuda::scatter_sorted_workspace(p));
  CHECK(bad.to_host_i32()[0] == 1);
}

TEST_CASE("gpu scatter_add: backward gathers; out-of-range indices make the output NaN") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  Context gpu(Device::cuda(0), Policy::parse({"*=deterministic"}));
  const int64_t m = 300, d = 7, rows = 20;
  auto index = random_index(std::size_t(m), 0, rows - 1, seed);
  auto src = test::random_vec(std::size_t(m * d), seed + 1);
  Var s(gpu.from_host(src, {m, d}), true);
  Tensor idx = gpu.from_host(index, {m});
  Var out = scatter_add(gpu, "seg", s, idx, rows);
  auto g = test::random_vec(std::size_t(rows * d), seed + 2);
  gpu.tape().backward(gpu, out, gpu.from_host(g, {rows, d}));
  std::vector<float> want(src.size());
  ref::gather_rows(g.data(), index.data(), want.data(), m, d);
  CHECK(s.grad().to_host_f32() == want);  // a gather copies: exact

  for (ScatterAlgo a : kAlgos) {
    INFO("scatter=" << name_of(a));
    gpu.policy().pin("bad", a);
    auto broken = index;
    broken[17] = int32_t(rows);  // one past the end
    broken[200] = -3;
    Var y = scatter_add(gpu, "bad", Var(gpu.from_host(src, {m, d})), gpu.from_host(broken, {m}), rows);
    std::size_t nans = 0;
    for (float v : y.value().to_host_f32()) nans += std::isnan(v);
    CHECK(nans == std::size_t(rows * d));
  }
}

TEST_CASE("gpu embedding and embedding_bag: forward against the reference, backward by both variants") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  Context gpu(Device::cuda(0));
  const int64_t rows = 3000, d = 96;
  auto table = test::random_vec(std::size_t(rows * d), seed);
  std::vector<double> tabled(table.begin(), table.end());
  Tensor w = gpu.from_host(table, {rows, d});
  // Half the lookups from 20 hot rows, half anywhere: long runs and singletons together.
  auto index = random_index(4000, 0, rows - 1, seed + 1);
  auto hot = random_index(4000, 0, 19, seed + 2);
  for (std::size_t i = 0; i < index.size(); i += 2) index[i] = hot[i];
  Tensor idx = gpu.from_host(index, {200, 20});
  {
    Var y = embedding(gpu, "emb", Var(w), idx);
    std::vector<float> want(index.size() * d);
    ref::gather_rows(table.data(), index.data(), want.data(), int64_t(index.size()), d);
    CHECK(y.value().to_host_f32() == want);  // a gather copies: exact
    auto g = test::random_vec(want.size(), seed + 3);
    std::vector<double> gd(g.begin(), g.end()), ga(g.size()), ones(index.size(), 1.0);
    for (std::size_t i = 0; i < g.size(); ++i) ga[i] = std::fabs(gd[i]);
    std::vector<double> dw(static_cast<std::size_t>(rows * d)), abs_sum(dw.size()), count(static_cast<std::size_t>(rows));
    ref::scatter_add_rows(gd.data(), index.data(), dw.data(), int64_t(index.size()), d, rows);
    ref::scatter_add_rows(ga.data(), index.data(), abs_sum.data(), int64_t(index.size()), d, rows);
    ref::scatter_add_rows(ones.data(), index.data(), count.data(), int64_t(index.size()), 1, rows);
    Tensor dy = gpu.from_host(g, {200, 20, d});
    for (ScatterAlgo a : kAlgos) {
      INFO("embedding scatter=" << name_of(a));
      gpu.policy().pin("emb", a);
      Var wv(w, true);
      Var yv = embedding(gpu, "emb", wv, idx);
      gpu.tape().backward(gpu, yv, gpu.to_device(dy));
      check_sums(wv.grad().to_host_f32(), dw, abs_sum, count, d);
      CHECK(gpu.manifest().find("emb", "scatter")->variant == name_of(a));
    }
  }
  // Bags: offsets with an empty bag and bags of different sizes, sum and mean.
  std::vector<int32_t> offsets;
  for (int32_t b = 0, at = 0; b < 300; ++b) {
    offsets.push_back(at);
    at += b % 7 == 3 ? 0 : 1 + (b * 13) % 25;
    if (at > 4000) at = 4000;
  }
  Tensor off = gpu.from_host(offsets, {int64_t(offsets.size())});
  Tensor flat = gpu.from_host(index, {int64_t(index.size())});
  ref::Bags bags;
  bags.m = int64_t(index.size());
  bags.count = int64_t(offsets.size());
  bags.offsets = offsets.data();
  for (BagMode mode : {BagMode::Sum, BagMode::Mean}) {
    const bool mean = mode == BagMode::Mean;
    INFO("bag mode " << bag_mode_name(mode));
    std::vector<double> want(std::size_t(bags.count * d)), abs_fwd(want.size()), tabs(tabled.size());
    for (std::size_t i = 0; i < tabled.size(); ++i) tabs[i] = std::fabs(tabled[i]);
    ref::embedding_bag_fwd(tabled.data(), index.data(), want.data(), d, bags, mean);
    ref::embedding_bag_fwd(tabs.data(), index.data(), abs_fwd.data(), d, bags, false);
    Var y = embedding_bag(gpu, "bag", Var(w), flat, off, mode);
    // Forward: a bag of k rows is added in order in float, then divided once for mean:
    // |error| <= (k + 1) * 2^-24 * sum |rows| (divided by k for mean). The last bag runs to the end
    // of the indices, so k is up to several hundred.
    auto got = y.value().to_host_f32();
    std::size_t bad = 0;
    for (int64_t b = 0; b < bags.count; ++b) {
      const double k = double(bags.end(b) - bags.begin(b));
      for (int64_t col = 0; col < d; ++col) {
        const std::size_t i = std::size_t(b * d + col);
        const double tol = (k + 1) * std::ldexp(1.0, -24) * abs_fwd[i] / (mean && k > 0 ? k : 1.0);
        bad += !(std::fabs(double(got[i]) - want[i]) <= tol);
      }
    }
    CHECK(bad == 0);
    auto g = test::random_vec(std::size_t(bags.count * d), seed + 4);
    std::vector<double> gd(g.begin(), g.end()), ga(g.size());
    for (std::size_t i = 0; i < g.size(); ++i) ga[i] = std::fabs(gd[i]);
    std::vector<double> dw(static_cast<std::size_t>(rows * d)), abs_sum(dw.size()), count(static_cast<std::size_t>(rows));
    ref::embedding_bag_bwd(gd.data(), index.data(), dw.data(), d, rows, bags, mean);
    ref::embedding_bag_bwd(ga.data(), index.data(), abs_sum.data(), d, rows, bags, mean);
    std::vector<double> ones(std::size_t(bags.count), 1.0);
    ref::embedding_bag_bwd(ones.data(), index.data(), count.data(), 1, rows, bags, false);
    for (ScatterAlgo a : kAlgos) {
      INFO("embedding_bag scatter=" << name_of(a));
      gpu.policy().pin("bag", a);
      Tensor dwt = embedding_bag_backward(gpu, "bag", gpu.from_host(g, {bags.count, d}), flat, off, mode, rows);
      check_sums(dwt.to_host_f32(), dw, abs_sum, count, d);
    }
  }
  // Fixed-size bags ({bags, L} index) equal offsets 0, L, 2L, ...
  std::vector<int32_t> even;
  for (int32_t b = 0; b < 200; ++b) even.push_back(20 * b);
  gpu.policy().pin("bag", ScatterAlgo::Sorted);
  for (BagMode mode : {BagMode::Sum, BagMode::Mean}) {
    Var a = embedding_bag(gpu, "bag", Var(w), idx, Tensor(), mode);
    Var b = embedding_bag(gpu, "bag", Var(w), flat, gpu.from_host(even, {200}), mode);
    CHECK(a.value().fingerprint() == b.value().fingerprint());
    Tensor g = gpu.from_host(test::random_vec(200 * d, seed + 5), {200, d});
    CHECK(embedding_bag_backward(gpu, "bag", g, idx, Tensor(), mode, rows).fingerprint() ==
          embedding_bag_backward(gpu, "bag", g, flat, gpu.from_host(even, {200}), mode, rows).fingerprint());
  }
}

TEST_CASE("gpu embedding: bad indices and offsets are NaN where they land, and backward skips them") {
  Context gpu(Device::cuda(0), Policy::parse({"*=deterministic"}));
  const int64_t rows = 8, d = 5;
  Tensor w = gpu.from_host(test::random_vec(std::size_t(rows * d), 3), {rows, d});
  Var y = embedding(gpu, "emb", Var(w), gpu.from_host(std::vector<int32_t>{1, 8, 2}, {3}));
  auto v = y.value().to_host_f32();
  for (int64_t k = 0; k < d; ++k) {
    CHECK_FALSE(std::isnan(v[std::size_t(k)]));
    CHECK(std::isnan(v[std::size_t(d + k)]));
    CHECK_FALSE(std::isnan(v[std::size_t(2 * d + k)]));
  }
  for (ScatterAlgo a : kAlgos) {
    gpu.policy().pin("emb", a);
    Tensor dw = embedding_backward(gpu, "emb", gpu.full({3, d}, 1.f), gpu.from_host(std::vector<int32_t>{1, 8, 1}, {3}), rows);
    auto g = dw.to_host_f32();
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t k = 0; k < d; ++k) CHECK(g[std::size_t(r * d + k)] == (r == 1 ? 2.f : 0.f));
  }
  // Malformed offsets make the bags they touch NaN: a first offset other than 0; a decreasing
  // offset (bag 1 = [3, 2)); an offset past the indices (bag 2 = [2, 7) of 6, bag 3 = [7, 6)).
  Tensor idx = gpu.from_host(std::vector<int32_t>{0, 1, 2, 3, 4, 5}, {6});
  auto bag_nans = [&](std::vector<int32_t> off) {
    Var yb = embedding_bag(gpu, "bag", Var(w), idx, gpu.from_host(off, {int64_t(off.size())}), BagMode::Sum);
    auto b = yb.value().to_host_f32();
    std::vector<bool> nan;
    for (std::size_t k = 0; k < off.size(); ++k) nan.push_back(std::isnan(b[k * std::size_t(d)]));
    return nan;
  };
  CHECK(bag_nans({1, 3}) == std::vector<bool>{true, false});
  CHECK(bag_nans({0, 3, 2, 7}) == std::vector<bool>{false, true, true, true});
  CHECK(bag_nans({0, 6}) == std::vector<bool>{false, false});  // an empty last bag is fine
}

// The sorted variant's zero fill, sort and tile kernels, eager and captured in a graph: both give
// the host's sums bit for bit (distinct rows: one add each) and zeros in every row no index
// reaches; the graph's output buffer is poisoned before each replay, so a fill that did not reach
// every untouched row, or a tile kernel that ran before it, would show. The 64 MB output is over
// the size whose fill runs beside the sort on the side stream: the capture holds that branch.
TEST_CASE("gpu embedding: the sorted variant eager and captured, untouched rows zero") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  Context gpu(Device::cuda(0), Policy::parse({"emb.scatter=sorted"}));
  const int64_t rows = 1 << 20, d = 16, m = 4096;
  std::vector<int32_t> ih(static_cast<std::size_t>(m));
  for (int64_t k = 0; k < m; ++k) ih[std::size_t(k)] = int32_t((k * 2654435761u) % uint64_t(rows));
  const auto dyh = test::random_vec(std::size_t(m * d), seed);
  Tensor idx = gpu.from_host(ih, {m}), dy = gpu.from_host(dyh, {m, d});
  std::vector<float> want(std::size_t(rows * d), 0.f);
  for (int64_t k = 0; k < m; ++k)
    for (int64_t j = 0; j < d; ++j) want[std::size_t(ih[std::size_t(k)] * d + j)] += dyh[std::size_t(k * d + j)];

  CHECK(embedding_backward(gpu, "emb", dy, idx, rows).to_host_f32() == want);
  Tensor out = gpu.full({rows, d}, std::nanf(""));
  StepGraph g;
  g.capture(gpu, [&] {
    Tensor dw = embedding_backward(gpu, "emb", dy, idx, rows);
    gpu.copy(out, dw);
  });
  for (int replay = 0; replay < 3; ++replay) {
    Tensor poison = gpu.full({rows, d}, std::nanf(""));
    gpu.copy(out, poison);
    g.launch(gpu);
    INFO("replay " << replay);
    CHECK(out.to_host_f32() == want);
  }
}

TEST_CASE("gpu embedding: determinism of each variant over 10 calls, and DETERMINISM lines at 1M x 64") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  // Heavy collisions: 4096 x 20 lookups of only 16 rows, about 5000 adds per row. Random
  // gradients (not ones) so that the order of the float adds shows in the bits.
  {
    Context gpu(Device::cuda(0));
    const int64_t rows = 1000, d = 64;
    Tensor idx = gpu.from_host(random_index(4096 * 20, 0, 15, seed), {4096, 20});
    Tensor dy = gpu.from_host(test::random_vec(std::size_t(4096 * 20 * d), seed + 1), {4096, 20, d});
    std::vector<Fingerprint> sorted_prints;
    for (ScatterAlgo a : kAlgos) {
      gpu.policy().pin("emb", a);
      std::size_t distinct = test::distinct_results(10, [&] { return embedding_backward(gpu, "emb", dy, idx, rows); });
      INFO("scatter=" << name_of(a) << ": " << distinct << " distinct dW of 10");
      std::printf("DETERMINISM | embedding 1000x64, 81920 lookups of 16 rows | scatter=%s | %zu/10\n", name_of(a),
                  distinct);
      if (a == ScatterAlgo::Sorted) {
        CHECK(distinct == 1);
        sorted_prints.push_back(embedding_backward(gpu, "emb", dy, idx, rows).fingerprint());
      } else {
        CHECK(distinct > 1);
      }
    }
    // Another context (fresh pool, fresh workspace addresses) gives the same bits.
    Context other(Device::cuda(0), Policy::parse({"emb.scatter=sorted"}));
    Tensor idx2 = other.to_device(idx), dy2 = other.to_device(dy);
    CHECK(embedding_backward(other, "emb", dy2, idx2, rows).fingerprint() == sorted_prints.at(0));
  }
  // The realistic size of the issue: a 1M x 64 table, a batch of 4096 x 20 uniform lookups.
  {
    Context gpu(Device::cuda(0));
    const int64_t rows = 1000000, d = 64;
    Tensor idx = gpu.from_host(random_index(4096 * 20, 0, int32_t(rows - 1), seed + 2), {4096, 20});
    Tensor dy = gpu.from_host(test::random_vec(std::size_t(4096 * 20 * d), seed + 3), {4096, 20, d});
    double us[2] = {0, 0};
    for (ScatterAlgo a : kAlgos) {
      gpu.policy().pin("emb", a);
      std::size_t distinct = test::distinct_results(10, [&] { return embedding_backward(gpu, "emb", dy, idx, rows); });
      us[int(a)] = us_per_call(gpu, [&] { embedding_backward(gpu, "emb", dy, idx, rows); });
      std::printf("DETERMINISM | embedding bwd 1000000x64, 4096x20 lookups | scatter=%s | %zu/10 | %.1f us\n",
                  name_of(a), distinct, us[int(a)]);
      if (a == ScatterAlgo::Sorted) CHECK(distinct == 1);
    }
    std::printf("COST | embedding bwd 1000000x64 | sorted / atomic = %.2f (goal <= 1.2)\n", us[1] / us[0]);
  }
}

// The privatized scatter's stated order, on the host: per chunk (scatter_privatized_chunks' bounds), each
// destination's bin starts at 0 and adds, per 32-position step from the chunk's start, the sum of that
// step's values for it in position order; the output adds the chunk sums in chunk order.
namespace {

std::vector<float> privatized_order(const std::vector<float>& src, const std::vector<int32_t>& keys,
                                    const cuda::DimScatter& g) {
  const cuda::PrivatizedChunks ch = cuda::scatter_privatized_chunks(g);
  const int64_t n = g.outer * g.rows * g.inner;
  std::vector<float> out(static_cast<std::size_t>(n), 0.0f), bin(static_cast<std::size_t>(n));
  for (int64_t t = 0; t < ch.chunks; ++t) {
    std::fill(bin.begin(), bin.end(), 0.0f);
    const int64_t i0 = t * ch.rows_per_chunk, i1 = std::min(g.extent, i0 + ch.rows_per_chunk);
    for (int64_t a = 0; a < g.outer; ++a)
      for (int64_t b = 0; b < g.inner; ++b)
        for (int64_t s0 = i0; s0 < i1; s0 += 32) {
          std::vector<std::pair<int32_t, float>> step;  // (key, running sum) in first-seen order
          for (int64_t i = s0; i < std::min(i1, s0 + 32); ++i) {
            const std::size_t pos = std::size_t((a * g.extent + i) * g.inner + b);
            auto it = std::find_if(step.begin(), step.end(), [&](const auto& e) { return e.first == keys[pos]; });
            if (it == step.end())
              step.emplace_back(keys[pos], src[pos]);
            else
              it->second += src[pos];
          }
          for (const auto& [key, sum] : step) bin[std::size_t(key)] += sum;
        }
    for (int64_t e = 0; e < n; ++e) out[std::size_t(e)] = t == 0 ? bin[std::size_t(e)] : out[std::size_t(e)] + bin[std::size_t(e)];
  }
  return out;
}

}  // namespace

TEST_CASE("gpu scatter_dim_add privatized: the stated order's bits, bad keys NaN, refusals that name the limit") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  const DimGeometry shapes[] = {
      {"dim 0, inner 64 (ditto.torch's scatter_add, fewer positions): chunks of 625", {20000, 64}, {4096, 64}, 0},
      {"dim 1 of 3, inner 16: 20 chunks of 250", {3, 5000, 16}, {3, 37, 16}, 1},
      {"one destination: every step one group", {3000, 8}, {1, 8}, 0},
      {"no positions: zeros", {2, 0, 8}, {2, 5, 8}, 1},
  };
  Context gpu(Device::cuda(0), Policy::parse({"seg.scatter=privatized"}));
  std::mt19937_64 g(seed);
  for (const auto& sh : shapes) {
    INFO(sh.what);
    const int64_t n = shape_numel(sh.is);
    REQUIRE(scatter_dim_privatized_refusal(gpu, sh.is, sh.dim, sh.os).empty());
    const std::vector<int32_t> vals = random_dim_values(g, sh);
    const Tensor index = gpu.from_host(vals, sh.is);
    const Tensor keys = scatter_dim_keys(gpu, index, false, sh.is, sh.dim, sh.os);
    const auto src = test::random_vec(std::size_t(n), seed + 3);
    cuda::DimScatter geo;
    geo.outer = shape_numel(Shape(sh.os.begin(), sh.os.begin() + sh.dim));
    geo.inner = shape_numel(Shape(sh.os.begin() + sh.dim + 1, sh.os.end()));
    geo.extent = sh.is[std::size_t(sh.dim)];
    geo.rows = sh.os[std::size_t(sh.dim)];
    const auto want = privatized_order(src, keys.to_host_i32(), geo);
    std::vector<float> first;
    for (int call = 0; call < 4; ++call) {
      // Calls 1 and 3 read the index as int64 words.
      const bool wide = call % 2 == 1;
      const auto got = scatter_dim_add(gpu, "seg", Var(gpu.from_host(src, sh.is)), wide ? wide_words(gpu, vals) : index,
                                       wide, sh.is, sh.dim, sh.os)
                           .value()
                           .to_host_f32();
      REQUIRE(got.size() == want.size());
      CHECK(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) == 0);
      if (call == 0) first = got;
      CHECK(std::memcmp(got.data(), first.data(), got.size() * sizeof(float)) == 0);
    }
    const auto& e = gpu.manifest().entries().back();
    CHECK(e.knob == "scatter");
    CHECK(e.variant == "privatized");
    CHECK(e.guarantee == Guarantee::GpuToGpu);
  }
  // Out-of-range values (narrow and wide) make the whole output NaN.
  check_out_of_range_poison(gpu, g, seed + 4);
  // Where it cannot run, pinning it is an error that says why and names the variants that run everything.
  const auto refused = [&](const Shape& ish, int dim, const Shape& osh, const char* why) {
    INFO(why);
    const std::string said = scatter_dim_privatized_refusal(gpu, ish, dim, osh);
    CHECK_THAT(said, Catch::Contains(why));
    std::vector<int32_t> v(static_cast<std::size_t>(shape_numel(ish)), 0);
    const Tensor s = gpu.zeros(ish);
    CHECK_THROWS_WITH(scatter_dim_add(gpu, "seg", Var(s), gpu.from_host(v, ish), false, ish, dim, osh),
                      Catch::Contains("scatter=privatized") && Catch::Contains(why) &&
                          Catch::Contains("scatter=sorted and scatter=atomic run every scatter"));
  };
  refused({100, 12}, 0, {40, 12}, "multiple of 8");
  refused({100, 8}, 0, {9000, 8}, "destinations along dim");
  refused({100, 40, 8}, 1, {100, 50, 16}, "index is smaller");
  CHECK_THAT(scatter_rows_privatized_refusal(gpu, 10, 12, 4), Catch::Contains("rows of a multiple of 8 floats"));
  CHECK_THROWS_WITH(scatter_add(gpu, "seg", Var(gpu.zeros({10, 12})), gpu.zeros({10}, DType::I32), 4),
                    Catch::Contains("scatter=privatized") && Catch::Contains("rows of a multiple of 8 floats"));
  CHECK_THAT(scatter_rows_privatized_refusal(gpu, 10, 8, 9000), Catch::Contains("destinations"));
}

TEST_CASE("gpu scatter_add privatized (rows, index_add's form): the stated order's bits with one index per row") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  struct RowCase {
    const char* what;
    int64_t m, d, rows;
  };
  const RowCase cases[] = {
      {"ditto.torch's index_add, fewer rows: chunks over 20000 rows, 8 column groups", 20000, 64, 4096},
      {"16 floats into 37 rows: many collisions per step", 5000, 16, 37},
      {"one destination", 3000, 8, 1},
  };
  Context gpu(Device::cuda(0), Policy::parse({"seg.scatter=privatized"}));
  for (const auto& c : cases) {
    INFO(c.what);
    REQUIRE(scatter_rows_privatized_refusal(gpu, c.m, c.d, c.rows).empty());
    const auto idx = random_index(std::size_t(c.m), 0, int32_t(c.rows - 1), seed);
    const auto src = test::random_vec(std::size_t(c.m * c.d), seed + 1);
    // The order's keys: each position's flat destination, its row's index times d plus its column.
    std::vector<int32_t> keys(src.size());
    for (int64_t i = 0; i < c.m; ++i)
      for (int64_t b = 0; b < c.d; ++b) keys[std::size_t(i * c.d + b)] = int32_t(idx[std::size_t(i)] * c.d + b);
    cuda::DimScatter geo;
    geo.outer = 1, geo.extent = c.m, geo.inner = c.d, geo.rows = c.rows;
    const auto want = privatized_order(src, keys, geo);
    for (int call = 0; call < 3; ++call) {
      const auto got = scatter_add(gpu, "seg", Var(gpu.from_host(src, {c.m, c.d})), gpu.from_host(idx, {c.m}), c.rows)
                           .value()
                           .to_host_f32();
      REQUIRE(got.size() == want.size());
      CHECK(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) == 0);
    }
    CHECK(gpu.manifest().entries().back().variant == "privatized");
  }
  // An out-of-range row index makes the whole output NaN.
  auto idx = random_index(200, 0, 39, seed + 2);
  idx[17] = 40;
  const auto got =
      scatter_add(gpu, "seg", Var(gpu.from_host(test::random_vec(200 * 8, seed + 3), {200, 8})), gpu.from_host(idx, {200}), 40)
          .value()
          .to_host_f32();
  std::size_t nans = 0;
  for (float v : got) nans += std::isnan(v);
  CHECK(nans == got.size());
}

TEST_CASE("gpu gather_dim: gather_rows' bits by the keys, in shared memory where the privatized scatter runs, NaN "
          "out of range; scatter_dim_add's gradient") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  const DimGeometry shapes[] = {
      {"dim 0, inner 64 into 4096 rows (shared memory)", {20000, 64}, {4096, 64}, 0},
      {"dim 1 of 3, inner 16 (shared memory)", {3, 5000, 16}, {3, 37, 16}, 1},
      {"inner 12 (keys, then gather_rows)", {100, 12}, {40, 12}, 0},
      {"index smaller outside dim (keys)", {100, 40, 6}, {100, 50, 8}, 1},
  };
  Context gpu(Device::cuda(0), Policy::parse({"seg.scatter=privatized"}));
  std::mt19937_64 g(seed);
  for (const auto& sh : shapes) {
    INFO(sh.what);
    const int64_t n = shape_numel(sh.is), total = shape_numel(sh.os);
    std::vector<int32_t> vals = random_dim_values(g, sh);
    vals[std::size_t(n / 2)] = int32_t(sh.os[std::size_t(sh.dim)]);  // out of range: NaN there only
    const Tensor index = gpu.from_host(vals, sh.is);
    const Tensor table = gpu.from_host(test::random_vec(std::size_t(total), seed + 7), sh.os);
    const Tensor keys = scatter_dim_keys(gpu, index, false, sh.is, sh.dim, sh.os);
    const auto want = gather_rows(gpu, table.reshape({total, 1}), keys).to_host_f32();
    for (bool wide : {false, true}) {
      INFO("wide " << wide);
      const Tensor got = gather_dim(gpu, table, wide ? wide_words(gpu, vals) : index, wide, sh.is, sh.dim);
      CHECK(got.shape() == sh.is);
      const auto h = got.to_host_f32();
      REQUIRE(h.size() == want.size());
      CHECK(std::memcmp(h.data(), want.data(), h.size() * sizeof(float)) == 0);
      CHECK(std::isnan(h[std::size_t(n / 2)]));
    }
  }
  // The privatized scatter's gradient is the gather of dout by the same index.
  const DimGeometry sh = shapes[0];
  const std::vector<int32_t> vals = random_dim_values(g, sh);
  const Tensor index = gpu.from_host(vals, sh.is);
  const Var src(gpu.from_host(test::random_vec(std::size_t(shape_numel(sh.is)), seed + 8), sh.is), true);
  const Tensor dout = gpu.from_host(test::random_vec(std::size_t(shape_numel(sh.os)), seed + 9), sh.os);
  Var y = scatter_dim_add(gpu, "seg", src, index, false, sh.is, sh.dim, sh.os);
  gpu.tape().backward(gpu, y, dout);
  const auto want = gather_dim(gpu, dout, index, false, sh.is, sh.dim).to_host_f32();
  const auto got = src.grad().to_host_f32();
  REQUIRE(got.size() == want.size());
  CHECK(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) == 0);
}
