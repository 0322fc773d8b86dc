// Training on the CPU: init replay, a 2-epoch SmallCNN run that is bit-identical when run
// twice, resume equivalence, outputs written, and the trainer's errors for bad input.
#include <catch2/catch.hpp>

#include <filesystem>
#include <unistd.h>
#include <fstream>
#include <nlohmann/json.hpp>

#include "engine/checkpoint.h"
#include "engine/error.h"
#include "experiments/run_dir.h"
#include "experiments/train.h"
#include "nets/nets.h"
#include "support.h"

using namespace ditto;
namespace fs = std::filesystem;

namespace {
// Run folders go to a scratch folder of this process, never into the caller's working tree.
std::string scratch(const std::string& name) {
  static const fs::path root = fs::temp_directory_path() / ("ditto_cpu_train_" + std::to_string(::getpid()));
  fs::create_directories(root);
  return name.empty() ? "" : (root / name).string();
}

TrainConfig small_config(const std::string& name) {
  const std::string out = scratch(name);
  TrainConfig c;
  c.model = "smallcnn";
  c.dataset = "synthetic";
  c.synthetic_train = 256;
  c.synthetic_test = 64;
  c.synthetic_size = 16;
  c.epochs = 2;
  c.batch_size = 32;
  c.lr = 2e-3f;
  c.device = "cpu";
  c.deterministic_init = c.deterministic_input = true;
  c.kernels = "deterministic";
  c.progress = false;
  c.loader_threads = 2;
  c.out = out;
  return c;
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}
}  // namespace

TEST_CASE("init: per-parameter streams replay, and do not depend on other layers") {
  Context ctx;
  auto a = make_net(ctx, {"smallcnn", 10, 3});
  auto b = make_net(ctx, {"smallcnn", 10, 3});
  auto c = make_net(ctx, {"smallcnn-bn", 10, 3});  // extra layers must not shift the others
  a->init(ctx, 42);
  b->init(ctx, 42);
  c->init(ctx, 42);
  auto pa = a->params(), pb = b->params(), pc = c->params();
  REQUIRE(pa.size() == pb.size());
  for (std::size_t i = 0; i < pa.size(); ++i) CHECK(pa[i].var.value().fingerprint() == pb[i].var.value().fingerprint());
  auto find = [](std::vector<Param>& ps, const std::string& n) {
    for (auto& p : ps)
      if (p.name == n) return p.var.value().fingerprint();
    FAIL("no parameter " << n);
    return Fingerprint{};
  };
  CHECK(find(pa, "conv2.weight") == find(pc, "conv2.weight"));
  CHECK(find(pa, "fc1.weight") == find(pc, "fc1.weight"));
  b->init(ctx, 43);
  CHECK(find(pa, "conv1.weight") != find(pb, "conv1.weight"));
  // Glorot-uniform bound holds: |w| <= sqrt(6 / (fan_in + fan_out)) for conv1 (27 + 144)
  for (float w : pa[0].var.value().to_host_f32()) CHECK(std::fabs(w) <= std::sqrt(6.0 / 171.0));
}

TEST_CASE("nets: names, parameter counts, unknown models") {
  Context ctx;
  auto s = make_net(ctx, {"smallcnn", 10, 3});
  // conv 3*16*9+16, 16*32*9+32, 32*32*9+32, fc 32*32+32, 32*10+10
  CHECK(s->param_count() == 448 + 4640 + 9248 + 1056 + 330);
  auto r = make_net(ctx, {"resnet18", 10, 3});
  CHECK(r->param_count() == 11173962);  // torchvision's resnet18 with a 3x3 stem and 10 classes
  CHECK_THROWS_WITH(make_net(ctx, {"vgg", 10, 3}), Catch::Matchers::Contains("resnet18"));
  Policy p = Policy::parse({"layer1.0.conv1.bwd_filter=algo0", "fc.bias_bwd=deterministic"});
  CHECK_NOTHROW(p.check_layers(r->knob_layers()));
  Policy bad = Policy::parse({"layer9.0.conv1.bwd_filter=algo0"});
  CHECK_THROWS_WITH(bad.check_layers(r->knob_layers()), Catch::Matchers::Contains("layer1.0.conv1"));
}

