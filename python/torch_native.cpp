// ditto.torch's eager path in C++: PyTorch operators (namespace ditto_native) over the same ditto
// calls as the torch.library custom ops of ditto/torch.py, with the same autograd formulas as C++
// autograd functions. A Python autograd.Function and the Python around each ditto call cost more
// host time than the whole of PyTorch's own op for the losses and row scatters of segmentation and
// graph models (the call, not the kernels, is the bottleneck there); here a call is one dispatch.
//
// Built only when the configuring interpreter has PyTorch, and tied to that PyTorch's version (its
// C++ ABI): ditto.torch loads it when the versions match, and otherwise runs the Python path (the
// same kernels, the same bits). The custom ops stay what torch.compile and other tracers see.
//
// Each operator's schema is its custom op's, so ditto.torch calls either with the same arguments.
// ditto's errors cross as RuntimeErrors whose message starts "[ditto.<Type>] ", which ditto.torch
// raises again as that ditto exception; argument errors are ValueErrors, as in the Python path.
#include <ATen/ATen.h>
#include <torch/autograd.h>
#include <torch/library.h>
#ifdef DITTO_TORCH_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "engine/context.h"
#include "engine/error.h"
#include "engine/external.h"
#include "engine/manifest.h"
#include "kernels/conv2d.h"
#include "kernels/grid_sample.h"
#include "kernels/pixel_xent.h"
#include "kernels/scatter.h"
#include "python/torch_runner.h"

namespace ditto::py {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// PyTorch's Python name of a dtype, for messages that read as the Python path's.
std::string python_dtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "torch.float32";
    case at::kDouble: return "torch.float64";
    case at::kHalf: return "torch.float16";
    case at::kBFloat16: return "torch.bfloat16";
    case at::kInt: return "torch.int32";
    case at::kLong: return "torch.int64";
    default: return std::string("torch.") + c10::toString(t);
  }
}

// The latest variants per op key (ditto.torch's record names: "pixel_xent", "scatter_add"), stamped
// with the monotonic clock that Python's time.monotonic_ns reads, so that ditto.torch.variants() can
// tell which of its two paths ran an op last.
struct Latest {
  std::mutex mu;
  std::map<std::string, std::pair<int64_t, std::vector<std::string>>> by_op;
};
Latest& latest() {
  static auto* l = new Latest();
  return *l;
}

// One operator call: the runner of the tensors' device, PyTorch's current stream there and the
// policy, locked, its manifest cleared so that what it records is this call's.
class Call {
 public:
  Call(const at::Tensor& like, bool deterministic, std::string op, std::string layer)
      : r_(runner_of(like, deterministic)), lock_(r_.mu), device_(like.device()), op_(std::move(op)),
        layer_(std::move(layer)) {
    r_.ctx->manifest().clear();
  }
  Context& ctx() { return *r_.ctx; }
  const std::string& layer() const { return layer_; }
  void set_layer(std::string layer) { layer_ = std::move(layer); }

  // A PyTorch tensor as a ditto tensor over its memory (contiguous; `held` keeps a contiguous copy
  // alive for the call). int64 indices and labels cross as their words, narrowed in one kernel.
  Tensor in(const at::Tensor& t, const char* what) {
    TORCH_CHECK_VALUE(t.device() == device_, "ditto.torch: tensors on ", t.device(), " and ", device_,
                      "; one device per op");
    const at::Tensor& c = held_.emplace_back(t.contiguous());
    const Shape shape(c.sizes().begin(), c.sizes().end());
    switch (c.scalar_type()) {
      case at::kFloat: return wrap_external(*r_.ctx, c.data_ptr(), shape, DType::F32, {});
      case at::kInt: return wrap_external(*r_.ctx, c.data_ptr(), shape, DType::I32, {});
      case at::kLong:
        return borrow_int64(*r_.ctx, c.data_ptr(), shape);
      default:
        C10_THROW_ERROR(ValueError, c10::str("ditto.torch: ", what, " is ", python_dtype(c.scalar_type()),
                                             "; ditto takes float32, int32 and int64 (as indices)"));
    }
  }
  // An index as a scatter along a dimension reads it: int32 values, or int64 values as their (low,
  // high) words without a conversion (*wide set); other dtypes as in().
  Tensor in_dim_index(const at::Tensor& t, bool* wide) {
    *wide = t.scalar_type() == at::kLong;
    if (!*wide) return in(t, "index");
    TORCH_CHECK_VALUE(t.device() == device_, "ditto.torch: tensors on ", t.device(), " and ", device_,
                      "; one device per op");
    const at::Tensor& c = held_.emplace_back(t.contiguous());
    return wrap_external(*r_.ctx, c.data_ptr(), {2 * c.numel()}, DType::I32, {});
  }
  Tensor in_f32(const at::Tensor& t, const char* what) {
    require_f32(t, what);
    return in(t, what);
  }
  static void require_f32(const at::Tensor& t, const char* what) {
    TORCH_CHECK_VALUE(t.scalar_type() == at::kFloat, "ditto.torch: ", what, " is ", python_dtype(t.scalar_type()),
                      "; ditto's ops here take float32");
  }

