// Named parameters and buffers: what optimizers update and checkpoints store.
#pragma once
#include <string>

#include "engine/tape.h"

namespace ditto {

struct Param {
  std::string name;  // "conv1.weight"
  Var var;
};

struct Buffer {
  std::string name;  // "bn1.running_mean", "conv1.weight.exp_avg": saved, not trained
  Tensor* tensor;
};

}  // namespace ditto
