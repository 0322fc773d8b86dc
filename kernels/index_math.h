// Index arithmetic shared by the host and device code of the scatter, upsampling and sampler op
// families (kernels/*.cu and the host/device functions of kernels/upsample_ref.h). Header-only, no
// CUDA headers.
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define DITTO_INDEX_HD __host__ __device__ __forceinline__
#else
#define DITTO_INDEX_HD inline
#endif

namespace ditto::ref {

// a / b for a >= 0, b > 0. On the device a 32-bit division where both fit: 64-bit division is
// emulated and several times slower, and kernels divide per element.
DITTO_INDEX_HD int64_t div_nonneg(int64_t a, int64_t b) {
#if defined(__CUDA_ARCH__)
  if (a <= 0xffffffffll && b <= 0xffffffffll) return static_cast<uint32_t>(a) / static_cast<uint32_t>(b);
#endif
  return a / b;
}

}  // namespace ditto::ref
