// Internal: launch geometry shared by the elementwise-style kernels. Grids are a function of the
// element count only (never of the device), so a kernel's work split — and any fixed-order
// reduction built on it — is the same on every GPU.
#pragma once
#include <cstdint>

namespace ditto::cuda {

constexpr int kThreads = 256;

// Blocks for a grid-stride loop over n elements: one per kThreads elements, capped so the
// grid stays within limits (the loop covers the rest).
inline unsigned blocks_for(int64_t n) {
  int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 524280 ? (b > 0 ? b : 1) : 524280);
}

}  // namespace ditto::cuda

// for (i over [0, n)) as a grid-stride loop: thread t of the grid takes t, t + grid size, ...
#define DITTO_GRID_STRIDE(i, n) \
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < (n); i += int64_t(gridDim.x) * blockDim.x)
