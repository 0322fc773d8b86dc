// Internal: CUDA launchers of kernels/pool.cu (ditto's own pooling kernels; the cuDNN variants
// are called from kernels/pool.cpp).
#pragma once
#include <cstdint>

#include "kernels/pool_ref.h"

namespace ditto { class Context; }

namespace ditto::cuda {
// argmax may be null (no backward will run).
void max_pool_fwd_argmax(Context& ctx, const float* x, float* y, int32_t* argmax, const ref::PoolDims& d);
// dx must be zeroed by the caller.
void max_pool_bwd_atomic_scatter(Context& ctx, const float* dy, const int32_t* argmax, float* dx,
                                 const ref::PoolDims& d);
void max_pool_bwd_gather(Context& ctx, const float* dy, const int32_t* argmax, float* dx, const ref::PoolDims& d);
void avg_pool_fwd(Context& ctx, const float* x, float* y, const ref::PoolDims& d);
void avg_pool_bwd(Context& ctx, const float* dy, float* dx, const ref::PoolDims& d);
void global_avg_pool_fwd(Context& ctx, const float* x, float* y, int64_t planes, int64_t hw);
void global_avg_pool_bwd(Context& ctx, const float* dy, float* dx, int64_t planes, int64_t hw);
void adaptive_avg_pool_fwd(Context& ctx, const float* x, float* y, const ref::AdaptivePoolDims& d);
void adaptive_avg_pool_bwd(Context& ctx, const float* dy, float* dx, const ref::AdaptivePoolDims& d);
}  // namespace ditto::cuda
