// Scatter-add, embedding and embedding-bag on the CPU: gradient checks of the references in
// double, the CPU op paths against the references (forward and through the tape), index and offset
// errors, the `scatter` knob's resolution and manifest entries, and the Embedding / EmbeddingBag
// layers (nets/embedding.h).
#include <catch2/catch.hpp>

#include <cmath>
#include <numeric>

#include "engine/context.h"
#include "engine/error.h"
#include "experiments/attribute.h"
#include "kernels/scatter.h"
#include "kernels/scatter_ref.h"
#include "nets/embedding.h"
#include "support.h"

using namespace ditto;
using Catch::Matchers::Contains;

namespace {

std::vector<int32_t> random_index(std::size_t m, int32_t rows, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::uniform_int_distribution<int32_t> d(0, rows - 1);
  std::vector<int32_t> v(m);
  for (auto& i : v) i = d(g);
  return v;
}

// The bags of the gradient checks: an empty bag, a bag of one, repeated indices inside a bag and
// across bags.
const std::vector<int32_t> kOffsets = {0, 3, 3, 4, 9};
const std::vector<int32_t> kBagIndex = {2, 0, 2, 5, 1, 1, 3, 2, 0, 4, 5};

}  // namespace

TEST_CASE("scatter references: gradient checks in double (scatter_add, gather, embedding bag sum and mean)") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  const int64_t m = 13, d = 3, rows = 5;
  const auto index = random_index(m, rows, seed);
  {  // scatter_add: d/dsrc of sum(w * out) is w gathered by index
    auto src = test::random_vec<double>(m * d, seed);
    auto w = test::loss_weights(rows * d, seed);
    auto loss = [&](const std::vector<double>& in) {
      std::vector<double> out(rows * d);
      ref::scatter_add_rows(in.data(), index.data(), out.data(), m, d, rows);
      return test::weighted_sum(out, w);
    };
    std::vector<double> dsrc(m * d);
    ref::gather_rows(w.data(), index.data(), dsrc.data(), m, d);
    CHECK(test::gradcheck(loss, src, dsrc) < 1e-6);
  }
  {  // gather: d/dtable of sum(w * y) is w scattered by index
    auto table = test::random_vec<double>(rows * d, seed + 1);
    auto w = test::loss_weights(m * d, seed + 1);
    auto loss = [&](const std::vector<double>& in) {
      std::vector<double> y(m * d);
      ref::gather_rows(in.data(), index.data(), y.data(), m, d);
      return test::weighted_sum(y, w);
    };
    std::vector<double> dtable(rows * d);
    ref::scatter_add_rows(w.data(), index.data(), dtable.data(), m, d, rows);
    CHECK(test::gradcheck(loss, table, dtable) < 1e-6);
  }
  for (bool mean : {false, true}) {
    for (bool offsets : {true, false}) {
      INFO((mean ? "mean" : "sum") << (offsets ? ", offsets" : ", fixed bags of 2"));
      ref::Bags bags;
      std::vector<int32_t> idx = kBagIndex;
      if (offsets) {
        bags.m = int64_t(idx.size());
        bags.count = int64_t(kOffsets.size());
        bags.offsets = kOffsets.data();
      } else {
        idx.resize(10);
        bags.m = 10;
        bags.count = 5;
        bags.bag_size = 2;
      }
      const int64_t table_rows = 6;
      auto table = test::random_vec<double>(table_rows * d, seed + 2);
      auto w = test::loss_weights(bags.count * d, seed + 2);
      auto loss = [&](const std::vector<double>& in) {
        std::vector<double> y(bags.count * d);
        ref::embedding_bag_fwd(in.data(), idx.data(), y.data(), d, bags, mean);
        return test::weighted_sum(y, w);
      };
      std::vector<double> dtable(table_rows * d);
      ref::embedding_bag_bwd(w.data(), idx.data(), dtable.data(), d, table_rows, bags, mean);
      CHECK(test::gradcheck(loss, table, dtable) < 1e-6);
    }
  }
}

