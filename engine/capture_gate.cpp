#include "engine/detail/capture_gate.h"

#include <cuda_runtime.h>
#include <fmt/format.h>

#include <array>
#include <shared_mutex>

#include "engine/error.h"

namespace ditto::detail {
namespace {

constexpr int kMaxDevices = 64;

std::shared_mutex& gate(int device) {
  static std::array<std::shared_mutex, kMaxDevices> gates;
  if (device < 0 || device >= kMaxDevices)
    throw Error(fmt::format("capture gate: cuda:{} is outside the {} devices ditto tracks", device, kMaxDevices));
  return gates[static_cast<std::size_t>(device)];
}

// How many captures this thread has under way, per device it is capturing on (nested captures
// on one thread are not something CUDA allows, but a count keeps the bookkeeping honest).
thread_local std::array<int, kMaxDevices> capturing{};

}  // namespace

CaptureScope::CaptureScope(int device) : device_(device) {
  gate(device).lock_shared();
  ++capturing[static_cast<std::size_t>(device)];
}

CaptureScope::~CaptureScope() {
  --capturing[static_cast<std::size_t>(device_)];
  gate(device_).unlock_shared();
}

DeviceSyncScope::DeviceSyncScope(int device) {
  if (device < 0 && cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();
    return;  // no device: nothing can be capturing
  }
  if (capturing[static_cast<std::size_t>(device)] > 0) return;  // our own capture: let CUDA report it
  gate(device).lock();
  device_ = device;
}

DeviceSyncScope::~DeviceSyncScope() {
  if (device_ >= 0) gate(device_).unlock();
}

}  // namespace ditto::detail
