// The knob registry (engine/knob.h): every family's knobs are declared once, every mode pick
// follows the one rule, the families' enums name their registered variants, and README's knob
// table is the registry's.
#include <catch2/catch.hpp>

#include <fstream>
#include <map>
#include <sstream>

#include "ditto/ditto.h"

using namespace ditto;

namespace {

int strength(Guarantee g) { return g == Guarantee::GpuToGpu ? 2 : g == Guarantee::RunToRun ? 1 : 0; }

std::string pick_name(const KnobSpec& k, SelectMode m) {
  const std::size_t i = k.mode_pick(m);
  return i == KnobPick::kNone ? "selected" : k.variants.at(i).name;
}

template <class E>
void check_enum_names(const KnobSpec& k, int count) {
  INFO(k.op.name << "." << k.name);
  REQUIRE(static_cast<int>(k.variants.size()) == count);
  for (int i = 0; i < count; ++i) CHECK(std::string(name_of(static_cast<E>(i))) == k.variants[i].name);
  CHECK(std::string(knob_name(E{})) == k.name);
}

}  // namespace

TEST_CASE("knobs: every mode pick follows the one rule") {
  REQUIRE(knobs().size() >= 25);
  for (const KnobSpec& k : knobs()) {
    INFO(k.op.name << "." << k.name);
    if (k.selected_at_run_time) {
      for (SelectMode m : {SelectMode::Heuristic, SelectMode::Deterministic, SelectMode::Nondeterministic,
                           SelectMode::Fastest})
        CHECK(k.mode_pick(m) == KnobPick::kNone);
      continue;
    }
    // heuristic and fastest: the framework default; pytorch: PyTorch's default where declared.
    CHECK(pick_name(k, SelectMode::Heuristic) == k.framework_default);
    CHECK(pick_name(k, SelectMode::Fastest) == k.framework_default);
    CHECK(pick_name(k, SelectMode::Pytorch) == (k.pytorch_default.empty() ? k.framework_default : k.pytorch_default));
    CHECK(k.pytorch_default != k.framework_default);  // declared only where it differs
    // deterministic: the strongest guarantee, the first declared among equals, never a variant
    // declared by_name_only.
    const std::size_t d = k.mode_pick(SelectMode::Deterministic);
    CHECK_FALSE(k.variants[d].by_name_only);
    for (std::size_t i = 0; i < k.variants.size(); ++i) {
      if (k.variants[i].by_name_only) continue;
      if (i < d) CHECK(strength(k.variants[i].guarantee) < strength(k.variants[d].guarantee));
      else CHECK(strength(k.variants[i].guarantee) <= strength(k.variants[d].guarantee));
    }
    CHECK(strength(k.variants[d].guarantee) > 0);
    // nondeterministic: ditto's own atomics first, then a library's unguaranteed path, else the default.
    std::string want;
    for (const auto& v : k.variants)
      if (want.empty() && v.guarantee == Guarantee::NotGuaranteed && v.impl == Impl::Ditto) want = v.name;
    for (const auto& v : k.variants)
      if (want.empty() && strength(v.guarantee) == 0) want = v.name;
    if (want.empty()) want = k.framework_default;
    CHECK(pick_name(k, SelectMode::Nondeterministic) == want);
  }
}