  // ditto's output as a PyTorch tensor of `sizes` sharing its memory: the storage is released (to
  // the context's stream-ordered pool) when PyTorch drops the tensor.
  at::Tensor out(const Tensor& t, at::IntArrayRef sizes) {
    auto* keep = new Tensor(t);
    const auto dtype = t.dtype() == DType::I32 ? at::kInt : at::kFloat;
    return at::from_blob(
        t.raw(), sizes, [keep](void*) { delete keep; }, at::TensorOptions().dtype(dtype).device(device_));
  }
  // The same, of ditto's shape.
  at::Tensor out(const Tensor& t) { return out(t, std::vector<int64_t>(t.shape().begin(), t.shape().end())); }

  // The variants this call ran, if it chose any, as the op's latest record.
  void record() {
    std::vector<std::string> flat;
    for (const ManifestEntry& e : r_.ctx->manifest().entries())
      if (e.layer == layer_) flat.insert(flat.end(), {e.knob, e.variant, guarantee_name(e.guarantee)});
    if (flat.empty()) return;
    const int64_t now =
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
            .count();
    Latest& l = latest();
    std::lock_guard<std::mutex> lock(l.mu);
    l.by_op[op_] = {now, std::move(flat)};
  }

 private:
  static Runner& runner_of(const at::Tensor& like, bool deterministic) {
    const c10::Device d = like.device();
    if (d.is_cpu()) return torch_runner("cpu", 0, deterministic);
#ifdef DITTO_TORCH_CUDA
    if (d.is_cuda()) {
      const auto stream = reinterpret_cast<std::intptr_t>(c10::cuda::getCurrentCUDAStream(d.index()).stream());
      return torch_runner("cuda:" + std::to_string(d.index()), stream, deterministic);
    }
#endif
    C10_THROW_ERROR(ValueError, c10::str("ditto.torch: tensors on ", d, "; ditto runs on the CPU and on CUDA devices"));
  }

  Runner& r_;
  std::unique_lock<std::mutex> lock_;
  c10::Device device_;
  std::string op_, layer_;
  std::vector<at::Tensor> held_;
};

// ditto's exceptions as RuntimeErrors tagged with their type (ditto.torch raises the ditto type).
template <class F>
auto rethrowing(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const c10::Error&) {
    throw;
  } catch (const Error& e) {
    const char* type = dynamic_cast<const DataError*>(&e)     ? "DataError"
                       : dynamic_cast<const ShapeError*>(&e)  ? "ShapeError"
                       : dynamic_cast<const PolicyError*>(&e) ? "PolicyError"
                       : dynamic_cast<const IoError*>(&e)     ? "IoError"
                       : dynamic_cast<const CudnnError*>(&e)  ? "CudnnError"
                       : dynamic_cast<const CublasError*>(&e) ? "CublasError"
                       : dynamic_cast<const CudaError*>(&e)   ? "CudaError"
                                                              : "Error";
    C10_THROW_ERROR(Error, std::string("[ditto.") + type + "] " + e.what());
  }
}

