// Spatial batch normalization: one mean and variance per channel, over N, H, W. x is f32 NCHW, or
// channels-last (Layout::Nhwc) in any float dtype: a native bf16/f16 convolution result read as it
// is (kernels/conv2d.h's output knob), its statistics, sums and running statistics in float, y and
// dx rounded once to x's dtype in x's layout (kernels/batchnorm_nhwc.cu; cuDNN gets descriptors of
// that dtype and layout). bf16/f16 NCHW x is refused on the GPU (no kernel reads it), and so is
// anything but f32 by synchronized batch norm. The CPU reference widens x to f32 NCHW (exact) and
// rounds y and dx where the GPU does.
//
// Training (training = true): x is normalized with the batch mean and the BIASED batch variance;
// the caller's running statistics are updated in place with the UNBIASED variance, as PyTorch
// and cuDNN do (M = N*H*W values per channel; training needs M > 1):
//   running_mean = (1 - momentum) * running_mean + momentum * batch_mean
//   running_var  = (1 - momentum) * running_var  + momentum * batch_var * M / (M - 1)
// Inference (training = false): the running statistics normalize x and are left alone.
// y = (x - mean) / sqrt(var + eps) * gamma + beta.
//
// The kernels are chosen per layer by the knob batchnorm.bwd (declared in batchnorm.cpp):
//   cudnn          cudnnBatchNormalizationForwardTraining / ForwardInference / Backward
//                  (CUDNN_BATCHNORM_SPATIAL, exponentialAverageFactor = momentum; the saved mean
//                  and inverse std of the forward feed the backward). Determinism: Unknown —
//                  cuDNN's reproducibility notes do not list these routines among those that use
//                  atomics, but the list is given "for example", so no guarantee is documented.
//                  Guarantee unknown.
//   atomic         ditto's kernels. Forward statistics are one fixed-order pass (per-thread
//                  moments merged with Chan's pairwise update by cub::BlockReduce, then one block
//                  per channel merges the partials the same way: deterministic). Backward reduces dbeta = sum dy and
//                  dgamma = sum dy*xhat (dx needs both) with one atomicAdd per warp: NOT
//                  deterministic (not_guaranteed).
//   deterministic  ditto's kernels; the backward reductions use the same fixed-order scheme as
//                  the forward statistics, on a grid that depends on the shape alone:
//                  gpu_to_gpu (engine/manifest.h).
// For bf16/f16 channels-last x a mode word's cudnn runs the deterministic kernels (PyTorch's own
// batch norm runs there, not cuDNN's; cuDNN's legacy routines are 20x slower on NHWC bf16), recorded
// as such; a pinned cudnn runs cuDNN.
// In inference mode the backward treats the running statistics as constants
// (dx = gamma * dy / sqrt(running_var + eps)); cuDNN has no such backward, so there the
// deterministic kernels run: a layer PINNED to cudnn throws PolicyError (when a gradient is
// needed), a mode word ("heuristic", "fastest") that resolved to cudnn is recorded as what ran
// ("deterministic").
// The manifest gets (layer, "batchnorm", "bwd") at forward and again when the backward runs. On
// a CPU context the CPU reference runs (deterministic); its entry reads variant "cpu-reference".
// Backward contributions go to accumulate_grad (gradients accumulate).
#pragma once
#include <string>

#include "engine/context.h"
#include "engine/tape.h"
#include "engine/knob.h"

namespace ditto {

namespace op { inline constexpr OpKind batchnorm{"batchnorm"}; }

// Knob batchnorm.bwd (kernels/batchnorm.cpp), also read by synchronized batch norm.
enum class BnBwd { Cudnn, Atomic, Deterministic };
const KnobSpec& bn_bwd_knob();
const char* name_of(BnBwd b);
inline const char* knob_name(BnBwd) { return "bwd"; }
// Knob batchnorm.stats (kernels/batchnorm.cpp): whose batch statistics normalize in training mode.
//   local  the examples this call sees: one rank's share, or one example group's, in a
//          data-parallel run (PyTorch DDP's BatchNorm2d)
//   sync   every rank's examples together (PyTorch's SyncBatchNorm, kernels/sync_batchnorm.h):
//          needs the rank group a data-parallel run gives the context (set_batch_norm_group)
// Both are ditto's fixed-order reductions; sync's bits follow the rank count.
enum class BnStats { Local, Sync };
const KnobSpec& bn_stats_knob();
const char* name_of(BnStats s);
inline const char* knob_name(BnStats) { return "stats"; }
namespace detail {
// The manifest entry of a training-mode call's stats knob (batch_norm and sync_batch_norm).
void record_bn_stats(Context& ctx, const std::string& layer, BnStats s);
}  // namespace detail

// Per-channel running statistics, owned by the caller (a network keeps one per layer) and
// updated in place by training-mode forwards. Both f32 of shape {C} on the context's device.
struct BatchNormState {
  Tensor running_mean, running_var;
};

// Fresh state for `channels` channels: running_mean = 0, running_var = 1 (PyTorch's start).
BatchNormState batch_norm_state(Context& ctx, int64_t channels);

Var batch_norm(Context& ctx, const std::string& layer, const Var& x, const Var& gamma, const Var& beta,
               BatchNormState& state, bool training, float momentum = 0.1f, float eps = 1e-5f);

}  // namespace ditto
