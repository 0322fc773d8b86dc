// Sum and mean of all elements of a tensor, to a {1} tensor (a loss's batch reduction, a global
// statistic). The reduction is the knob `reduce` of op kind reduce:
//   atomic         each warp's sum is atomicAdded into the output in the order warps arrive: NOT
//                  deterministic (Determinism no, not_guaranteed); a mean is divided afterwards.
//   deterministic  per-block sums in a fixed order (each thread a fixed strided set of elements, then
//                  cub::BlockReduce), then one block adds the at most 1024 partials the same way: the
//                  number of blocks depends on the element count alone, so the same bits for a given
//                  shape on any GPU (Determinism yes, gpu_to_gpu). kernels/detail/fixed_sum.cuh.
// The CPU adds in double in index order (variant "cpu-reference" in the manifest).
// The mean of an empty tensor is NaN (0/0, as PyTorch's); its sum is 0.
// Backward: dx = dy (sum) or dy / numel (mean) everywhere: one thread per element, deterministic.
#pragma once
#include <string>
#include <vector>

#include "engine/context.h"
#include "engine/tape.h"
#include "engine/knob.h"

namespace ditto {

namespace op { inline constexpr OpKind reduce{"reduce"}; }

// Knob `reduce` of the ops that sum many terms into few (softmax_xent in kernels/loss.cpp,
// pixel_xent, and reduce here): atomicAdd, or ditto's fixed-order tree; the whole-tensor reduce
// also CUB's two-pass cub::DeviceReduce::Sum, whose grid follows the SM count (the same bits on
// one GPU model, run_to_run, as CUB documents it).
enum class Reduction { Atomic, Deterministic, Cub };
const KnobSpec& reduce_knob();
const char* name_of(Reduction r);
inline const char* knob_name(Reduction) { return "reduce"; }
// The knob's variants, in Reduction's order, for every family that registers a reduce knob.
std::vector<VariantSpec> reduction_variants();

Var reduce_sum(Context& ctx, const std::string& layer, const Var& x);
Var reduce_mean(Context& ctx, const std::string& layer, const Var& x);

}  // namespace ditto
