// Two runs' kernel choices compared from their manifests (experiments/kernel_choices.h): a precision
// pin shows on the layer it moved and nowhere else; another GPU, another engine and entries only one
// run recorded are named; a damaged guarantee is a DataError naming the field.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "engine/error.h"
#include "experiments/kernel_choices.h"
#include "experiments/train.h"
#include "train_support.h"

using namespace ditto;
namespace fs = std::filesystem;
using Catch::Matchers::Contains;

namespace {

TrainConfig tiny(const std::string& out) {
  TrainConfig c = test::synthetic_config("two-conv", 64, 32, 16, 32);
  c.deterministic_init = c.deterministic_input = true;
  c.loader_threads = 0;
  c.out = out;
  c.overwrite = true;
  return c;
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

void write_json(const std::string& path, const nlohmann::json& j) { std::ofstream(path) << j.dump(1); }

}  // namespace

TEST_CASE("kernel choices: a precision pin is the only difference, on the layer it names") {
  const std::string a = test::scratch("kernel_choices", "plain"), b = test::scratch("kernel_choices", "pinned");
  train(tiny(a));
  TrainConfig pinned = tiny(b);
  pinned.pins = {"conv1.precision=bf16"};
  train(pinned);

  const KernelChoices same = compare_kernel_choices(a, a + "/manifest.json");
  CHECK_FALSE(same.differ());
  CHECK(same.runtime.empty());
  CHECK(same.same > 0);

  const KernelChoices c = compare_kernel_choices(a, b);
  REQUIRE(c.differ());
  CHECK(c.runtime.empty());
  CHECK(c.same + c.differing.size() == same.same);  // the same entries, two of them moved
  for (const KernelChoice& k : c.differing) {
    INFO(k.layer << "." << k.knob);
    CHECK(k.layer == "conv1");
    REQUIRE(k.a.has_value());
    REQUIRE(k.b.has_value());
    CHECK(k.a->precision.empty());
    CHECK(k.b->precision == "bf16");
  }
  CHECK_THAT(format_kernel_choices(c), Contains("conv1.fwd") && Contains("bf16") && Contains("differ (A | B)"));
}

TEST_CASE("kernel choices: another GPU, another engine, and entries one run lacks are named") {
  const std::string run = test::scratch("kernel_choices", "base");
  train(tiny(run));
  nlohmann::json m = read_json(run + "/manifest.json");
  const std::string a = test::scratch("kernel_choices", "a.json"), b = test::scratch("kernel_choices", "b.json");
  m["runtime"]["gpu"] = "NVIDIA H100 80GB HBM3";
  m["ops"][0]["variant"] = "engine";
  m["ops"][0]["algorithm"] = "eng47[] TENSOR_CORE";
  write_json(a, m);
  const std::string first_layer = m["ops"][0]["layer"], first_knob = m["ops"][0]["knob"];
  const std::string last_layer = m["ops"].back()["layer"], last_knob = m["ops"].back()["knob"];
  m["runtime"]["gpu"] = "NVIDIA H200";
  m["ops"][0]["algorithm"] = "eng12[] TENSOR_CORE";
  m["ops"].erase(m["ops"].size() - 1);
  write_json(b, m);

  const KernelChoices c = compare_kernel_choices(a, b);
  REQUIRE(c.runtime.size() == 1);
  CHECK(c.runtime[0] == std::array<std::string, 3>{"gpu", "NVIDIA H100 80GB HBM3", "NVIDIA H200"});
  REQUIRE(c.differing.size() == 2);
  CHECK(c.differing[0].layer == first_layer);
  CHECK(c.differing[0].knob == first_knob);
  CHECK(c.differing[0].a->algorithm == "eng47[] TENSOR_CORE");
  CHECK(c.differing[0].b->algorithm == "eng12[] TENSOR_CORE");
  CHECK(c.differing[1].layer == last_layer);
  CHECK(c.differing[1].knob == last_knob);
  CHECK(c.differing[1].a.has_value());
  CHECK_FALSE(c.differing[1].b.has_value());
  const std::string text = format_kernel_choices(c);
  CHECK_THAT(text, Contains("gpu: NVIDIA H100 80GB HBM3 | NVIDIA H200") && Contains("eng12[]") &&
                       Contains("(not recorded)"));

  // The other way round the missing entry is A's.
  const KernelChoices r = compare_kernel_choices(b, a);
  REQUIRE(r.differing.size() == 2);
  CHECK_FALSE(r.differing[1].a.has_value());
  CHECK(r.differing[1].b.has_value());
}

TEST_CASE("kernel choices: a damaged manifest is an error naming the file and field") {
  const std::string run = test::scratch("kernel_choices", "damaged-base");
  train(tiny(run));
  nlohmann::json m = read_json(run + "/manifest.json");
  const std::string bad = test::scratch("kernel_choices", "bad.json");
  m["ops"][1]["guarantee"] = "mostly";
  write_json(bad, m);
  CHECK_THROWS_AS(compare_kernel_choices(run, bad), DataError);
  CHECK_THROWS_WITH(compare_kernel_choices(run, bad), Contains(bad) && Contains("ops[1].guarantee"));
  CHECK_THROWS_AS(compare_kernel_choices(run, test::scratch("kernel_choices", "nothing-here")), IoError);
}

TEST_CASE("kernel choices: a replay's mismatches are the GPU entries whose pinned variant ran in another configuration") {
  auto entry = [](const std::string& layer, const std::string& knob, const std::string& variant,
                  const std::string& algorithm, const std::string& device, const std::string& shape = "") {
    ManifestEntry e;
    e.layer = layer, e.knob = knob, e.variant = variant, e.algorithm = algorithm, e.device = device, e.shape = shape;
    return e;
  };
  const std::vector<ManifestEntry> recorded = {
      entry("conv1", "fwd", "engine", "eng47[] TENSOR_CORE", "cuda:0", "8x3x16x16"),
      entry("conv1", "bwd_data", "engine", "eng3[]", "cuda:0", "8x3x16x16"),
      entry("fc", "gemm", "cublaslt", "id 21 tile 128x128", "cuda:0"),
      entry("conv2", "fwd", "algo1", "", "cuda:0", "8x16x8x8"),
      entry("pool1", "bwd", "gather", "", "cpu"),
  };
  Manifest now;
  now.record(entry("conv1", "fwd", "engine", "eng12[] TENSOR_CORE", "cuda:1", "8x3x16x16"));  // another pick
  now.record(entry("conv1", "bwd_data", "engine", "eng3[]", "cuda:1", "8x3x16x16"));          // the same
  now.record(entry("fc", "gemm", "cublas", "", "cuda:1"));            // another variant: an explicit pin
  now.record(entry("conv2", "fwd", "algo1", "", "cuda:1", "8x16x8x8"));  // no configuration to differ
  now.record(entry("pool1", "bwd", "gather", "", "cuda:1"));          // recorded on the CPU: not compared
  const std::vector<std::string> differ = replay_mismatches(recorded, now);
  REQUIRE(differ.size() == 1);
  CHECK(differ[0] == "conv1.fwd @8x3x16x16: engine eng12[] TENSOR_CORE (recorded eng47[] TENSOR_CORE)");

  Manifest on_cpu;  // a GPU run's pins replayed on the CPU reference: nothing to compare
  on_cpu.record(entry("conv1", "fwd", "engine", "", "cpu", "8x3x16x16"));
  CHECK(replay_mismatches(recorded, on_cpu).empty());
}
