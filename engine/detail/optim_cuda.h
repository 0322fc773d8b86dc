// Internal: CUDA launchers of engine/optim.cu.
#pragma once
#include <cstdint>

namespace ditto { class Context; }

namespace ditto::cuda {
void sgd_update(Context& ctx, float* p, const float* grad, float* buf, int64_t n, float lr, float momentum,
                bool nesterov, float wd);
void adam_update(Context& ctx, float* p, const float* grad, float* m, float* v, int64_t n, float step_size, float b1,
                 float b2, float eps, float bias2_sqrt, float wd);
}  // namespace ditto::cuda
