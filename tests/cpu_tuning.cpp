// Tuning files: what is written reads back; a hand-edited or mismatched file is an error that
// names the entry; the trainer refuses a tuning file where it cannot apply.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <unistd.h>

#include "engine/error.h"
#include "engine/tuning.h"
#include "experiments/train.h"
#include "train_support.h"

using namespace ditto;
namespace fs = std::filesystem;

namespace {
std::string scratch(const std::string& name) { return test::scratch("cpu_tuning", name); }

TuningTable sample() {
  TuningTable t;
  t.gpu = "NVIDIA H100 80GB HBM3";
  t.cudnn = "9.14.0";
  TuningEntry a;
  a.direction = "bwd_filter";
  a.x = {128, 16, 16, 16};
  a.w = {32, 16, 3, 3};
  a.pad_h = a.pad_w = 1;
  a.precision = "fp32";
  a.algo = "winograd_nonfused";
  a.time_ms = 0.042;
  a.layer = "conv2";
  TuningEntry b = a;
  b.direction = "fwd";
  b.algo = "implicit_precomp_gemm";
  TuningEntry c = a;
  c.stride_h = c.stride_w = 2;  // another problem: strides are part of the key
  c.algo = "algo1";
  t.add(a);
  t.add(b);
  t.add(c);
  return t;
}

// Rewrites the first occurrence of `from` in the file with `to`.
void edit(const std::string& path, const std::string& from, const std::string& to) {
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), {});
  auto at = text.find(from);
  REQUIRE(at != std::string::npos);
  text.replace(at, from.size(), to);
  std::ofstream(path, std::ios::trunc) << text;
}

std::string error_of(const std::string& path, const std::string& gpu = "", const std::string& cudnn = "") {
  try {
    TuningTable::load(path, gpu, cudnn);
  } catch (const DataError& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST_CASE("tuning file: round trip") {
  TuningTable t = sample();
  REQUIRE(t.entries().size() == 3);
  const std::string path = scratch("round.json");
  const Fingerprint written = t.save(path);
  TuningTable back = TuningTable::load(path, "NVIDIA H100 80GB HBM3", "9.14.0");
  CHECK(back.reading());
  CHECK(back.file_hash() == written);
  CHECK(back.gpu == t.gpu);
  REQUIRE(back.entries().size() == 3);
  for (const auto& e : t.entries()) {
    const TuningEntry* r = back.find(e.key());
    REQUIRE(r);
    CHECK(r->algo == e.algo);
    CHECK(r->time_ms == e.time_ms);
    CHECK(r->layer == e.layer);
  }
  // Adding an entry with an existing key replaces it.
  TuningEntry again = t.entries()[0];
  again.algo = "algo1";
  t.add(again);
  CHECK(t.entries().size() == 3);
  CHECK(t.find(again.key())->algo == "algo1");
}

TEST_CASE("tuning file: hand edits and mismatches are errors naming the entry") {
  const std::string path = scratch("edit.json");
  sample().save(path);
  edit(path, "\"winograd_nonfused\"", "\"winograd_fused\"");
  std::string err = error_of(path);
  CHECK(err.find("entry 0") != std::string::npos);
  CHECK(err.find("bwd_filter|x128x16x16x16") != std::string::npos);
  CHECK(err.find("'winograd_fused' is not a bwd_filter algorithm") != std::string::npos);

  sample().save(path);
  edit(path, "\"fp32\"", "\"fp8\"");
  CHECK(error_of(path).find("unknown precision 'fp8'") != std::string::npos);

  // A file written before precisions says "math": "fma", which reads as fp32.
  sample().save(path);
  edit(path, "\"precision\": \"fp32\"", "\"math\": \"fma\"");
  CHECK(TuningTable::load(path, "NVIDIA H100 80GB HBM3", "9.14.0").find(sample().entries()[0].key()));

  sample().save(path);
  edit(path, "\"fwd\"", "\"bwd_filter\"");  // now entry 1 repeats entry 0's problem
  edit(path, "\"implicit_precomp_gemm\"", "\"algo1\"");
  CHECK(error_of(path).find("entry 1") != std::string::npos);
  CHECK(error_of(path).find("a second entry for the same problem") != std::string::npos);

  sample().save(path);
  CHECK(error_of(path, "NVIDIA H200").find("tuned on 'NVIDIA H100 80GB HBM3', this run is on 'NVIDIA H200'") !=
        std::string::npos);
  CHECK(error_of(path, "", "9.19.0").find("tuned with cuDNN 9.14.0") != std::string::npos);

  std::ofstream(path, std::ios::trunc) << "{\"ditto_tuning\": 1, \"gpu\": \"x\", \"cudnn\": \"y\", \"entries\": [";
  CHECK(error_of(path).find("malformed JSON at byte") != std::string::npos);
  std::ofstream(path, std::ios::trunc) << "{\"ditto_tuning\": 1, \"gpu\": \"x\", \"cudnn\": \"y\", \"entries\": "
                                          "[{\"direction\": \"fwd\"}]}";
  CHECK(error_of(path).find("entry 0") != std::string::npos);
  CHECK_THROWS_AS(TuningTable::load(scratch("missing.json")), IoError);
}

TEST_CASE("tuning file: the trainer takes it only where it applies") {
  TrainConfig c = test::synthetic_config("two-conv", 64, 32, 16, 32);
  c.max_steps = 1;
  c.tuning = scratch("cpu.json");
  try {
    train(c);
    FAIL("a CPU run accepted --tuning");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("--tuning: a tuning file chooses cuDNN algorithms") != std::string::npos);
  }
  CHECK_FALSE(fs::exists(c.tuning));
}

TEST_CASE("tuning file: a workspace budget is written, read back, and bounds every entry") {
  TuningTable t = sample();
  t.workspace_budget = std::size_t(64) << 20;
  TuningEntry big = t.entries()[0];
  big.workspace_bytes = std::size_t(48) << 20;
  t.add(big);
  const std::string path = scratch("budget.json");
  t.save(path);
  const TuningTable back = TuningTable::load(path);
  CHECK(back.workspace_budget == t.workspace_budget);
  CHECK(back.find(big.key())->workspace_bytes == big.workspace_bytes);
  // A file without a budget reads as none; an entry over the file's budget is an error naming it.
  sample().save(path);
  CHECK(TuningTable::load(path).workspace_budget == 0);
  t.save(path);
  edit(path, "\"workspace_bytes\": 50331648", "\"workspace_bytes\": 1073741824");
  const std::string err = error_of(path);
  CHECK(err.find("entry 0") != std::string::npos);
  CHECK(err.find("over the file's budget of 67108864 bytes") != std::string::npos);
}

TEST_CASE("tuning file: --tuning-workspace-mb needs --tuning") {
  TrainConfig c = test::synthetic_config("two-conv", 64, 32, 16, 32);
  c.max_steps = 1;
  c.tuning_workspace_mb = 256;
  c.out = scratch("budget_run");
  try {
    train(c);
    FAIL("a budget without a tuning file was accepted");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("--tuning-workspace-mb: a workspace budget is a tuning file's") !=
          std::string::npos);
  }
  CHECK_FALSE(fs::exists(c.out + "/manifest.json"));
}