TEST_CASE("knobs: the picks every trained run relies on stay what they were") {
  // heuristic / deterministic / nondeterministic for each knob: a change here changes the bits of
  // runs made under a mode, so it must be deliberate.
  const std::map<std::string, std::vector<std::string>> expected = {
      {"conv2d.precision", {"fp32", "fp32", "fp32"}},
      {"conv2d.bias_bwd", {"cudnn", "deterministic", "atomic"}},
      {"conv2d.layout", {"nchw", "nchw", "nchw"}},
      {"conv2d.output", {"fp32", "fp32", "fp32"}},
      {"linear.precision", {"fp32", "fp32", "fp32"}},
      {"linear.bias_bwd", {"atomic", "deterministic", "atomic"}},
      {"linear.cublas_atomics", {"off", "off", "on"}},
      {"linear.gemm", {"cublas", "cublas", "cublas"}},
      {"maxpool2d.bwd", {"cudnn", "gather", "atomic-scatter"}},
      {"batchnorm.bwd", {"cudnn", "deterministic", "atomic"}},
      {"batchnorm.stats", {"local", "local", "local"}},
      {"softmax_xent.reduce", {"atomic", "deterministic", "atomic"}},
      {"pixel_xent.reduce", {"atomic", "deterministic", "atomic"}},
      {"reduce.reduce", {"atomic", "deterministic", "atomic"}},
      {"scatter_add.scatter", {"atomic", "sorted", "atomic"}},
      {"embedding.scatter", {"atomic", "sorted", "atomic"}},
      {"upsample.bwd", {"atomic", "gather", "atomic"}},
      {"grid_sample.bwd", {"atomic", "deterministic", "atomic"}},
      {"affine_grid.bwd", {"deterministic", "deterministic", "atomic"}},
      {"roi_align.bwd", {"atomic", "deterministic", "atomic"}},
      {"ctc_loss.algo", {"cudnn-nondeterministic", "ditto", "cudnn-nondeterministic"}},
      {"spmm.fwd", {"cusparse-default", "ditto", "cusparse-default"}},
      {"spmm.bwd", {"cusparse", "deterministic", "atomic"}},
      {"allreduce.algo", {"nccl-default", "fixed-order", "nccl-default"}},
      {"allreduce.channels", {"auto", "auto", "auto"}},
  };
  std::size_t seen = 0;
  for (const KnobSpec& k : knobs()) {
    const std::string key = std::string(k.op.name) + "." + k.name;
    INFO(key);
    if (k.selected_at_run_time) continue;
    auto it = expected.find(key);
    REQUIRE(it != expected.end());  // a new knob adds its row here
    ++seen;
    CHECK(pick_name(k, SelectMode::Heuristic) == it->second[0]);
    CHECK(pick_name(k, SelectMode::Deterministic) == it->second[1]);
    CHECK(pick_name(k, SelectMode::Nondeterministic) == it->second[2]);
  }
  CHECK(seen == expected.size());
}

TEST_CASE("knobs: the pytorch mode picks what PyTorch 2.11 runs by default") {
  // Where PyTorch's default differs from the libraries' defaults that `heuristic` runs: its own
  // reductions for bias gradients, the batch loss and sums (no atomics), its own max-pool backward
  // (a gather) and its sorted embedding backward. Everything else as heuristic.
  const std::map<std::string, std::string> differs = {
      {"conv2d.bias_bwd", "deterministic"}, {"linear.bias_bwd", "deterministic"},
      {"maxpool2d.bwd", "gather"},          {"softmax_xent.reduce", "deterministic"},
      {"reduce.reduce", "deterministic"},   {"embedding.scatter", "sorted"},
  };
  for (const KnobSpec& k : knobs()) {
    const std::string key = std::string(k.op.name) + "." + k.name;
    INFO(key);
    if (k.selected_at_run_time) {
      CHECK(k.mode_pick(SelectMode::Pytorch) == KnobPick::kNone);
      continue;
    }
    auto it = differs.find(key);
    CHECK(pick_name(k, SelectMode::Pytorch) == (it == differs.end() ? k.framework_default : it->second));
  }
  // The mode word parses and resolves like the others; conv2d selects per shape (engine-first).
  const Policy p = Policy::parse({"*=pytorch"});
  CHECK(p.variant<PoolBwd>("pool1", op::maxpool2d) == PoolBwd::Gather);
  CHECK(p.variant<BiasBwd>("fc1", op::linear) == BiasBwd::Deterministic);
  CHECK(conv_choice<ConvFwdAlgo>(p, "conv1").mode == SelectMode::Pytorch);
  CHECK(p.requested("conv1", "fwd", op::conv2d) == "pytorch");
  CHECK(std::string(name_of(ConvBwdFilterAlgo::EngineFirst)) == "engine-first");
  CHECK(conv_bwd_filter_knob().variants.back().guarantee == Guarantee::Unknown);
  // engine-first's guarantee is its per-shape configuration's: not a noise-lab candidate.
  CHECK(conv_bwd_filter_knob().nondeterministic() == std::vector<std::string>{"algo0", "algo3"});
  CHECK(conv_fwd_knob().nondeterministic().empty());
}

