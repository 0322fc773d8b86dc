#include "experiments/scheduler.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <exception>
#include <thread>

#include "engine/context.h"
#include "engine/error.h"

namespace ditto {

std::vector<Placement> place_jobs(int jobs, int devices, int per_device) {
  if (jobs < 0) throw Error(fmt::format("place_jobs: {} jobs", jobs));
  if (devices < 1) throw Error(fmt::format("--gpus must be at least 1, got {}", devices));
  if (per_device < 1) throw Error(fmt::format("--concurrent must be at least 1, got {}", per_device));
  std::vector<Placement> out(static_cast<std::size_t>(jobs));
  for (int i = 0; i < jobs; ++i) out[static_cast<std::size_t>(i)] = {i % devices, (i / devices) % per_device};
  return out;
}

std::vector<std::string> replica_devices(const std::string& device, int max_devices) {
  if (max_devices < 1) throw Error(fmt::format("--gpus must be at least 1, got {}", max_devices));
  if (device != "cuda") return {device};
  const int n = std::max(1, std::min(cuda_device_count(), max_devices));
  std::vector<std::string> out;
  for (int i = 0; i < n; ++i) out.push_back(fmt::format("cuda:{}", i));
  return out;
}

void run_jobs(int jobs, const std::vector<std::string>& devices, int per_device,
              const std::function<void(int, const std::string&)>& job) {
  if (devices.empty()) throw Error("run_jobs: no device to run on");
  const auto placement = place_jobs(jobs, static_cast<int>(devices.size()), per_device);
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(jobs));
  std::atomic<int> first_failed{jobs};  // lowest failed index so far; jobs: none
  auto worker = [&](int device, int lane) {
    for (int i = 0; i < jobs && i < first_failed.load(); ++i) {
      const Placement& p = placement[static_cast<std::size_t>(i)];
      if (p.device != device || p.lane != lane) continue;
      try {
        job(i, devices[static_cast<std::size_t>(device)]);
      } catch (...) {
        errors[static_cast<std::size_t>(i)] = std::current_exception();
        int seen = first_failed.load();
        while (i < seen && !first_failed.compare_exchange_weak(seen, i)) {
        }
      }
    }
  };
  const int lanes = std::min(per_device, std::max(1, jobs));
  if (devices.size() == 1 && lanes == 1) {
    worker(0, 0);  // the plain sequential case runs on the caller's thread
  } else {
    std::vector<std::thread> threads;
    for (int d = 0; d < static_cast<int>(devices.size()); ++d)
      for (int l = 0; l < lanes; ++l) threads.emplace_back(worker, d, l);
    for (auto& t : threads) t.join();
  }
  for (const auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace ditto
