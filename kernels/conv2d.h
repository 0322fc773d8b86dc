// 2-D convolution (cross-correlation, NCHW, float32) through cuDNN's convolution API, with a
// CPU reference (kernels/conv2d_ref.h) on CPU contexts. No bias: that is a separate op.
//
// Determinism: each direction (fwd, bwd_data, bwd_filter) runs one cuDNN algorithm chosen per
// layer by the policy (pinned / heuristic / deterministic / nondeterministic / fastest) and
// written into the manifest with cuDNN's own determinism label. The atomics algorithms
// (bwd_data algo0, bwd_filter algo0 and algo3) add partial sums in whatever order the
// hardware schedules them, so they can differ in the last bits from run to run; the others
// reduce in a fixed order.
//
// Precision per layer (conv2d.precision, kernels/precision.h): fp32 (no tensor cores), tf32, or
// bf16/fp16: x and w are read rounded to bf16/fp16 (cuDNN's PSEUDO_BFLOAT16/PSEUDO_HALF
// configuration: bf16/f16 tensors, fp32 accumulation on tensor cores), and the direction's
// result (y, dx, dw) is rounded to bf16/fp16 by cuDNN, then handed on widened to fp32 (or as it
// is: conv2d.output below). Inputs that are already in the layer's dtype and layout (the tape keeps
// x and w rounded for backward; a native result of the layer before) are not converted again.
// ditto's own algorithms compute in fp32 or tf32 and NCHW only: pinned under bf16/fp16 or the nhwc
// layout they are an error.
// The CPU path is the double-accumulating reference, with the same rounding points: deterministic.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include "engine/context.h"
#include "engine/manifest.h"
#include "engine/policy.h"
#include "engine/tape.h"
#include "kernels/precision.h"

