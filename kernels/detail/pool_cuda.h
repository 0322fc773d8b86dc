// Internal: CUDA launchers of kernels/pool.cu (ditto's own pooling kernels; the cuDNN variants
// are called from kernels/pool.cpp).
#pragma once
#include <cstdint>

#include "engine/tensor.h"

#include "kernels/pool_ref.h"

namespace ditto { class Context; }

namespace ditto::cuda {
// argmax may be null (no backward will run).
void max_pool_fwd_argmax(Context& ctx, const float* x, float* y, int32_t* argmax, const ref::PoolDims& d);
// dx must be zeroed by the caller.
void max_pool_bwd_atomic_scatter(Context& ctx, const float* dy, const int32_t* argmax, float* dx,
                                 const ref::PoolDims& d);
void max_pool_bwd_gather(Context& ctx, const float* dy, const int32_t* argmax, float* dx, const ref::PoolDims& d);
// Max pooling of x in any float dtype t, NCHW or channels-last (y, dy, dx alike; the argmax, an
// in-plane index h*W + w per output, in y's order). Forward exact (y is one of x's values);
// gather sums its dy in float in the NCHW kernel's order and rounds once to t; atomic scatter adds
// float dy into the zeroed float buffer dx32 (x's shape and layout), for the caller to round.
void max_pool_fwd_argmax_any(Context& ctx, DType t, bool nhwc, const void* x, void* y, int32_t* argmax,
                             const ref::PoolDims& d);
void max_pool_bwd_gather_any(Context& ctx, DType t, bool nhwc, const void* dy, const int32_t* argmax, void* dx,
                             const ref::PoolDims& d);
void max_pool_bwd_atomic_scatter_any(Context& ctx, DType t, bool nhwc, const void* dy, const int32_t* argmax,
                                     float* dx32, const ref::PoolDims& d);
// Average pooling of x in any float dtype t, NCHW or channels-last: the window sums (forward) and
// the gathered dy / (kh*kw) (backward) in float, in the float kernels' orders, rounded once to t.
void avg_pool_fwd_any(Context& ctx, DType t, bool nhwc, const void* x, void* y, const ref::PoolDims& d);
void avg_pool_bwd_any(Context& ctx, DType t, bool nhwc, const void* dy, void* dx, const ref::PoolDims& d);
void avg_pool_fwd(Context& ctx, const float* x, float* y, const ref::PoolDims& d);
void avg_pool_bwd(Context& ctx, const float* dy, float* dx, const ref::PoolDims& d);
// Global average pooling of x of any float dtype t, NCHW or channels-last: y (N*C floats) is each
// plane's sum in a fixed order over (h, w) (NCHW: one warp per plane, lane-strided, a fixed shuffle
// tree; channels-last: 16 lanes per channel added in lane order), divided by hw; dx = dy / hw
// rounded to t, in x's layout.
void global_avg_pool_fwd_any(Context& ctx, DType t, bool nhwc, const void* x, float* y, int64_t n, int64_t c,
                             int64_t hw);
void global_avg_pool_bwd_any(Context& ctx, DType t, bool nhwc, const float* dy, void* dx, int64_t n, int64_t c,
                             int64_t hw);
void adaptive_avg_pool_fwd(Context& ctx, const float* x, float* y, const ref::AdaptivePoolDims& d);
void adaptive_avg_pool_bwd(Context& ctx, const float* dy, float* dx, const ref::AdaptivePoolDims& d);
}  // namespace ditto::cuda
