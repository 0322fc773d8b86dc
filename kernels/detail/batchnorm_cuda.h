// Internal: CUDA launchers of kernels/batchnorm.cu (ditto's own batch-norm kernels; the cuDNN
// variant is called from kernels/batchnorm.cpp). x, y, dy, dx are N x C x HW; per-channel
// arrays have C elements.
#pragma once
#include <cstdint>

#include "engine/tensor.h"

namespace ditto { class Context; }

namespace ditto::cuda {

struct BnDims {
  int64_t n = 0, c = 0, hw = 0;
  int64_t m() const { return n * hw; }  // values per channel
};

// Floats of scratch the fixed-order reductions need (per-block partials: three per block for the
// statistics, two for the backward sums).
int64_t bn_scratch_floats(const BnDims& d);

// Batch mean / inverse std (one fixed-order pass: per-thread shifted sums merged by Chan's
// pairwise update, see kernels/batchnorm.cu) and the running-stat update (unbiased variance).
// scratch: bn_scratch_floats(d) floats.
void bn_batch_stats(Context& ctx, const float* x, const BnDims& d, float momentum, float eps, float* saved_mean,
                    float* saved_invstd, float* running_mean, float* running_var, float* scratch);
// mean = running_mean, invstd = 1/sqrt(running_var + eps).
void bn_running_stats(Context& ctx, const float* running_mean, const float* running_var, int64_t c, float eps,
                      float* mean, float* invstd);
void bn_apply(Context& ctx, const float* x, const float* mean, const float* invstd, const float* gamma,
              const float* beta, float* y, const BnDims& d);
// dbeta = sum dy, dgamma = sum dy * xhat per channel. `atomic`: one atomicAdd per warp into
// dbeta/dgamma (zeroed here); otherwise fixed-order partials in scratch, then one pass per channel.
void bn_bwd_reduce(Context& ctx, const float* x, const float* dy, const float* mean, const float* invstd,
                   const BnDims& d, bool atomic, float* dgamma, float* dbeta, float* scratch);
// dx from the reduced sums (training) or dx = gamma * invstd * dy (inference).
void bn_bwd_dx(Context& ctx, const float* x, const float* dy, const float* mean, const float* invstd,
               const float* gamma, const float* dgamma, const float* dbeta, bool training, float* dx, const BnDims& d);

// The same for channels-last x (memory N, H, W, C) of any float dtype t (kernels/batchnorm_nhwc.cu):
// statistics and sums in float, y and dx rounded to t. Scratch: bn_nhwc_scratch_floats(d) floats,
// the reduction partials and the per-channel coefficients of the elementwise passes: the forward
// statistics (training) or bn_nhwc_running_affine (inference) write y = x * scale + shift's, which
// bn_nhwc_apply then reads from the same scratch; bn_nhwc_bwd_dx writes and reads its own.
int64_t bn_nhwc_scratch_floats(const BnDims& d);
void bn_nhwc_batch_stats(Context& ctx, DType t, const void* x, const BnDims& d, float momentum, float eps,
                         const float* gamma, const float* beta, float* saved_mean, float* saved_invstd,
                         float* running_mean, float* running_var, float* scratch);
void bn_nhwc_running_affine(Context& ctx, const float* mean, const float* invstd, const float* gamma,
                            const float* beta, const BnDims& d, float* scratch);
void bn_nhwc_apply(Context& ctx, DType t, const void* x, void* y, const BnDims& d, const float* scratch);
void bn_nhwc_bwd_reduce(Context& ctx, DType t, const void* x, const void* dy, const float* mean, const float* invstd,
                        const BnDims& d, bool atomic, float* dgamma, float* dbeta, float* scratch);
void bn_nhwc_bwd_dx(Context& ctx, DType t, const void* x, const void* dy, const float* mean, const float* invstd,
                    const float* gamma, const float* dgamma, const float* dbeta, bool training, void* dx,
                    const BnDims& d, float* scratch);

}  // namespace ditto::cuda
