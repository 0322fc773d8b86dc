#include "python/torch_ops.h"

#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <fmt/format.h>

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "engine/context.h"
#include "engine/error.h"
#include "engine/external.h"
#include "engine/manifest.h"
#include "engine/tape.h"
#include "engine/tensor_ops.h"
#include "kernels/conv2d.h"
#include "kernels/ctc.h"
#include "kernels/grid_sample.h"
#include "kernels/pixel_xent.h"
#include "kernels/roi_align.h"
#include "kernels/scatter.h"
#include "kernels/spmm.h"
#include "kernels/upsample.h"
#include "kernels/upsample_ref.h"
#include "python/bridge.h"
#include "python/torch_runner.h"

namespace ditto::py {
namespace {

using namespace nb::literals;

Shape shape_of(const std::vector<int64_t>& v) { return Shape(v.begin(), v.end()); }

DType dtype_named(const std::string& name) {
  for (DType d : {DType::F32, DType::I32, DType::BF16, DType::F16})
    if (name == dtype_name(d)) return d;
  throw ShapeError(fmt::format("ditto.torch: dtype '{}'; ditto holds f32, i32, bf16 and f16", name));
}

// One op call: its context locked, its manifest cleared so that what it records is this call's.
class Call {
 public:
  Call(const std::string& device, std::intptr_t stream, bool deterministic, std::string layer)
      : r_(torch_runner(device, stream, deterministic)), lock_(r_.mu), layer_(std::move(layer)) {
    r_.ctx->manifest().clear();
  }
  Context& ctx() { return *r_.ctx; }
  const std::string& layer() const { return layer_; }
  void set_layer(std::string layer) { layer_ = std::move(layer); }
  // A tensor argument: (data pointer, shape, dtype name) of a contiguous PyTorch tensor on this
  // context's device, or any DLPack array. The pointer form skips DLPack's per-tensor Python calls
  // (most of a small op's host time); the caller holds the tensor for the call, and the work is
  // queued on the caller's stream, so PyTorch's allocator reuses the memory only after it, as it
  // does for PyTorch's own ops.
  Tensor in(nb::handle h) {
    if (!nb::isinstance<nb::tuple>(h)) return from_dlpack(*r_.ctx, h);
    nb::tuple t = nb::borrow<nb::tuple>(h);
    const auto ptr = nb::cast<std::uintptr_t>(t[0]);
    const auto dims = nb::cast<std::vector<int64_t>>(t[1]);
    const Shape shape(dims.begin(), dims.end());
    const std::string dtype = nb::cast<std::string>(t[2]);
    // int64 indices and labels (PyTorch's default) arrive as their words and are narrowed here, in one
    // kernel queued before the op's own: a conversion in Python costs two dispatches of host time.
    if (dtype == "i64")
      return borrow_int64(*r_.ctx, reinterpret_cast<void*>(ptr), shape);
    return wrap_external(*r_.ctx, reinterpret_cast<void*>(ptr), shape, dtype_named(dtype), {});
  }
  Tensor in_opt(nb::handle h) { return h.is_none() ? Tensor() : in(h); }
  // The outputs (None for an undefined one) as DLPack capsules and, last, the variants that ran: a
  // list of (knob, variant, guarantee). A capsule, not the array object: torch.from_dlpack takes it
  // as it is, where an object with __dlpack__ costs it a device query, a stream object and the
  // export call on every output (the work is on PyTorch's current stream already).
  nb::tuple done(std::initializer_list<Tensor> outs) {
    nb::list l;
    for (const Tensor& t : outs) l.append(t.defined() ? nb::cast(share_on_stream(t)).attr("__dlpack__")() : nb::none());
    nb::list ran;
    for (const ManifestEntry& e : r_.ctx->manifest().entries())
      if (e.layer == layer_) ran.append(nb::make_tuple(e.knob, e.variant, guarantee_name(e.guarantee)));
    l.append(ran);
    return nb::tuple(l);
  }