// ---- pixel-wise NLL and cross-entropy (mean over the counted pixels) -------------------------------

// Both losses: the forward returns the loss and what the backward reads (cross-entropy's per-pixel
// log-sum-exp, the counted pixels), which are kept, non-differentiable, beside the input and labels.
// Loss supplies forward(c, input, labels, ignore_index) -> (loss, its kept ditto tensors) and
// backward(c, dloss, input, labels, kept, ignore_index) -> dinput.
template <class Loss>
struct PixelLoss : torch::autograd::Function<PixelLoss<Loss>> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& input, const at::Tensor& labels,
                               int64_t ignore_index, bool deterministic) {
    return rethrowing([&] {
      Call c(input, deterministic, "pixel_xent", "pixel_xent");
      const Tensor y = c.in(labels, "target");
      const auto [loss, kept] = Loss::forward(c, c.in_f32(input, "input"), y, static_cast<int>(ignore_index));
      c.record();
      variable_list out{c.out(loss, {})}, aux;
      for (const Tensor& t : kept) aux.push_back(c.out(t, {t.numel()}));
      // int64 labels are kept as the int32 labels ditto narrowed them to: the backward reads them as they are.
      variable_list saved{input, labels.scalar_type() == at::kLong ? c.out(y, labels.sizes()) : labels};
      saved.insert(saved.end(), aux.begin(), aux.end());
      ctx->save_for_backward(saved);
      ctx->saved_data["ignore_index"] = ignore_index;
      ctx->saved_data["deterministic"] = deterministic;
      ctx->mark_non_differentiable(aux);
      ctx->set_materialize_grads(false);
      out.insert(out.end(), aux.begin(), aux.end());
      return out;
    });
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list s = ctx->get_saved_variables();
    if (!grads[0].defined()) return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
    return rethrowing([&] {
      Call c(s[0], ctx->saved_data["deterministic"].toBool(), "pixel_xent", "pixel_xent");
      std::vector<Tensor> kept;
      for (size_t i = 2; i < s.size(); ++i) kept.push_back(c.in(s[i], "kept"));
      const Tensor dx = Loss::backward(c, c.in_f32(grads[0], "grad").reshape({1}), c.in_f32(s[0], "input"),
                                       c.in(s[1], "target"), kept, static_cast<int>(ctx->saved_data["ignore_index"].toInt()));
      c.record();
      return variable_list{c.out(dx, s[0].sizes()), at::Tensor(), at::Tensor(), at::Tensor()};
    });
  }
};

struct Nll {
  static std::pair<Tensor, std::vector<Tensor>> forward(Call& c, const Tensor& x, const Tensor& y, int ignore_index) {
    const PixelXentForward f = pixel_nll_forward(c.ctx(), c.layer(), x, y, ignore_index);
    return {f.loss, {f.count}};
  }
  static Tensor backward(Call& c, const Tensor& dloss, const Tensor& x, const Tensor& y, const std::vector<Tensor>& kept,
                         int ignore_index) {
    return pixel_nll_backward(c.ctx(), c.layer(), dloss, x, y, PixelXentForward{Tensor(), c.ctx().empty({0}), kept[0]},
                              ignore_index);
  }
};

struct CrossEntropy {
  static std::pair<Tensor, std::vector<Tensor>> forward(Call& c, const Tensor& x, const Tensor& y, int ignore_index) {
    const PixelXentForward f = pixel_cross_entropy_forward(c.ctx(), c.layer(), x, y, ignore_index);
    return {f.loss, {f.lse, f.count}};
  }
  static Tensor backward(Call& c, const Tensor& dloss, const Tensor& x, const Tensor& y, const std::vector<Tensor>& kept,
                         int ignore_index) {
    return pixel_cross_entropy_backward(c.ctx(), c.layer(), dloss, x, y, PixelXentForward{Tensor(), kept[0], kept[1]},
                                        ignore_index);
  }
};

// ---- index_add: source's slices summed into input's at index (the gradient a gather) ---------------

