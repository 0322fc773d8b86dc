// A run killed with SIGKILL at any moment leaves its folder at one complete epoch (all files of
// the same epoch, or none yet), and --resume from there ends bit-identical to an uninterrupted
// run. The runs are child processes (fork) killed after random delays.
#include <catch2/catch.hpp>

#include <csignal>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

#include "engine/checkpoint.h"
#include "experiments/train.h"
#include "train_support.h"

using namespace ditto;
namespace fs = std::filesystem;

namespace {
std::string scratch(const std::string& name) { return test::scratch("cpu_kill", name); }

TrainConfig config(const std::string& out) {
  TrainConfig c = test::synthetic_config("smallcnn", 256, 64, 16, 32);
  c.epochs = 6;
  c.deterministic_init = c.deterministic_input = true;
  c.out = out;
  return c;
}

// The epoch the folder's visible files agree on; -1 where they disagree, 0 for none yet.
int consistent_epoch(const std::string& dir) {
  const fs::path d(dir);
  if (!fs::exists(d / "manifest.json")) {
    // Nothing published: every link must dangle alike.
    for (const char* f : {"log.csv", "checkpoint.safetensors", "metrics.json", "predictions.csv"})
      if (fs::exists(d / f)) return -1;
    return 0;
  }
  auto manifest = nlohmann::json::parse(std::ifstream(d / "manifest.json"));
  auto metrics = nlohmann::json::parse(std::ifstream(d / "metrics.json"));
  const int epoch = manifest["results"]["epochs_done"].get<int>();
  auto ck = load_safetensors((d / "checkpoint.safetensors").string());
  std::ifstream log(d / "log.csv");
  int rows = -1;
  for (std::string line; std::getline(log, line);) ++rows;
  if (metrics["epoch"].get<int>() != epoch || std::stoi(ck.metadata.at("epoch")) != epoch || rows != epoch) return -1;
  return epoch;
}

// Runs cfg in a child and kills it after `ms` milliseconds (or lets it finish).
void run_child(const TrainConfig& cfg, int ms) {
  pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    try {
      train(cfg);
    } catch (...) {
      ::_exit(3);
    }
    ::_exit(0);
  }
  if (ms >= 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    ::kill(pid, SIGKILL);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (!WIFSIGNALED(status)) REQUIRE(WEXITSTATUS(status) == 0);
}
}  // namespace

TEST_CASE("SIGKILL at random moments: the folder is one epoch's, resume ends bit-identical") {
  const std::string ref_dir = scratch("reference");
  run_child(config(ref_dir), -1);
  REQUIRE(consistent_epoch(ref_dir) == 6);
  const auto reference = load_safetensors(ref_dir + "/checkpoint.safetensors").metadata.at("weights_fingerprint");

  // How long a whole run takes, to spread the kills over it.
  auto t0 = std::chrono::steady_clock::now();
  run_child(config(scratch("timing")), -1);
  const int run_ms = static_cast<int>(
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());

  std::mt19937 rng(std::random_device{}());
  const std::string dir = scratch("killed");
  int kills = 0, last = 0;
  for (int attempt = 0; attempt < 12 && last < 6; ++attempt) {
    TrainConfig c = config(dir);
    if (last > 0) c.resume = dir;  // continue from whatever epoch the folder holds
    const int delay = std::uniform_int_distribution<int>(0, std::max(1, run_ms * 2 / 3))(rng);
    INFO("attempt " << attempt << ", kill after " << delay << " ms, folder at epoch " << last);
    run_child(c, attempt < 10 ? delay : -1);
    ++kills;
    const int now = consistent_epoch(dir);
    REQUIRE(now >= 0);     // never a mix of epochs
    REQUIRE(now >= last);  // a published epoch is never lost
    last = now;
  }
  REQUIRE(last == 6);
  CHECK(kills >= 2);
  CHECK(load_safetensors(dir + "/checkpoint.safetensors").metadata.at("weights_fingerprint") == reference);
}