 private:
  Runner& r_;
  std::unique_lock<std::mutex> lock_;
  std::string layer_;
};

UpsampleParams upsample_params(const std::string& mode, int64_t out_h, int64_t out_w, bool align_corners) {
  UpsampleParams p;
  if (mode == "nearest")
    p.mode = UpsampleMode::Nearest;
  else if (mode == "bilinear")
    p.mode = UpsampleMode::Bilinear;
  else
    throw ShapeError(fmt::format("interpolate: mode '{}'; ditto has nearest and bilinear", mode));
  p.out_h = out_h, p.out_w = out_w, p.align_corners = align_corners;
  return p;
}

// A CSR matrix over the caller's arrays (i32 structure, f32 values; no gradient to the values).
CsrMatrix csr_of(Call& c, nb::handle row_ptr, nb::handle col_idx, nb::handle values, int64_t rows, int64_t cols) {
  CsrMatrix a;
  a.rows = rows, a.cols = cols;
  a.row_ptr = c.in(row_ptr);
  a.col_idx = c.in(col_idx);
  a.values = Var(c.in(values));
  return a;
}

}  // namespace

void bind_torch_ops(nb::module_& m) {
  // Every function takes (device, stream, deterministic) first: the tensors' device ("cpu" or
  // "cuda:N"), PyTorch's current stream there (its cuda_stream handle; 0 on the CPU) and the
  // policy. Tensors are C-contiguous DLPack arrays on that device; results share ditto's memory.
  m.def("_torch_scatter_add", [](const std::string& dev, std::intptr_t s, bool det, nb::handle src, nb::handle index,
                                  int64_t rows) {
    Call c(dev, s, det, "scatter_add");
    const Tensor st = c.in(src);
    const int64_t m = st.ndim() ? st.shape()[0] : 0;
    c.set_layer(scatter_rows_layer(c.ctx(), m, m ? st.numel() / m : 1, rows));
    return c.done({scatter_add(c.ctx(), c.layer(), Var(st), c.in(index), rows).value()});
  });
  // index: the index's values along dim as i32 words, two per value (low, high) where wide (a view of
  // PyTorch's int64 index: no conversion pass); a value outside the extent (past int32 too) makes the
  // GPU's output NaN and is a DataError naming it on the CPU.
  m.def("_torch_scatter_dim_add",
        [](const std::string& dev, std::intptr_t s, bool det, nb::handle src, nb::handle index, bool wide,
           const std::vector<int64_t>& index_shape, int dim, const std::vector<int64_t>& out_shape) {
          Call c(dev, s, det, "scatter_add");
          // Layer "scatter_dim" (the policy pins the privatized scatter there) where that scatter runs this
          // geometry on this GPU; the sorted scatter of layer "scatter_add" elsewhere.
          if (scatter_dim_privatized_refusal(c.ctx(), shape_of(index_shape), dim, shape_of(out_shape)).empty())
            c.set_layer("scatter_dim");
          return c.done({scatter_dim_add(c.ctx(), c.layer(), Var(c.in(src)), c.in(index), wide, shape_of(index_shape),
                                         dim, shape_of(out_shape))
                             .value()});
        });
  // The gradient of a scatter along dim: torch.gather of it by the same index words (NaN where a value is
  // out of range on the GPU).
  m.def("_torch_gather_dim",
        [](const std::string& dev, std::intptr_t s, bool det, nb::handle table, nb::handle index, bool wide,
           const std::vector<int64_t>& index_shape, int dim) {
          Call c(dev, s, det, "scatter_add");
          return c.done({gather_dim(c.ctx(), c.in(table), c.in(index), wide, shape_of(index_shape), dim)});
        });
  m.def("_torch_embedding_backward",
        [](const std::string& dev, std::intptr_t s, bool det, nb::handle dy, nb::handle index, int64_t rows) {
          Call c(dev, s, det, "embedding");
          return c.done({embedding_backward(c.ctx(), c.layer(), c.in(dy), c.in(index), rows)});
        });
  m.def("_torch_embedding_bag",
        [](const std::string& dev, std::intptr_t s, bool det, nb::handle weight, nb::handle index, nb::handle offsets,
           const std::string& mode) {
          Call c(dev, s, det, "embedding_bag");
          return c.done({embedding_bag(c.ctx(), c.layer(), Var(c.in(weight)), c.in(index), c.in_opt(offsets),
                                       bag_mode(mode))
                             .value()});
        },
        "device"_a, "stream"_a, "deterministic"_a, "weight"_a, "index"_a, "offsets"_a.none(), "mode"_a);
  m.def("_torch_embedding_bag_backward",
        [](const std::string& dev, std::intptr_t s, bool det, nb::handle dy, nb::handle index, nb::handle offsets,
           const std::string& mode, int64_t rows) {
          Call c(dev, s, det, "embedding_bag");
          return c.done({embedding_bag_backward(c.ctx(), c.layer(), c.in(dy), c.in(index), c.in_opt(offsets),
                                                bag_mode(mode), rows)});
        },
        "device"_a, "stream"_a, "deterministic"_a, "dy"_a, "index"_a, "offsets"_a.none(), "mode"_a, "num_rows"_a);
  m.def("_torch_upsample",
        [](const std::string& dev, std::intptr_t s, bool det, nb::handle x, const std::string& mode, int64_t oh,
           int64_t ow, bool align_corners) {
          Call c(dev, s, det, "upsample");
          return c.done({upsample2d(c.ctx(), c.layer(), Var(c.in(x)), upsample_params(mode, oh, ow, align_corners))
                             .value()});
        });
  m.def("_torch_upsample_nearest_whole",
        [](int64_t h, int64_t w, int64_t oh, int64_t ow) {
          ref::UpsampleDims d;
          d.h = h, d.w = w, d.oh = oh, d.ow = ow;
          return ref::nearest_whole(d);
        },
        "h"_a, "w"_a, "out_h"_a, "out_w"_a,
        "Whether nearest upsampling from h x w to out_h x out_w has whole scale factors, where ditto's GPU "
        "forward copies each input to its block.");
  m.def("_torch_upsample_backward",
        [](const std::string& dev, std::intptr_t s, bool det, nb::handle dy, const std::vector<int64_t>& x_shape,
           const std::string& mode, bool align_corners) {
          Call c(dev, s, det, "upsample");
          Tensor g = c.in(dy);
          const UpsampleParams p = upsample_params(mode, g.ndim() == 4 ? g.shape()[2] : 0,
                                                   g.ndim() == 4 ? g.shape()[3] : 0, align_corners);
          return c.done({upsample2d_backward(c.ctx(), c.layer(), g, shape_of(x_shape), p)});
        });
  m.def("_torch_grid_sample",
        [](const std::string& dev, std::intptr_t s, bool det, nb::handle x, nb::handle grid, bool align_corners) {
          Call c(dev, s, det, "grid_sample");
          return c.done({grid_sample(c.ctx(), c.layer(), Var(c.in(x)), Var(c.in(grid)), align_corners).value()});
        });
  m.def("_torch_grid_sample_backward",
        [](const std::string& dev, std::intptr_t s, bool det, nb::handle dy, nb::handle x, nb::handle grid,
           bool align_corners, bool want_dx, bool want_dgrid) {
          Call c(dev, s, det, "grid_sample");
          GridSampleGrads g =
              grid_sample_backward(c.ctx(), c.layer(), c.in(dy), c.in(x), c.in(grid), align_corners, want_dx, want_dgrid);
          return c.done({g.dx, g.dgrid});
        });
  m.def("_torch_affine_grid",
        [](const std::string& dev, std::intptr_t s, bool det, nb::handle theta, int64_t h, int64_t w,
           bool align_corners) {
          Call c(dev, s, det, "affine_grid");
          return c.done({affine_grid(c.ctx(), c.layer(), Var(c.in(theta)), h, w, align_corners).value()});
        });
  m.def("_torch_affine_grid_backward",
        [](const std::string& dev, std::intptr_t s, bool det, nb::handle dgrid, bool align_corners) {
          Call c(dev, s, det, "affine_grid");
          return c.done({affine_grid_backward(c.ctx(), c.layer(), c.in(dgrid), align_corners)});
        });
  m.def("_torch_roi_align",
        [](const std::string& dev, std::intptr_t s, bool det, nb::handle x, nb::handle rois, int64_t oh, int64_t ow,
           float scale, int sampling_ratio, bool aligned) {
          Call c(dev, s, det, "roi_align");
          const RoiAlignParams p{oh, ow, scale, sampling_ratio, aligned};
          return c.done({roi_align(c.ctx(), c.layer(), Var(c.in(x)), c.in(rois), p).value()});
        });
  m.def("_torch_roi_align_backward",
        [](const std::string& dev, std::intptr_t s, bool det, nb::handle dy, const std::vector<int64_t>& x_shape,
           nb::handle rois, int64_t oh, int64_t ow, float scale, int sampling_ratio, bool aligned) {
          Call c(dev, s, det, "roi_align");
          const RoiAlignParams p{oh, ow, scale, sampling_ratio, aligned};
          return c.done({roi_align_backward(c.ctx(), c.layer(), c.in(dy), shape_of(x_shape), c.in(rois), p)});
        });
  // CTC computes the gradient in its forward pass (as cuDNN does): with want_grad the costs' gradient
  // for an upstream gradient of ones comes back beside them, and backward only scales it.
  m.def("_torch_ctc_loss",
        [](const std::string& dev, std::intptr_t s, bool det, nb::handle logits, nb::handle labels,
           nb::handle label_lengths, nb::handle input_lengths, bool want_grad) {
          Call c(dev, s, det, "ctc_loss");
          Var lg(c.in(logits), want_grad);
          Var cost = ctc_loss(c.ctx(), c.layer(), lg, c.in(labels), c.in(label_lengths), c.in(input_lengths));
          if (!want_grad) return c.done({cost.value(), Tensor()});
          c.ctx().tape().backward(c.ctx(), cost);
          return c.done({cost.value(), lg.grad()});
        });
  // The forward hands back, besides the loss, each pixel's log-sum-exp and the counted pixels,
  // which the autograd formula keeps for the backward (one pass over the logits, not two).
  m.def("_torch_pixel_cross_entropy",
        [](const std::string& dev, std::intptr_t s, bool det, nb::handle logits, nb::handle labels, int ignore_index) {
          Call c(dev, s, det, "pixel_xent");
          const PixelXentForward f = pixel_cross_entropy_forward(c.ctx(), c.layer(), c.in(logits), c.in(labels),
                                                                 ignore_index);
          return c.done({f.loss, f.lse, f.count});
        });
  m.def("_torch_pixel_cross_entropy_backward",
        [](const std::string& dev, std::intptr_t s, bool det, nb::handle dloss, nb::handle logits, nb::handle labels,
           nb::handle lse, nb::handle count, int ignore_index) {
          Call c(dev, s, det, "pixel_xent");
          const PixelXentForward saved{Tensor(), c.in(lse), c.in(count)};
          return c.done({pixel_cross_entropy_backward(c.ctx(), c.layer(), c.in(dloss), c.in(logits), c.in(labels),
                                                      saved, ignore_index)});
        });
  // The NLL's forward hands back the loss and the counted pixels (its backward needs no more).
  m.def("_torch_pixel_nll",
        [](const std::string& dev, std::intptr_t s, bool det, nb::handle log_probs, nb::handle labels, int ignore_index) {
          Call c(dev, s, det, "pixel_xent");
          const PixelXentForward f = pixel_nll_forward(c.ctx(), c.layer(), c.in(log_probs), c.in(labels), ignore_index);
          return c.done({f.loss, f.count});
        });
  m.def("_torch_pixel_nll_backward",
        [](const std::string& dev, std::intptr_t s, bool det, nb::handle dloss, nb::handle log_probs, nb::handle labels,
           nb::handle count, int ignore_index) {
          Call c(dev, s, det, "pixel_xent");
          const PixelXentForward saved{Tensor(), c.ctx().empty({0}), c.in(count)};
          return c.done({pixel_nll_backward(c.ctx(), c.layer(), c.in(dloss), c.in(log_probs), c.in(labels), saved,
                                            ignore_index)});
        });
  m.def("_torch_spmm",
        [](const std::string& dev, std::intptr_t s, bool det, nb::handle row_ptr, nb::handle col_idx, nb::handle values,
           int64_t rows, int64_t cols, nb::handle b) {
          Call c(dev, s, det, "spmm");
          const CsrMatrix a = csr_of(c, row_ptr, col_idx, values, rows, cols);
          return c.done({spmm(c.ctx(), c.layer(), a, Var(c.in(b))).value()});
        });
  m.def("_torch_spmm_backward",
        [](const std::string& dev, std::intptr_t s, bool det, nb::handle dc, nb::handle row_ptr, nb::handle col_idx,
           nb::handle values, int64_t rows, int64_t cols, const std::vector<int64_t>& b_shape) {
          Call c(dev, s, det, "spmm");
          const CsrMatrix a = csr_of(c, row_ptr, col_idx, values, rows, cols);
          return c.done({spmm_backward_dense(c.ctx(), c.layer(), a, c.in(dc), shape_of(b_shape))});
        });
  m.def("_torch_conv2d",
        [](const std::string& dev, std::intptr_t s, bool det, nb::handle x, nb::handle w, const std::vector<int64_t>& stride,
           const std::vector<int64_t>& padding, const std::vector<int64_t>& dilation, int groups) {
          Call c(dev, s, det, "conv2d");
          const Conv2dParams p = conv_params(stride, padding, dilation, groups);
          const Tensor xt = c.in(x), wt = c.in(w);
          c.set_layer(conv2d_layer(det, xt.shape(), wt.shape(), p));
          return c.done({conv2d_forward(c.ctx(), c.layer(), xt, wt, p)});
        });
  m.def("_torch_conv2d_backward",
        [](const std::string& dev, std::intptr_t s, bool det, nb::handle dy, nb::handle x, nb::handle w,
           const std::vector<int64_t>& stride, const std::vector<int64_t>& padding, const std::vector<int64_t>& dilation, int groups,
           bool want_dx, bool want_dw) {
          Call c(dev, s, det, "conv2d");
          const Conv2dParams p = conv_params(stride, padding, dilation, groups);
          const Tensor g = c.in(dy), xt = c.in(x), wt = c.in(w);
          c.set_layer(conv2d_layer(det, xt.shape(), wt.shape(), p));
          Tensor dx, dw;
          if (want_dx) dx = conv2d_backward_data(c.ctx(), c.layer(), g, wt, xt.shape(), p);
          if (want_dw) dw = conv2d_backward_filter(c.ctx(), c.layer(), xt, g, wt.shape(), p);
          return c.done({dx, dw});
        });
}

}  // namespace ditto::py