struct IndexAdd : torch::autograd::Function<IndexAdd> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, int64_t dim, const at::Tensor& index,
                            const at::Tensor& source, double alpha, bool deterministic) {
    return rethrowing([&] {
      // Rows along dim 0 (a moved view otherwise), scaled first as torch.index_add scales them.
      at::Tensor src = dim ? source.movedim(dim, 0) : source;
      if (alpha != 1) src = src * alpha;
      Call c(src, deterministic, "scatter_add", "scatter_add");
      const int64_t m = src.dim() ? src.size(0) : 0;
      c.set_layer(scatter_rows_layer(c.ctx(), m, m ? src.numel() / m : 1, input.size(dim)));
      const Tensor rows = scatter_add(c.ctx(), c.layer(), Var(c.in_f32(src, "source")), c.in(index, "index"),
                                      input.size(dim))
                              .value();
      c.record();
      const at::Tensor summed = c.out(rows);
      ctx->save_for_backward({index});
      ctx->saved_data["dim"] = dim;
      ctx->saved_data["alpha"] = alpha;
      return input + (dim ? summed.movedim(0, dim) : summed);
    });
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor index = ctx->get_saved_variables()[0];
    const double alpha = ctx->saved_data["alpha"].toDouble();
    at::Tensor dsource;  // needs_input_grad counts the tensor arguments: input 0, index 1, source 2
    if (ctx->needs_input_grad(2)) {
      dsource = grads[0].index_select(ctx->saved_data["dim"].toInt(), index);  // a gather: no collisions
      if (alpha != 1) dsource = dsource * alpha;
    }
    return {ctx->needs_input_grad(0) ? grads[0] : at::Tensor(), at::Tensor(), at::Tensor(), dsource, at::Tensor(),
            at::Tensor()};
  }
};

// ---- scatter_add along a dimension: src's values summed into input's (the gradient a gather) --------

struct ScatterAdd : torch::autograd::Function<ScatterAdd> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, int64_t dim, const at::Tensor& index,
                            const at::Tensor& src, bool deterministic) {
    return rethrowing([&] {
      Call c(src, deterministic, "scatter_add", "scatter_add");
      const Shape ishape(index.sizes().begin(), index.sizes().end()), oshape(input.sizes().begin(), input.sizes().end());
      // Layer "scatter_dim" (the policy pins the privatized scatter there) where that scatter runs this
      // geometry on this GPU; the sorted scatter of layer "scatter_add" elsewhere.
      if (scatter_dim_privatized_refusal(c.ctx(), ishape, static_cast<int>(dim), oshape).empty())
        c.set_layer("scatter_dim");
      bool wide = false;
      const Tensor words = c.in_dim_index(index, &wide);
      const Tensor summed = scatter_dim_add(c.ctx(), c.layer(), Var(c.in_f32(src, "source")), words, wide, ishape,
                                            static_cast<int>(dim), oshape)
                                .value();
      c.record();
      ctx->save_for_backward({index});
      ctx->saved_data["dim"] = dim;
      return input + c.out(summed, input.sizes());
    });
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    at::Tensor dsrc;  // needs_input_grad counts the tensor arguments: input 0, index 1, src 2
    if (ctx->needs_input_grad(2)) {
      dsrc = rethrowing([&] {
        const at::Tensor index = ctx->get_saved_variables()[0];
        // ditto's gather along dim: NaN where a value is out of range, as the forward's output already
        // is (PyTorch's gather would stop the process with a device-side assert).
        Call c(grads[0], true, "scatter_add", "scatter_add");
        bool wide = false;
        const Tensor words = c.in_dim_index(index, &wide);
        const Tensor g = gather_dim(c.ctx(), c.in_f32(grads[0], "grad"), words, wide,
                                    Shape(index.sizes().begin(), index.sizes().end()),
                                    static_cast<int>(ctx->saved_data["dim"].toInt()));
        return c.out(g, index.sizes());
      });
    }
    return {ctx->needs_input_grad(0) ? grads[0] : at::Tensor(), at::Tensor(), at::Tensor(), dsrc, at::Tensor()};
  }
};

// ---- conv2d: ditto's Winograd or cuDNN's forward, ditto's own deterministic backward ---------------------

