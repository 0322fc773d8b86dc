// Top-k and correct counts: one thread per row, scanning the row in index order (same
// selection as the CPU reference). Counts are integer atomicAdds: exact, so deterministic.
#include "engine/detail/cuda_state.h"
#include "kernels/detail/metrics_cuda.h"

namespace ditto::cuda {
namespace {
constexpr int kMaxK = 16;

__device__ void row_topk(const float* row, int64_t c, int k, int32_t* out) {
  for (int j = 0; j < k; ++j) {
    int64_t best = -1;
    for (int64_t i = 0; i < c; ++i) {
      bool taken = false;
      for (int q = 0; q < j; ++q) taken = taken || out[q] == i;
      if (taken) continue;
      if (best < 0 || row[i] > row[best]) best = i;
    }
    out[j] = static_cast<int32_t>(best);
  }
}

__global__ void topk_kernel(const float* logits, int64_t n, int64_t c, int k, int32_t* out) {
  int64_t r = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (r >= n) return;
  int32_t local[kMaxK];
  row_topk(logits + r * c, c, k, local);
  for (int j = 0; j < k; ++j) out[r * k + j] = local[j];
}

__global__ void correct_kernel(const float* logits, const int32_t* labels, int64_t n, int64_t c, int32_t* counts) {
  int64_t r = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (r >= n) return;
  int k = c < 5 ? static_cast<int>(c) : 5;
  int32_t top[5];
  row_topk(logits + r * c, c, k, top);
  int hit1 = top[0] == labels[r], hit5 = 0;
  for (int j = 0; j < k; ++j) hit5 |= top[j] == labels[r];
  if (hit1) atomicAdd(&counts[0], 1);
  if (hit5) atomicAdd(&counts[1], 1);
}
}  // namespace

void topk(Context& ctx, const float* logits, int64_t n, int64_t c, int k, int32_t* out) {
  if (n == 0) return;
  topk_kernel<<<static_cast<unsigned>((n + 127) / 128), 128, 0, detail::stream_of(ctx)>>>(logits, n, c, k, out);
  DITTO_CHECK_LAUNCH(ctx);
}

void accumulate_correct(Context& ctx, const float* logits, const int32_t* labels, int64_t n, int64_t c, int32_t* counts) {
  if (n == 0) return;
  correct_kernel<<<static_cast<unsigned>((n + 127) / 128), 128, 0, detail::stream_of(ctx)>>>(logits, labels, n, c, counts);
  DITTO_CHECK_LAUNCH(ctx);
}
}  // namespace ditto::cuda
