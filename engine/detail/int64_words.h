// int64 values held as (low, high) pairs of i32 words, how another framework's int64 array crosses into
// ditto without a conversion pass: the value the pair holds, and whether it fits int32. Host and device
// (engine/tensor_ops' narrowing, kernels/scatter's keys along a dimension).
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define DITTO_WORDS_HD __host__ __device__ __forceinline__
#else
#define DITTO_WORDS_HD inline
#endif

namespace ditto::detail {

DITTO_WORDS_HD int64_t int64_of_words(int32_t lo, int32_t hi) {
  return static_cast<int64_t>(static_cast<uint64_t>(static_cast<uint32_t>(hi)) << 32 | static_cast<uint32_t>(lo));
}

// The high word is the low word's sign extension exactly when the value fits int32.
DITTO_WORDS_HD bool int64_words_fit_int32(int32_t lo, int32_t hi) { return hi == (lo >> 31); }

}  // namespace ditto::detail
