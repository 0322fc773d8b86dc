// Replicas at once: a small scheduler for the ensemble protocols. Replicas are independent
// training runs, each with its own Context (stream, cuDNN and cuBLAS handles, memory pool), so
// several can share one GPU, and a group can run on each visible GPU. Results are kept by
// replica index, never by order of completion, so a deterministic configuration gives the same
// numbers however many run at once (tested on the CPU; the GPU's deterministic kernels make no
// use of timing). What does change under load is timing: ms/step measured with several replicas
// at once is the time under that load, and `fastest` (cuDNN Find, which times algorithms) may
// choose differently.
#pragma once
#include <functional>
#include <string>
#include <vector>

namespace ditto {

struct Placement {
  int device = 0;  // index into the device list
  int lane = 0;    // which of that device's concurrent slots
};

// Replica i goes to device i % devices, lane (i / devices) % per_device: consecutive replicas
// spread over the GPUs first, then over each GPU's lanes. Throws Error for a count below 1.
std::vector<Placement> place_jobs(int jobs, int devices, int per_device);

// The devices replicas of a run on `device` may spread over: a CPU or an explicit cuda:N run
// stays where it is; "cuda" spreads over cuda:0 .. cuda:(k-1), k = min(visible GPUs, max_devices).
std::vector<std::string> replica_devices(const std::string& device, int max_devices);

// Runs job(i, device) for i in [0, jobs): devices.size() x per_device worker threads, each
// serving one device and taking the placed jobs of its lane in index order. Waits for all; if
// any job threw, the exception of the lowest failing index is rethrown after every worker
// stopped. Once job f has failed, workers skip jobs above f but still run those below it, so
// which error comes back does not depend on thread timing.
void run_jobs(int jobs, const std::vector<std::string>& devices, int per_device,
              const std::function<void(int job, const std::string& device)>& job);

}  // namespace ditto