TEST_CASE("knobs: each family's enum names its registered variants in order") {
  check_enum_names<ConvFwdAlgo>(conv_fwd_knob(), 12);
  check_enum_names<ConvBwdDataAlgo>(conv_bwd_data_knob(), 11);
  check_enum_names<ConvBwdFilterAlgo>(conv_bwd_filter_knob(), 12);
  check_enum_names<Precision>(knob_spec(op::conv2d, "precision"), 4);
  check_enum_names<Precision>(knob_spec(op::linear, "precision"), 4);
  check_enum_names<BiasBwd>(conv_bias_bwd_knob(), 3);
  check_enum_names<ConvLayout>(conv_layout_knob(), 2);
  check_enum_names<BiasBwd>(linear_bias_bwd_knob(), 2);  // the prefix without cudnn
  check_enum_names<CublasAtomics>(linear_cublas_atomics_knob(), 2);
  check_enum_names<LinearGemm>(linear_gemm_knob(), 3);
  check_enum_names<PoolBwd>(pool_bwd_knob(), 4);
  check_enum_names<BnBwd>(bn_bwd_knob(), 3);
  check_enum_names<BnStats>(bn_stats_knob(), 2);
  check_enum_names<Reduction>(reduce_knob(), 3);
  check_enum_names<Reduction>(knob_spec(op::softmax_xent, "reduce"), 2);  // the prefix without cub
  check_enum_names<Reduction>(knob_spec(op::pixel_xent, "reduce"), 2);
  check_enum_names<ScatterAlgo>(scatter_add_knob(), 3);  // embedding's knob lacks privatized (its last)
  check_enum_names<ScatterAlgo>(embedding_scatter_knob(), 2);
  check_enum_names<UpsampleBwd>(upsample_bwd_knob(), 2);
  check_enum_names<GridSampleBwd>(grid_sample_bwd_knob(), 3);
  check_enum_names<AffineGridBwd>(affine_grid_bwd_knob(), 3);
  check_enum_names<RoiAlignBwd>(roi_align_bwd_knob(), 2);
  check_enum_names<CtcAlgo>(ctc_algo_knob(), 3);
  check_enum_names<SpmmFwd>(spmm_fwd_knob(), 5);
  check_enum_names<SpmmBwd>(spmm_bwd_knob(), 3);
  check_enum_names<AllReduceAlgo>(allreduce_algo_knob(), 9);
}

TEST_CASE("knobs: a bad variant lists the valid ones per op kind, and a layer's own once known") {
  using Catch::Matchers::Contains;
  std::string msg;
  try {
    Policy::parse({"conv1.fwd=bogus"});
  } catch (const PolicyError& e) {
    msg = e.what();
  }
  CHECK_THAT(msg, Contains("conv2d layers: implicit_gemm") && Contains("spmm layers: ditto"));
  // Once the network says conv1 is a convolution, a spmm variant is refused with conv's list alone.
  const Policy p = Policy::parse({"conv1.fwd=ditto"});
  try {
    p.check_layers({{"conv1", op::conv2d}});
    FAIL("a spmm variant on a conv layer was accepted");
  } catch (const PolicyError& e) {
    CHECK_THAT(std::string(e.what()), Contains("implicit_gemm") && !Contains("cusparse"));
  }
}

