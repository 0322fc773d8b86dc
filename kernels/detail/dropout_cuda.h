// Internal: CUDA launcher of kernels/dropout.cu.
#pragma once
#include <cstdint>

namespace ditto { class Context; }

namespace ditto::cuda {
// y = x * scale where kept, 0 where dropped (forward and backward alike).
void dropout_apply(Context& ctx, const float* x, float* y, int64_t n, float p, float scale, uint64_t key);
}  // namespace ditto::cuda