TEST_CASE("scatter_add on the CPU: the reference's sums, rows nothing points at are zero, gather backward") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  Context ctx;
  const int64_t m = 40, rows = 9;
  const Shape ss = {m, 2, 3};  // rows of 6 values
  auto index = random_index(m, rows - 2, seed);  // rows 7 and 8 receive nothing
  auto sv = test::random_vec(std::size_t(shape_numel(ss)), seed);
  Var src(ctx.from_host(sv, ss), true);
  Tensor idx = ctx.from_host(index, {m});
  Var out = scatter_add(ctx, "seg", src, idx, rows);
  REQUIRE(out.shape() == Shape{rows, 2, 3});
  std::vector<float> want(std::size_t(rows * 6));
  ref::scatter_add_rows(sv.data(), index.data(), want.data(), m, 6, rows);
  CHECK(out.value().to_host_f32() == want);
  auto o = out.value().to_host_f32();
  for (int k = 7 * 6; k < 9 * 6; ++k) CHECK(o[std::size_t(k)] == 0.0f);

  auto g = test::random_vec(want.size(), seed + 1);
  ctx.tape().backward(ctx, out, ctx.from_host(g, out.shape()));
  std::vector<float> dsrc(sv.size());
  ref::gather_rows(g.data(), index.data(), dsrc.data(), m, 6);
  CHECK(src.grad().to_host_f32() == dsrc);
  // The gather on its own (ditto.torch's scatter gradient): same rows, index of any shape.
  Tensor gathered = gather_rows(ctx, ctx.from_host(g, out.shape()), ctx.from_host(index, {m / 4, 4}));
  CHECK(gathered.shape() == Shape{m / 4, 4, 2, 3});
  CHECK(gathered.to_host_f32() == dsrc);
  CHECK_THROWS_WITH(gather_rows(ctx, ctx.from_host(g, out.shape()), ctx.from_host(std::vector<int32_t>{0, 9}, {2})),
                    Contains("gather_rows") && Contains("position 1") && Contains("index 9"));
  // TensorFlow's names are the same op.
  CHECK(unsorted_segment_sum(ctx, "seg", Var(src.value()), idx, rows).value().to_host_f32() == want);
  CHECK(segment_sum(ctx, "seg", Var(src.value()), idx, rows).value().to_host_f32() == want);
}

TEST_CASE("embedding on the CPU: rows gathered, any index shape, weight gradient scattered and accumulated") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  Context ctx;
  const int64_t rows = 11, d = 4;
  auto tv = test::random_vec(rows * d, seed);
  Var weight(ctx.from_host(tv, {rows, d}), true);
  auto index = random_index(2 * 3 * 5, rows, seed);
  Tensor idx = ctx.from_host(index, {2, 3, 5});
  Var y = embedding(ctx, "emb", weight, idx);
  REQUIRE(y.shape() == Shape{2, 3, 5, d});
  std::vector<float> want(index.size() * d);
  ref::gather_rows(tv.data(), index.data(), want.data(), int64_t(index.size()), d);
  CHECK(y.value().to_host_f32() == want);

  auto g = test::random_vec(want.size(), seed + 1);
  ctx.tape().backward(ctx, y, ctx.from_host(g, y.shape()));
  std::vector<float> dw(tv.size());
  ref::scatter_add_rows(g.data(), index.data(), dw.data(), int64_t(index.size()), d, rows);
  CHECK(weight.grad().to_host_f32() == dw);
  // A second pass accumulates: the same sums again, added in float.
  Var y2 = embedding(ctx, "emb", weight, idx);
  ctx.tape().backward(ctx, y2, ctx.from_host(g, y.shape()));
  auto acc = weight.grad().to_host_f32();
  for (std::size_t i = 0; i < acc.size(); ++i) CHECK(acc[i] == dw[i] + dw[i]);
  // The tensor-level backward is what the tape ran.
  CHECK(embedding_backward(ctx, "emb", ctx.from_host(g, y.shape()), idx, rows).to_host_f32() == dw);
}

