// Autodiff: variables and the tape.
//
// A Var is a shared handle to a value and its gradient. Ops that see an input with
// requires_grad (and a context with grad enabled) record a closure on the context's tape;
// Tape::backward runs the closures in reverse order of recording. Gradients ACCUMULATE: a
// contribution is added to an existing gradient (fan-out, or several backward passes before
// zero_grad) and moved in where there is none.
//
// Each recorded op names its inputs and its output, so a Tracer set on the tape (see
// engine/tracer.h) can observe every forward output and every backward closure.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/tensor.h"

namespace ditto {

class Context;

// The gradient half of a Var: what backward closures write into. A closure that routes
// gradients through GradRefs (not Vars) does not keep the forward value alive, so an activation
// no backward needs goes back to the pool once the forward has passed it.
struct GradSlot {
  Tensor grad;  // undefined until a gradient reaches it
  bool requires_grad = false;
  Shape shape;  // the value's shape, dtype and layout: a gradient must have all three (accumulate_grad)
  DType dtype = DType::F32;
  Layout layout = Layout::Nchw;
};

struct VarNode {
  Tensor value;
  std::shared_ptr<GradSlot> slot;
};

class GradRef {
 public:
  GradRef() = default;
  explicit GradRef(std::shared_ptr<GradSlot> slot) : slot_(std::move(slot)) {}
  bool defined() const { return slot_ != nullptr; }
  bool requires_grad() const { return slot_ && slot_->requires_grad; }
  Tensor& grad() const;          // throws Error when undefined
  const Shape& shape() const;    // likewise
  const GradSlot& slot() const;  // likewise

 private:
  std::shared_ptr<GradSlot> slot_;
};

class Var {
 public:
  Var() = default;
  explicit Var(Tensor value, bool requires_grad = false);
  bool defined() const { return node_ != nullptr; }
  Tensor& value() const;
  Tensor& grad() const;
  bool requires_grad() const { return node_ && node_->slot->requires_grad; }
  const Shape& shape() const { return value().shape(); }
  void zero_grad() const;  // drops the gradient; the next contribution overwrites
  VarNode* node() const { return node_.get(); }
  // The gradient half alone (see GradSlot): what a backward closure captures to route gradients.
  GradRef grad_ref() const;

 private:
  std::shared_ptr<VarNode> node_;
};

using BackwardFn = std::function<void(Context&)>;

class Tracer;

// One named input of a recorded op ("x", "w", "b", "gamma", ...).
struct TapeInput {
  const char* name;
  Var var;
};

class Tape {
 public:
  // Records op's backward closure. inputs and output are what the op read and produced; they
  // are kept only while a tracer is set (it reports them), so without one the tape holds just
  // the closures, and a closure holds just what its backward reads.
  void record(std::string op, std::string layer, std::vector<TapeInput> inputs, Var output, BackwardFn fn);
  // Seeds root's gradient (ones of root's shape, dtype and layout when seed is undefined; a given
  // seed must have all three), runs every recorded closure in reverse order, then clears the tape.
  void backward(Context& ctx, const Var& root, Tensor seed = {});
  void clear() { entries_.clear(); }
  std::size_t size() const { return entries_.size(); }
  std::vector<std::string> op_names() const;  // "layer:op" in recording order

  // The caller keeps the tracer alive while it is set; nullptr switches tracing off.
  void set_tracer(Tracer* t) { tracer_ = t; }
  Tracer* tracer() const { return tracer_; }

 private:
  struct Entry {
    std::string op, layer;
    std::vector<TapeInput> inputs;  // only when recorded under a tracer
    Var output;                     // likewise
    BackwardFn fn;
  };
  void run_traced(Context& ctx, Entry& e);
  std::vector<Entry> entries_;
  Tracer* tracer_ = nullptr;
};

// True when ctx records gradients and any input requires one.
bool needs_grad(const Context& ctx, std::initializer_list<const Var*> inputs);

// Adds a gradient contribution into v's gradient (moved in when v has none). No-op when v
// does not require grad. The contribution must be a fresh tensor the caller gives up, of the
// value's shape, dtype and layout (a ShapeError names both otherwise: a bf16 channels-last value's
// gradient is bf16 channels-last, kernels/conv2d.h's output knob).
void accumulate_grad(Context& ctx, const GradRef& v, Tensor contribution);
void accumulate_grad(Context& ctx, const Var& v, Tensor contribution);

// The gradient into which a backward kernel may add a contribution of this dtype and layout itself
// (in the launch that computes it) instead of handing a fresh tensor to accumulate_grad: v's gradient
// when v requires one and it is already there, float32, of v's shape and of that layout. For float32,
// the kernel's `g + c` rounded once per element is what accumulate_grad's add_inplace computes, so the
// bits are the same. nullptr otherwise (no gradient yet: accumulate_grad moves the contribution in;
// bf16 or fp16; another layout): the caller accumulates through accumulate_grad. What the kernel must
// still ensure is its own: no two adds into one gradient in one launch, no read of memory it writes.
Tensor* grad_to_add_into(const GradRef& v, DType dtype, Layout layout);

// The upstream gradient of an op whose backward hands it on unchanged to one input (add, bias,
// flatten): moved out of `out` — its producer's closure is the last reader of it, and nothing
// later may alias the tensor it passes on — or copied while a tracer is set (it reports dy after
// the closure has run). After backward, such an intermediate Var's gradient is gone, as a
// non-leaf tensor's is in PyTorch.
Tensor pass_grad(Context& ctx, const GradRef& out);

}  // namespace ditto
