// Tuning files on the GPU: a tuning run writes an entry for every conv problem it met, with
// deterministic algorithms only; two runs that read the file end bit-identical; an entry naming
// an atomics algorithm is refused; a problem missing from a read file is an error.
#include <catch2/catch.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <unistd.h>

#include "engine/error.h"
#include "engine/tuning.h"
#include "experiments/train.h"
#include "train_support.h"

using namespace ditto;
namespace fs = std::filesystem;

namespace {
std::string scratch(const std::string& name) { return test::scratch("gpu_tuning", name); }
}  // namespace

TEST_CASE("gpu tuning: tune, then two reading runs are bit-identical") {
  TrainConfig c = test::synthetic_config("two-conv", 1024, 256, 32, 128, "cuda");
  c.deterministic_init = c.deterministic_input = true;
  c.max_steps = 8;
  c.tuning = scratch("two-conv.json");
  train(c);  // tunes: the file does not exist yet
  REQUIRE(fs::exists(c.tuning));
  TuningTable t = TuningTable::load(c.tuning);
  // conv1: fwd and bwd_filter (its input needs no gradient); conv2: all three directions; the
  // full batches of 128 only (8 steps of 1024 images). Beside them every other knob with two
  // deterministic variants: the max pool's backward, and the bias reductions of the two convs
  // (the dense layer's 2-D bias has only ditto's).
  std::map<std::string, int> per_op;
  for (const auto& e : t.entries()) {
    std::printf("TUNING %s -> %s (%.3f ms, %s)\n", e.key().c_str(), e.algo.c_str(), e.time_ms, e.layer.c_str());
    per_op[e.op] += 1;
    CHECK(e.algo != "algo0");
    CHECK(!(e.direction == "bwd_filter" && e.algo == "algo3"));
    if (e.op == "maxpool2d") CHECK((e.algo == "gather" || e.algo == "cudnn-deterministic"));
    if (e.op == "bias_add") CHECK((e.algo == "deterministic" || e.algo == "cudnn"));
  }
  CHECK(per_op["conv2d"] == 5);
  CHECK(per_op["maxpool2d"] == 1);
  CHECK(per_op["bias_add"] == 2);
  CHECK(t.entries().size() == 8);
  auto a = train(c);
  auto b = train(c);
  CHECK(a.weights_fingerprint == b.weights_fingerprint);
  for (const auto& op : a.ops)
    if (op.op == "conv2d" || op.op == "maxpool2d" || op.knob == "bias_bwd") CHECK(op.deterministic == Determinism::Yes);

  // A hand edit that names the atomics algorithm is refused, naming the layer and the entry.
  std::ifstream in(c.tuning);
  std::string text((std::istreambuf_iterator<char>(in)), {});
  in.close();
  TuningTable edited = TuningTable::load(c.tuning);
  for (const auto& e : edited.entries())
    if (e.direction == "bwd_filter" && e.layer == "conv2") {
      TuningEntry x = e;
      x.algo = "algo0";
      edited.add(x);
    }
  const std::string bad = scratch("atomics.json");
  edited.save(bad);
  c.tuning = bad;
  CHECK_THROWS_AS(train(c), PolicyError);

  // A read file without the problem of another batch size is an error, not a silent heuristic.
  c.tuning = scratch("two-conv.json");
  c.batch_size = 64;
  CHECK_THROWS_AS(train(c), PolicyError);
}

TEST_CASE("gpu tuning: a workspace budget bounds what the tuning run writes down; reading runs repeat") {
  // VGG-like 3x3 layers at batch 64, where FFT and Winograd workspaces run far above the budget.
  TrainConfig c = test::synthetic_config("two-conv", 512, 128, 32, 64, "cuda");
  c.deterministic_init = c.deterministic_input = true;
  c.max_steps = 4;
  c.tuning = scratch("budget.json");
  c.tuning_workspace_mb = 1;
  fs::remove(c.tuning);
  train(c);
  const TuningTable t = TuningTable::load(c.tuning);
  CHECK(t.workspace_budget == std::size_t(1) << 20);
  int conv = 0;
  for (const auto& e : t.entries())
    if (e.op == "conv2d") {
      ++conv;
      std::printf("TUNING budget 1 MiB %s -> %s (%zu bytes)\n", e.key().c_str(), e.algo.c_str(), e.workspace_bytes);
      CHECK(e.workspace_bytes <= t.workspace_budget);
    }
  CHECK(conv == 5);
  const TrainResult a = train(c), b = train(c);
  CHECK(a.weights_fingerprint == b.weights_fingerprint);
  for (const auto& op : a.ops)
    if (op.op == "conv2d" && (op.knob == "fwd" || op.knob == "bwd_data" || op.knob == "bwd_filter"))
      CHECK(op.workspace_bytes <= t.workspace_budget);
  // Reading the file under another budget is another run: refused, naming both.
  c.tuning_workspace_mb = 2;
  try {
    train(c);
    FAIL("a file tuned under 1 MiB was read under 2");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("was tuned with a workspace budget of 1048576 bytes") != std::string::npos);
  }
}
