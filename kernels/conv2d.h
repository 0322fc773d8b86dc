// 2-D convolution (cross-correlation, NCHW, float32) through cuDNN's convolution API, with a
// CPU reference (kernels/conv2d_ref.h) on CPU contexts. No bias: that is a separate op.
//
// Determinism: each direction (fwd, bwd_data, bwd_filter) runs one cuDNN algorithm chosen per
// layer by the policy (pinned / heuristic / deterministic / nondeterministic / fastest) and
// written into the manifest with cuDNN's own determinism label. The atomics algorithms
// (bwd_data algo0, bwd_filter algo0 and algo3) add partial sums in whatever order the
// hardware schedules them, so they can differ in the last bits from run to run; the others
// reduce in a fixed order. Math mode per layer: fma (no tensor cores) or tf32.
// The CPU path is the double-accumulating reference: deterministic.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include "engine/context.h"
#include "engine/manifest.h"
#include "engine/policy.h"
#include "engine/tape.h"

namespace ditto {

struct Conv2dParams {
  int stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0, dilation_h = 1, dilation_w = 1, groups = 1;
};

// Output shape N,K,Ho,Wo with Ho = (H + 2*pad_h - dilation_h*(R-1) - 1)/stride_h + 1 (same for W).
// Checks x (N,C,H,W) and w (K,C/groups,R,S): 4-D, C and K divisible by groups, w's second
// dimension C/groups, positive strides/dilations/groups, non-negative padding, an output of at
// least 1x1. Throws ShapeError naming the layer and both shapes.
Shape conv2d_output_shape(const std::string& layer, const Shape& x, const Shape& w, const Conv2dParams& p);

// y = conv(x, w). Records a tape entry when x or w requires grad; backward computes dx only if
// x requires grad and dw only if w requires grad (fresh tensors, accumulated into the grads).
Var conv2d(Context& ctx, const std::string& layer, const Var& x, const Var& w, const Conv2dParams& p = {});

// The three directions on plain tensors (no tape), each resolving its algorithm through
// ctx.policy() for `layer` and recording it in the manifest. conv2d uses these; tests and
// benchmarks call them to run one direction alone. Each returns a fresh tensor (beta = 0).
Tensor conv2d_forward(Context& ctx, const std::string& layer, const Tensor& x, const Tensor& w,
                      const Conv2dParams& p);
Tensor conv2d_backward_data(Context& ctx, const std::string& layer, const Tensor& dy, const Tensor& w,
                            const Shape& x_shape, const Conv2dParams& p);
Tensor conv2d_backward_filter(Context& ctx, const std::string& layer, const Tensor& x, const Tensor& dy,
                              const Shape& w_shape, const Conv2dParams& p);

// One algorithm cuDNN supports for a shape (its workspace-size query succeeds).
struct ConvAlgoInfo {
  std::string name;                                   // name_of(...) of the ditto enum
  Determinism deterministic = Determinism::Unknown;   // cuDNN's own label
  std::size_t workspace_bytes = 0;
};

// direction: "fwd", "bwd_data" or "bwd_filter" (anything else throws PolicyError). Needs a
// CUDA context (throws Error on a CPU one). The shapes are checked as by conv2d_output_shape.
std::vector<ConvAlgoInfo> conv_algos(Context& ctx, const std::string& direction, const Shape& x, const Shape& w,
                                     const Conv2dParams& p, MathMode math = MathMode::Fma);
// Just the names of conv_algos(...), in cuDNN's enum order.
std::vector<std::string> conv_supported_algos(Context& ctx, const std::string& direction, const Shape& x,
                                              const Shape& w, const Conv2dParams& p, MathMode math = MathMode::Fma);

}  // namespace ditto
