// The noise lab on the GPU: tracing does not change the bits it traces; the lockstep search names
// the one kernel that was made nondeterministic; an all-deterministic pair never parts; a
// one-candidate attribution separates a noisy kernel from a quiet one.
#include <catch2/catch.hpp>

#include <cstdio>
#include <filesystem>
#include <unistd.h>

#include "engine/error.h"
#include "experiments/attribute.h"
#include "experiments/diverge.h"
#include "train_support.h"
#include "ditto/ditto.h"

using namespace ditto;
namespace fs = std::filesystem;

namespace {
std::string scratch(const std::string& name) { return test::scratch("gpu_noise_lab", name); }

TrainConfig small(const std::string& model = "two-conv") {
  TrainConfig c = test::synthetic_config(model, 2560, 512, 32, 128, "cuda");
  c.loader_threads = 4;
  c.deterministic_init = c.deterministic_input = true;
  return c;
}
}  // namespace

TEST_CASE("gpu trace: a traced deterministic run ends with the untraced run's weights") {
  for (const char* model : {"two-conv", "smallcnn-bn"}) {
    TrainConfig c = small(model);
    auto plain = train(c);
    auto traced = record_trace(c, scratch(std::string(model) + ".trace"));
    INFO(model);
    CHECK(plain.weights_fingerprint == traced.weights_fingerprint);
    CHECK(plain.steps == 20);
  }
}

TEST_CASE("gpu diverge: only conv2.bwd_filter=algo0 nondeterministic is named as the first divergence") {
  TrainConfig c = small();
  c.max_steps = 20;
  c.pins = {"conv2.bwd_filter=algo0"};
  DivergeOptions o;
  o.eval_every = 5;
  o.log = [](const std::string&) {};
  auto r = diverge(c, o);
  std::printf("NOISELAB %s", format_divergence(r).c_str());
  REQUIRE(r.first.found);
  CHECK(r.first.inputs_identical);
  CHECK(r.first.event_a.phase == "bwd");
  CHECK(r.first.event_a.layer == "conv2");
  CHECK(r.first.event_a.op == "conv2d");
  CHECK(r.first.tensor == "dw");
  // Nothing else is nondeterministic, so the first difference is also the first that is read on.
  REQUIRE(r.source.found);
  CHECK(r.source.event_a.layer == "conv2");
  CHECK(r.source.tensor == "dw");
  CHECK(r.first_diff.differing > 0);
  CHECK(r.first_diff.max_ulp > 0);
  // Per layer: after step 1 only conv2's weights differ (its dw did; conv1's dw reads conv2's dx,
  // which the deterministic bwd_data computed from identical inputs), and by the last step the
  // difference has reached the forward activations.
  REQUIRE(r.layer_growth.size() == 20);
  for (std::size_t l = 0; l < r.layer_growth[0].size(); ++l) {
    INFO(r.layers[l]);
    CHECK((r.layer_growth[0][l].weights_l2 > 0) == (r.layers[l] == "conv2"));
    CHECK(r.layer_growth[0][l].activations_l2 == 0);
  }
  bool activations_differ = false;
  for (const auto& d : r.layer_growth.back()) activations_differ |= d.activations_l2 > 0;
  CHECK(activations_differ);
}

TEST_CASE("gpu diverge: an all-deterministic pair never parts") {
  TrainConfig c = small("smallcnn");
  c.epochs = 2;  // 20 batches each
  c.max_steps = 40;
  DivergeOptions o;
  o.eval_every = 10;
  o.log = [](const std::string&) {};
  auto r = diverge(c, o);
  CHECK_FALSE(r.first.found);
  CHECK_FALSE(r.first.structure_mismatch);
  CHECK(r.run_a.weights_fingerprint == r.run_b.weights_fingerprint);
  for (const auto& g : r.growth) CHECK(g.weights_max_ulp == 0);
}

TEST_CASE("gpu attribute: a noisy kernel diverges, the deterministic baseline does not") {
  TrainConfig c = small();
  c.max_steps = 10;
  c.checkpoint = false;
  Candidate noisy{"conv2.bwd_filter=algo0", op::conv2d, "bwd_filter", "algo0", {"conv2"}, false};
  AttributeOptions o;
  o.replicas = 3;
  o.l2_steps = {1, 10};
  o.bootstrap = 100;
  o.log = [](const std::string&) {};
  auto r = attribute(c, {noisy}, o);
  std::printf("NOISELAB %s", format_attribution(r).c_str());
  for (const auto& row : r.rows) {
    INFO(row.name << ": " << row.message);
    REQUIRE(row.status == "ok");
    if (row.name == "all-deterministic") {
      CHECK(row.distinct_fingerprints == 1);
      CHECK(row.weight_l2 == 0);
    } else {
      CHECK(row.distinct_fingerprints > 1);
      CHECK(row.first_divergence_step >= 1);
      CHECK(row.l2_at.back().second > 0);
    }
  }
}
