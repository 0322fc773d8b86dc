// Internal: CUDA launchers of kernels/upsample.cu.
#pragma once
#include "kernels/upsample_ref.h"

namespace ditto { class Context; }

namespace ditto::cuda {
void upsample_fwd(Context& ctx, const float* x, float* y, const ref::UpsampleDims& d);
// dx is overwritten (zeroed first by the atomic variant).
void upsample_bwd_atomic(Context& ctx, const float* dy, float* dx, const ref::UpsampleDims& d);
void upsample_bwd_gather(Context& ctx, const float* dy, float* dx, const ref::UpsampleDims& d);
}  // namespace ditto::cuda