TEST_CASE("embedding_bag on the CPU: sum and mean, offsets and fixed bags, empty bags give zeros") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  Context ctx;
  const int64_t rows = 6, d = 5;
  auto tv = test::random_vec(rows * d, seed);
  for (BagMode mode : {BagMode::Sum, BagMode::Mean}) {
    INFO("mode " << bag_mode_name(mode));
    const bool mean = mode == BagMode::Mean;
    Var weight(ctx.from_host(tv, {rows, d}), true);
    Tensor idx = ctx.from_host(kBagIndex, {int64_t(kBagIndex.size())});
    Tensor off = ctx.from_host(kOffsets, {int64_t(kOffsets.size())});
    Var y = embedding_bag(ctx, "bag", weight, idx, off, mode);
    REQUIRE(y.shape() == Shape{5, d});
    ref::Bags bags;
    bags.m = int64_t(kBagIndex.size());
    bags.count = 5;
    bags.offsets = kOffsets.data();
    std::vector<float> want(5 * d);
    ref::embedding_bag_fwd(tv.data(), kBagIndex.data(), want.data(), d, bags, mean);
    CHECK(y.value().to_host_f32() == want);
    auto yv = y.value().to_host_f32();
    for (int64_t k = 0; k < d; ++k) CHECK(yv[std::size_t(1 * d + k)] == 0.0f);  // bag 1 is empty
    auto g = test::random_vec(want.size(), seed + 1);
    ctx.tape().backward(ctx, y, ctx.from_host(g, y.shape()));
    std::vector<float> dw(tv.size());
    ref::embedding_bag_bwd(g.data(), kBagIndex.data(), dw.data(), d, rows, bags, mean);
    CHECK(weight.grad().to_host_f32() == dw);

    // {bags, L} without offsets: the same as offsets 0, L, 2L, ...
    std::vector<int32_t> fixed(kBagIndex.begin(), kBagIndex.begin() + 10);
    Var y2 = embedding_bag(ctx, "bag", Var(weight.value()), ctx.from_host(fixed, {5, 2}), Tensor(), mode);
    Var y3 = embedding_bag(ctx, "bag", Var(weight.value()), ctx.from_host(fixed, {10}),
                           ctx.from_host(std::vector<int32_t>{0, 2, 4, 6, 8}, {5}), mode);
    CHECK(y2.value().to_host_f32() == y3.value().to_host_f32());
  }
}

TEST_CASE("scatter ops: bad indices, offsets and shapes are errors naming the op, layer and place") {
  Context ctx;
  Var table(ctx.from_host(test::random_vec(12, 1), {4, 3}), true);
  CHECK_THROWS_AS(embedding(ctx, "emb", table, ctx.from_host(std::vector<int32_t>{0, 4}, {2})), DataError);
  CHECK_THROWS_WITH(embedding(ctx, "emb", table, ctx.from_host(std::vector<int32_t>{0, 1, -1}, {3})),
                    Contains("emb") && Contains("position 2") && Contains("index -1") && Contains("[0, 4)"));
  CHECK_THROWS_WITH(scatter_add(ctx, "seg", Var(ctx.zeros({3, 2})), ctx.from_host(std::vector<int32_t>{0, 5, 1}, {3}), 4),
                    Contains("seg") && Contains("position 1") && Contains("index 5"));
  CHECK_THROWS_WITH(scatter_add(ctx, "seg", Var(ctx.zeros({3, 2})), ctx.from_host(std::vector<int32_t>{0, 1}, {2}), 4),
                    Contains("one index per row"));
  CHECK_THROWS_WITH(scatter_add(ctx, "seg", Var(ctx.zeros({3, 2})), ctx.zeros({3}), 4), Contains("must be i32"));
  CHECK_THROWS_AS(scatter_add(ctx, "seg", Var(ctx.zeros({3, 2})), ctx.zeros({3}, DType::I32), -1), ShapeError);
  CHECK_THROWS_WITH(embedding(ctx, "emb", Var(ctx.zeros({4})), ctx.zeros({2}, DType::I32)), Contains("2 dimensions"));

  Tensor idx = ctx.from_host(std::vector<int32_t>{0, 1, 2, 3}, {4});
  auto bag = [&](std::vector<int32_t> off) {
    return embedding_bag(ctx, "bag", table, idx, ctx.from_host(off, {int64_t(off.size())}), BagMode::Sum);
  };
  CHECK_THROWS_WITH(bag({1, 2}), Contains("offsets[0] is 1"));
  CHECK_THROWS_WITH(bag({0, 3, 2}), Contains("offsets[2] = 2") && Contains("must not decrease"));
  CHECK_THROWS_WITH(bag({0, 5}), Contains("past the 4 indices"));
  CHECK_NOTHROW(bag({0, 4}));  // a last bag that is empty
  CHECK_THROWS_WITH(embedding_bag(ctx, "bag", table, idx, Tensor(), BagMode::Sum), Contains("{bags, bag size}"));
  CHECK_THROWS_WITH(embedding_bag_backward(ctx, "bag", ctx.zeros({3, 3}), idx, ctx.from_host(std::vector<int32_t>{0, 2}, {2}),
                                           BagMode::Mean, 4),
                    Contains("for 2 bags"));
}

