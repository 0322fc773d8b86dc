// experiments/run_dir: what a run folder holds, when a run may write it, the lock, publishing a
// generation at once, and reading a run back with every field checked.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "engine/error.h"
#include "experiments/run_dir.h"
#include "train_support.h"

using namespace ditto;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {
std::string scratch(const std::string& name) {
  const std::string p = test::scratch("cpu_run_dir", name);
  fs::remove_all(p);
  return p;
}

void write(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << text;
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

using test::error_of;

// Publishes a generation holding a manifest of `epochs_done` of `epochs` and the given files.
void publish_epoch(RunDir& d, int epochs_done, int epochs, const std::vector<std::string>& files) {
  const fs::path gen = d.begin_generation(epochs_done);
  write(gen / "manifest.json",
        nlohmann::json{{"results", {{"epochs_done", epochs_done}}}, {"config", {{"epochs", epochs}}}}.dump());
  for (const auto& f : files) write(gen / f, f + " of epoch " + std::to_string(epochs_done));
  d.publish(gen.string());
}

int generations(const std::string& dir) {
  int n = 0;
  for (const auto& e : fs::directory_iterator(dir)) n += e.path().filename().string().rfind(".gen-", 0) == 0;
  return n;
}
}  // namespace

TEST_CASE("run_dir: what a folder holds") {
  const std::string dir = scratch("states");
  CHECK_FALSE(inspect_run_folder(dir).exists);
  write(dir, "a file");
  CHECK(inspect_run_folder(dir).exists);
  CHECK_FALSE(inspect_run_folder(dir).is_folder);
  CHECK_THAT(error_of([&] { check_out_allowed(dir, OutIntent::Overwrite); }), Contains("not a folder"));
  fs::remove(dir);
  fs::create_directories(fs::path(dir) / ".gen-1-00000001");  // a run stopped before it published
  auto s = inspect_run_folder(dir);
  CHECK(s.is_folder);
  CHECK_FALSE(s.published);
  CHECK(s.unpublished);
  CHECK_NOTHROW(check_out_allowed(dir, OutIntent::Fresh));  // nothing there can be lost
  CHECK_THAT(error_of([&] { check_out_allowed(dir, OutIntent::Continue); }), Contains("before its first epoch ended"));
  {
    RunDir d(dir, OutIntent::Fresh);
    publish_epoch(d, 1, 3, {"log.csv"});
  }
  s = inspect_run_folder(dir);
  CHECK(s.published);
  CHECK_FALSE(s.unpublished);  // publishing removed the stray generation
  CHECK(s.epochs_done == 1);
  CHECK(s.epochs_planned == 3);
  CHECK_THAT(error_of([&] { check_out_allowed(dir, OutIntent::Fresh); }),
             Contains("--out") && Contains("stopped after epoch 1 of 3") && Contains("--overwrite") &&
                 Contains("--resume " + dir));
  CHECK_NOTHROW(check_out_allowed(dir, OutIntent::Overwrite));
  CHECK_NOTHROW(check_out_allowed(dir, OutIntent::Continue));
}

TEST_CASE("run_dir: one writer at a time; the lock of a dead process is free") {
  const std::string dir = scratch("lock");
  {
    RunDir first(dir, OutIntent::Fresh);
    CHECK(slurp(fs::path(dir) / ".lock") == "pid " + std::to_string(::getpid()) + "\n");
    CHECK_THAT(error_of([&] { RunDir second(dir, OutIntent::Overwrite); }),
               Contains("in use by another ditto run") && Contains("pid " + std::to_string(::getpid())));
    CHECK(fs::is_directory(dir));  // the refused writer removed nothing of the first's
  }
  // The first published nothing and made the folder: it is gone again.
  CHECK_FALSE(fs::exists(dir));
  // A lock file a killed process left (no process holds its flock) does not stop a writer.
  write(fs::path(dir) / ".lock", "pid 999999\n");
  CHECK_NOTHROW(RunDir(dir, OutIntent::Fresh));
  CHECK(fs::is_directory(dir));  // it existed before: kept
}

TEST_CASE("run_dir: publishing swaps whole generations; an overwrite keeps the old run until it publishes") {
  const std::string dir = scratch("publish");
  {
    RunDir d(dir, OutIntent::Fresh);
    publish_epoch(d, 1, 2, {"log.csv", "checkpoint.safetensors"});
    CHECK(slurp(fs::path(dir) / "checkpoint.safetensors") == "checkpoint.safetensors of epoch 1");
    CHECK(fs::read_symlink(fs::path(dir) / "log.csv") == fs::path("state") / "log.csv");
    publish_epoch(d, 2, 2, {"log.csv", "checkpoint.safetensors"});
    CHECK(slurp(fs::path(dir) / "log.csv") == "log.csv of epoch 2");
    CHECK(generations(dir) == 1);
  }
  const std::string old_state = fs::read_symlink(fs::path(dir) / "state").string();
  {
    RunDir d(dir, OutIntent::Overwrite);
    // The same epoch number again: never the published generation's name.
    const std::string gen = d.begin_generation(2);
    CHECK(fs::path(gen).filename().string() != old_state);
    write(fs::path(gen) / "log.csv", "new");
    CHECK(slurp(fs::path(dir) / "log.csv") == "log.csv of epoch 2");  // not visible before publish
  }
  // Abandoned before publishing: the old run is whole, the new generation gone.
  CHECK(fs::read_symlink(fs::path(dir) / "state").string() == old_state);
  CHECK(slurp(fs::path(dir) / "checkpoint.safetensors") == "checkpoint.safetensors of epoch 2");
  CHECK(generations(dir) == 1);
  {
    RunDir d(dir, OutIntent::Overwrite);
    publish_epoch(d, 1, 1, {"log.csv"});  // a run without checkpoints
  }
  CHECK(slurp(fs::path(dir) / "log.csv") == "log.csv of epoch 1");
  // The replaced run's checkpoint link is gone rather than left to dangle (or to outlive its run).
  CHECK_FALSE(fs::exists(fs::symlink_status(fs::path(dir) / "checkpoint.safetensors")));
  CHECK(generations(dir) == 1);
}

TEST_CASE("run_dir: a generation that failed after an earlier epoch published is removed with its writer") {
  // A write that fails midway (a full disk) leaves a partial generation; the published epoch stays
  // the folder's state and the partial one goes when the writer does, not at some later epoch.
  const std::string dir = scratch("failed-generation");
  std::string partial;
  try {
    RunDir d(dir, OutIntent::Fresh);
    publish_epoch(d, 1, 2, {"log.csv"});
    partial = d.begin_generation(2);
    write(fs::path(partial) / "log.csv", "half of epoch 2");
    throw IoError("no space left on device");
  } catch (const IoError&) {
  }
  CHECK_FALSE(fs::exists(partial));
  CHECK(generations(dir) == 1);
  CHECK(slurp(fs::path(dir) / "log.csv") == "log.csv of epoch 1");
  CHECK(inspect_run_folder(dir).epochs_done == 1);
  CHECK_FALSE(inspect_run_folder(dir).unpublished);
}

TEST_CASE("run_dir: checkpoint metadata, every field checked") {
  CheckpointMeta m;
  m.model = "smallcnn";
  m.optimizer = "adam";
  m.epoch = 3;
  m.steps = 24;
  m.seed_init = 18446744073709551615ull;
  m.seed_order = 1;
  m.seed_augment = 2;
  m.weights_fingerprint = {0x0123456789abcdefull, 0x8000000000000000ull};
  m.state_fingerprint = Fingerprint{0xfedcba9876543210ull, 1};
  const auto fields = checkpoint_metadata(m);
  const CheckpointMeta back = parse_checkpoint_meta(fields, "ck");
  CHECK(back.epoch == 3);
  CHECK(back.steps == 24);
  CHECK(back.seed_init == m.seed_init);
  CHECK(back.weights_fingerprint == m.weights_fingerprint);
  CHECK(back.state_fingerprint == m.state_fingerprint);
  const std::vector<std::tuple<std::string, std::string, std::string>> bad = {
      {"epoch", "-5", "metadata epoch is '-5'"},         {"epoch", "0", "at least 1"},
      {"epoch", "3 ", "'3 '"},                           {"epoch", "99999999999", "'99999999999'"},
      {"steps", "abc", "metadata steps is 'abc'"},       {"steps", "-1", "'-1'"},
      {"seed_init", "18446744073709551616", "seed_init"}, {"seed_order", "+1", "'+1'"},
      {"weights_fingerprint", "0123456789ABCDEF0123456789ABCDEF", "32 lowercase hex"},
      {"weights_fingerprint", "0123456789abcdef", "FNV-1a"},
      {"state_fingerprint", "", "state_fingerprint is ''"}, {"model", "", "model is ''"}};
  for (const auto& [key, value, says] : bad) {
    INFO(key << "=" << value);
    auto f = fields;
    f[key] = value;
    CHECK_THAT(error_of([&] { parse_checkpoint_meta(f, "run/checkpoint.safetensors"); }),
               Contains("run/checkpoint.safetensors: ") && Contains(says));
  }
  auto missing = fields;
  missing.erase("steps");
  CHECK_THAT(error_of([&] { parse_checkpoint_meta(missing, "ck"); }), Contains("ck: metadata steps is missing"));
}

TEST_CASE("run_dir: manifests, logs and pins files name the file and the field") {
  const std::string dir = scratch("files");
  const fs::path manifest = fs::path(dir) / "manifest.json";
  nlohmann::json m = {{"flags", {{"--lr", "0.002"}}},
                      {"seeds", {{"init", {{"value", 0}}}, {"order", {{"value", 1}}}, {"augment", {{"value", 2}}}}},
                      {"results", {{"epochs_done", 2}, {"weights_fingerprint", "0123456789abcdef0123456789abcdef"}}},
                      {"data", {{"train_fingerprint", "000000000000000000000000000000aa"},
                                {"test_fingerprint", "000000000000000000000000000000bb"}}},
                      {"ops", nlohmann::json::array()}};
  write(manifest, m.dump());
  const RunManifest r = read_run_manifest(manifest.string());
  CHECK(r.flags.at("--lr") == "0.002");
  CHECK(r.epochs_done == 2);
  CHECK(r.seed_augment == 2);
  auto broken = m;
  broken["seeds"]["init"]["value"] = "x";
  write(manifest, broken.dump());
  CHECK_THAT(error_of([&] { read_run_manifest(manifest.string()); }),
             Contains(manifest.string()) && Contains("field seeds.init.value is \"x\"; expected a whole number"));
  broken = m;
  broken["results"]["epochs_done"] = -5;
  write(manifest, broken.dump());
  CHECK_THAT(error_of([&] { read_run_manifest(manifest.string()); }), Contains("results.epochs_done is -5"));
  broken = m;
  broken["results"]["weights_fingerprint"] = "0123456789abcdef";  // a run of the FNV-1a versions
  write(manifest, broken.dump());
  CHECK_THAT(error_of([&] { read_run_manifest(manifest.string()); }),
             Contains(manifest.string()) && Contains("results.weights_fingerprint") && Contains("FNV-1a"));
  broken = m;
  broken.erase("flags");
  write(manifest, broken.dump());
  CHECK_THAT(error_of([&] { read_run_manifest(manifest.string()); }), Contains("field flags is missing"));
  write(manifest, "{\"flags\": {\"--lr\": \"0.002\"} \"seeds\": 1}");
  CHECK_THAT(error_of([&] { read_run_manifest(manifest.string()); }),
             Contains("malformed JSON at byte 34") && Contains("unexpected string literal") && !Contains("json.exception"));
  CHECK_THROWS_AS(read_run_manifest((fs::path(dir) / "none.json").string()), IoError);

  write(manifest, R"({"ops": [{"layer": "conv1", "knob": "fwd", "variant": "gemm", "shape": 5}]})");
  CHECK_THAT(error_of([&] { pins_from_manifest(manifest.string()); }), Contains("ops[0].shape is 5; expected a string"));
  write(manifest, R"({"ops": [7]})");
  CHECK_THAT(error_of([&] { pins_from_manifest(manifest.string()); }), Contains("ops[0] is 7; expected an object"));
  write(manifest, R"({"ops": [{"knob": "fwd", "variant": "gemm"}]})");
  CHECK_THAT(error_of([&] { pins_from_manifest(manifest.string()); }), Contains("ops[0].layer is missing"));

  const fs::path log = fs::path(dir) / "log.csv";
  std::vector<EpochLog> rows = {{1, 0.002, 2.25, 0.5, 0.25, 0.5, 1.5}, {2, 0.002, 2.0, 0.5, 0.25, 0.5, 1.5}};
  write(log, log_csv_text(rows));
  auto back = read_log_csv(log.string());
  REQUIRE(back.size() == 2);
  CHECK(back[1].loss == 2.0);
  write(log, log_csv_text(rows) + "3,0.002,abc\n");
  CHECK_THAT(error_of([&] { read_log_csv(log.string()); }), Contains(log.string() + ":4: malformed log row"));
}

TEST_CASE("run_dir: defining flags, the replay line and the resume check") {
  TrainConfig c = test::synthetic_config("smallcnn", 128, 32, 16, 32);
  c.data = "/data/my cifar";
  c.pins = {"conv1.bwd_filter=algo1", "fc1.precision=fp32"};
  c.augment = true;
  const std::string line = replay_line(c, 1, 2, 3);
  CHECK_THAT(line, Contains("--data '/data/my cifar'") && Contains("--synthetic-train 128") && Contains("--augment") &&
                       Contains("--pin conv1.bwd_filter=algo1 --pin fc1.precision=fp32") &&
                       Contains("--seed-init 1 --seed-order 2 --seed-augment 3") && !Contains("--nesterov") &&
                       !Contains("--graph"));

  ResumePoint r;
  r.dir = "RUN";
  for (const auto& f : defining_flags(c)) r.manifest.flags[f.flag] = f.value;
  CHECK_NOTHROW(check_resume_flags(r, c));
  TrainConfig moved = c;
  moved.data = "/elsewhere";  // where the data live does not define the run (their fingerprint does)
  moved.graph = true;         // graphs keep the bits
  moved.epochs = 9;           // checked against the schedule, not here
  CHECK_NOTHROW(check_resume_flags(r, moved));
  TrainConfig other = c;
  other.device = "cuda:1";
  r.manifest.flags["--device"] = "cuda";
  CHECK_NOTHROW(check_resume_flags(r, other));  // another GPU of the run's kind
  other.device = "cpu";
  CHECK_THAT(error_of([&] { check_resume_flags(r, other); }), Contains("--device cuda") && Contains("--device cpu"));
  other = c;
  other.batch_size = 64;
  r.manifest.flags["--device"] = c.device;
  CHECK_THAT(error_of([&] { check_resume_flags(r, other); }),
             Contains("--batch-size: 'RUN' was trained with --batch-size 32, this run asks to go on with --batch-size 64"));
  r.manifest.flags.erase("--optimizer");
  CHECK_THAT(error_of([&] { check_resume_flags(r, c); }), Contains("--optimizer (not recorded)"));
}
