// Internal: CUDA launchers of kernels/reduction.cu.
#pragma once
#include <cstddef>
#include <cstdint>

#include "kernels/reduction.h"

namespace ditto { class Context; }

namespace ditto::cuda {
// Floats of workspace a variant needs for n elements (0 for atomic; cub: CUB's temporary storage).
std::size_t reduce_workspace_floats(int64_t n, Reduction r);
// out[0] = sum of x[0 .. n), divided by n when mean. partials: the workspace (null for atomic).
void reduce_all(Context& ctx, const float* x, int64_t n, bool mean, Reduction r, float* partials, float* out);
// dx[i] = dy[0] (sum) or dy[0] / n (mean).
void reduce_all_bwd(Context& ctx, const float* dy, float* dx, int64_t n, bool mean);
}  // namespace ditto::cuda