TEST_CASE("scatter_dim_keys on the CPU: a scatter's offsets along each dimension, int64 words, errors") {
  Context ctx;
  // index {2, 3, 2} into out {3, 4, 3}: offsets by explicit coordinates, for each dim.
  const Shape is = {2, 3, 2}, os = {3, 4, 3};
  const std::vector<int32_t> vals = {0, 1, 2, 1, 0, 1, 1, 0, 1, 1, 0, 0};
  for (int dim = 0; dim < 3; ++dim) {
    INFO("dim " << dim);
    std::vector<int32_t> want;
    for (int64_t a = 0; a < 2; ++a)
      for (int64_t b = 0; b < 3; ++b)
        for (int64_t c = 0; c < 2; ++c) {
          int64_t co[3] = {a, b, c};
          co[dim] = vals[std::size_t((a * 3 + b) * 2 + c)];
          want.push_back(int32_t((co[0] * 4 + co[1]) * 3 + co[2]));
        }
    Tensor narrow = ctx.from_host(vals, is);
    CHECK(scatter_dim_keys(ctx, narrow, false, is, dim, os).to_host_i32() == want);
    std::vector<int32_t> words;  // the same values as int64's (low, high) words
    for (int32_t v : vals) words.insert(words.end(), {v, v < 0 ? -1 : 0});
    CHECK(scatter_dim_keys(ctx, ctx.from_host(words, {24}), true, is, dim, os).to_host_i32() == want);
  }
  // Out of range: past the extent along dim, negative, and an int64 past int32 (2^32 + 3, not 3).
  auto keys = [&](std::vector<int32_t> w, bool wide, int dim) {
    return scatter_dim_keys(ctx, ctx.from_host(w, {int64_t(w.size())}), wide, {int64_t(w.size()) / (wide ? 2 : 1)},
                            dim, {4});
  };
  CHECK(keys({3, 0, 2}, false, 0).to_host_i32() == std::vector<int32_t>{3, 0, 2});
  CHECK_THROWS_WITH(keys({3, 4, 2}, false, 0), Contains("element 1") && Contains("is 4") && Contains("[0, 4)"));
  CHECK_THROWS_WITH(keys({-1}, false, 0), Contains("is -1"));
  CHECK_THROWS_WITH(keys({0, 0, 3, 1}, true, 0), Contains("element 1") && Contains("is 4294967299"));
  CHECK_THROWS_WITH(keys({-5, -2}, true, 0), Contains("is -4294967301"));
  // A coordinate past the width of its row does not spill into the next row.
  CHECK_THROWS_AS(scatter_dim_keys(ctx, ctx.from_host(std::vector<int32_t>{0, 3}, {1, 2}), false, {1, 2}, 1, {2, 3}),
                  DataError);
  // Shapes.
  Tensor two = ctx.from_host(std::vector<int32_t>{0, 1}, {2});
  CHECK_THROWS_WITH(scatter_dim_keys(ctx, two, false, {2}, 0, {2, 2}), Contains("the same rank"));
  CHECK_THROWS_WITH(scatter_dim_keys(ctx, two, false, {2}, 1, {4}), Contains("dim 1"));
  CHECK_THROWS_WITH(scatter_dim_keys(ctx, two, false, {1, 2}, 0, {4, 1}), Contains("larger than"));
  CHECK_THROWS_WITH(scatter_dim_keys(ctx, two, true, {2}, 0, {4}), Contains("2 per element"));
  CHECK_THROWS_WITH(scatter_dim_keys(ctx, ctx.zeros({2}), false, {2}, 0, {4}), Contains("must be i32"));
}

