// Bias addition for convolution and fully connected layers: y = x + b, b broadcast over the batch
// and the spatial positions. x is {N, C} or {N, C, H, W}; b is {C}.
//
// `kind` is the owning layer's kind (op::conv2d or op::linear) and `layer` its name: the
// policy knob `bias_bwd` and the manifest entry belong to that layer (op "conv2d" / "linear").
//
// Forward: one thread per element, deterministic.
// Backward: dx = dy (a fresh copy); db[c] = sum of dy over N and the spatial positions, by the
// layer's BiasBwd variant:
//   atomic         per-warp partial sums added into db[c] with atomicAdd, in the order the warps
//                  happen to finish: NOT deterministic (Determinism no, not_guaranteed).
//   deterministic  per-block partial sums (a fixed set of elements per thread, then
//                  cub::BlockReduce) into a workspace, then one block per channel adds the
//                  partials with cub::BlockReduce: bit-reproducible for a given shape on any GPU
//                  (Determinism yes, gpu_to_gpu: engine/manifest.h).
//   cudnn          cudnnConvolutionBackwardBias; 4-D x only (a PolicyError otherwise, naming the
//                  layer and shape and listing atomic and deterministic). cuDNN documents its
//                  routines as bit-reproducible on one architecture except a listed few, which do
//                  not include this one (Determinism yes, run_to_run).
// Channels-last x of any float dtype (a native convolution result, kernels/conv2d.h): y = x + b
// rounded once to x's dtype in x's layout; db in float, the deterministic variant over fixed row
// ranges of the N*H*W x C matrix the memory is, then the partials in order (kernels/bias.cu); cudnn
// gets descriptors of dy's dtype and layout. bf16/f16 NCHW x is refused on the GPU.
// The policy is resolved at the forward call, so a misconfigured layer fails there.
// On the CPU the double-accumulating reference runs and the manifest records variant "reference".
#pragma once
#include <string>

#include "engine/context.h"
#include "engine/policy.h"
#include "engine/tape.h"
#include "engine/knob.h"
#include "kernels/conv2d.h"
#include "kernels/linear.h"

namespace ditto {

// Knob bias_bwd of conv2d and linear layers (declared in kernels/bias.cpp, the family that runs
// it): the bias gradient's reduction over every position. Linear layers have no cudnn variant.
enum class BiasBwd { Atomic, Deterministic, Cudnn };
const KnobSpec& conv_bias_bwd_knob();
const KnobSpec& linear_bias_bwd_knob();
const char* name_of(BiasBwd b);
inline const char* knob_name(BiasBwd) { return "bias_bwd"; }

Var bias_add(Context& ctx, const std::string& layer, OpKind kind, const Var& x, const Var& b);

}  // namespace ditto
