// Internal: CUDA launchers of kernels/elementwise.cu.
#pragma once
#include <cstdint>

namespace ditto { class Context; }

namespace ditto::cuda {
void add(Context& ctx, float* y, const float* a, const float* b, int64_t n);
}  // namespace ditto::cuda
