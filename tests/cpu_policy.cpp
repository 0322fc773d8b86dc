#include <catch2/catch.hpp>

#include "engine/error.h"
#include "engine/policy.h"
#include "ditto/ditto.h"

using namespace ditto;

TEST_CASE("policy: defaults are what frameworks do") {
  Policy p;
  CHECK(conv_choice<ConvFwdAlgo>(p, "c").mode == SelectMode::Heuristic);
  CHECK(conv_choice<ConvBwdFilterAlgo>(p, "c").mode == SelectMode::Heuristic);
  CHECK(p.variant<BiasBwd>("c", op::conv2d) == BiasBwd::Cudnn);
  CHECK(p.variant<BiasBwd>("fc", op::linear) == BiasBwd::Atomic);
  CHECK(p.variant<PoolBwd>("pool", op::maxpool2d) == PoolBwd::Cudnn);
  CHECK(p.variant<BnBwd>("bn", op::batchnorm) == BnBwd::Cudnn);
  CHECK(p.variant<Reduction>("loss", op::softmax_xent) == Reduction::Atomic);
  CHECK(p.variant<Precision>("c", op::conv2d) == Precision::Fp32);
  CHECK(p.variant<CublasAtomics>("fc", op::linear) == CublasAtomics::Off);
}

TEST_CASE("policy: the issue's example strings parse to what they say") {
  Policy p = Policy::parse({"conv2.bwd_filter=algo0", "pool1.bwd=atomic-scatter", "fc1.bias_bwd=atomic",
                            "*.bwd_data=algo1", "*=deterministic"});
  auto bf = conv_choice<ConvBwdFilterAlgo>(p, "conv2");
  CHECK(bf.mode == SelectMode::Pinned);
  CHECK(bf.algo == ConvBwdFilterAlgo::Algo0);
  CHECK(p.variant<PoolBwd>("pool1", op::maxpool2d) == PoolBwd::AtomicScatter);
  CHECK(p.variant<BiasBwd>("fc1", op::linear) == BiasBwd::Atomic);
  // *.bwd_data (wildcard layer, named knob) beats *=deterministic (wildcard both).
  CHECK(conv_choice<ConvBwdDataAlgo>(p, "conv7").mode == SelectMode::Pinned);
  CHECK(conv_choice<ConvBwdDataAlgo>(p, "conv7").algo == ConvBwdDataAlgo::Algo1);
  // everything else follows *=deterministic
  CHECK(conv_choice<ConvBwdFilterAlgo>(p, "conv1").mode == SelectMode::Deterministic);
  CHECK(p.variant<PoolBwd>("pool2", op::maxpool2d) == PoolBwd::Gather);
  CHECK(p.variant<BnBwd>("bn1", op::batchnorm) == BnBwd::Deterministic);
  CHECK(p.variant<Reduction>("loss", op::softmax_xent) == Reduction::Deterministic);
  CHECK(p.variant<BiasBwd>("conv1", op::conv2d) == BiasBwd::Deterministic);
}

TEST_CASE("policy: specificity beats order, last wins among equals") {
  Policy p = Policy::parse({"conv1.bwd_filter=algo3", "*=nondeterministic", "conv1=deterministic"});
  CHECK(conv_choice<ConvBwdFilterAlgo>(p, "conv1").algo == ConvBwdFilterAlgo::Algo3);   // LAYER.KNOB wins
  CHECK(conv_choice<ConvBwdDataAlgo>(p, "conv1").mode == SelectMode::Deterministic);     // LAYER= beats *=
  CHECK(conv_choice<ConvBwdDataAlgo>(p, "conv2").mode == SelectMode::Nondeterministic);
  CHECK(p.variant<PoolBwd>("p", op::maxpool2d) == PoolBwd::AtomicScatter);
  CHECK(p.variant<CublasAtomics>("fc", op::linear) == CublasAtomics::On);
  p.set("conv1.bwd_filter=algo1");
  CHECK(conv_choice<ConvBwdFilterAlgo>(p, "conv1").algo == ConvBwdFilterAlgo::Algo1);
}

TEST_CASE("policy: typed pins equal their strings") {
  Policy p;
  p.pin("conv2", ConvBwdFilterAlgo::Algo0).pin("conv1", ConvFwdAlgo::Winograd).pin("pool1", PoolBwd::Gather);
  p.pin("bn1", BnBwd::Atomic).pin("fc", Precision::Tf32).pin("loss", Reduction::Deterministic);
  CHECK(conv_choice<ConvBwdFilterAlgo>(p, "conv2").algo == ConvBwdFilterAlgo::Algo0);
  CHECK(conv_choice<ConvFwdAlgo>(p, "conv1").algo == ConvFwdAlgo::Winograd);
  CHECK(p.variant<PoolBwd>("pool1", op::maxpool2d) == PoolBwd::Gather);
  CHECK(p.variant<BnBwd>("bn1", op::batchnorm) == BnBwd::Atomic);
  CHECK(p.variant<Precision>("fc", op::linear) == Precision::Tf32);
  CHECK(p.variant<Reduction>("loss", op::softmax_xent) == Reduction::Deterministic);
  CHECK(p.rules().at(0) == "conv2.bwd_filter=algo0");
}

