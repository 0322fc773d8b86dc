// CPU reference of kernels/concat (channel ops): templated so gradient checks run in double;
// the channel_mul reduction accumulates in double in index order.
#pragma once
#include <cstdint>

namespace ditto::ref {

// Copies, for every n < batch, `c` channels of `hw` elements from src (which has src_c
// channels; starting at channel src_off) to dst (dst_c channels; starting at dst_off).
// Forward of concat: src = input i, dst = y. Backward: src = dy, dst = dx_i.
template <class T>
void copy_channels(const T* src, int64_t src_c, int64_t src_off, T* dst, int64_t dst_c, int64_t dst_off,
                   int64_t batch, int64_t c, int64_t hw) {
  for (int64_t n = 0; n < batch; ++n)
    for (int64_t i = 0; i < c * hw; ++i) dst[(n * dst_c + dst_off) * hw + i] = src[(n * src_c + src_off) * hw + i];
}

// y[p*hw + i] = x[p*hw + i] * s[p] over planes p = n*C + c.
template <class T>
void channel_mul_fwd(const T* x, const T* s, T* y, int64_t planes, int64_t hw) {
  for (int64_t p = 0; p < planes; ++p)
    for (int64_t i = 0; i < hw; ++i) y[p * hw + i] = x[p * hw + i] * s[p];
}

// dx = dy * s (dx may be null); ds[p] = sum_i dy * x over plane p (ds may be null).
template <class T>
void channel_mul_bwd(const T* x, const T* s, const T* dy, T* dx, T* ds, int64_t planes, int64_t hw) {
  for (int64_t p = 0; p < planes; ++p) {
    double acc = 0;
    for (int64_t i = 0; i < hw; ++i) {
      if (dx) dx[p * hw + i] = dy[p * hw + i] * s[p];
      if (ds) acc += double(dy[p * hw + i]) * double(x[p * hw + i]);  // x may be null without ds
    }
    if (ds) ds[p] = static_cast<T>(acc);
  }
}

}  // namespace ditto::ref
