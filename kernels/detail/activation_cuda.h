// Internal: CUDA launchers of kernels/activation.cu.
#pragma once
#include <cstdint>

namespace ditto { class Context; }

namespace ditto::cuda {
void relu_fwd(Context& ctx, const float* x, float* y, int64_t n);
void relu_bwd(Context& ctx, const float* y, const float* dy, float* dx, int64_t n);
void sigmoid_fwd(Context& ctx, const float* x, float* y, int64_t n);
void sigmoid_bwd(Context& ctx, const float* y, const float* dy, float* dx, int64_t n);
void silu_fwd(Context& ctx, const float* x, float* y, int64_t n);
void silu_bwd(Context& ctx, const float* x, const float* dy, float* dx, int64_t n);
void relu6_fwd(Context& ctx, const float* x, float* y, int64_t n);
void relu6_bwd(Context& ctx, const float* x, const float* dy, float* dx, int64_t n);
}  // namespace ditto::cuda
