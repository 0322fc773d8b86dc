// Pixel-wise softmax cross-entropy with mean reduction: the segmentation loss, PyTorch's
// F.cross_entropy(logits, labels, ignore_index=..., reduction="mean") on N,C,H,W logits (log_softmax
// then nll_loss2d), fused:
//   L = sum over pixels p with labels[p] != ignore_index of (logsumexp_c logits[n, c, h, w] -
//       logits[n, labels[p], h, w]) / (the number of such pixels)
// logits {N, C, H, W} f32, labels {N, H, W} i32 on the context's device; returns {1}. Each pixel's
// log-sum-exp subtracts the pixel's maximum first. Every pixel ignored: L = NaN (0/0, as PyTorch)
// and the gradient is zero.
// Backward: dlogits = (softmax - onehot(label)) * dL / count at counted pixels, 0 at ignored ones:
// one thread per logit, deterministic.
//
// The reduction over pixels is the knob `reduce` of op kind pixel_xent:
//   atomic         each warp's sum of pixel losses is atomicAdded into the output in the order warps
//                  arrive, then divided by the count: NOT deterministic (Determinism no,
//                  not_guaranteed). What PyTorch's nll_loss2d forward does (per-block atomicAdd).
//   deterministic  per-block sums in a fixed order, then one block adds the partials
//                  (kernels/detail/fixed_sum.cuh): the block count depends on N*H*W alone, so the same
//                  bits for a given shape on any GPU (Determinism yes, gpu_to_gpu).
// The pixel count is an integer atomicAdd in both: exact, whatever the order.
//
// Labels neither in [0, C) nor the ignore index: on the CPU a DataError naming the pixel (n, h, w)
// and the label. The GPU cannot check without a host copy: that pixel's loss is NaN (so L is NaN)
// and its dlogits are NaN. On the CPU the double-accumulating reference runs (manifest variant
// "cpu-reference").
#pragma once
#include <string>

#include "engine/context.h"
#include "engine/tape.h"
#include "engine/knob.h"
#include "kernels/reduction.h"

namespace ditto {

namespace op { inline constexpr OpKind pixel_xent{"pixel_xent"}; }

Var pixel_cross_entropy(Context& ctx, const std::string& layer, const Var& logits, const Tensor& labels,
                        int ignore_index = -100);

// The two passes on plain tensors (no tape), for callers that keep the forward's results themselves
// (ditto.torch's autograd formula): pixel_cross_entropy runs exactly these. What the forward leaves
// for the backward: the loss {1}; each pixel's log-sum-exp {N*H*W} (empty {0} on the CPU, whose
// reference recomputes it); the number of counted pixels, {1} i32.
struct PixelXentForward {
  Tensor loss, lse, count;
};
PixelXentForward pixel_cross_entropy_forward(Context& ctx, const std::string& layer, const Tensor& logits,
                                             const Tensor& labels, int ignore_index = -100);
// dlogits for the loss's upstream gradient dloss {1}, from the forward's results `saved`.
Tensor pixel_cross_entropy_backward(Context& ctx, const std::string& layer, const Tensor& dloss, const Tensor& logits,
                                    const Tensor& labels, const PixelXentForward& saved, int ignore_index = -100);

// Pixel-wise NLL with mean reduction, PyTorch's F.nll_loss(log_probs, labels, ignore_index=...,
// reduction="mean") on N,C,H,W log-probabilities (any values; they are read, not normalized):
//   L = -sum over counted pixels of log_probs[n, labels[p], h, w] / (the number of counted pixels)
// The same `reduce` knob (op kind pixel_xent), label rules and NaN cases as the cross-entropy. Backward:
// dlog_probs = -dL / count at each counted pixel's label channel, 0 everywhere else: one thread per
// element, no reduction, deterministic. The forward's `lse` is empty {0} (there is none).
Var pixel_nll(Context& ctx, const std::string& layer, const Var& log_probs, const Tensor& labels,
              int ignore_index = -100);
PixelXentForward pixel_nll_forward(Context& ctx, const std::string& layer, const Tensor& log_probs,
                                   const Tensor& labels, int ignore_index = -100);
Tensor pixel_nll_backward(Context& ctx, const std::string& layer, const Tensor& dloss, const Tensor& log_probs,
                          const Tensor& labels, const PixelXentForward& saved, int ignore_index = -100);

}  // namespace ditto
