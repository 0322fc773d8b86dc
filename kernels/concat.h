// Channel ops on NCHW tensors for the model zoo: concatenation along channels (DenseNet,
// Inception) and the channel-wise broadcast multiply of squeeze-and-excitation.
//
// concat_channels: inputs (N, C_i, H, W), same N, H, W -> (N, sum C_i, H, W), input i in
// channels [C_0 + ... + C_{i-1}, ... + C_i). Forward and backward are copies, one thread per
// element, no reductions: deterministic. Backward slices dy back into each input that requires
// a gradient.
//
// channel_mul: y = x * s, x (N, C, H, W), s (N, C) or (N, C, 1, 1), s[n, c] scaling plane
// (n, c). Forward and dx = dy * s are elementwise (one thread per element): deterministic.
// ds[n, c] = sum over the H*W plane of dy * x is a REDUCTION, done in a FIXED order with no
// atomics: one warp per (n, c); lane l adds the products at positions l, l + 32, l + 64, ... in
// ascending order, then the 32 lane sums meet in a butterfly (__shfl_xor_sync, offsets 16, 8,
// 4, 2, 1). Neither order depends on scheduling or launch shape, so ds is bit-reproducible. The
// CPU reference sums in double, in index order. ds has s's shape.
//
// Both also read any float dtype in either layout (native bf16 channels-last results, kernels/
// conv2d.h): concat_channels copies bits (inputs of one dtype and layout; bf16/f16 channels move in
// pairs, so each input needs an even channel count), channel_mul computes in float and rounds y and
// dx once to x's dtype, ds to s's (one thread column per plane, 16 lanes added in lane order).
//
// Backward contributions are fresh tensors handed to accumulate_grad (gradients accumulate), except
// on the GPU for a float32 input whose gradient already holds a sum: its slice is added there in
// the same launch, dst + slice rounded once as accumulate_grad's add, in the same order, so the
// bits are those of the fresh-slice path without its copy and one add launch per input (a
// DenseNet block's backward adds each feature's slices from every later layer).
#pragma once
#include <vector>

#include "engine/context.h"
#include "engine/tape.h"

namespace ditto {

Var concat_channels(Context& ctx, const std::vector<Var>& xs);
Var channel_mul(Context& ctx, const Var& x, const Var& s);

}  // namespace ditto