TEST_CASE("train: two CPU runs of SmallCNN on synthetic data are bit-identical; outputs are complete") {
  fs::remove_all(scratch("train_a"));
  fs::remove_all(scratch("train_b"));
  auto a = train(small_config("train_a"));
  auto b = train(small_config("train_b"));
  REQUIRE(a.log.size() == 2);
  CHECK(a.weights_fingerprint == b.weights_fingerprint);
  CHECK(a.predictions == b.predictions);
  CHECK(slurp(scratch("train_a") + "/checkpoint.safetensors") == slurp(scratch("train_b") + "/checkpoint.safetensors"));
  CHECK(slurp(scratch("train_a") + "/predictions.csv") == slurp(scratch("train_b") + "/predictions.csv"));
  // learning happened (the synthetic classes overlap, so two tiny epochs only lower the loss)
  CHECK(a.log[1].loss < a.log[0].loss);

  auto m = nlohmann::json::parse(slurp(scratch("train_a") + "/manifest.json"));
  CHECK(m["seeds"]["init"]["value"] == 0);
  CHECK(m["seeds"]["init"]["source"] == "deterministic switch");
  CHECK(m["policy"]["kernels"] == "deterministic");
  CHECK(m["runtime"]["device"] == "cpu");
  CHECK(m["ops"].size() > 5);
  CHECK(m["replay"].get<std::string>().find("--seed-init 0") != std::string::npos);
  CHECK(m["results"]["weights_fingerprint"] == a.weights_fingerprint.hex());
  std::string log = slurp(scratch("train_a") + "/log.csv");
  CHECK(log.rfind("epoch,lr,loss,train_acc,test_top1,test_top5,seconds\n", 0) == 0);
  CHECK(std::count(log.begin(), log.end(), '\n') == 3);
  std::string pred = slurp(scratch("train_a") + "/predictions.csv");
  CHECK(std::count(pred.begin(), pred.end(), '\n') == 65);
  CHECK(fs::exists(scratch("train_a") + "/metrics.json"));
  // no temporaries left behind
  for (const auto& e : fs::directory_iterator(scratch("train_a"))) CHECK(e.path().string().find(".tmp.") == std::string::npos);
}

TEST_CASE("train: seeds drawn from the OS differ between runs and are recorded") {
  auto c = small_config("");
  c.epochs = 1;
  c.deterministic_init = c.deterministic_input = false;
  auto a = train(c);
  auto b = train(c);
  CHECK(a.seed_init != b.seed_init);
  CHECK(a.weights_fingerprint != b.weights_fingerprint);
  c.seed_init = a.seed_init;
  c.seed_order = a.seed_order;
  c.seed_augment = a.seed_augment;
  CHECK(train(c).weights_fingerprint == a.weights_fingerprint);  // replay from the recorded seeds
}

TEST_CASE("train: resuming after epoch 1 ends bit-identical to an uninterrupted run") {
  fs::remove_all(scratch("resume_full"));
  fs::remove_all(scratch("resume_part"));
  auto full = train(small_config("resume_full"));
  auto part_cfg = small_config("resume_part");
  part_cfg.epochs = 1;
  train(part_cfg);
  auto cont = small_config("resume_part");
  cont.resume = scratch("resume_part");
  auto resumed = train(cont);
  CHECK(resumed.weights_fingerprint == full.weights_fingerprint);
  CHECK(slurp(scratch("resume_part") + "/checkpoint.safetensors") == slurp(scratch("resume_full") + "/checkpoint.safetensors"));
  REQUIRE(resumed.log.size() == 2);
  CHECK(resumed.log[0].loss == Approx(full.log[0].loss).epsilon(1e-7));  // read back from log.csv text
}

