// Internal: CUDA launchers of engine/digest.cu.
#pragma once
#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

#include "engine/tensor.h"

namespace ditto::cuda {
// Adds the digest sums of bytes[0..n) into slot[0] (lane a) and slot[1] (lane b) on `stream`.
void digest_sums(const void* bytes, std::size_t n, unsigned long long* slot, cudaStream_t stream);

// Per-block partials of a bit distance: the blocks a pair of n elements uses, and a launch
// writing them at partials (kDistanceFields doubles per block, as distance_fields lays them out).
constexpr int kDistanceFields = 5;  // differing, max_ulp (bits of a uint64), sum (a-b)^2, max |a-b|, sum a^2
unsigned distance_blocks(int64_t n);
void distance_partials(const void* a, const void* b, DType dtype, int64_t n, double* partials, cudaStream_t stream);
}  // namespace ditto::cuda
