// ReLU. Forward and backward are elementwise (one thread per element): deterministic.
#pragma once
#include "engine/context.h"
#include "engine/tape.h"

namespace ditto {

Var relu(Context& ctx, const Var& x);

}  // namespace ditto
