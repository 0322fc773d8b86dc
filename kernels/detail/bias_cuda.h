// Internal: CUDA launchers of kernels/bias.cu. Layout {N, C, S}, S = H*W (1 for {N, C}).
#pragma once
#include <cstdint>

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
}  // namespace ditto::cuda
