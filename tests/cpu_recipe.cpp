// The training-recipe flags on the CPU (the ResNet-18 CIFAR-10 recipe of docs/determinism.md:
// SGD with Nesterov momentum, weight decay, pad-4 crop + flip, a one-cycle schedule with a
// linear warm-up): the flags reach the TrainConfig, the per-step rates reach the optimizer, the
// manifest and replay command record them, and augmentation is keyed by its seed alone.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "engine/context.h"
#include "engine/error.h"
#include "engine/optim.h"
#include "experiments/cli.h"
#include "experiments/train.h"
#include "nets/nets.h"
#include "train_support.h"

using namespace ditto;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

// 128 training images, batch 32: 4 steps an epoch.
TrainConfig recipe_config(const std::string& name) {
  TrainConfig c = test::synthetic_config("smallcnn", 128, 64, 16, 32);
  c.epochs = 3;
  c.optimizer = "sgd";
  c.lr = 0.05f;
  c.momentum = 0.9f;
  c.nesterov = true;
  c.weight_decay = 5e-4f;
  c.augment = true;
  c.lr_schedule = "onecycle";
  c.warmup_epochs = 1;
  c.deterministic_init = c.deterministic_input = true;
  c.out = name.empty() ? "" : test::scratch("cpu_recipe", name);
  if (!c.out.empty()) fs::remove_all(c.out);
  return c;
}

}  // namespace

TEST_CASE("recipe flags: ditto-train's flags fill the config") {
  CLI::App app;
  TrainConfig c;
  TrainFlags f;
  add_train_flags(app, c, f);
  std::vector<std::string> args = {"--optimizer", "sgd",        "--momentum",      "0.9",    "--nesterov",
                                   "--weight-decay", "5e-4",    "--augment",       "--lr-schedule", "onecycle",
                                   "--warmup-epochs", "2.5",    "--lr",            "0.2",    "--batch-size", "256"};
  std::reverse(args.begin(), args.end());  // CLI11 parses a vector from its back
  app.parse(args);
  CHECK(c.optimizer == "sgd");
  CHECK(c.momentum == 0.9f);
  CHECK(c.nesterov);
  CHECK(c.weight_decay == 5e-4f);
  CHECK(c.augment);
  CHECK(c.lr_schedule == "onecycle");
  CHECK(c.warmup_epochs == 2.5);
  CHECK(c.lr == 0.2f);
  CHECK(c.batch_size == 256);

  CLI::App bad;
  TrainConfig b;
  TrainFlags bf;
  add_train_flags(bad, b, bf);
  std::vector<std::string> negative = {"--warmup-epochs", "-1"};
  std::reverse(negative.begin(), negative.end());
  CHECK_THROWS_AS(bad.parse(negative), CLI::ValidationError);
  std::vector<std::string> unknown = {"--lr-schedule", "triangle"};
  std::reverse(unknown.begin(), unknown.end());
  CHECK_THROWS_AS(bad.parse(unknown), CLI::ValidationError);
}

TEST_CASE("recipe: the warm-up's rates reach the optimizer step by step; outputs record the recipe") {
  TrainConfig c = recipe_config("onecycle");
  // The initial weights, as train() makes them (fixed init seed 0).
  Context cpu;
  auto net = make_net(cpu, {c.model, 10, 3});
  net->init(cpu, 0);
  const Fingerprint init = params_fingerprint(net->params());
  std::vector<Fingerprint> after;
  TrainHooks hooks;
  hooks.after_step = [&](const StepView& v) { after.push_back(params_fingerprint(v.params)); };
  TrainResult r = train(c, hooks);
  REQUIRE(after.size() == 12);
  // The first step's rate is 0 (the warm-up starts there): the weights do not move; the second's
  // is base / 4 and they do.
  CHECK(after[0] == init);
  CHECK(after[1] != init);
  // Logged per epoch at its start: 0, then the peak, then half-way down (epoch 2 of the 2 after
  // the warm-up).
  REQUIRE(r.log.size() == 3);
  CHECK(r.log[0].lr == 0.0);
  CHECK(r.log[1].lr == Approx(0.05));
  CHECK(r.log[2].lr == Approx(0.025));

  std::ifstream in(fs::path(c.out) / "manifest.json");
  const nlohmann::json m = nlohmann::json::parse(in);
  CHECK(m["config"]["lr_schedule"] == "onecycle");
  CHECK(m["config"]["warmup_epochs"].get<double>() == 1.0);
  CHECK(m["config"]["augment"] == true);
  CHECK(m["config"]["nesterov"] == true);
  CHECK(m["config"]["weight_decay"].get<double>() == Approx(5e-4));
  const std::string replay = m["replay"];
  for (const char* flag : {"--lr-schedule onecycle", "--warmup-epochs 1", "--augment", "--nesterov", "--optimizer sgd"})
    CHECK_THAT(replay, Contains(flag));

  // A rerun is bit-identical (augmentation and order are Philox-keyed by their seeds); another
  // augmentation seed, or no augmentation, trains to other weights.
  TrainConfig again = recipe_config("");
  CHECK(train(again).weights_fingerprint == r.weights_fingerprint);
  TrainConfig other = recipe_config("");
  other.seed_augment = 1;
  CHECK(train(other).weights_fingerprint != r.weights_fingerprint);
  TrainConfig plain = recipe_config("");
  plain.augment = false;
  CHECK(train(plain).weights_fingerprint != r.weights_fingerprint);
}

TEST_CASE("recipe: a warm-up as long as the run is an error naming the flag") {
  TrainConfig c = recipe_config("");
  c.warmup_epochs = 3;
  CHECK_THROWS_WITH(train(c), Contains("--warmup-epochs"));
  c.warmup_epochs = -0.5;
  CHECK_THROWS_WITH(train(c), Contains("--warmup-epochs"));
}
