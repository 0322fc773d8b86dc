// Internal: CUDA launchers of kernels/bias.cu. Layout {N, C, S}, S = H*W (1 for {N, C}).
#pragma once
#include <cstdint>

#include "engine/tensor.h"

namespace ditto { class Context; }

namespace ditto::cuda {
void bias_fwd(Context& ctx, const float* x, const float* b, float* y, int64_t n, int64_t c, int64_t s);
// Number of partial sums per channel the db kernels use for this shape (a function of the shape
// only, so the deterministic variant's reduction tree is too); the deterministic variant needs a
// workspace of bias_bwd_partials(n, s) * c floats.
int64_t bias_bwd_partials(int64_t n, int64_t s);
void bias_bwd_atomic(Context& ctx, const float* dy, float* db, int64_t n, int64_t c, int64_t s);
void bias_bwd_deterministic(Context& ctx, const float* dy, float* db, float* partials, int64_t n, int64_t c,
                            int64_t s);
// Channels-last x of any float dtype t ({N, H, W, C} memory, S = H*W): y = x + b rounded once to t;
// db = sum of dy over the N*S rows of its channel column, in float: per-block column sums over
// fixed row ranges, then (deterministic) one thread per channel adds its partials in order, or
// (atomic) each block atomicAdds its sum. bias_nhwc_partials floats per channel of workspace.
void bias_fwd_nhwc(Context& ctx, DType t, const void* x, const float* b, void* y, int64_t rows, int64_t c);
int64_t bias_nhwc_partials(int64_t rows);
void bias_bwd_nhwc(Context& ctx, DType t, const void* dy, float* db, float* partials, bool atomic, int64_t rows,
                   int64_t c);
}  // namespace ditto::cuda
