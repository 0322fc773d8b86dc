// A small training configuration on the built-in synthetic data, shared by the tests that train.
#pragma once
#include <unistd.h>

#include <exception>
#include <filesystem>
#include <functional>
#include <stdexcept>
#include <string>

#include "experiments/report.h"
#include "experiments/train.h"

namespace ditto::test {

// The value of `m` for `setting` in a report; a report without it fails the test (by exception).
inline double metric(const ReportData& r, const std::string& setting, const std::string& m) {
  for (const auto& x : r.metrics)
    if (x.setting == setting && x.metric == m) return x.value;
  throw std::runtime_error("no metric " + m + " for " + setting);
}

// A path under this process's own scratch folder (<tmp>/ditto_<suite>_<pid>/<name>): run
// folders and files tests write never land in the caller's working tree.
inline std::string scratch(const std::string& suite, const std::string& name) {
  const std::filesystem::path root =
      std::filesystem::temp_directory_path() / ("ditto_" + suite + "_" + std::to_string(::getpid()));
  std::filesystem::create_directories(root);
  return (root / name).string();
}

// The message of what f throws; "(no error)" when it throws nothing.
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

// CONTROL-free defaults (seeds unset, deterministic kernels); callers fix what they compare.
inline TrainConfig synthetic_config(const std::string& model, int train_n, int test_n, int size, int batch,
                                    const std::string& device = "cpu") {
  TrainConfig c;
  c.model = model;
  c.dataset = "synthetic";
  c.synthetic_train = train_n;
  c.synthetic_test = test_n;
  c.synthetic_size = size;
  c.batch_size = batch;
  c.epochs = 1;
  c.lr = 2e-3f;
  c.device = device;
  c.kernels = "deterministic";
  c.progress = false;
  c.loader_threads = 1;
  return c;
}

}  // namespace ditto::test
