#include "engine/tape.h"

#include <fmt/format.h>

#include "engine/context.h"
#include "engine/error.h"
#include "engine/tracer.h"
#include "engine/tensor_ops.h"

namespace ditto {

Var::Var(Tensor value, bool requires_grad) : node_(std::make_shared<VarNode>()) {
  node_->slot = std::make_shared<GradSlot>();
  node_->slot->requires_grad = requires_grad;
  node_->slot->shape = value.shape();
  node_->slot->dtype = value.dtype();
  node_->slot->layout = value.layout();
  node_->value = std::move(value);
}

Tensor& Var::value() const {
  if (!node_) throw Error("use of an undefined Var");
  return node_->value;
}

Tensor& Var::grad() const {
  if (!node_) throw Error("use of an undefined Var");
  return node_->slot->grad;
}

void Var::zero_grad() const {
  if (node_) node_->slot->grad = Tensor();
}

GradRef Var::grad_ref() const {
  if (!node_) throw Error("use of an undefined Var");
  return GradRef(node_->slot);
}

Tensor& GradRef::grad() const {
  if (!slot_) throw Error("use of an undefined GradRef");
  return slot_->grad;
}

const Shape& GradRef::shape() const {
  if (!slot_) throw Error("use of an undefined GradRef");
  return slot_->shape;
}

const GradSlot& GradRef::slot() const {
  if (!slot_) throw Error("use of an undefined GradRef");
  return *slot_;
}

void Tape::record(std::string op, std::string layer, std::vector<TapeInput> inputs, Var output, BackwardFn fn) {
  if (!tracer_) {
    entries_.push_back({std::move(op), std::move(layer), {}, Var(), std::move(fn)});
    return;
  }
  std::vector<TracedTensor> in;
  for (const auto& i : inputs) in.push_back({i.name, &i.var.value()});
  tracer_->event("fwd", layer, op, in, {{"y", &output.value()}});
  entries_.push_back({std::move(op), std::move(layer), std::move(inputs), std::move(output), std::move(fn)});
}

void Tape::run_traced(Context& ctx, Entry& e) {
  // Inputs of a backward closure: the upstream gradient, the forward values it reads, and any
  // gradient already accumulated into an input (fan-out), since the closure adds to it.
  if (!e.output.grad().defined()) return e.fn(ctx);  // nothing flows back through this op
  std::vector<TracedTensor> in{{"dy", &e.output.grad()}};
  std::vector<std::string> acc_names, grad_names;
  for (const auto& i : e.inputs) in.push_back({i.name, &i.var.value()});
  std::vector<Tensor> before;  // copies: the closure adds into the accumulated gradient in place
  for (const auto& i : e.inputs)
    if (i.var.requires_grad() && i.var.grad().defined()) {
      acc_names.push_back(fmt::format("d{}_acc", i.name));
      before.push_back(ctx.to_device(i.var.grad()));
    }
  for (std::size_t k = 0; k < before.size(); ++k) in.push_back({acc_names[k], &before[k]});
  e.fn(ctx);
  std::vector<TracedTensor> out;
  for (const auto& i : e.inputs) grad_names.push_back(fmt::format("d{}", i.name));
  for (std::size_t k = 0; k < e.inputs.size(); ++k)
    if (e.inputs[k].var.requires_grad() && e.inputs[k].var.grad().defined())
      out.push_back({grad_names[k], &e.inputs[k].var.grad()});
  tracer_->event("bwd", e.layer, e.op, in, out);
}

void Tape::backward(Context& ctx, const Var& root, Tensor seed) {
  if (!root.defined()) throw Error("backward from an undefined Var");
  if (!root.requires_grad())
    throw Error("backward from a Var that does not require grad (nothing recorded it, or no-grad scope)");
  // A caller's seed is copied: closures may hand the gradient on in place (pass_grad), and the
  // caller's tensor must not change under it.
  seed = seed.defined() ? ctx.to_device(seed)
                        : to_form(ctx, ctx.full(root.shape(), 1.0f), root.value().dtype(), root.value().layout());
  if (seed.shape() != root.shape())
    throw ShapeError(fmt::format("backward seed shape {} != root shape {}", shape_str(seed.shape()),
                                 shape_str(root.shape())));
  try {
    accumulate_grad(ctx, root, std::move(seed));
  } catch (...) {
    entries_.clear();  // a refused seed ends this backward as a failed closure would
    throw;
  }
  // Closures may record nothing (grad is disabled while they run): backward is not itself
  // differentiated.
  bool prev = ctx.grad_enabled();
  ctx.set_grad_enabled(false);
  try {
    for (auto it = entries_.rbegin(); it != entries_.rend(); ++it) {
      if (tracer_ && it->output.defined())
        run_traced(ctx, *it);
      else
        it->fn(ctx);
      // Nothing later reads this entry: drop its closure (and the activations it saved) and its
      // references to the output and inputs, so an intermediate value and its gradient go back
      // to the pool as soon as the last entry that needs them has run, as in PyTorch, instead of
      // all of them living until the end of backward.
      *it = Entry{};
    }
  } catch (...) {
    ctx.set_grad_enabled(prev);
    entries_.clear();
    throw;
  }
  ctx.set_grad_enabled(prev);
  entries_.clear();
}

std::vector<std::string> Tape::op_names() const {
  std::vector<std::string> out;
  for (const auto& e : entries_) out.push_back(e.layer + ":" + e.op);
  return out;
}

bool needs_grad(const Context& ctx, std::initializer_list<const Var*> inputs) {
  if (!ctx.grad_enabled()) return false;
  for (const Var* v : inputs)
    if (v && v->requires_grad()) return true;
  return false;
}

void accumulate_grad(Context& ctx, const GradRef& v, Tensor contribution) {
  if (!v.requires_grad() || !contribution.defined()) return;
  if (contribution.shape() != v.shape())
    throw ShapeError(fmt::format("gradient shape {} does not match variable shape {}",
                                 shape_str(contribution.shape()), shape_str(v.shape())));
  const GradSlot& slot = v.slot();
  if (contribution.dtype() != slot.dtype || contribution.layout() != slot.layout)
    throw ShapeError(fmt::format("gradient {} {} does not match the variable's {} (a gradient comes in its "
                                 "variable's dtype and layout)",
                                 contribution.type_tag(), shape_str(contribution.shape()),
                                 type_tag(slot.dtype, slot.layout)));
  Tensor& g = v.grad();
  if (!g.defined())
    g = std::move(contribution);
  else
    add_inplace(ctx, g, contribution);
}

Tensor* grad_to_add_into(const GradRef& v, DType dtype, Layout layout) {
  if (!v.requires_grad() || dtype != DType::F32) return nullptr;
  Tensor& g = v.grad();
  if (!g.defined() || g.dtype() != DType::F32 || g.layout() != layout || g.shape() != v.shape()) return nullptr;
  return &g;
}

void accumulate_grad(Context& ctx, const Var& v, Tensor contribution) {
  if (!v.defined()) return;
  accumulate_grad(ctx, v.grad_ref(), std::move(contribution));
}

Tensor pass_grad(Context& ctx, const GradRef& out) {
  if (ctx.tape().tracer()) return ctx.to_device(out.grad());
  return std::move(out.grad());
}

}  // namespace ditto
