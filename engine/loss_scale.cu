// Loss scaling's kernels (engine/loss_scale.h). Deterministic:
//  - unscale_and_check: one thread per element divides it by the scale (__fdiv_rn: correctly
//    rounded, so the CPU's g / s bits; exact for a power of two). The overflow flag is an integer
//    atomicOr of 1 by the threads that saw a non-finite result: OR commutes, so the flag is the
//    same whatever order the threads arrive in, and no float is ever summed.
//  - update_loss_scale: one thread runs the schedule (ref::update_loss_scale, the CPU's code).
#include "engine/detail/cuda_state.h"
#include "engine/detail/launch.cuh"
#include "engine/detail/loss_scale_cuda.h"
#include "engine/loss_scale_ref.h"

namespace ditto::cuda {
namespace {

__global__ void clear_flag_kernel(int32_t* flag) { *flag = 0; }

__global__ void copy_kernel(float* dst, const float* src, int64_t n) { DITTO_GRID_STRIDE(i, n) dst[i] = src[i]; }

__global__ void unscale_kernel(float* g, int64_t n, const float* scale, int32_t* found_inf) {
  const float s = *scale;
  bool bad = false;
  DITTO_GRID_STRIDE(i, n) {
    const float x = __fdiv_rn(g[i], s);
    g[i] = x;
    bad |= !isfinite(x);
  }
  if (bad) atomicOr(found_inf, 1);
}

__global__ void update_kernel(float* scale, int32_t* good_steps, const int32_t* found_inf, float* record,
                              int32_t* cursor, int64_t capacity, bool dynamic, float growth, float backoff,
                              int32_t interval) {
  const bool overflow = *found_inf != 0;
  const int64_t row = *cursor;
  if (row < capacity) {
    record[2 * row] = *scale;
    record[2 * row + 1] = overflow ? 1.0f : 0.0f;
  }
  *cursor = static_cast<int32_t>(row + 1);
  if (dynamic) ref::update_loss_scale(*scale, *good_steps, overflow, growth, backoff, interval);
}

}  // namespace

void clear_flag(Context& ctx, int32_t* flag) {
  clear_flag_kernel<<<1, 1, 0, detail::stream_of(ctx)>>>(flag);
  DITTO_CHECK_LAUNCH(ctx);
}

void copy_floats(Context& ctx, float* dst, const float* src, int64_t n) {
  if (n == 0) return;
  copy_kernel<<<blocks_for(n), kThreads, 0, detail::stream_of(ctx)>>>(dst, src, n);
  DITTO_CHECK_LAUNCH(ctx);
}

void unscale_and_check(Context& ctx, float* g, int64_t n, const float* scale, int32_t* found_inf) {
  if (n == 0) return;
  unscale_kernel<<<blocks_for(n), kThreads, 0, detail::stream_of(ctx)>>>(g, n, scale, found_inf);
  DITTO_CHECK_LAUNCH(ctx);
}

void update_loss_scale(Context& ctx, float* scale, int32_t* good_steps, const int32_t* found_inf, float* record,
                       int32_t* cursor, int64_t capacity, bool dynamic, float growth, float backoff, int32_t interval) {
  update_kernel<<<1, 1, 0, detail::stream_of(ctx)>>>(scale, good_steps, found_inf, record, cursor, capacity, dynamic,
                                                     growth, backoff, interval);
  DITTO_CHECK_LAUNCH(ctx);
}

}  // namespace ditto::cuda
