// Internal: CUDA launchers of kernels/grid_sample.cu (ditto's own spatial-transformer kernels; the
// cuDNN variants are called from kernels/grid_sample.cpp).
#pragma once
#include <cstddef>
#include <cstdint>

#include "kernels/grid_sample_ref.h"

namespace ditto { class Context; }

namespace ditto::cuda {

void affine_grid_fwd(Context& ctx, const float* theta, float* grid, int64_t n, int64_t h, int64_t w,
                     bool align_corners);
// Partial sums per image the dtheta kernels use (a function of h*w only); the deterministic
// variant needs a workspace of n * affine_grid_bwd_partials(h * w) * 6 floats.
int64_t affine_grid_bwd_partials(int64_t hw);
void affine_grid_bwd_atomic(Context& ctx, const float* dgrid, float* dtheta, int64_t n, int64_t h, int64_t w,
                            bool align_corners);
void affine_grid_bwd_deterministic(Context& ctx, const float* dgrid, float* dtheta, float* partials, int64_t n,
                                   int64_t h, int64_t w, bool align_corners);

void grid_sample_fwd(Context& ctx, const float* x, const float* grid, float* y, const ref::GridSampleDims& d);
// dx (zeroed by the caller) and dgrid may each be null.
void grid_sample_bwd_atomic(Context& ctx, const float* x, const float* grid, const float* dy, float* dx,
                            float* dgrid, const ref::GridSampleDims& d);
// Workspace bytes of the deterministic dx gather (0 when dx is not wanted).
std::size_t grid_sample_bwd_deterministic_workspace(const ref::GridSampleDims& d, bool want_dx);
// dx and dgrid may each be null; dx needs no zeroing.
void grid_sample_bwd_deterministic(Context& ctx, const float* x, const float* grid, const float* dy, float* dx,
                                   float* dgrid, void* workspace, const ref::GridSampleDims& d);

}  // namespace ditto::cuda
