// Internal: CUDA launchers of kernels/ctc.cu: ditto's CTC, and the staging around cuDNN's
// (concatenated labels, stand-ins for invalid samples, the outputs of those samples).
#pragma once
#include <cstddef>
#include <cstdint>

#include "kernels/ctc_ref.h"

namespace ditto { class Context; }

namespace ditto::cuda {

std::size_t ctc_workspace(const ref::CtcDims& d);
// cost {N}; grad {T, N, A} or null.
void ctc_ditto(Context& ctx, const float* logits, const int32_t* labels, const int32_t* label_len,
               const int32_t* input_len, float* cost, float* grad, void* workspace, const ref::CtcDims& d);

// What cudnnCTCLoss_v8 reads, on the device: labels concatenated, their lengths and the input
// lengths, with a stand-in (one label 1, input length T) for each sample that is invalid
// (status 1), has more labels than frames (status 2) or has an empty label (status 3: cuDNN 9
// returns cost 0 and a gradient without the blank's occupancy for it); status 0 otherwise.
struct CtcCudnnStage {
  int32_t* flat_labels;
  int32_t* label_len;
  int32_t* input_len;
  int32_t* status;
  float* lse;  // {T, N}: log-softmax normalizers of the empty-label samples' frames
};
std::size_t ctc_cudnn_stage_workspace(const ref::CtcDims& d);
CtcCudnnStage ctc_cudnn_stage(Context& ctx, const int32_t* labels, const int32_t* label_len, const int32_t* input_len,
                              void* workspace, const ref::CtcDims& d);
// After cuDNN: status 1 -> cost and gradient NaN; status 2 -> cost +inf, gradient 0; status 3 ->
// cost -sum_t log softmax[t, blank] and gradient softmax - onehot(blank) (the all-blank path is
// the only alignment), each one thread's sum in a fixed order; every sample's gradient rows at
// t >= its input length -> 0. grad may be null.
void ctc_cudnn_finish(Context& ctx, const CtcCudnnStage& stage, const float* logits, const int32_t* input_len,
                      float* cost, float* grad, const ref::CtcDims& d);

// out[t, n, a] = dcost[n] * grad[t, n, a].
void ctc_scale_grad(Context& ctx, const float* grad, const float* dcost, float* out, const ref::CtcDims& d);

}  // namespace ditto::cuda