TEST_CASE("scatter_dim_add and gather_dim on the CPU: the flat scatter_add's result in the output's shape, the "
          "gather backward, int64 words, errors") {
  Context ctx;
  const Shape is = {2, 3, 2}, os = {3, 4, 3};
  const std::vector<int32_t> vals = {0, 1, 2, 1, 0, 1, 1, 0, 1, 1, 0, 0};
  std::vector<int32_t> words;  // the same values as int64's (low, high) words
  for (int32_t v : vals) words.insert(words.end(), {v, 0});
  const std::vector<float> src = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  for (int dim = 0; dim < 3; ++dim) {
    for (bool wide : {false, true}) {
      INFO("dim " << dim << " wide " << wide);
      const Tensor index = wide ? ctx.from_host(words, {24}) : ctx.from_host(vals, is);
      const Tensor keys = scatter_dim_keys(ctx, index, wide, is, dim, os);
      Var x(ctx.from_host(src, is), true);
      Var y = scatter_dim_add(ctx, "seg", x, index, wide, is, dim, os);
      CHECK(y.shape() == os);
      const Var flat = scatter_add(ctx, "seg", Var(ctx.from_host(src, {12, 1})), keys, 36);
      CHECK(y.value().to_host_f32() == flat.value().to_host_f32());
      // Backward: each source element gets the output gradient at its destination (gather_dim).
      std::vector<float> dy(36);
      std::iota(dy.begin(), dy.end(), 1.f);
      ctx.tape().backward(ctx, y, ctx.from_host(dy, os));
      std::vector<float> want;
      for (int32_t k : keys.to_host_i32()) want.push_back(dy[std::size_t(k)]);
      CHECK(x.grad().to_host_f32() == want);
      CHECK(x.grad().shape() == is);
      const Tensor gathered = gather_dim(ctx, ctx.from_host(dy, os), index, wide, is, dim);
      CHECK(gathered.shape() == is);
      CHECK(gathered.to_host_f32() == want);
      ctx.tape().clear();
    }
  }
  const Tensor index = ctx.from_host(vals, is);
  CHECK_THROWS_WITH(scatter_dim_add(ctx, "seg", Var(ctx.from_host(src, {3, 4})), ctx.from_host(vals, {12}), false, is,
                                    0, {3, 4}),
                    Contains("the same rank"));
  CHECK_THROWS_WITH(scatter_dim_add(ctx, "seg", Var(ctx.zeros({11})), index, false, is, 0, os),
                    Contains("one value of each"));
  CHECK_THROWS_WITH(scatter_dim_add(ctx, "seg", Var(ctx.zeros({12})), index, true, is, 0, os),
                    Contains("2 words per element"));
  std::vector<int32_t> bad = vals;
  bad[5] = 3;  // past the extent along dim 0
  CHECK_THROWS_WITH(scatter_dim_add(ctx, "seg", Var(ctx.from_host(src, is)), ctx.from_host(bad, is), false, is, 0, os),
                    Contains("index element 5") && Contains("is 3"));
  CHECK_THROWS_WITH(gather_dim(ctx, ctx.zeros(os), ctx.from_host(bad, is), false, is, 0),
                    Contains("index element 5") && Contains("is 3"));
  std::vector<int32_t> past = words;
  past[11] = 1;  // element 5's high word: 2^32 + 1, not 1
  CHECK_THROWS_WITH(gather_dim(ctx, ctx.zeros(os), ctx.from_host(past, {24}), true, is, 0), Contains("is 4294967297"));
  CHECK_THROWS_WITH(gather_dim(ctx, ctx.zeros(os), index, true, is, 0), Contains("2 per element"));
  CHECK_THROWS_WITH(gather_dim(ctx, ctx.zeros({3, 4}), index, false, is, 0), Contains("the same rank"));
}

