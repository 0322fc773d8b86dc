// Internal: CUDA launchers of kernels/activation.cu.
#pragma once
#include <cstdint>

#include "engine/tensor.h"

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
// The same four on bf16/f16 tensors (dtype t): read widened, the float formula, rounded once.
enum class Act { Relu, Sigmoid, Silu, Relu6 };
void act_fwd_half(Context& ctx, Act a, DType t, const void* x, void* y, int64_t n);
void act_bwd_half(Context& ctx, Act a, DType t, const void* saved, const void* dy, void* dx, int64_t n);
}  // namespace ditto::cuda
