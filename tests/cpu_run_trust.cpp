// Runs you can trust: each wrong or weak behaviour a hostile user found, as a test.
// Bad numbers name their flag; --resume continues in its folder, refuses changed settings and
// verifies the checkpoint it reads; a finished run is never overwritten without --overwrite, and
// then only once the new run has an epoch to show; two writers never share a folder; a run
// refused by a check leaves nothing behind; a resumed run's replay line reproduces its bits.
#include <catch2/catch.hpp>

#include <algorithm>
#include <csignal>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

#include "engine/checkpoint.h"
#include "engine/error.h"
#include "experiments/cli.h"
#include "experiments/run_dir.h"
#include "experiments/train.h"
#include "train_support.h"

using namespace ditto;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {
std::string scratch(const std::string& name) { return test::scratch("cpu_run_trust", name); }

TrainConfig small(const std::string& out, int epochs = 1) {
  TrainConfig c = test::synthetic_config("smallcnn", 128, 32, 16, 32);
  c.deterministic_init = c.deterministic_input = true;
  c.epochs = epochs;
  c.out = out;
  if (!out.empty()) fs::remove_all(out);
  return c;
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

// Writes over the file a run folder's link leads to (the published generation's copy).
void overwrite_target(const fs::path& link, const std::string& bytes) {
  std::ofstream out(fs::canonical(link), std::ios::binary | std::ios::trunc);
  out << bytes;
  REQUIRE(out.good());
}

using test::error_of;

// The length of a safetensors file's JSON header (its first 8 bytes, little-endian).
uint64_t header_size(const std::string& bytes) {
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t(static_cast<unsigned char>(bytes[i])) << (8 * i);
  return n;
}

// The options of a command line, split as a shell would (the replay line quotes with '...').
std::vector<std::string> shell_words(const std::string& line) {
  std::vector<std::string> out;
  std::string word;
  bool in_word = false, quoted = false;
  for (char c : line) {
    if (quoted) {
      if (c == '\'') quoted = false;
      else word += c;
    } else if (c == '\'') {
      quoted = in_word = true;
    } else if (c == ' ') {
      if (in_word) out.push_back(word);
      word.clear();
      in_word = false;
    } else {
      word += c;
      in_word = true;
    }
  }
  if (in_word) out.push_back(word);
  return out;
}

// A TrainConfig from a ditto-train command line, through the flags ditto-train itself defines.
TrainConfig parse_command(const std::string& line) {
  std::vector<std::string> words = shell_words(line);
  std::vector<char*> argv;
  for (auto& w : words) argv.push_back(w.data());
  TrainConfig c;
  TrainFlags f;
  CLI::App app;
  add_train_flags(app, c, f);
  app.parse(static_cast<int>(argv.size()), argv.data());
  apply_train_flags(c, f, static_cast<int>(argv.size()), argv.data());
  return c;
}

std::string cli_error(std::vector<std::string> args) {
  TrainConfig c;
  TrainFlags f;
  CLI::App app;
  add_train_flags(app, c, f);
  std::reverse(args.begin(), args.end());
  try {
    app.parse(args);
  } catch (const CLI::ParseError& e) {
    return e.what();
  }
  return "(accepted)";
}
// A ditto-train command line parsed and applied (parse_command): "(accepted)" or the error's text.
std::string apply_error(const std::vector<std::string>& args) {
  std::string line = "ditto-train";
  for (const auto& a : args) line += " " + a;
  try {
    parse_command(line);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(accepted)";
}
}  // namespace

TEST_CASE("row 1: a non-finite or out-of-range number is an error naming its flag") {
  auto c = small("");
  c.lr = INFINITY;
  CHECK_THAT(error_of([&] { train(c); }), Contains("--lr") && Contains("finite"));
  c.lr = NAN;
  CHECK_THAT(error_of([&] { train(c); }), Contains("--lr"));
  c = small("");
  c.momentum = NAN;
  CHECK_THAT(error_of([&] { train(c); }), Contains("--momentum"));
  c = small("");
  c.weight_decay = INFINITY;
  CHECK_THAT(error_of([&] { train(c); }), Contains("--weight-decay"));
  c = small("");
  c.milestones = {-3};
  CHECK_THAT(error_of([&] { train(c); }), Contains("--milestones"));
  // The command line refuses them before CLI11 converts anything.
  CHECK_THAT(cli_error({"--lr", "inf"}), Contains("--lr") && Contains("finite number above 0") && Contains("got inf"));
  // A number a double holds but a float does not is refused as typed, not as the inf it becomes.
  CHECK_THAT(cli_error({"--lr", "1e39"}), Contains("--lr") && Contains("at most 3.40282e+38, got 1e39"));
  CHECK_THAT(cli_error({"--weight-decay", "1e39"}), Contains("--weight-decay") && Contains("got 1e39"));
  CHECK_THAT(cli_error({"--lr", "nan"}), Contains("--lr"));
  CHECK_THAT(cli_error({"--momentum", "nan"}), Contains("--momentum"));
  CHECK_THAT(cli_error({"--weight-decay", "inf"}), Contains("--weight-decay"));
  CHECK_THAT(cli_error({"--milestones", "-3"}), Contains("--milestones"));
  CHECK_THAT(cli_error({"--synthetic-train", "99999999999"}), Contains("--synthetic-train") && Contains("whole number"));
  CHECK_THAT(cli_error({"--seed-init", "-1"}), Contains("--seed-init"));
  CHECK_THAT(cli_error({"--epochs", "inf"}), Contains("--epochs") && Contains("whole number"));
  c = small("");
  c.optimizer = "adam";
  c.nesterov = true;  // a flag the optimizer would silently ignore
  CHECK_THAT(error_of([&] { train(c); }), Contains("--nesterov") && Contains("adam"));
}

TEST_CASE("weak: --batch-size past what the data or memory allow names the flag") {
  CHECK_THAT(cli_error({"--batch-size", "99999999999999999999"}),
             Contains("--batch-size") && Contains("whole number from 1 to"));
  auto c = small("");
  c.batch_size = 9999999999999;
  CHECK_THAT(error_of([&] { train(c); }), Contains("--batch-size"));
  c.batch_size = 129;  // the training set holds 128
  CHECK_THAT(error_of([&] { train(c); }), Contains("--batch-size: 129 is larger than the training set (128"));
}

TEST_CASE("row 2: --resume without --out continues in the resumed folder, bit-identical") {
  const std::string dir = scratch("in_place"), straight = scratch("straight");
  train(small(dir, 1));
  auto cont = small("", 2);
  cont.resume = dir;
  auto resumed = train(cont);
  auto full = train(small(straight, 2));
  CHECK(resumed.weights_fingerprint == full.weights_fingerprint);
  auto m = nlohmann::json::parse(slurp(fs::path(dir) / "manifest.json"));
  CHECK(m["results"]["epochs_done"] == 2);
  CHECK(slurp(fs::path(dir) / "checkpoint.safetensors") == slurp(fs::path(straight) / "checkpoint.safetensors"));
}

TEST_CASE("row 3: --resume with a changed setting is refused, naming the flag and both values") {
  const std::string dir = scratch("changed");
  train(small(dir, 1));
  auto c = small("", 2);
  c.resume = dir;
  c.lr = 0.01f;
  CHECK_THAT(error_of([&] { train(c); }), Contains("--lr") && Contains("--lr 0.002") && Contains("--lr 0.01"));
  c = small("", 2);
  c.resume = dir;
  c.synthetic_train = 96;
  CHECK_THAT(error_of([&] { train(c); }), Contains("--synthetic-train 128") && Contains("--synthetic-train 96"));
  c = small("", 2);
  c.resume = dir;
  c.augment = true;
  CHECK_THAT(error_of([&] { train(c); }), Contains("without --augment") && Contains("with --augment"));
  c = small("", 2);
  c.resume = dir;
  c.pins = {"conv1.bwd_filter=algo1"};
  CHECK_THAT(error_of([&] { train(c); }), Contains("--pin"));
  c = small("", 2);
  c.resume = dir;
  c.seed_init = 5;
  CHECK_THAT(error_of([&] { train(c); }), Contains("--seed-init") && Contains("seed 0") && Contains("asks for 5"));
  c = small("", 1);
  c.resume = dir;
  CHECK_THAT(error_of([&] { train(c); }), Contains("--epochs") && Contains("finished 1 epochs"));
  // A cosine schedule spans all epochs: lengthening it changes the learning rates already used.
  const std::string cos = scratch("cosine");
  auto k = small(cos, 2);
  k.lr_schedule = "cosine";
  train(k);
  k = small("", 3);
  k.lr_schedule = "cosine";
  k.resume = cos;
  CHECK_THAT(error_of([&] { train(k); }), Contains("--epochs") && Contains("cosine") && Contains("--epochs 2"));
  // Nothing of the refused attempts reached the folder.
  CHECK(nlohmann::json::parse(slurp(fs::path(dir) / "manifest.json"))["results"]["epochs_done"] == 1);
}

TEST_CASE("resume: a resumed run's manifest replay line reproduces its bits") {
  const std::string dir = scratch("replayed"), again = scratch("replay");
  auto first = small(dir, 1);
  first.weight_decay = 1e-4f;
  first.optimizer = "sgd";
  first.nesterov = true;
  first.lr_schedule = "step";
  first.milestones = {2};
  train(first);
  auto cont = first;
  cont.out.clear();
  cont.epochs = 3;
  cont.resume = dir;
  auto resumed = train(cont);
  const auto m = nlohmann::json::parse(slurp(fs::path(dir) / "manifest.json"));
  const std::string replay = m["replay"].get<std::string>();
  INFO(replay);
  TrainConfig r = parse_command(replay);
  r.out = again;
  r.progress = false;
  r.loader_threads = 1;
  fs::remove_all(again);
  auto replayed = train(r);
  CHECK(replayed.weights_fingerprint == resumed.weights_fingerprint);
  CHECK(slurp(fs::path(again) / "checkpoint.safetensors") == slurp(fs::path(dir) / "checkpoint.safetensors"));
  CHECK(replay.find("--synthetic-train 128") != std::string::npos);
  CHECK(replay.find("--milestones 2") != std::string::npos);
}

TEST_CASE("row 4: --out holding a run is refused without --overwrite; --overwrite replaces it only whole") {
  const std::string dir = scratch("finished");
  auto a = train(small(dir, 1));
  const std::string before = slurp(fs::path(dir) / "checkpoint.safetensors");
  auto b = small("", 1);
  b.out = dir;
  b.lr = 0.01f;
  CHECK_THAT(error_of([&] { train(b); }), Contains("--out") && Contains("--overwrite") && Contains("finished run"));
  CHECK(slurp(fs::path(dir) / "checkpoint.safetensors") == before);

  // An overwriting run that fails before its first epoch ends leaves the old run whole.
  b.overwrite = true;
  TrainHooks stop;
  stop.after_step = [](const StepView& v) {
    if (v.step == 2) throw Error("stopped by the test");
  };
  CHECK_THAT(error_of([&] { train(b, stop); }), Contains("stopped by the test"));
  CHECK(slurp(fs::path(dir) / "checkpoint.safetensors") == before);
  CHECK(read_run_manifest(dir + "/manifest.json").weights_fingerprint == a.weights_fingerprint);

  auto replaced = train(b);
  CHECK(read_run_manifest(dir + "/manifest.json").weights_fingerprint == replaced.weights_fingerprint);
  CHECK(replaced.weights_fingerprint != a.weights_fingerprint);
  int generations = 0;
  for (const auto& e : fs::directory_iterator(dir)) generations += e.path().filename().string().rfind(".gen-", 0) == 0;
  CHECK(generations == 1);
  // --overwrite of the folder being resumed would destroy what is resumed.
  auto both = small("", 2);
  both.resume = dir;
  both.overwrite = true;
  CHECK_THAT(error_of([&] { train(both); }), Contains("--overwrite"));
}

TEST_CASE("row 5: a checkpoint with a flipped weight bit or a NaN weight is refused, naming the file") {
  const std::string dir = scratch("damaged");
  train(small(dir, 1));
  const fs::path ck = fs::path(dir) / "checkpoint.safetensors";
  const std::string good = slurp(ck);
  const std::size_t data = 8 + header_size(good);
  auto resume = [&] {
    auto c = small("", 2);
    c.resume = dir;
    train(c);
  };
  std::string flipped = good;
  flipped[data + 41] ^= 0x04;
  overwrite_target(ck, flipped);
  CHECK_THAT(error_of(resume), Contains(ck.string()) && Contains("fingerprint mismatch"));
  std::string nan = good;
  const float q = NAN;
  std::memcpy(&nan[data + 4 * 3], &q, 4);
  overwrite_target(ck, nan);
  CHECK_THAT(error_of(resume), Contains(ck.string()) && Contains("fingerprint mismatch"));
  overwrite_target(ck, good);
  CHECK_NOTHROW(resume());
}

TEST_CASE("a folder holding files of others is refused without --overwrite, and none of them is ever replaced") {
  const std::string dir = scratch("notes");
  fs::remove_all(dir);
  fs::create_directories(dir);
  { std::ofstream(fs::path(dir) / "log.csv") << "notes\n"; }
  auto c = small("", 1);
  c.out = dir;
  CHECK_THAT(error_of([&] { train(c); }), Contains("--out") && Contains("holds no ditto run") && Contains("log.csv"));
  c.overwrite = true;  // even then: log.csv is a name the run writes
  CHECK_THAT(error_of([&] { train(c); }), Contains("--overwrite") && Contains("log.csv") && Contains("never"));
  CHECK(slurp(fs::path(dir) / "log.csv") == "notes\n");
  CHECK_FALSE(fs::is_symlink(fs::path(dir) / "log.csv"));
  // A file of another name stays beside the run that --overwrite writes there.
  fs::rename(fs::path(dir) / "log.csv", fs::path(dir) / "notes.txt");
  CHECK_NOTHROW(train(c));
  CHECK(slurp(fs::path(dir) / "notes.txt") == "notes\n");
  CHECK(fs::exists(fs::path(dir) / "manifest.json"));
  // Not even --resume touches it.
  auto more = small("", 2);
  more.resume = dir;
  CHECK_NOTHROW(train(more));
  CHECK(slurp(fs::path(dir) / "notes.txt") == "notes\n");
}

TEST_CASE("--out with an empty or non-UTF-8 path is refused, naming the flag") {
  CHECK_THAT(cli_error({"--out", ""}), Contains("--out") && Contains("empty"));
  CHECK_THAT(cli_error({"--out", "runs/\xff\xfe"}), Contains("--out") && Contains("UTF-8"));
  CHECK(cli_error({"--out", "runs/caf\xc3\xa9"}) == "(accepted)");
}

TEST_CASE("a checkpoint with the signs of two weights flipped in a pair is refused") {
  // Floats 1 and 3 of conv2.weight: their sign bits are the top bits of two consecutive 64-bit
  // words, a change the former FNV-1a fingerprint could not see (tests/cpu_fingerprint.cpp).
  const std::string dir = scratch("paired_flips");
  train(small(dir, 1));
  const fs::path ck = fs::path(dir) / "checkpoint.safetensors";
  const std::string good = slurp(ck);
  const uint64_t n = header_size(good);
  const auto offsets = nlohmann::json::parse(good.substr(8, n))["conv2.weight"]["data_offsets"];
  const std::size_t at = 8 + n + offsets[0].get<std::size_t>();
  std::string flipped = good;
  flipped[at + 4 * 1 + 3] ^= static_cast<char>(0x80);
  flipped[at + 4 * 3 + 3] ^= static_cast<char>(0x80);
  overwrite_target(ck, flipped);
  auto c = small("", 2);
  c.resume = dir;
  CHECK_THAT(error_of([&] { train(c); }), Contains(ck.string()) && Contains("fingerprint mismatch"));
  overwrite_target(ck, good);
}

TEST_CASE("row 6: malformed checkpoint metadata names the file, field and value") {
  const std::string dir = scratch("metadata");
  train(small(dir, 1));
  const fs::path ck = fs::path(dir) / "checkpoint.safetensors";
  const std::string good = slurp(ck);
  auto with = [&](const std::string& key, const std::string& value) {
    auto f = load_safetensors(ck.string());
    std::vector<NamedTensor> tensors;
    for (const auto& [name, t] : f.tensors) tensors.push_back({name, t});
    f.metadata[key] = value;
    save_safetensors(fs::canonical(ck).string(), tensors, f.metadata);
    auto c = small("", 3);
    c.resume = dir;
    const std::string e = error_of([&] { train(c); });
    overwrite_target(ck, good);
    return e;
  };
  CHECK_THAT(with("epoch", "-5"), Contains(ck.string()) && Contains("epoch") && Contains("'-5'"));
  CHECK_THAT(with("steps", "abc"), Contains(ck.string()) && Contains("steps") && Contains("'abc'"));
  CHECK_THAT(with("steps", "999"), Contains(ck.string()) && Contains("steps is 999"));
  CHECK_THAT(with("seed_order", "1e3"), Contains("seed_order") && Contains("'1e3'"));
  CHECK_THAT(with("weights_fingerprint", "xyz"), Contains("weights_fingerprint") && Contains("'xyz'"));
  CHECK_THAT(with("epoch", "2"), Contains("epoch is 2") && Contains("epochs_done 1"));
  // Two tensors sharing bytes: conv1.bias moved onto conv1.weight's first bytes.
  const uint64_t n = header_size(good);
  auto j = nlohmann::json::parse(good.substr(8, n));
  const auto bias = j["conv1.bias"]["data_offsets"];
  j["conv1.bias"]["data_offsets"] = {0, bias[1].get<uint64_t>() - bias[0].get<uint64_t>()};
  std::string h = j.dump();
  while ((h.size() + 8) % 8) h.push_back(' ');
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((h.size() >> (8 * i)) & 0xff);
  overwrite_target(ck, bytes + h + good.substr(8 + n));
  auto c = small("", 3);
  c.resume = dir;
  CHECK_THAT(error_of([&] { train(c); }), Contains(ck.string()) && Contains("data_offsets") && Contains("overlap"));
  overwrite_target(ck, good);
}

TEST_CASE("weak: malformed JSON in a manifest or pins file is described in words, with file and byte") {
  const std::string dir = scratch("bad_manifest");
  train(small(dir, 1));
  const fs::path manifest = fs::path(dir) / "manifest.json";
  overwrite_target(manifest, "{\"flags\": {\"--lr\": 0.002,, }");
  auto c = small("", 2);
  c.resume = dir;
  CHECK_THAT(error_of([&] { train(c); }), Contains(manifest.string()) && Contains("malformed JSON at byte 25") && Contains("unexpected ','") &&
                                              !Contains("json.exception"));
  const std::string pins = scratch("pins.json");
  write_file_atomic(pins, "{\"ops\": [");
  CHECK_THAT(error_of([&] { pins_from_manifest(pins); }),
             Contains(pins) && Contains("malformed JSON at byte") && Contains("ends before") && !Contains("json.exception"));
  write_file_atomic(pins, R"({"ops": [{"layer": 123, "knob": "fwd", "variant": "gemm"}]})");
  CHECK_THAT(error_of([&] { pins_from_manifest(pins); }),
             Contains(pins) && Contains("ops[0].layer is 123; expected a string") && !Contains("type_error"));
}

TEST_CASE("row 9: a second writer of one --out is refused while the first runs; a dead one's lock is free") {
  const std::string dir = scratch("locked");
  auto slow = small(dir, 400);
  pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    try {
      train(slow);
    } catch (...) {
      ::_exit(3);
    }
    ::_exit(0);
  }
  const std::string want = "pid " + std::to_string(child);
  bool held = false;
  for (int i = 0; i < 600 && !held; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    held = slurp(fs::path(dir) / ".lock").rfind(want, 0) == 0;
  }
  REQUIRE(held);
  auto second = small("", 1);
  second.out = dir;
  second.overwrite = true;
  CHECK_THAT(error_of([&] { train(second); }), Contains("in use by another ditto run") && Contains(want));
  ::kill(child, SIGKILL);
  int status = 0;
  ::waitpid(child, &status, 0);
  // The killed writer's lock file stays, but its lock went with it.
  REQUIRE(fs::exists(fs::path(dir) / ".lock"));
  CHECK_NOTHROW(train(second));
}

TEST_CASE("weak: a run stopped before its first epoch ended cannot be resumed, and says so") {
  const std::string dir = scratch("stopped_early");
  fs::remove_all(dir);
  fs::create_directories(fs::path(dir) / ".gen-1-0badc0de");
  write_file_atomic((fs::path(dir) / ".gen-1-0badc0de" / "log.csv").string(), "epoch\n");
  write_file_atomic((fs::path(dir) / ".lock").string(), "pid 1\n");
  auto c = small("", 2);
  c.resume = dir;
  CHECK_THAT(error_of([&] { train(c); }), Contains("--resume") && Contains("before its first epoch ended") &&
                                              Contains("without --resume"));
  // Nothing was lost by that run, so it may simply start again in the same folder.
  auto fresh = small("", 1);
  fresh.out = dir;
  CHECK_NOTHROW(train(fresh));
  CHECK_FALSE(fs::exists(fs::path(dir) / ".gen-1-0badc0de"));
}

TEST_CASE("weak: a run refused by a check leaves no --out folder behind") {
  const std::string dir = scratch("refused");
  auto c = small(dir, 1);
  c.pins = {"conv9.bwd_filter=algo0"};
  CHECK_THAT(error_of([&] { train(c); }), Contains("conv9"));
  CHECK_FALSE(fs::exists(dir));
  c = small(dir, 1);
  c.model = "no-such-net";
  CHECK_THROWS(train(c));
  CHECK_FALSE(fs::exists(dir));
  c = small(dir + "/nested/deeper", 1);
  c.lr = -1;
  CHECK_THROWS(train(c));
  CHECK_FALSE(fs::exists(dir));
  // A folder that existed before is kept (empty of the refused run's files).
  fs::create_directories(dir);
  c = small("", 1);
  c.out = dir;
  c.pins = {"conv9.bwd_filter=algo0"};
  CHECK_THROWS(train(c));
  CHECK(fs::is_directory(dir));
  CHECK_FALSE(fs::exists(fs::path(dir) / "manifest.json"));
}

TEST_CASE("weak: a pin on the CPU, where it cannot apply, is warned about and recorded") {
  const std::string dir = scratch("cpu_pin");
  auto c = small(dir, 1);
  c.pins = {"conv1.fwd=fft"};
  auto r = train(c);
  REQUIRE(r.warnings.size() == 1);
  CHECK_THAT(r.warnings[0], Contains("conv1.fwd=fft") && Contains("no effect on the CPU"));
  auto m = nlohmann::json::parse(slurp(fs::path(dir) / "manifest.json"));
  CHECK(m["policy"]["pins_not_applied"] == nlohmann::json::array({"conv1.fwd=fft"}));
  CHECK(m["warnings"].size() == 1);
}

TEST_CASE("weak: --dataset cifar10 on a folder without its files names the file it expected") {
  const std::string dir = scratch("not_cifar");
  fs::create_directories(dir);
  auto c = small("", 1);
  c.dataset = "cifar10";
  c.data = dir;
  CHECK_THAT(error_of([&] { load_train_data(c); }), Contains("--data") && Contains(dir + "/data_batch_1.bin"));
}

TEST_CASE("weak: flags that would be ignored or half-applied are refused, naming them") {
  // --image-size and --resize belong to stream-folder.
  CHECK_THAT(apply_error({"--image-size", "64"}), Contains("--image-size") && Contains("stream-folder"));
  CHECK_THAT(apply_error({"--resize", "300"}), Contains("--resize") && Contains("--dataset synthetic"));
  CHECK(apply_error({"--dataset", "stream-folder", "--image-size", "64"}) == "(accepted)");
  // --pins-from another model's manifest.
  const std::string dir = scratch("pins_source");
  train(small(dir, 1));
  CHECK_THAT(apply_error({"--model", "two-conv", "--pins-from", dir + "/manifest.json"}),
             Contains("--pins-from") && Contains("--model smallcnn") && Contains("--model two-conv"));
  CHECK(apply_error({"--model", "smallcnn", "--pins-from", dir + "/manifest.json"}) == "(accepted)");
  // --steps beyond what --epochs hold stopped silently at the last epoch.
  auto c = small("", 1);
  c.max_steps = 9223372036854775807LL;
  CHECK_THAT(error_of([&] { train(c); }),
             Contains("--steps 9223372036854775807") && Contains("--epochs 1 of 4 batches hold only 4 steps"));
  c.max_steps = 4;
  CHECK(train(c).steps == 4);
  // embedding-bag on images: the flags' words, not the net's.
  c = small("", 1);
  c.model = "embedding-bag";
  CHECK_THAT(error_of([&] { train(c); }), Contains("--model embedding-bag reads category ids") &&
                                              Contains("--dataset synthetic holds images"));
}

TEST_CASE("weak: --out on a run whose manifest cannot be read offers what can work") {
  const std::string dir = scratch("broken_manifest");
  train(small(dir, 1));
  overwrite_target(fs::path(dir) / "manifest.json", "{broken");
  auto again = small("", 1);  // small(dir) would clear the folder first
  again.out = dir;
  const std::string msg = error_of([&] { train(again); });
  CHECK_THAT(msg, Contains("manifest cannot be read") && Contains("malformed JSON") && Contains("--overwrite"));
  CHECK_THAT(msg, !Contains("--resume"));
  again.overwrite = true;
  CHECK(train(again).steps == 4);
}

