#include "engine/tensor_ops.h"

#include <fmt/format.h>

#include <cstdint>

#include "engine/operand_check.h"
#include "engine/detail/half_bits.h"
#include "engine/detail/int64_words.h"
#include "engine/detail/tensor_ops_cuda.h"

namespace ditto {

void fill(Context& ctx, Tensor& t, float value) {
  check_f32_on(ctx, t, "fill", "t");
  if (ctx.is_cuda()) return cuda::fill(ctx, t.f32(), t.numel(), value);
  float* p = t.f32();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = value;
}

namespace {
float read_float(const Tensor& t, int64_t i);
void write_float(Tensor& t, int64_t i, float v);
}  // namespace

void add_into(Context& ctx, Tensor& out, const Tensor& a, const Tensor& b) {
  check_float_any_layout_on(ctx, a, "add", "a");
  check_float_any_layout_on(ctx, b, "add", "b");
  check_float_any_layout_on(ctx, out, "add", "out");
  if (a.shape() != b.shape() || a.dtype() != b.dtype() || a.layout() != b.layout() || out.shape() != a.shape() ||
      out.dtype() != a.dtype() || out.layout() != a.layout())
    throw ShapeError(fmt::format("add: operands {} {}, {} {} and output {} {} must have one shape, dtype and layout",
                                 a.type_tag(), shape_str(a.shape()), b.type_tag(), shape_str(b.shape()),
                                 out.type_tag(), shape_str(out.shape())));
  if (ctx.is_cuda()) return cuda::add_any(ctx, a.dtype(), a.raw(), b.raw(), out.raw(), a.numel());
  for (int64_t i = 0; i < a.numel(); ++i) write_float(out, i, read_float(a, i) + read_float(b, i));
}

void add_inplace(Context& ctx, Tensor& dst, const Tensor& src) {
  if (dst.defined() && dst.dtype() == DType::F32 && !dst.channels_last()) return axpy_inplace(ctx, dst, 1.0f, src);
  add_into(ctx, dst, dst, src);
}

void axpy_inplace(Context& ctx, Tensor& dst, float alpha, const Tensor& x) {
  check_f32_on(ctx, dst, "axpy", "dst");
  check_f32_on(ctx, x, "axpy", "x");
  if (dst.shape() != x.shape())
    throw ShapeError(fmt::format("axpy: shapes {} and {} differ", shape_str(dst.shape()), shape_str(x.shape())));
  if (ctx.is_cuda()) return cuda::axpy(ctx, dst.f32(), alpha, x.f32(), dst.numel());
  float* d = dst.f32();
  const float* s = x.f32();
  for (int64_t i = 0; i < dst.numel(); ++i) d[i] += alpha * s[i];
}

void scale_inplace(Context& ctx, Tensor& t, float alpha) {
  check_f32_on(ctx, t, "scale", "t");
  if (ctx.is_cuda()) return cuda::scale(ctx, t.f32(), alpha, t.numel());
  float* p = t.f32();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] *= alpha;
}

namespace {
void check_convertible(const Context& ctx, const Tensor& t, DType to) {
  if (!t.defined() || !is_float(t.dtype()) || !is_float(to) || t.device() != ctx.device())
    throw ShapeError(fmt::format("to_dtype: converts float tensors on the context's device ({}) between f32, bf16 "
                                 "and f16; got {} {} on {} to {}",
                                 ctx.device().str(), t.defined() ? dtype_name(t.dtype()) : "an undefined tensor",
                                 shape_str(t.shape()), t.device().str(), dtype_name(to)));
}

Tensor narrow(Context& ctx, const Tensor& t, DType dtype) {
  Tensor out = ctx.empty(t.shape(), dtype, t.layout());
  auto* dst = static_cast<uint16_t*>(out.raw());
  if (ctx.is_cuda()) {
    cuda::narrow(ctx, t.f32(), dst, t.numel(), dtype == DType::BF16);
    return out;
  }
  const float* src = t.f32();
  for (int64_t i = 0; i < t.numel(); ++i) dst[i] = detail::float_to_half_bits(dtype, src[i]);
  return out;
}

Tensor widen(Context& ctx, const Tensor& t) {
  Tensor out = ctx.empty(t.shape(), DType::F32, t.layout());
  const auto* src = static_cast<const uint16_t*>(t.raw());
  if (ctx.is_cuda()) {
    cuda::widen(ctx, src, out.f32(), t.numel(), t.dtype() == DType::BF16);
    return out;
  }
  float* dst = out.f32();
  for (int64_t i = 0; i < t.numel(); ++i) dst[i] = detail::half_bits_to_float(t.dtype(), src[i]);
  return out;
}
}  // namespace

