// Internal: CUDA launchers of kernels/roi_align.cu.
#pragma once
#include <cstddef>
#include <cstdint>

#include "kernels/roi_align_ref.h"

namespace ditto { class Context; }

namespace ditto::cuda {
void roi_align_fwd(Context& ctx, const float* x, const float* rois, float* y, const ref::RoiAlignDims& d);
// dx zeroed by the caller.
void roi_align_bwd_atomic(Context& ctx, const float* rois, const float* dy, float* dx, const ref::RoiAlignDims& d);
std::size_t roi_align_bwd_deterministic_workspace(const ref::RoiAlignDims& d);
// The deterministic gather keeps a row and a column weight per bin and tile pixel in shared memory:
// out_h + out_w at most this.
constexpr int64_t kRoiGatherMaxPooledSum = 760;
// dx needs no zeroing.
void roi_align_bwd_deterministic(Context& ctx, const float* rois, const float* dy, float* dx, void* workspace,
                                 const ref::RoiAlignDims& d);
}  // namespace ditto::cuda
