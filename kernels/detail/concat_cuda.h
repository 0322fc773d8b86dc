// Internal: CUDA launchers of kernels/concat.cu.
#pragma once
#include <cstdint>

namespace ditto { class Context; }

namespace ditto::cuda {
void copy_channels(Context& ctx, const float* src, int64_t src_c, int64_t src_off, float* dst, int64_t dst_c,
                   int64_t dst_off, int64_t batch, int64_t c, int64_t hw);
void channel_mul_fwd(Context& ctx, const float* x, const float* s, float* y, int64_t planes, int64_t hw);
void channel_mul_bwd(Context& ctx, const float* x, const float* s, const float* dy, float* dx, float* ds,
                     int64_t planes, int64_t hw);
}  // namespace ditto::cuda
