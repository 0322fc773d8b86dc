// Internal: CUDA launchers of kernels/upsample.cu.
#pragma once
#include <cstddef>

#include "kernels/upsample_ref.h"

namespace ditto { class Context; }

namespace ditto::cuda {
void upsample_fwd(Context& ctx, const float* x, float* y, const ref::UpsampleDims& d);
// dx is overwritten (zeroed first by the atomic variant).
void upsample_bwd_atomic(Context& ctx, const float* dy, float* dx, const ref::UpsampleDims& d);
// Workspace bytes of the gather's per-axis tap tables (bilinear; 0 for nearest).
std::size_t upsample_gather_workspace(const ref::UpsampleDims& d);
void upsample_bwd_gather(Context& ctx, const float* dy, float* dx, const ref::UpsampleDims& d, void* workspace);
}  // namespace ditto::cuda
