// Softmax cross-entropy, fused: L = mean over the batch of (logsumexp(logits_i) - logits_i[label_i]).
//
// logits is {N, C} f32; labels is {N} i32 on the same device. Returns a {1} tensor. Each row's
// log-sum-exp subtracts the row maximum first, so no exponential overflows.
// Backward: dlogits = (softmax(logits) - onehot(labels)) * dL / N, with dL read from out's gradient
// on the device (no host copy). One thread per element: deterministic.
//
// The batch reduction of the per-example losses is the policy knob `reduce` (op "softmax_xent"):
//   atomic         each example atomicAdds loss_i / N into the output, in the order the warps happen
//                  to finish: NOT deterministic (Determinism no, not_guaranteed). The default, as in
//                  frameworks.
//   deterministic  per-example losses into a workspace, then one block adds them in a fixed order
//                  (fixed per-thread strides, then cub::BlockReduce) and divides by N: the same
//                  bits for a given N on any GPU (gpu_to_gpu, engine/manifest.h).
//
// Labels outside [0, C): on the CPU a DataError naming the example index and the label. The GPU
// path cannot check without a host copy, so it makes that example's loss NaN (hence the mean is
// NaN) and that example's dlogits row NaN: the fault is visible, never silently trained on.
// On the CPU the double-accumulating reference runs; the manifest records variant "reference".
#pragma once
#include <string>

#include "engine/context.h"
#include "engine/tape.h"
#include "engine/knob.h"
#include "kernels/reduction.h"

namespace ditto {

namespace op { inline constexpr OpKind softmax_xent{"softmax_xent"}; }

Var softmax_cross_entropy(Context& ctx, const std::string& layer, const Var& logits, const Tensor& labels);

}  // namespace ditto
