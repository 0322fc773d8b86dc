// CTC loss (connectionist temporal classification) of unnormalized logits; kernels/ctc_ref.h states
// the arithmetic. logits {T, N, A} f32 (time-major; class 0 is the blank), labels {N, S} i32
// (padded), label_lengths {N} and input_lengths {N} i32, all on the context's device. Returns the
// per-sample costs {N} = -log p(labels | logits) (reduce them with a sum or mean op). The
// log-softmax is part of the op, so the gradient is with respect to the logits:
// d cost[n] / d logits = softmax - (CTC posterior occupancy), zero past input_lengths[n].
//
// The forward pass computes the cost and, when a gradient is wanted, that gradient (as cuDNN does);
// the backward pass scales it by the upstream gradient of each cost (one thread per element). The
// algorithm is the layer's CtcAlgo (knob "algo" of op kind ctc_loss, manifest op "ctc_loss"):
//   ditto                   one thread block per sequence: log-softmax normalizers, alpha and beta
//                           recursions in log space (threads over the 2L+1 states, one barrier per
//                           time step), then one thread per (time, class) sums the occupancy of
//                           that class's states in ascending state order. No cross-block or atomic
//                           work: deterministic, gpu_to_gpu. Workspace: N * T * (2 * (2S + 1) + 1)
//                           floats and N * (A + 2S + 1) ints. Any S.
//   cudnn-deterministic     cudnnCTCLoss_v8 with CUDNN_CTC_LOSS_ALGO_DETERMINISTIC (softmax
//                           normalization, zero gradient for samples no alignment fits):
//                           run_to_run.
//   cudnn-nondeterministic  the same with CUDNN_CTC_LOSS_ALGO_NON_DETERMINISTIC, which cuDNN's
//                           Reproducibility notes list as not reproducible: not_guaranteed. What
//                           frameworks do (PyTorch's cuDNN path, cudnn.deterministic off).
// Both cuDNN variants: logits as cuDNN's "probs" with CUDNN_LOSS_NORMALIZATION_SOFTMAX (cuDNN
// applies the softmax, the gradient is with respect to the logits), labels concatenated on the
// device (staged from the padded {N, S}), lengths on the device, any input lengths <= T.
// cuDNN gets an empty label wrong (cost 0 and a gradient lacking the blank's occupancy, seen on an
// H100 with cuDNN 9.14; pytorch/pytorch#21680 showed cuDNN 7 wrong there too), so such a sample is handed to cuDNN as
// a stand-in and its cost -sum_t log softmax[t, blank] and gradient softmax - onehot(blank) (the
// all-blank path is its only alignment) are written after the call by one thread per element
// (the cost one thread's sum in ascending t): deterministic, so the variant's label holds.
// cuDNN documents labels of at most 256 symbols but fails at 256 (PyTorch hands it at most 255):
// a pinned cuDNN variant with S > 255 is a PolicyError naming the layer; under a mode word
// (heuristic, nondeterministic, fastest) the op runs ditto's instead and the manifest says so.
// Invalid samples (label length outside [0, S], input length outside [1, T], a label outside
// [1, A)): a DataError naming the sample on the CPU; on the GPU (no host copy) that sample's cost
// and gradient are NaN, whatever the variant (cuDNN is handed a harmless stand-in). A sample that
// no alignment fits (T_n < L + repeats) costs +inf with a zero gradient; with the cuDNN variants
// the cost of such a sample is cuDNN's where L <= T_n.
// On a CPU context the double-precision reference runs, recorded as variant "cpu-reference".
#pragma once
#include <string>

#include "engine/context.h"
#include "engine/tape.h"
#include "engine/knob.h"

namespace ditto {

namespace op { inline constexpr OpKind ctc_loss{"ctc_loss"}; }

// Knob ctc_loss.algo (kernels/ctc.cpp).
enum class CtcAlgo { Ditto, CudnnDeterministic, CudnnNondeterministic };
const KnobSpec& ctc_algo_knob();
const char* name_of(CtcAlgo v);
inline const char* knob_name(CtcAlgo) { return "algo"; }

Var ctc_loss(Context& ctx, const std::string& layer, const Var& logits, const Tensor& labels,
             const Tensor& label_lengths, const Tensor& input_lengths);

}  // namespace ditto
