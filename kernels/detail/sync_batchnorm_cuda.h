// Internal: CUDA launchers of kernels/sync_batchnorm.cu. x, dy, dx are N x C x HW.
#pragma once
#include <cstdint>

#include "kernels/detail/batchnorm_cuda.h"

namespace ditto::cuda {

// sums (2c + 1 doubles): per-channel sum and sum of squares of x in double, one block per channel
// in a fixed order (a strided walk per thread, then a CUB block reduction), then the count.
void sbn_local_sums(Context& ctx, const float* x, const BnDims& d, double* sums);
// out[i] = binary-counter tree sum over the ranks of records[r * per + i], in double.
void sbn_merge(Context& ctx, const double* records, int ranks, int64_t per, double* out);
// mean, invstd, running statistics from merged sums (kernels/sync_batchnorm_ref.h, sbn_stats).
void sbn_stats(Context& ctx, const double* sums, int64_t c, float momentum, float eps, float* mean, float* invstd,
               float* running_mean, float* running_var);
// dx from the merged backward sums; count: the merged count (sums[2c] of the forward).
void sbn_bwd_dx(Context& ctx, const float* x, const float* dy, const float* mean, const float* invstd,
                const float* gamma, const float* dbeta, const float* dgamma, const double* count, float* dx,
                const BnDims& d);

}  // namespace ditto::cuda
