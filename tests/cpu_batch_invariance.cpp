// Batch-invariant evaluation on the CPU: the variants and the rule set that ask for it, the
// evaluation machinery of tests/batch_invariance.h on the reference path (every output summed in
// one order whatever the batch), and ditto-train's --eval-kernels (its manifest section, replay
// line and refusals). tests/gpu_batch_invariance.cpp checks the property on the GPU kernels.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "batch_invariance.h"
#include "engine/error.h"
#include "engine/knob.h"
#include "engine/policy.h"
#include "experiments/train.h"
#include "kernels/conv2d.h"
#include "kernels/linear.h"
#include "train_support.h"

using namespace ditto;
using Catch::Matchers::Contains;

TEST_CASE("batch invariance: the variants are ditto's own, gpu_to_gpu, and only linear's is kept from the modes") {
  const KnobSpec& fwd = conv_fwd_knob();
  const VariantSpec& direct = fwd.variants.at(fwd.index_of("ditto-direct"));
  CHECK(direct.guarantee == Guarantee::GpuToGpu);
  CHECK(direct.impl == Impl::Ditto);
  CHECK(std::string(name_of(ConvFwdAlgo::DittoDirect)) == "ditto-direct");
  const KnobSpec& gemm = linear_gemm_knob();
  const VariantSpec& own = gemm.variants.at(gemm.index_of("ditto"));
  CHECK(own.guarantee == Guarantee::GpuToGpu);
  CHECK(own.by_name_only);
  // `deterministic` keeps cuBLAS for linear layers: a gpu_to_gpu variant declared by_name_only is
  // not the strongest-guarantee pick.
  CHECK(gemm.variants.at(gemm.mode_pick(SelectMode::Deterministic)).name == std::string("cublas"));
  Policy p = Policy::parse({"*=deterministic"});
  for (const std::string& r : batch_invariant_rules()) p.set(r);
  CHECK(p.variant<LinearGemm>("fc", op::linear) == LinearGemm::Ditto);
  CHECK(conv_choice<ConvFwdAlgo>(p, "conv1").algo == ConvFwdAlgo::DittoDirect);
  CHECK(conv_choice<ConvFwdAlgo>(p, "conv1").mode == SelectMode::Pinned);
  CHECK(p.variant<ConvLayout>("conv1", op::conv2d) == ConvLayout::Nchw);
}

TEST_CASE("batch invariance: on the CPU reference every example's logits are the same bits in any batch") {
  Context ctx(Device::cpu(), Policy::parse(batch_invariant_rules()));
  const int64_t n = 10;
  for (const char* model : {"smallcnn", "resnet18", "smallcnn-bn"}) {
    INFO(model);
    auto net = make_net(ctx, {model, 10, 3});
    net->init(ctx, 7);
    const Shape one{3, 16, 16};
    const std::vector<float> images = test::random_vec(std::size_t(n * shape_numel(one)), 11);
    const std::vector<test::EvalPass> passes = {{n, test::identity_order(n)},
                                                {1, test::identity_order(n)},
                                                {3, test::identity_order(n)},
                                                {4, test::strided_order(n, 3, 5)}};
    const test::InvarianceReport rep = test::compare_passes(ctx, *net, images, one, passes, 10);
    INFO(rep.first_difference);
    CHECK(rep.examples == n);
    CHECK(rep.differing == 0);
  }
}

TEST_CASE("batch invariance: the comparison sees a logit that moved") {
  // The check above must be able to fail: a net whose output depends on the batch (training-mode
  // batch norm normalizes by the batch's statistics) differs between batch sizes.
  struct BatchStats : Net {
    std::unique_ptr<Net> inner;
    explicit BatchStats(std::unique_ptr<Net> n) : Net(n->input_spec()), inner(std::move(n)) {}
    std::string name() const override { return "batch-stats"; }
    std::vector<Param> params() override { return inner->params(); }
    std::vector<std::pair<std::string, OpKind>> knob_layers() const override { return inner->knob_layers(); }
    void init(Context& c, uint64_t s) override { inner->init(c, s); }
    Var forward_impl(Context& c, const Var& x, bool, SummaryTrace*) override { return inner->forward(c, x, true); }
  };
  Context ctx(Device::cpu());
  BatchStats net(make_net(ctx, {"smallcnn-bn", 10, 3}));
  net.init(ctx, 7);
  const int64_t n = 6;
  const Shape one{3, 16, 16};
  const std::vector<float> images = test::random_vec(std::size_t(n * shape_numel(one)), 12);
  const test::InvarianceReport rep =
      test::compare_passes(ctx, net, images, one, {{n, test::identity_order(n)}, {2, test::identity_order(n)}}, 10);
  CHECK(rep.differing == n);
  CHECK_THAT(rep.first_difference, Contains("example 0: batch 2 vs batch 6"));
}

TEST_CASE("batch invariance: ditto-train --eval-kernels batch-invariant records the evaluation's kernels apart") {
  auto base = test::synthetic_config("smallcnn", 64, 40, 16, 16);
  base.seed_init = 1, base.seed_order = 2, base.seed_augment = 3;
  base.checkpoint = false;
  TrainConfig inv = base;
  inv.eval_kernels = "batch-invariant";
  inv.out = test::scratch("batchinv", "inv");
  const TrainResult a = train(base), b = train(inv);
  // The evaluation's kernels touch no training state; on the CPU both evaluations are the reference.
  CHECK(a.weights_fingerprint == b.weights_fingerprint);
  CHECK(a.predictions == b.predictions);
  std::ifstream f(std::filesystem::path(inv.out) / "manifest.json");
  const nlohmann::json m = nlohmann::json::parse(f);
  CHECK(m.at("config").at("eval_kernels") == "batch-invariant");
  CHECK_THAT(m.at("replay").get<std::string>(), Contains("--eval-kernels batch-invariant"));
  const nlohmann::json& ev = m.at("evaluation");
  CHECK(ev.at("kernels") == "batch-invariant");
  CHECK(ev.at("rules").get<std::vector<std::string>>() == batch_invariant_rules());
  bool eval_conv = false, train_conv = false;
  for (const auto& e : ev.at("ops"))
    if (e.at("op") == "conv2d" && e.at("knob") == "fwd") {
      eval_conv = true;
      CHECK(e.at("requested") == "pinned");
    }
  for (const auto& e : m.at("ops"))
    if (e.at("op") == "conv2d" && e.at("knob") == "fwd") {
      train_conv = true;
      CHECK(e.at("requested") == "deterministic");
    }
  CHECK(eval_conv);
  CHECK(train_conv);
}

TEST_CASE("batch invariance: --eval-kernels refuses another precision and an unknown value, naming the flags") {
  auto c = test::synthetic_config("smallcnn", 32, 16, 16, 16);
  c.eval_kernels = "batch-invariant";
  c.precision = "bf16";
  const std::string msg = test::error_of([&] { train(c); });
  CHECK_THAT(msg, Contains("--eval-kernels batch-invariant") && Contains("--precision is bf16"));
  c.precision = "fp32";
  c.eval_kernels = "invariant";
  CHECK_THAT(test::error_of([&] { train(c); }), Contains("--eval-kernels: unknown value 'invariant'"));
}