TEST_CASE("scatter knob: modes resolve, pins and rules are checked, the manifest records the CPU reference") {
  Policy p;
  CHECK(p.variant<ScatterAlgo>("emb", op::embedding) == ScatterAlgo::Atomic);  // heuristic: what TF / JAX do
  CHECK(p.variant<ScatterAlgo>("seg", op::scatter_add) == ScatterAlgo::Atomic);
  p.set("*=deterministic");
  CHECK(p.variant<ScatterAlgo>("emb", op::embedding) == ScatterAlgo::Sorted);
  CHECK(p.variant<ScatterAlgo>("seg", op::scatter_add) == ScatterAlgo::Sorted);
  p.pin("seg", ScatterAlgo::Atomic);
  CHECK(p.rules().back() == "seg.scatter=atomic");
  CHECK(p.variant<ScatterAlgo>("seg", op::scatter_add) == ScatterAlgo::Atomic);
  CHECK(Policy::parse({"*=nondeterministic"}).variant<ScatterAlgo>("e", op::embedding) == ScatterAlgo::Atomic);
  CHECK_THROWS_AS(p.variant<ScatterAlgo>("pool1", op::maxpool2d), Error);
  CHECK_THROWS_WITH(Policy::parse({"emb.scatter=gather"}), Contains("unknown variant 'gather'") && Contains("sorted"));
  std::vector<std::pair<std::string, OpKind>> layers = {{"emb", op::embedding}, {"seg", op::scatter_add}};
  CHECK_NOTHROW(Policy::parse({"emb.scatter=sorted", "seg.scatter=atomic"}).check_layers(layers));
  CHECK_THROWS_WITH(Policy::parse({"emb.bwd=gather"}).check_layers(layers), Contains("has no knob 'bwd'"));

  // The noise lab's candidates come from the knob table.
  auto cands = list_candidates(layers, false, {});
  std::vector<std::string> names;
  for (const auto& c : cands) names.push_back(c.name);
  CHECK(names == std::vector<std::string>{"emb.scatter=atomic", "seg.scatter=atomic"});

  Context ctx(Device::cpu(), Policy::parse({"emb.scatter=sorted"}));
  Var w(ctx.from_host(test::random_vec(8, 2), {4, 2}), true);
  embedding(ctx, "emb", w, ctx.from_host(std::vector<int32_t>{1, 1, 3}, {3}));
  const ManifestEntry* e = ctx.manifest().find("emb", "scatter");
  REQUIRE(e != nullptr);
  CHECK(e->op == "embedding");
  CHECK(e->variant == "cpu-reference");
  CHECK(e->requested == "pinned");
  CHECK(e->deterministic == Determinism::Yes);
  CHECK(e->guarantee == Guarantee::RunToRun);
  scatter_add(ctx, "seg", Var(ctx.zeros({3, 2})), ctx.from_host(std::vector<int32_t>{0, 0, 1}, {3}), 2);
  REQUIRE(ctx.manifest().find("seg", "scatter") != nullptr);
  CHECK(ctx.manifest().find("seg", "scatter")->requested == "heuristic");
  CHECK(ctx.manifest().find("seg", "scatter")->op == "scatter_add");

  // privatized: scatter_add's alone (embedding's knob has no such variant), pinned by name only (the mode
  // `deterministic` keeps the sort, which runs every scatter); a CPU context runs its reference.
  Policy pinned = Policy::parse({"seg.scatter=privatized"});
  CHECK(pinned.variant<ScatterAlgo>("seg", op::scatter_add) == ScatterAlgo::Privatized);
  CHECK_THROWS_WITH(Policy::parse({"emb.scatter=privatized"}).variant<ScatterAlgo>("emb", op::embedding),
                    Contains("privatized") && Contains("sorted"));
  Context cpu(Device::cpu(), pinned);
  const Shape is = {6, 8}, os = {3, 8};
  std::vector<int32_t> rows(48);
  for (std::size_t i = 0; i < rows.size(); ++i) rows[i] = int32_t(i % 3);
  CHECK(scatter_dim_privatized_refusal(cpu, is, 0, os).empty());
  CHECK(scatter_rows_privatized_refusal(cpu, 10, 12, 4).empty());  // the CPU runs its reference
  CHECK_THAT(scatter_dim_privatized_refusal(cpu, {6, 9}, 0, os), Contains("larger than"));
  const Var y = scatter_dim_add(cpu, "seg", Var(cpu.from_host(std::vector<float>(48, 1.0f), is)),
                                cpu.from_host(rows, is), false, is, 0, os);
  CHECK(y.value().to_host_f32() == std::vector<float>(24, 2.0f));
  CHECK(cpu.manifest().find("seg", "scatter")->variant == "cpu-reference");
}

