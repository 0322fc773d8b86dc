// Internal: CUDA launchers of kernels/concat.cu.
#pragma once
#include <cstdint>

#include "engine/tensor.h"

namespace ditto { class Context; }

namespace ditto::cuda {
void copy_channels(Context& ctx, const float* src, int64_t src_c, int64_t src_off, float* dst, int64_t dst_c,
                   int64_t dst_off, int64_t batch, int64_t c, int64_t hw);
// Many channel copies of one shape family in one launch (a concatenation's inputs into its
// output, or its output gradient's slices into the inputs' gradients): segment i copies c[i]
// channels of every image from src[i] (src_c[i] channels, from channel src_off[i]) to dst[i]
// (dst_c[i] channels, from channel dst_off[i]), or with `accumulate` adds them to what dst holds
// (dst = dst + src, one rounding: the bits of add_inplace). Each element is written by one thread,
// so no two segments of a launch may write the same memory.
struct ChannelCopy {
  const float* src;
  float* dst;
  int64_t src_c, src_off, dst_c, dst_off, c;
  bool accumulate = false;
};
void copy_channels_many(Context& ctx, const ChannelCopy* copies, int64_t count, int64_t batch, int64_t hw);
void channel_mul_fwd(Context& ctx, const float* x, const float* s, float* y, int64_t planes, int64_t hw);
void channel_mul_bwd(Context& ctx, const float* x, const float* s, const float* dy, float* dx, float* ds,
                     int64_t planes, int64_t hw);
// channel_mul for x of any float dtype tx, NCHW or channels-last (y, dy, dx alike), and s of
// float dtype ts holding N*C values (its layout does not matter: one value per plane): y = x * s
// rounded once to tx; dx = dy * s likewise; ds32[n*C + c] = the plane's sum of dy * x in float,
// over (h, w) in a shape-fixed order (the caller rounds it to s's dtype).
void channel_mul_fwd_any(Context& ctx, DType tx, bool nhwc, const void* x, DType ts, const void* s, void* y,
                         int64_t n, int64_t c, int64_t hw);
void channel_mul_bwd_any(Context& ctx, DType tx, bool nhwc, const void* x, DType ts, const void* s, const void* dy,
                         void* dx, float* ds32, int64_t n, int64_t c, int64_t hw);
}  // namespace ditto::cuda
