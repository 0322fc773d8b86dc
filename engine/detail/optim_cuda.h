// Internal: CUDA launchers of engine/optim.cu.
#pragma once
#include <cstdint>

namespace ditto { class Context; }

namespace ditto::cuda {
void sgd_update(Context& ctx, float* p, const float* grad, float* buf, int64_t n, float lr, float momentum,
                bool nesterov, float wd);
void adam_update(Context& ctx, float* p, const float* grad, float* m, float* v, int64_t n, float step_size, float b1,
                 float b2, float eps, float bias2_sqrt, float wd);
// The same updates with their per-step scalars read from row *cursor of a device table (CUDA
// graphs; see Optimizer::plan): sgd reads lr, adam reads step_size and bias2_sqrt.
void sgd_update_table(Context& ctx, float* p, const float* grad, float* buf, int64_t n, const float* table,
                      const int32_t* cursor, int width, float momentum, bool nesterov, float wd);
void adam_update_table(Context& ctx, float* p, const float* grad, float* m, float* v, int64_t n, const float* table,
                       const int32_t* cursor, int width, float b1, float b2, float eps, float wd);
void advance_cursor(Context& ctx, int32_t* cursor);  // *cursor += 1, in stream order
}  // namespace ditto::cuda