namespace {
float read_float(const Tensor& t, int64_t i) {
  if (t.dtype() == DType::F32) return static_cast<const float*>(t.raw())[i];
  return detail::half_bits_to_float(t.dtype(), static_cast<const uint16_t*>(t.raw())[i]);
}
void write_float(Tensor& t, int64_t i, float v) {
  if (t.dtype() == DType::F32) static_cast<float*>(t.raw())[i] = v;
  else static_cast<uint16_t*>(t.raw())[i] = detail::float_to_half_bits(t.dtype(), v);
}

// {batch, rows, cols} -> {batch, cols, rows}, converted to dtype; the result has t's shape and `layout`.
Tensor transpose_convert(Context& ctx, const Tensor& t, DType dtype, int64_t batch, int64_t rows, int64_t cols,
                         Layout layout) {
  Tensor out = ctx.empty(t.shape(), dtype, layout);
  if (ctx.is_cuda()) {
    cuda::transpose_convert(ctx, t.raw(), t.dtype(), out.raw(), dtype, batch, rows, cols);
    return out;
  }
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c)
        write_float(out, (b * cols + c) * rows + r, read_float(t, (b * rows + r) * cols + c));
  return out;
}

void check_4d(const Context& ctx, const Tensor& t, DType to, const char* op) {
  check_convertible(ctx, t, to);
  if (t.ndim() != 4) throw ShapeError(fmt::format("{}: needs a 4-D tensor, got {}", op, shape_str(t.shape())));
}
}  // namespace

Tensor to_channels_last(Context& ctx, const Tensor& t, DType dtype) {
  check_4d(ctx, t, dtype, "to_channels_last");
  if (t.channels_last()) return to_dtype(ctx, t, dtype);
  const Shape& s = t.shape();
  return transpose_convert(ctx, t, dtype, s[0], s[1], s[2] * s[3], Layout::Nhwc);
}

Tensor from_channels_last(Context& ctx, const Tensor& t, DType dtype) {
  check_4d(ctx, t, dtype, "from_channels_last");
  if (!t.channels_last()) return to_dtype(ctx, t, dtype);
  const Shape& s = t.shape();
  return transpose_convert(ctx, t, dtype, s[0], s[2] * s[3], s[1], Layout::Nchw);
}

Tensor to_form(Context& ctx, const Tensor& t, DType dtype, Layout layout) {
  return layout == Layout::Nhwc ? to_channels_last(ctx, t, dtype)
                                : (t.channels_last() ? from_channels_last(ctx, t, dtype) : to_dtype(ctx, t, dtype));
}

Tensor to_dtype(Context& ctx, const Tensor& t, DType dtype) {
  check_convertible(ctx, t, dtype);
  if (t.dtype() == dtype) return t;
  if (dtype == DType::F32) return widen(ctx, t);
  return narrow(ctx, t.dtype() == DType::F32 ? t : widen(ctx, t), dtype);
}

Tensor narrow_int64_words(Context& ctx, const Tensor& words, const Shape& shape) {
  check_i32_on(ctx, words, "narrow_int64_words", "words");
  const int64_t n = shape_numel(shape);
  if (words.numel() != 2 * n)
    throw ShapeError(fmt::format("narrow_int64_words: {} i32 words for int64 values of shape {}; two words per value, "
                                 "{} expected",
                                 words.numel(), shape_str(shape), 2 * n));
  Tensor out = ctx.empty(shape, DType::I32);
  if (ctx.is_cuda()) {
    cuda::narrow_int64_words(ctx, words.i32(), out.i32(), n);
    return out;
  }
  const int32_t* w = words.i32();
  int32_t* o = out.i32();
  for (int64_t i = 0; i < n; ++i) {
    if (!detail::int64_words_fit_int32(w[2 * i], w[2 * i + 1]))
      throw DataError(fmt::format("narrow_int64_words: element {} is {}, outside int32 (no index, label or length an "
                                  "op takes can be)",
                                  i, detail::int64_of_words(w[2 * i], w[2 * i + 1])));
    o[i] = w[2 * i];
  }
  return out;
}

}  // namespace ditto