namespace ditto {

namespace op { inline constexpr OpKind conv2d{"conv2d"}; }

// The three algorithm knobs (conv2d.fwd, .bwd_data, .bwd_filter), declared in kernels/conv2d.cpp.
// cuDNN's algorithms keep cuDNN's numbering; ditto's own algorithms follow them:
//   ditto-gemm    (backward) explicit GEMM on cuBLAS with a shape-fixed reduction order
//                 (kernels/detail/conv2d_own.h)
//   ditto-direct  ditto's own kernels, no library: backward, gather / fixed-tree kernels (depthwise,
//                 and few-weight filters); forward, a fixed-order implicit GEMM whose every output
//                 is summed over (c, r, s) in ascending order, so an example's result does not depend
//                 on the batch size or its position in the batch (batch-invariant; slower than cuDNN,
//                 deterministic and heuristic never pick it; fastest and a tuning file only where it times fastest)
//   ditto-winograd Winograd transforms of ditto's own with the sums as cuBLAS GEMMs (3x3, stride 1, one
//                 group, padding <= 2): bwd_filter F(3x3, 2x2), the sums over tiles over shape-fixed parts
//                 folded in order; fwd and bwd_data F(2x2, 3x3), the sums over input channels
// and, last in every direction, cuDNN's backend (graph) API:
//   engine        the first engine configuration heuristic mode A lists
//                 for the problem whose numerical notes allow it — not NONDETERMINISTIC, not
//                 REDUCED_PRECISION_REDUCTION, and under fp32 neither TENSOR_CORE nor
//                 DOWN_CONVERT_INPUTS (tf32: not DOWN_CONVERT_INPUTS). The engines frameworks run
//                 today (PyTorch's cuDNN path is the backend API); the manifest's `algorithm` names the
//                 configuration that ran ("eng12[k2=3] TENSOR_CORE"). Heuristic mode A is a function of
//                 the problem, GPU and cuDNN version, so a pin or replay runs the same configuration.
//   engine-first  what PyTorch 2.11's cuDNN path runs by default (cudnn.benchmark and
//                 deterministic off): heuristic mode A's first configuration that builds a plan,
//                 NONDETERMINISTIC and REDUCED_PRECISION_REDUCTION ones included; never
//                 DOWN_CONVERT_INPUTS, and under fp32 no TENSOR_CORE (PyTorch with allow_tf32 off).
//                 Its determinism is the configuration's: "no" where cuDNN notes it NONDETERMINISTIC.
// The op selects among them per shape: the mode words pass through to its selection
// (heuristic: cuDNN's first pick; deterministic: under bf16/fp16 the engine, otherwise cuDNN's
// first pick among those it labels deterministic, or a tuning file's; nondeterministic: the
// atomics algorithm where the direction has one; fastest: cuDNN's Find among all, with ditto's
// own and the engines timed beside it; pytorch: engine-first).
enum class ConvFwdAlgo {
  ImplicitGemm, ImplicitPrecompGemm, Gemm, Direct, Fft, FftTiling, Winograd, WinogradNonfused, DittoDirect,
  DittoWinograd, Engine, EngineFirst
};
enum class ConvBwdDataAlgo {
  Algo0, Algo1, Fft, FftTiling, Winograd, WinogradNonfused, DittoGemm, DittoDirect, DittoWinograd, Engine, EngineFirst
};
enum class ConvBwdFilterAlgo {
  Algo0, Algo1, Fft, Algo3, Winograd, WinogradNonfused, FftTiling, DittoGemm, DittoDirect, DittoWinograd, Engine,
  EngineFirst
};
const KnobSpec& conv_fwd_knob();
const KnobSpec& conv_bwd_data_knob();
const KnobSpec& conv_bwd_filter_knob();
const char* name_of(ConvFwdAlgo a);
const char* name_of(ConvBwdDataAlgo a);
const char* name_of(ConvBwdFilterAlgo a);
inline const char* knob_name(ConvFwdAlgo) { return "fwd"; }
inline const char* knob_name(ConvBwdDataAlgo) { return "bwd_data"; }
inline const char* knob_name(ConvBwdFilterAlgo) { return "bwd_filter"; }

// Knob conv2d.layout: the memory layout cuDNN computes in. nchw hands cuDNN ditto's own tensors
// (its bf16/fp16 tensor-core kernels may transpose inside); nhwc hands it channels-last copies,
// made in the same pass that rounds them to the precision (engine/tensor_ops.h), and transposes
// each result back in the pass that widens it (unless conv2d.output=native hands it on
// channels-last). The layout changes which kernels cuDNN runs, so the bits; not what they promise.
enum class ConvLayout { Nchw, Nhwc };
const KnobSpec& conv_layout_knob();
const char* name_of(ConvLayout l);
inline const char* knob_name(ConvLayout) { return "layout"; }

// Knob conv2d.output: the form the op hands its results (y; dx and dw go back in their variables'
// forms) on in. fp32 widens them to fp32 NCHW, so every op after a bf16/fp16 layer reads fp32 (one
// widening pass per result, and twice the bytes for batch norm and activations). native hands them
// on as cuDNN wrote them: the precision's dtype in the layer's layout (bf16 channels-last under
// bf16 + nhwc), for the ops that read such tensors as they are (batch norm, activations, add,
// pooling: engine/operand_check.h); an op that reads only NCHW fp32 refuses them by name. native
// changes where the next ops round (they read and write bf16), so the bits; not what anything
// promises.
enum class ConvOutput { Fp32, Native };
const KnobSpec& conv_output_knob();
const char* name_of(ConvOutput o);
inline const char* knob_name(ConvOutput) { return "output"; }

// A convolution algorithm choice: a selection mode, and the algorithm when pinned.
template <class Algo>
struct AlgoChoice {
  SelectMode mode = SelectMode::Heuristic;
  Algo algo{};
  std::string str() const { return mode == SelectMode::Pinned ? name_of(algo) : select_mode_name(mode); }
};
// What the policy asks of one direction of one layer at one input shape (shape_key; "" matches
// no @SHAPE rule). Algo is ConvFwdAlgo, ConvBwdDataAlgo or ConvBwdFilterAlgo.
template <class Algo>
AlgoChoice<Algo> conv_choice(const Policy& policy, const std::string& layer, const std::string& shape = "") {
  const KnobPick pick = policy.pick(layer, op::conv2d, knob_name(Algo{}), shape);
  return {pick.mode, pick.mode == SelectMode::Pinned ? static_cast<Algo>(pick.index) : Algo{}};
}

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
                                     const Conv2dParams& p, Precision precision = Precision::Fp32,
                                     ConvLayout layout = ConvLayout::Nchw);
// Just the names of conv_algos(...), in cuDNN's enum order.
std::vector<std::string> conv_supported_algos(Context& ctx, const std::string& direction, const Shape& x,
                                              const Shape& w, const Conv2dParams& p,
                                              Precision precision = Precision::Fp32,
                                              ConvLayout layout = ConvLayout::Nchw);

// Why ditto-winograd cannot run this convolution (empty where it can; the same problems in all three
// directions): a function of the geometry alone, for callers that pin it where it runs (ditto.torch's
// conv2d). Shapes are checked as by conv2d_output_shape.
std::string conv_winograd_refusal(const Shape& x, const Shape& w, const Conv2dParams& p);

}  // namespace ditto
