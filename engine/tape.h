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

struct VarNode {
  Tensor value;
  Tensor grad;  // undefined until a gradient reaches it
  bool requires_grad = false;
};

class Var {
 public:
  Var() = default;
  explicit Var(Tensor value, bool requires_grad = false);
  bool defined() const { return node_ != nullptr; }
  Tensor& value() const;
  Tensor& grad() const;
  bool requires_grad() const { return node_ && node_->requires_grad; }
  const Shape& shape() const { return value().shape(); }
  void zero_grad() const;  // drops the gradient; the next contribution overwrites
  VarNode* node() const { return node_.get(); }

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
  // are kept for the tracer (the closure holds its own references for the gradients).
  void record(std::string op, std::string layer, std::vector<TapeInput> inputs, Var output, BackwardFn fn);
  // Seeds root's gradient (ones of root's shape when seed is undefined), runs every recorded
  // closure in reverse order, then clears the tape.
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
    std::vector<TapeInput> inputs;
    Var output;
    BackwardFn fn;
  };
  void run_traced(Context& ctx, Entry& e);
  std::vector<Entry> entries_;
  Tracer* tracer_ = nullptr;
};

// True when ctx records gradients and any input requires one.
bool needs_grad(const Context& ctx, std::initializer_list<const Var*> inputs);

// Adds a gradient contribution into v's gradient (moved in when v has none). No-op when v
// does not require grad. The contribution must be a fresh tensor the caller gives up.
void accumulate_grad(Context& ctx, const Var& v, Tensor contribution);

}  // namespace ditto
