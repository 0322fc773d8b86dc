// Internal: CUDA launchers of kernels/loss.cu.
#pragma once
#include <cstdint>

#include "kernels/reduction.h"

namespace ditto { class Context; }

namespace ditto::cuda {
// Writes lse[i] (row log-sum-exp, for backward) and loss[0] (the batch mean). `row_loss` is a
// workspace of n floats for Reduction::Deterministic (unused, may be null, for Atomic).
void softmax_xent_fwd(Context& ctx, const float* logits, const int32_t* labels, float* lse, float* row_loss,
                      float* loss, int64_t n, int64_t c, Reduction reduce);
// dlogits = (exp(logits - lse) - onehot) * dl[0] / n; dl is a device pointer.
void softmax_xent_bwd(Context& ctx, const float* logits, const int32_t* labels, const float* lse, const float* dl,
                      float* dlogits, int64_t n, int64_t c);
}  // namespace ditto::cuda
