// Internal: CUDA launchers of engine/tensor_ops.cu.
#pragma once
#include <cstdint>

namespace ditto { class Context; }

namespace ditto::cuda {
void fill(Context& ctx, float* p, int64_t n, float v);
void axpy(Context& ctx, float* dst, float alpha, const float* x, int64_t n);
void scale(Context& ctx, float* p, float alpha, int64_t n);
}  // namespace ditto::cuda