TEST_CASE("knobs: the variants the CPU runs itself, for the trainer's pins-not-applied warning") {
  CHECK(runs_on_cpu("algo", "fixed-order"));
  CHECK(runs_on_cpu("algo", "ring"));
  CHECK(runs_on_cpu("stats", "sync"));
  CHECK(runs_on_cpu("stats", "local"));
  CHECK_FALSE(runs_on_cpu("algo", "nccl-default"));
  CHECK_FALSE(runs_on_cpu("bwd_filter", "algo0"));
  CHECK_FALSE(runs_on_cpu("bwd", "gather"));
  CHECK_FALSE(runs_on_cpu("stats", "deterministic"));  // a mode word: the reference runs
}

TEST_CASE("knobs: a declaration that breaks the rule's assumptions is refused") {
  const OpKind test_op{"knob_test_op"};
  CHECK_THROWS_AS(register_knob({test_op, "k", {}, "a", false, ""}), Error);
  CHECK_THROWS_AS(register_knob({test_op, "k", {{"a", Guarantee::NotGuaranteed, Impl::Ditto, ""}}, "a", false, ""}),
                  Error);  // nothing for deterministic to pick
  CHECK_THROWS_AS(register_knob({test_op, "k", {{"a", Guarantee::GpuToGpu, Impl::Ditto, ""}}, "b", false, ""}),
                  Error);  // a default that is not a variant
  CHECK_THROWS_AS(register_knob({test_op, "k",
                                 {{"deterministic", Guarantee::RunToRun, Impl::Library, ""},
                                  {"fixed", Guarantee::GpuToGpu, Impl::Ditto, ""}},
                                 "deterministic", false, ""}),
                  Error);  // named like a mode that picks another variant
  CHECK_THROWS_AS(register_knob({op::maxpool2d, "bwd", {{"x", Guarantee::GpuToGpu, Impl::Ditto, ""}}, "x", false, ""}),
                  Error);  // registered twice
  CHECK_THROWS_AS(register_knob({test_op, "k",
                                 {{"a", Guarantee::NotGuaranteed, Impl::Library, ""},
                                  {"b", Guarantee::GpuToGpu, Impl::Ditto, "", false, /*by_name_only=*/true}},
                                 "a", false, ""}),
                  Error);  // the only guaranteed variant is one no mode may pick
  CHECK_THROWS_AS(register_knob({test_op, "k",
                                 {{"a", Guarantee::RunToRun, Impl::Library, "", false, /*by_name_only=*/true},
                                  {"b", Guarantee::GpuToGpu, Impl::Ditto, ""}},
                                 "a", false, ""}),
                  Error);  // a framework default no mode may pick
  CHECK_THROWS_AS(register_knob({test_op, "k",
                                 {{"a", Guarantee::NotGuaranteed, Impl::Library, ""},
                                  {"b", Guarantee::GpuToGpu, Impl::Ditto, ""}},
                                 "a", false, "", "c"}),
                  Error);  // PyTorch's default is not a variant
  CHECK(find_knob(test_op, "k") == nullptr);
}

TEST_CASE("knobs: README's knob table is the registry's") {
  std::ifstream in(DITTO_SOURCE_DIR "/README.md", std::ios::binary);
  REQUIRE(in);
  std::stringstream buf;
  buf << in.rdbuf();
  const std::string text = buf.str();
  const std::string begin = "<!-- registry:knobs begin (ditto-knobs --update README.md) -->\n";
  const auto b = text.find(begin), e = text.find("<!-- registry:knobs end -->");
  REQUIRE(b != std::string::npos);
  REQUIRE(e != std::string::npos);
  INFO("regenerate with: build/examples/ditto-knobs --update README.md");
  CHECK(text.substr(b + begin.size(), e - b - begin.size()) == knob_table_markdown());
}