TEST_CASE("policy: a wildcard rule skips layers whose op kind lacks the value") {
  Policy p = Policy::parse({"*.bwd=gather"});
  CHECK(p.variant<PoolBwd>("pool1", op::maxpool2d) == PoolBwd::Gather);
  CHECK(p.variant<BnBwd>("bn1", op::batchnorm) == BnBwd::Cudnn);
}

static std::string error_of(const std::vector<std::string>& rules) {
  try {
    Policy::parse(rules);
  } catch (const PolicyError& e) {
    return e.what();
  }
  return "";
}

TEST_CASE("policy: bad strings are errors that list what is valid") {
  using Catch::Matchers::Contains;
  CHECK_THAT(error_of({"conv2.bwd_filter=algo9"}), Contains("unknown variant 'algo9'") && Contains("algo3"));
  CHECK_THAT(error_of({"conv2.bwd_filtr=algo0"}), Contains("unknown knob 'bwd_filtr'") && Contains("bwd_filter"));
  CHECK_THAT(error_of({"*=algo0"}), Contains("takes a mode") && Contains("deterministic"));
  CHECK_THAT(error_of({"conv2"}), Contains("expected LAYER.KNOB=VALUE"));
  CHECK_THAT(error_of({"=x"}), Contains("expected"));
  CHECK_THAT(error_of({".bwd=gather"}), Contains("empty layer"));
  CHECK(error_of({"pool1.bwd=cudnn-deterministic", "*=fastest"}).empty());
}

TEST_CASE("policy: rules are checked against the network's layers") {
  using Catch::Matchers::Contains;
  std::vector<std::pair<std::string, OpKind>> layers = {
      {"conv1", op::conv2d}, {"pool1", op::maxpool2d}, {"fc1", op::linear}, {"bn1", op::batchnorm}};
  Policy ok = Policy::parse({"conv1.bwd_filter=algo0", "pool1.bwd=gather", "fc1.bias_bwd=atomic", "*=deterministic"});
  CHECK_NOTHROW(ok.check_layers(layers));

  Policy unknown_layer = Policy::parse({"conv9.bwd_filter=algo0"});
  CHECK_THROWS_WITH(unknown_layer.check_layers(layers), Contains("unknown layer 'conv9'") && Contains("conv1, pool1, fc1, bn1"));

  Policy wrong_knob = Policy::parse({"pool1.bwd_filter=algo0"});
  CHECK_THROWS_WITH(wrong_knob.check_layers(layers), Contains("has no knob 'bwd_filter'") && Contains("bwd"));

  Policy wrong_value = Policy::parse({"bn1.bwd=gather"});
  CHECK_THROWS_WITH(wrong_value.check_layers(layers), Contains("not a variant of bwd"));

  Policy linear_cudnn = Policy::parse({"fc1.bias_bwd=cudnn"});
  CHECK_THROWS_AS(linear_cudnn.check_layers(layers), PolicyError);
  // resolution itself refuses, too, so an op never runs with a choice its kind lacks
  CHECK_THROWS_AS(linear_cudnn.variant<BiasBwd>("fc1", op::linear), PolicyError);
}

TEST_CASE("policy: requested() reports pinned or the mode word, for manifests") {
  Policy p = Policy::parse({"fc1.bias_bwd=deterministic", "fc2.precision=tf32", "*=nondeterministic"});
  CHECK(p.requested("fc1", "bias_bwd", op::linear) == "deterministic");
  CHECK(p.requested("fc2", "precision", op::linear) == "pinned");
  CHECK(p.requested("fc3", "cublas_atomics", op::linear) == "nondeterministic");
  CHECK(Policy{}.requested("loss", "reduce", op::softmax_xent) == "heuristic");
}

TEST_CASE("policy: shape-qualified conv rules beat plain ones, for their shape only") {
  Policy p = Policy::parse({"*=deterministic", "conv1.bwd_filter=algo1", "conv1.bwd_filter@80x3x32x32=winograd_nonfused"});
  CHECK(conv_choice<ConvBwdFilterAlgo>(p, "conv1", "128x3x32x32").algo == ConvBwdFilterAlgo::Algo1);
  CHECK(conv_choice<ConvBwdFilterAlgo>(p, "conv1", "80x3x32x32").algo == ConvBwdFilterAlgo::WinogradNonfused);
  CHECK(conv_choice<ConvBwdFilterAlgo>(p, "conv1").algo == ConvBwdFilterAlgo::Algo1);
  CHECK(conv_choice<ConvBwdFilterAlgo>(p, "conv2", "80x3x32x32").mode == SelectMode::Deterministic);
  CHECK(shape_key({80, 3, 32, 32}) == "80x3x32x32");
  using Catch::Matchers::Contains;
  CHECK_THROWS_WITH(Policy::parse({"conv1.bwd_filter@80x3=algo1x"}), Contains("unknown variant"));
  CHECK_THROWS_WITH(Policy::parse({"conv1.bwd_filter@80,3=algo1"}), Contains("NxCxHxW"));
  CHECK_THROWS_WITH(Policy::parse({"pool1.bwd@8x3x4x4=gather"}), Contains("selected per shape take @SHAPE"));
  CHECK_THROWS_WITH(Policy::parse({"*.fwd@8x3x4x4=gemm"}), Contains("selected per shape take @SHAPE"));
}
