#include "kernels/concat.h"

#include <fmt/format.h>

#include <array>
#include <string>
#include <vector>

#include "engine/error.h"
#include "engine/operand_check.h"
#include "engine/tensor_ops.h"
#include "kernels/concat_ref.h"
#include "kernels/detail/concat_cuda.h"

namespace ditto {
namespace {

void copy_channels(Context& ctx, const float* src, int64_t src_c, int64_t src_off, float* dst, int64_t dst_c,
                   int64_t dst_off, int64_t batch, int64_t c, int64_t hw) {
  if (ctx.is_cuda())
    cuda::copy_channels(ctx, src, src_c, src_off, dst, dst_c, dst_off, batch, c, hw);
  else
    ref::copy_channels(src, src_c, src_off, dst, dst_c, dst_off, batch, c, hw);
}

// Tape input names must outlive the tape (TapeInput holds a const char*): "x0" .. "x63", then "x".
const char* input_name(std::size_t i) {
  static const std::array<std::string, 64> names = [] {
    std::array<std::string, 64> a;
    for (std::size_t k = 0; k < a.size(); ++k) a[k] = "x" + std::to_string(k);
    return a;
  }();
  return i < names.size() ? names[i].c_str() : "x";
}

}  // namespace

namespace {
// How concat_channels moves a tensor of its form with the float copy kernels. A channels-last
// tensor's memory is an (N*H*W) x C matrix, so a channel slice of it is the NCHW copy with N*H*W
// "images" of one pixel each; bf16/f16 channels move as pairs of 16-bit values, one float-sized
// word each (a bit copy, never a float operation), which needs every channel count to be even.
struct CopyGeometry {
  int64_t batch, hw, unit;  // unit: channels per copied word (1, or 2 for bf16/f16)
};
CopyGeometry copy_geometry(const Tensor& t, const std::vector<int64_t>& channel_counts) {
  const Shape& s = t.shape();
  CopyGeometry g{t.channels_last() ? s[0] * s[2] * s[3] : s[0], t.channels_last() ? 1 : s[2] * s[3],
                 dtype_size(t.dtype()) == 2 ? 2 : 1};
  if (g.unit == 2)
    for (int64_t c : channel_counts)
      if (c % 2)
        throw ShapeError(fmt::format("concat_channels: a {} input of {} channels; bf16/f16 tensors are concatenated "
                                     "in channel pairs, so every input needs an even channel count",
                                     t.type_tag(), c));
  return g;
}
float* words(const Tensor& t) { return static_cast<float*>(t.raw()); }

// Whether concat_channels' backward may add input i's slice of dy straight into its gradient, in
// the launch that writes the other inputs' slices: the tape allows it (grad_to_add_into: a float32
// gradient of the slice's layout is already there), no other input of this concatenation shares
// its gradient (two adds to one tensor in one launch would race; concat_channels({x, x}) takes the
// ordered path), and it is not dy's own memory.
bool adds_in_place(const std::vector<GradRef>& refs, std::size_t i, const Tensor& dy) {
  const Tensor* g = grad_to_add_into(refs[i], dy.dtype(), dy.layout());
  if (!g) return false;
  for (std::size_t j = 0; j < refs.size(); ++j)
    if (j != i && refs[j].defined() && &refs[j].slot() == &refs[i].slot()) return false;
  const char* gb = static_cast<const char*>(g->raw());
  const char* db = static_cast<const char*>(dy.raw());
  return gb + g->nbytes() <= db || db + dy.nbytes() <= gb;
}
}  // namespace

Var concat_channels(Context& ctx, const std::vector<Var>& xs) {
  if (xs.empty()) throw ShapeError("concat_channels: no inputs");
  int64_t channels = 0;
  bool grad = false;
  std::vector<int64_t> counts;
  for (std::size_t i = 0; i < xs.size(); ++i) {
    const std::string what = "x" + std::to_string(i);
    check_float_any_layout_on(ctx, xs[i].value(), "concat_channels", what);
    check_ndim(xs[i].value(), 4, "concat_channels", what);
    const Shape& s = xs[i].shape();
    const Shape& s0 = xs[0].shape();
    if (s[0] != s0[0] || s[2] != s0[2] || s[3] != s0[3])
      throw ShapeError(fmt::format("concat_channels: {} has shape {}, x0 has {}; N, H and W must match", what,
                                   shape_str(s), shape_str(s0)));
    if (xs[i].value().dtype() != xs[0].value().dtype() || xs[i].value().layout() != xs[0].value().layout())
      throw ShapeError(fmt::format("concat_channels: {} is {}, x0 is {}; the inputs need one dtype and layout", what,
                                   xs[i].value().type_tag(), xs[0].value().type_tag()));
    channels += s[1];
    counts.push_back(s[1]);
    grad = grad || needs_grad(ctx, {&xs[i]});
  }
  const Shape& s0 = xs[0].shape();
  Tensor y = ctx.empty({s0[0], channels, s0[2], s0[3]}, xs[0].value().dtype(), xs[0].value().layout());
  const CopyGeometry g = copy_geometry(y, counts);
  const int64_t batch = g.batch, hw = g.hw, total = channels / g.unit;
  if (ctx.is_cuda()) {  // one launch for all inputs (DenseNet concatenates dozens per layer)
    std::vector<cuda::ChannelCopy> copies;
    int64_t off = 0;
    for (const Var& x : xs) {
      const int64_t ci = x.shape()[1] / g.unit;
      copies.push_back({words(x.value()), words(y), ci, 0, total, off, ci});
      off += ci;
    }
    cuda::copy_channels_many(ctx, copies.data(), int64_t(copies.size()), batch, hw);
  } else {
    int64_t off = 0;
    for (const Var& x : xs) {
      const int64_t ci = x.shape()[1] / g.unit;
      copy_channels(ctx, words(x.value()), ci, 0, words(y), total, off, batch, ci, hw);
      off += ci;
    }
  }
  Var out(std::move(y), grad);
  if (grad) {
    std::vector<TapeInput> inputs;
    for (std::size_t i = 0; i < xs.size(); ++i) inputs.push_back({input_name(i), xs[i]});
    std::vector<GradRef> refs;
    for (const Var& x : xs) refs.push_back(x.grad_ref());
    ctx.tape().record("concat_channels", "", std::move(inputs), out,
                      [refs, outr = out.grad_ref(), total, batch, hw, unit = g.unit](Context& c) {
      if (!outr.grad().defined()) return;
      const Tensor& dy = outr.grad();
      // Every input's slice of dy (in dy's form), in one launch on the GPU. A float32 input whose
      // gradient already holds a sum (DenseNet's features, each read by every later layer's
      // concatenation) gets its slice added there in the same launch, with add_inplace's rounding,
      // so the sums keep their order and bits; the others get fresh slices, accumulated in order.
      std::vector<Tensor> dxs(refs.size());
      std::vector<cuda::ChannelCopy> copies;
      int64_t off = 0;
      for (std::size_t i = 0; i < refs.size(); ++i) {
        const int64_t ci = refs[i].shape()[1] / unit;
        if (refs[i].requires_grad()) {
          if (c.is_cuda() && adds_in_place(refs, i, dy)) {
            copies.push_back({words(dy), words(refs[i].grad()), total, off, ci, 0, ci, true});
          } else {
            dxs[i] = c.empty(refs[i].shape(), dy.dtype(), dy.layout());
            if (c.is_cuda())
              copies.push_back({words(dy), words(dxs[i]), total, off, ci, 0, ci});
            else
              copy_channels(c, words(dy), total, off, words(dxs[i]), ci, 0, batch, ci, hw);
          }
        }
        off += ci;
      }
      if (!copies.empty()) cuda::copy_channels_many(c, copies.data(), int64_t(copies.size()), batch, hw);
      for (std::size_t i = 0; i < refs.size(); ++i)
        if (dxs[i].defined()) accumulate_grad(c, refs[i], std::move(dxs[i]));
    });
  }
  return out;
}

namespace {
// A tensor of one value per (n, c) plane ({N, C, 1, 1}) has the same bytes in either layout: the
// other layout's label on the same storage, no copy.
Tensor with_layout_label(const Tensor& t, Layout layout) {
  return t.layout() == layout ? t : Tensor(detail::storage_of(t), t.shape(), t.dtype(), layout);
}

// channel_mul of any other form: x of any float dtype in either layout, s of any float dtype (one
// value per plane, so its layout does not matter). y and dx in x's form, ds in s's dtype. The CPU
// reference reads both widened to f32 NCHW (exact) and rounds its results where the GPU does.
Var channel_mul_any(Context& ctx, const Var& x, const Var& s, int64_t planes, int64_t hw) {
  const Tensor &xv = x.value(), &sv = s.value();
  const Shape& xs = x.shape();
  if (ctx.is_cuda() && xv.dtype() != DType::F32 && !xv.channels_last())
    throw ShapeError(fmt::format("channel_mul: x is {} {}; on the GPU it reads f32, or channels-last tensors of any "
                                 "float dtype", xv.type_tag(), shape_str(xs)));
  const Tensor s_flat = with_layout_label(sv, Layout::Nchw);
  Tensor y = ctx.empty(xs, xv.dtype(), xv.layout());
  if (ctx.is_cuda()) {
    cuda::channel_mul_fwd_any(ctx, xv.dtype(), xv.channels_last(), xv.raw(), s_flat.dtype(), s_flat.raw(), y.raw(),
                              xs[0], xs[1], hw);
  } else {
    Tensor yf = ctx.empty(xs);
    ref::channel_mul_fwd(to_form(ctx, xv, DType::F32, Layout::Nchw).f32(), to_dtype(ctx, s_flat, DType::F32).f32(),
                         yf.f32(), planes, hw);
    y = to_form(ctx, yf, xv.dtype(), xv.layout());
  }
  const bool grad = needs_grad(ctx, {&x, &s});
  Var out(std::move(y), grad);
  if (grad) {
    // x is read only for s's gradient (see channel_mul).
    ctx.tape().record("channel_mul", "", {{"x", x}, {"s", s}}, out,
                      [sx = needs_grad(ctx, {&s}) ? xv : Tensor(), xs, x_dtype = xv.dtype(), x_layout = xv.layout(),
                       ss = s_flat, xr = x.grad_ref(), sr = s.grad_ref(), outr = out.grad_ref(), planes, hw,
                       s_layout = sv.layout()](Context& c) {
      if (!outr.grad().defined()) return;
      const Tensor& dy = outr.grad();
      Tensor dx, ds;
      if (c.is_cuda()) {
        if (xr.requires_grad()) dx = c.empty(xs, x_dtype, x_layout);
        Tensor ds32 = sr.requires_grad() ? c.empty({xs[0], xs[1]}) : Tensor();
        cuda::channel_mul_bwd_any(c, x_dtype, x_layout == Layout::Nhwc, sx.defined() ? sx.raw() : nullptr, ss.dtype(),
                                  ss.raw(), dy.raw(), dx.defined() ? dx.raw() : nullptr,
                                  ds32.defined() ? ds32.f32() : nullptr, xs[0], xs[1], hw);
        if (ds32.defined()) ds = to_dtype(c, ds32.reshape(sr.shape()), ss.dtype());
      } else {
        Tensor dxf = xr.requires_grad() ? c.empty(xs) : Tensor(), dsf = sr.requires_grad() ? c.empty(sr.shape()) : Tensor();
        const Tensor xf = sx.defined() ? to_form(c, sx, DType::F32, Layout::Nchw) : Tensor();
        ref::channel_mul_bwd(xf.defined() ? xf.f32() : nullptr, to_dtype(c, ss, DType::F32).f32(),
                             to_form(c, dy, DType::F32, Layout::Nchw).f32(), dxf.defined() ? dxf.f32() : nullptr,
                             dsf.defined() ? dsf.f32() : nullptr, planes, hw);
        if (dxf.defined()) dx = to_form(c, dxf, x_dtype, x_layout);
        if (dsf.defined()) ds = to_dtype(c, dsf, ss.dtype());
      }
      // s's gradient in s's form (a 1x1 channels-last s gets its layout back: the same bytes).
      if (ds.defined()) ds = with_layout_label(ds, s_layout);
      if (dx.defined()) accumulate_grad(c, xr, std::move(dx));
      if (ds.defined()) accumulate_grad(c, sr, std::move(ds));
    });
  }
  return out;
}
}  // namespace

Var channel_mul(Context& ctx, const Var& x, const Var& s) {
  if (x.value().dtype() != DType::F32 || x.value().channels_last() || s.value().dtype() != DType::F32 ||
      s.value().channels_last()) {
    check_float_any_layout_on(ctx, x.value(), "channel_mul", "x");
    check_float_any_layout_on(ctx, s.value(), "channel_mul", "s");
  } else {
    check_f32_on(ctx, x.value(), "channel_mul", "x");
    check_f32_on(ctx, s.value(), "channel_mul", "s");
  }
  check_ndim(x.value(), 4, "channel_mul", "x");
  const Shape& xs = x.shape();
  const Shape& ss = s.shape();
  const bool flat = ss.size() == 2 && ss[0] == xs[0] && ss[1] == xs[1];
  const bool boxed = ss.size() == 4 && ss[0] == xs[0] && ss[1] == xs[1] && ss[2] == 1 && ss[3] == 1;
  if (!flat && !boxed)
    throw ShapeError(fmt::format("channel_mul: s has shape {}; for x of shape {} it must be [{}, {}] or [{}, {}, 1, 1]",
                                 shape_str(ss), shape_str(xs), xs[0], xs[1], xs[0], xs[1]));
  if (xs[2] < 1 || xs[3] < 1)
    throw ShapeError(fmt::format("channel_mul: x has an empty plane, shape {}", shape_str(xs)));
  const int64_t planes = xs[0] * xs[1], hw = xs[2] * xs[3];
  if (x.value().dtype() != DType::F32 || x.value().channels_last() || s.value().dtype() != DType::F32 ||
      s.value().channels_last())
    return channel_mul_any(ctx, x, s, planes, hw);
  Tensor y = ctx.empty(xs);
  if (ctx.is_cuda())
    cuda::channel_mul_fwd(ctx, x.value().f32(), s.value().f32(), y.f32(), planes, hw);
  else
    ref::channel_mul_fwd(x.value().f32(), s.value().f32(), y.f32(), planes, hw);
  const bool grad = needs_grad(ctx, {&x, &s});
  Var out(std::move(y), grad);
  if (grad) {
    // x is read only for s's gradient: a scale that needs none (stochastic depth's mask) does not
    // keep x alive until backward.
    ctx.tape().record("channel_mul", "", {{"x", x}, {"s", s}}, out,
                      [sx = needs_grad(ctx, {&s}) ? x.value() : Tensor(), ss = s.value(), xr = x.grad_ref(),
                       sr = s.grad_ref(), outr = out.grad_ref(), planes, hw](Context& c) {
      if (!outr.grad().defined()) return;
      Tensor dx, ds;
      if (xr.requires_grad()) dx = c.empty(xr.shape());
      if (sr.requires_grad()) ds = c.empty(sr.shape());
      float* pdx = dx.defined() ? dx.f32() : nullptr;
      float* pds = ds.defined() ? ds.f32() : nullptr;
      const float* px = sx.defined() ? sx.f32() : nullptr;  // defined whenever ds is wanted
      if (c.is_cuda())
        cuda::channel_mul_bwd(c, px, ss.f32(), outr.grad().f32(), pdx, pds, planes, hw);
      else
        ref::channel_mul_bwd(px, ss.f32(), outr.grad().f32(), pdx, pds, planes, hw);
      if (dx.defined()) accumulate_grad(c, xr, std::move(dx));
      if (ds.defined()) accumulate_grad(c, sr, std::move(ds));
    });
  }
  return out;
}

}  // namespace ditto
