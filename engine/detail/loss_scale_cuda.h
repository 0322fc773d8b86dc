// Internal: CUDA launchers of engine/loss_scale.cu.
#pragma once
#include <cstdint>

namespace ditto { class Context; }

namespace ditto::cuda {
void clear_flag(Context& ctx, int32_t* flag);  // *flag = 0, in stream order
void copy_floats(Context& ctx, float* dst, const float* src, int64_t n);  // a record's rows into a larger one
// g /= *scale in place; ORs 1 into *found_inf when any result is non-finite.
void unscale_and_check(Context& ctx, float* g, int64_t n, const float* scale, int32_t* found_inf);
// Writes (scale, found_inf) to row *cursor of record (when below capacity) and advances the
// cursor; then, when dynamic, applies ref::update_loss_scale to scale and good_steps.
void update_loss_scale(Context& ctx, float* scale, int32_t* good_steps, const int32_t* found_inf, float* record,
                       int32_t* cursor, int64_t capacity, bool dynamic, float growth, float backoff, int32_t interval);
}  // namespace ditto::cuda