struct Conv2d : torch::autograd::Function<Conv2d> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w, at::IntArrayRef stride,
                            at::IntArrayRef padding, at::IntArrayRef dilation, int64_t groups, bool deterministic) {
    return rethrowing([&] {
      const Conv2dParams p = conv_params(stride.vec(), padding.vec(), dilation.vec(), groups);
      Call c(x, deterministic, "conv2d",
             conv2d_layer(deterministic, Shape(x.sizes().begin(), x.sizes().end()), Shape(w.sizes().begin(), w.sizes().end()), p));
      const Tensor y = conv2d_forward(c.ctx(), c.layer(), c.in_f32(x, "input"), c.in_f32(w, "weight"), p);
      c.record();
      ctx->save_for_backward({x, w});
      ctx->saved_data["stride"] = stride.vec();
      ctx->saved_data["padding"] = padding.vec();
      ctx->saved_data["dilation"] = dilation.vec();
      ctx->saved_data["groups"] = groups;
      ctx->saved_data["deterministic"] = deterministic;
      return c.out(y);
    });
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &w = saved[1];
    const bool want_dx = ctx->needs_input_grad(0), want_dw = ctx->needs_input_grad(1);
    at::Tensor dx, dw;
    rethrowing([&] {
      const bool det = ctx->saved_data["deterministic"].toBool();
      const Conv2dParams p = conv_params(ctx->saved_data["stride"].toIntVector(), ctx->saved_data["padding"].toIntVector(),
                                         ctx->saved_data["dilation"].toIntVector(), ctx->saved_data["groups"].toInt());
      Call c(x, det, "conv2d",
             conv2d_layer(det, Shape(x.sizes().begin(), x.sizes().end()), Shape(w.sizes().begin(), w.sizes().end()), p));
      const Tensor g = c.in_f32(grads[0], "grad"), xt = c.in_f32(x, "input"), wt = c.in_f32(w, "weight");
      if (want_dx) dx = c.out(conv2d_backward_data(c.ctx(), c.layer(), g, wt, xt.shape(), p), x.sizes());
      if (want_dw) dw = c.out(conv2d_backward_filter(c.ctx(), c.layer(), xt, g, wt.shape(), p), w.sizes());
      c.record();
      return 0;
    });
    return {dx, dw, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// ---- embedding and embedding_bag: the rows' gradients scattered by ditto ---------------------------

// Indices as ditto.torch hands them to ditto: int32 and int64 as they are, other integer dtypes as int32.
at::Tensor index_of(const at::Tensor& t) {
  return t.scalar_type() == at::kInt || t.scalar_type() == at::kLong ? t : t.to(at::kInt);
}

// The forward is PyTorch's gather (one source per output: deterministic everywhere); the backward a
// scatter of the rows' gradients by ditto (sorted segment sums, or atomics).
struct Embedding : torch::autograd::Function<Embedding> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& weight, const at::Tensor& index,
                            int64_t padding_idx, bool deterministic) {
    ctx->save_for_backward({index});
    ctx->saved_data["rows"] = weight.size(0);
    ctx->saved_data["padding_idx"] = padding_idx;
    ctx->saved_data["deterministic"] = deterministic;
    return at::embedding(weight, index);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor index = ctx->get_saved_variables()[0];
    const int64_t padding_idx = ctx->saved_data["padding_idx"].toInt();
    at::Tensor grad = grads[0];
    if (padding_idx >= 0) grad = grad.masked_fill((index == padding_idx).unsqueeze(-1), 0);
    const at::Tensor dw = rethrowing([&] {
      Call c(grad, ctx->saved_data["deterministic"].toBool(), "embedding", "embedding");
      const int64_t rows = ctx->saved_data["rows"].toInt();
      const Tensor g = embedding_backward(c.ctx(), c.layer(), c.in_f32(grad, "grad"), c.in(index_of(index), "index"), rows);
      c.record();
      return c.out(g, {rows, grad.size(-1)});
    });
    return {dw, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// Per bag the rows' sum or mean in position order (ditto's kernel both ways).
struct EmbeddingBag : torch::autograd::Function<EmbeddingBag> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& weight, const at::Tensor& index,
                            const c10::optional<at::Tensor>& offsets, const std::string& mode, bool deterministic) {
    const at::Tensor idx = index_of(index), off = offsets ? index_of(*offsets) : at::Tensor();
    at::Tensor y = rethrowing([&] {
      Call c(weight, deterministic, "embedding_bag", "embedding_bag");
      const Tensor yt = embedding_bag(c.ctx(), c.layer(), Var(c.in_f32(weight, "weight")), c.in(idx, "index"),
                                      off.defined() ? c.in(off, "offsets") : Tensor(), bag_mode(mode))
                            .value();
      c.record();
      return c.out(yt);
    });
    ctx->save_for_backward({idx, off});
    ctx->saved_data["rows"] = weight.size(0);
    ctx->saved_data["mode"] = mode;
    ctx->saved_data["deterministic"] = deterministic;
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &idx = saved[0], &off = saved[1];
    const at::Tensor dw = rethrowing([&] {
      Call c(grads[0], ctx->saved_data["deterministic"].toBool(), "embedding_bag", "embedding_bag");
      const int64_t rows = ctx->saved_data["rows"].toInt();
      const Tensor g = embedding_bag_backward(c.ctx(), c.layer(), c.in_f32(grads[0], "grad"), c.in(idx, "index"),
                                              off.defined() ? c.in(off, "offsets") : Tensor(),
                                              bag_mode(ctx->saved_data["mode"].toStringRef()), rows);
      c.record();
      return c.out(g, {rows, grads[0].size(1)});
    });
    return {dw, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// ---- grid_sample (bilinear, zero padding): ditto's deterministic backward ---------------------------

// On the GPU the forward is PyTorch's own kernel (one thread per output, no reduction: deterministic,
// and faster than ditto's); on the CPU ditto's. The backward, where the atomics are, is ditto's.
struct GridSample : torch::autograd::Function<GridSample> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& grid, bool align_corners,
                            bool deterministic) {
    at::Tensor y = rethrowing([&] {
      if (x.is_cuda()) {
        Call::require_f32(x, "input");
        Call::require_f32(grid, "grid");
        return at::grid_sampler(x.contiguous(), grid.contiguous(), 0, 0, align_corners);
      }
      Call c(x, deterministic, "grid_sample", "grid_sample");
      const Tensor yt =
          grid_sample(c.ctx(), c.layer(), Var(c.in_f32(x, "input")), Var(c.in_f32(grid, "grid")), align_corners).value();
      c.record();
      return c.out(yt);
    });
    ctx->save_for_backward({x, grid});
    ctx->saved_data["align_corners"] = align_corners;
    ctx->saved_data["deterministic"] = deterministic;
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &grid = saved[1];
    const bool want_dx = ctx->needs_input_grad(0), want_dgrid = ctx->needs_input_grad(1);
    at::Tensor dx, dgrid;
    rethrowing([&] {
      Call c(x, ctx->saved_data["deterministic"].toBool(), "grid_sample", "grid_sample");
      const GridSampleGrads g =
          grid_sample_backward(c.ctx(), c.layer(), c.in_f32(grads[0], "grad"), c.in_f32(x, "input"),
                               c.in_f32(grid, "grid"), ctx->saved_data["align_corners"].toBool(), want_dx, want_dgrid);
      if (want_dx) dx = c.out(g.dx, x.sizes());
      if (want_dgrid) dgrid = c.out(g.dgrid, grid.sizes());
      c.record();
      return 0;
    });
    return {dx, dgrid, at::Tensor(), at::Tensor()};
  }
};

std::tuple<at::Tensor, at::Tensor> pixel_nll(const at::Tensor& log_probs, const at::Tensor& labels,
                                             int64_t ignore_index, bool deterministic) {
  const variable_list out = PixelLoss<Nll>::apply(log_probs, labels, ignore_index, deterministic);
  return {out[0], out[1]};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> pixel_cross_entropy(const at::Tensor& logits, const at::Tensor& labels,
                                                                   int64_t ignore_index, bool deterministic) {
  const variable_list out = PixelLoss<CrossEntropy>::apply(logits, labels, ignore_index, deterministic);
  return {out[0], out[1], out[2]};
}

at::Tensor index_add(const at::Tensor& input, int64_t dim, const at::Tensor& index, const at::Tensor& source,
                     double alpha, bool deterministic) {
  return IndexAdd::apply(input, dim, index, source, alpha, deterministic);
}

at::Tensor scatter_add(const at::Tensor& input, int64_t dim, const at::Tensor& index, const at::Tensor& src,
                       bool deterministic) {
  return ScatterAdd::apply(input, dim, index, src, deterministic);
}

at::Tensor conv2d(const at::Tensor& x, const at::Tensor& w, at::IntArrayRef stride, at::IntArrayRef padding,
                  at::IntArrayRef dilation, int64_t groups, bool deterministic) {
  return Conv2d::apply(x, w, stride, padding, dilation, groups, deterministic);
}

at::Tensor embedding_op(const at::Tensor& weight, const at::Tensor& index, int64_t padding_idx, bool deterministic) {
  return Embedding::apply(weight, index, padding_idx, deterministic);
}

at::Tensor embedding_bag_op(const at::Tensor& weight, const at::Tensor& index, const c10::optional<at::Tensor>& offsets,
                            c10::string_view mode, bool deterministic) {
  return EmbeddingBag::apply(weight, index, offsets, std::string(mode), deterministic);
}

at::Tensor grid_sample_op(const at::Tensor& x, const at::Tensor& grid, bool align_corners, bool deterministic) {
  return GridSample::apply(x, grid, align_corners, deterministic);
}

// Every op's latest record: "op\tnanoseconds\tknob\tvariant\tguarantee[\tknob\tvariant\tguarantee...]".
std::vector<std::string> latest_variants() {
  Latest& l = latest();
  std::lock_guard<std::mutex> lock(l.mu);
  std::vector<std::string> rows;
  for (const auto& [op, record] : l.by_op) {
    std::string row = op + "\t" + std::to_string(record.first);
    for (const std::string& f : record.second) row += "\t" + f;
    rows.push_back(std::move(row));
  }
  return rows;
}

}  // namespace
}  // namespace ditto::py

TORCH_LIBRARY(ditto_native, m) {
  m.def("pixel_nll(Tensor log_probs, Tensor labels, int ignore_index, bool deterministic) -> (Tensor, Tensor)");
  m.def("pixel_cross_entropy(Tensor logits, Tensor labels, int ignore_index, bool deterministic) -> "
        "(Tensor, Tensor, Tensor)");
  m.def("index_add(Tensor input, int dim, Tensor index, Tensor source, float alpha, bool deterministic) -> Tensor");
  m.def("scatter_add(Tensor input, int dim, Tensor index, Tensor src, bool deterministic) -> Tensor");
  m.def("conv2d(Tensor x, Tensor w, int[] stride, int[] padding, int[] dilation, int groups, bool deterministic) -> "
        "Tensor");
  m.def("grid_sample(Tensor x, Tensor grid, bool align_corners, bool deterministic) -> Tensor");
  m.def("embedding(Tensor weight, Tensor index, int padding_idx, bool deterministic) -> Tensor");
  m.def("embedding_bag(Tensor weight, Tensor index, Tensor? offsets, str mode, bool deterministic) -> Tensor");
  m.def("latest_variants() -> str[]", &ditto::py::latest_variants);
}

// CompositeImplicitAutograd: one kernel for every device, whose autograd function records the graph.
TORCH_LIBRARY_IMPL(ditto_native, CompositeImplicitAutograd, m) {
  m.impl("pixel_nll", &ditto::py::pixel_nll);
  m.impl("pixel_cross_entropy", &ditto::py::pixel_cross_entropy);
  m.impl("index_add", &ditto::py::index_add);
  m.impl("scatter_add", &ditto::py::scatter_add);
  m.impl("conv2d", &ditto::py::conv2d);
  m.impl("grid_sample", &ditto::py::grid_sample_op);
  m.impl("embedding", &ditto::py::embedding_op);
  m.impl("embedding_bag", &ditto::py::embedding_bag_op);
}