TEST_CASE("Embedding and EmbeddingBag layers: named weights, normal(0, 1) init from Philox, summary rows") {
  Context ctx;
  Embedding emb(ctx, "tok", 500, 16);
  emb.init(ctx, 7);
  std::vector<Param> params;
  emb.collect(params);
  REQUIRE(params.size() == 1);
  CHECK(params[0].name == "tok.weight");
  CHECK(params[0].var.shape() == Shape{500, 16});
  auto w = emb.weight.value().to_host_f32();
  double mean = std::accumulate(w.begin(), w.end(), 0.0) / double(w.size()), var = 0;
  for (float v : w) var += (v - mean) * (v - mean);
  var /= double(w.size());
  // 8000 draws of N(0, 1): the mean's standard error is 0.011, the variance's 0.016.
  CHECK(std::fabs(mean) < 0.06);
  CHECK(std::fabs(var - 1.0) < 0.08);
  Embedding again(ctx, "tok", 500, 16);
  again.init(ctx, 7);
  CHECK(again.weight.value().fingerprint() == emb.weight.value().fingerprint());
  again.init(ctx, 8);
  CHECK(again.weight.value().fingerprint() != emb.weight.value().fingerprint());

  SummaryTrace trace;
  Var y = emb(ctx, ctx.from_host(std::vector<int32_t>{3, 499}, {2}), &trace);
  CHECK(y.shape() == Shape{2, 16});
  REQUIRE(trace.size() == 1);
  CHECK(trace[0].op == "embedding");
  CHECK(trace[0].params == 500 * 16);
  CHECK(Embedding::kind == op::embedding);

  EmbeddingBag bag(ctx, "attrs", 40, 8, BagMode::Mean);
  bag.init(ctx, 7);
  Var yb = bag(ctx, ctx.from_host(std::vector<int32_t>{1, 2, 3, 4, 5, 6}, {2, 3}), Tensor(), &trace);
  CHECK(yb.shape() == Shape{2, 8});
  CHECK(trace.back().op == "embedding_bag");
  ctx.tape().backward(ctx, yb);
  auto g = bag.weight.grad().to_host_f32();
  // Mean bags of 3, upstream gradient 1: rows 1..6 get 1/3 in every column, the others 0.
  for (int64_t r = 0; r < 40; ++r)
    for (int64_t k = 0; k < 8; ++k) CHECK(g[std::size_t(r * 8 + k)] == (r >= 1 && r <= 6 ? 1.0f / 3.0f : 0.0f));
  CHECK_THROWS_AS(Embedding(ctx, "bad", 0, 4), ShapeError);
}
