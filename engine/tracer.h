// Tracer: an observer of every op a training step runs, the basis of the noise lab's search
// for the first op whose output differs between two runs. When a context has one, the tape
// reports each op's forward output as it is recorded and, during backward, each closure's
// inputs (the upstream gradient, the saved forward values, any gradient already accumulated)
// and outputs (the accumulated gradients); the trainer reports the data and the optimizer
// updates. A tracer only reads tensors, after the work that made them, on the same stream, so
// a traced run computes exactly the bits an untraced one does.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "engine/tensor.h"

namespace ditto {

struct TracedTensor {
  std::string name;      // "x", "w", "y", "dy", "dx", "dw", "w_before", ...
  const Tensor* tensor;  // valid only during the call
};

class Tracer {
 public:
  virtual ~Tracer() = default;
  // A training step begins (1-based); events until the next call belong to it.
  virtual void begin_step(int64_t step) = 0;
  // phase: "data" | "fwd" | "bwd" | "update". layer is "" for ops without a layer name (ReLU,
  // adds, global pooling); tracers name those by order.
  virtual void event(const std::string& phase, const std::string& layer, const std::string& op,
                     const std::vector<TracedTensor>& inputs, const std::vector<TracedTensor>& outputs) = 0;
};

}  // namespace ditto
