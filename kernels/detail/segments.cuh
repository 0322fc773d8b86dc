// Internal (CUDA only): turning a scatter into a gather. A scatter "add value_e into target[key_e]"
// over many entries e is made deterministic by sorting the entries by key with CUB's radix sort
// (stable: entries with equal keys keep their input order) and finding where each key's run starts;
// one thread per target then adds its run in entry order. A stable sort has exactly one result, so
// the order of every sum depends on the inputs alone, not on the GPU or the grid CUB chooses
// (CUB's DeviceRadixSort picks its grid from the device, but not its output): gpu_to_gpu.
//
// Also: WorkspaceCarve, which lays several arrays out in one workspace allocation; the same code
// computes the size (base == nullptr) and the pointers.
#pragma once
#include <cub/device/device_radix_sort.cuh>

#include <cstddef>
#include <cstdint>

#include "engine/detail/cuda_check.h"

namespace ditto::cuda {

// Carves 256-byte aligned arrays out of one block of memory.
struct WorkspaceCarve {
  char* base = nullptr;
  std::size_t bytes = 0;
  template <class T>
  T* take(int64_t count) {
    bytes = (bytes + 255) / 256 * 256;
    T* p = base ? reinterpret_cast<T*>(base + bytes) : nullptr;
    bytes += sizeof(T) * static_cast<std::size_t>(count);
    return p;
  }
};

// Bits needed to hold every key in [0, max_key].
inline int key_bits(uint64_t max_key) {
  int b = 1;
  while (b < 32 && (uint64_t(1) << b) <= max_key) ++b;
  return b;
}

// CUB's temporary storage for sorting n (uint32 key, int32 value) pairs on bits [0, end_bit).
inline std::size_t sort_pairs_temp_bytes(int64_t n, int end_bit) {
  std::size_t bytes = 0;
  DITTO_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, bytes, static_cast<const uint32_t*>(nullptr),
                                                   static_cast<uint32_t*>(nullptr),
                                                   static_cast<const int32_t*>(nullptr),
                                                   static_cast<int32_t*>(nullptr), n, 0, end_bit));
  return bytes;
}

inline void sort_pairs(void* temp, std::size_t temp_bytes, const uint32_t* keys_in, uint32_t* keys_out,
                       const int32_t* vals_in, int32_t* vals_out, int64_t n, int end_bit, cudaStream_t stream) {
  DITTO_CUDA_CHECK(
      cub::DeviceRadixSort::SortPairs(temp, temp_bytes, keys_in, keys_out, vals_in, vals_out, n, 0, end_bit, stream));
}

// starts[k] = first position of sorted[] holding a key >= k, for k = 0 .. num_keys (so key k's run
// is [starts[k], starts[k + 1])). One thread per k, a binary search each: no cross-thread work.
template <int kUnused = 0>
__global__ void segment_starts_kernel(const uint32_t* __restrict__ sorted, int64_t n, int32_t* __restrict__ starts,
                                      int64_t num_keys) {
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k <= num_keys;
       k += int64_t(gridDim.x) * blockDim.x) {
    int64_t lo = 0, hi = n;
    while (lo < hi) {
      const int64_t mid = (lo + hi) / 2;
      if (int64_t(sorted[mid]) < k)
        lo = mid + 1;
      else
        hi = mid;
    }
    starts[k] = static_cast<int32_t>(lo);
  }
}

}  // namespace ditto::cuda