TEST_CASE("train: bad flags and data are errors naming the flag") {
  using Catch::Matchers::Contains;
  auto c = small_config("");
  c.model = "vgg";
  CHECK_THROWS_WITH(train(c), Contains("vgg") && Contains("smallcnn"));
  c = small_config("");
  c.pins = {"conv9.bwd_filter=algo0"};
  CHECK_THROWS_WITH(train(c), Contains("unknown layer 'conv9'"));
  c = small_config("");
  c.dataset = "cifar10";
  c.data = "/nonexistent";
  CHECK_THROWS_WITH(train(c), Contains("--data"));
  c = small_config("");
  c.out = "/proc/ditto-cannot-write-here";
  CHECK_THROWS_WITH(train(c), Contains("--out"));
  c = small_config("");
  c.train_size = 100000;
  CHECK_THROWS_WITH(train(c), Contains("--train-size"));
  c = small_config("");
  c.lr_schedule = "linear";
  CHECK_THROWS_WITH(train(c), Contains("constant, step, cosine"));
  c = small_config("");
  c.graph = true;
  CHECK_THROWS_WITH(train(c), Contains("--graph") && Contains("CUDA device"));
}

TEST_CASE("pins_from_manifest: every recorded kernel becomes a pin the policy accepts") {
  nlohmann::json m = {{"ops",
                       {{{"layer", "conv1"}, {"knob", "bwd_filter"}, {"variant", "algo0"}, {"precision", "tf32"}},
                        {{"layer", "conv1"}, {"knob", "bwd_filter"}, {"variant", "algo1"}, {"precision", "tf32"},
                         {"shape", "80x3x32x32"}},
                        {{"layer", "pool1"}, {"knob", "bwd"}, {"variant", "gather"}, {"precision", ""}},
                        {{"layer", "fc1"}, {"knob", "precision"}, {"variant", "fp32"}, {"precision", "fp32"}},
                        {{"layer", "conv2"}, {"knob", "fwd"}, {"variant", "cpu-reference"}, {"precision", ""}},
                        {{"layer", "conv3"}, {"knob", "fwd"}, {"variant", "cpu-reference"}, {"precision", "bf16"}}}}};
  write_file_atomic("m.json", m.dump());
  auto pins = pins_from_manifest("m.json");
  CHECK(pins == std::vector<std::string>{"conv1.bwd_filter=algo0", "conv1.precision=tf32",
                                         "conv1.bwd_filter@80x3x32x32=algo1", "conv1.precision=tf32",
                                         "pool1.bwd=gather", "fc1.precision=fp32", "conv3.precision=bf16"});
  Policy p = Policy::parse(pins);
  CHECK(conv_choice<ConvBwdFilterAlgo>(p, "conv1").algo == ConvBwdFilterAlgo::Algo0);
  CHECK(conv_choice<ConvBwdFilterAlgo>(p, "conv1", "80x3x32x32").algo == ConvBwdFilterAlgo::Algo1);
  CHECK(p.variant<Precision>("conv1", op::conv2d) == Precision::Tf32);
  CHECK(p.variant<Precision>("conv3", op::conv2d) == Precision::Bf16);
  // Manifests written before the precision knob: "math" fma is fp32, and linear's math knob is
  // the precision knob.
  nlohmann::json old = {{"ops",
                         {{{"layer", "conv1"}, {"knob", "fwd"}, {"variant", "gemm"}, {"math", "fma"}},
                          {{"layer", "fc1"}, {"knob", "math"}, {"variant", "tf32"}, {"math", "tf32"}}}}};
  write_file_atomic("old.json", old.dump());
  CHECK(pins_from_manifest("old.json") ==
        std::vector<std::string>{"conv1.fwd=gemm", "conv1.precision=fp32", "fc1.precision=tf32"});
  write_file_atomic("bad.json", "{\"ops\": [");
  CHECK_THROWS_WITH(pins_from_manifest("bad.json"), Catch::Matchers::Contains("bad.json"));
  CHECK_THROWS_AS(pins_from_manifest("none.json"), IoError);
  std::remove("m.json");
  std::remove("bad.json");
}

TEST_CASE("train: a run's manifest replays it through pins_from_manifest") {
  fs::remove_all(scratch("replay_a"));
  auto c = small_config("replay_a");
  c.epochs = 1;
  c.kernels = "fastest";
  auto a = train(c);
  auto r = small_config("");
  r.epochs = 1;
  r.kernels = "nondeterministic";  // overridden by every recorded pin
  r.pins = pins_from_manifest(scratch("replay_a") + "/manifest.json");
  CHECK(train(r).weights_fingerprint == a.weights_fingerprint);
}
