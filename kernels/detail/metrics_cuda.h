// Internal: CUDA launchers of kernels/metrics.cu.
#pragma once
#include <cstdint>

namespace ditto { class Context; }

namespace ditto::cuda {
void topk(Context& ctx, const float* logits, int64_t n, int64_t c, int k, int32_t* out);
void accumulate_correct(Context& ctx, const float* logits, const int32_t* labels, int64_t n, int64_t c, int32_t* counts);
}  // namespace ditto::cuda
