// The math knob of the layers whose GEMMs can run on tensor cores (conv2d.math in
// kernels/conv2d.cpp, linear.math in kernels/linear.cpp): fma computes in fp32 with FMA units;
// tf32 rounds inputs to TF32 for tensor cores and accumulates in fp32. The knob decides where the
// op rounds, not the order it sums in: what the op's algorithm promises holds under either, and no
// mode word changes precision (every mode picks fma).
#pragma once
#include <vector>

#include "engine/knob.h"

namespace ditto {

enum class MathMode { Fma, Tf32 };
const char* name_of(MathMode m);
inline const char* knob_name(MathMode) { return "math"; }
// The knob's variants, in MathMode's order, for every family that registers a math knob.
std::vector<VariantSpec> math_mode_variants();

}  // namespace ditto
