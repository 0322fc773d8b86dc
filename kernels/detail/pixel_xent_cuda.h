// Internal: CUDA launchers of kernels/pixel_xent.cu. Layout: logits {n, c, hw}, labels {n, hw}.
#pragma once
#include <cstddef>
#include <cstdint>

#include "kernels/reduction.h"

namespace ditto { class Context; }

namespace ditto::cuda {
// Floats of workspace the deterministic variant needs (0 for atomic).
std::size_t pixel_xent_workspace_floats(int64_t pixels, Reduction r);
// Writes lse[p] (for backward), *count (the counted pixels) and loss[0] (the mean). partials: the
// workspace (null for atomic).
void pixel_xent_fwd(Context& ctx, const float* logits, const int32_t* labels, int64_t n, int64_t c, int64_t hw,
                    int ignore, Reduction r, float* lse, int32_t* count, float* partials, float* loss);
// dl, count: device scalars.
void pixel_xent_bwd(Context& ctx, const float* logits, const int32_t* labels, const float* lse, const float* dl,
                    const int32_t* count, int64_t n, int64_t c, int64_t hw, int ignore, float* dlogits);
// Pixel NLL (log-probabilities in): *count and loss[0] (the mean of -log_probs[label]).
void pixel_nll_fwd(Context& ctx, const float* log_probs, const int32_t* labels, int64_t n, int64_t c, int64_t hw,
                   int ignore, Reduction r, int32_t* count, float* partials, float* loss);
void pixel_nll_bwd(Context& ctx, const int32_t* labels, const float* dl, const int32_t* count, int64_t n, int64_t c,
                   int64_t hw, int ignore, float* dlog_probs);
}  // namespace ditto::cuda
