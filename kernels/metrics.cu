// Top-k and correct counts: one thread per row, scanning the row in index order (same
// selection as the CPU reference). Each block counts its hits with cub::BlockReduce and thread 0
// atomicAdds the block's counts: integer addition is exact in any order, so the counts are the
// same on every run and GPU (CCCL's gpu_to_gpu) although the atomics' order is not.
#include "engine/detail/cuda_state.h"
#include "kernels/detail/metrics_cuda.h"

#include <cub/block/block_reduce.cuh>

namespace ditto::cuda {
namespace {
constexpr int kMaxK = 16;
constexpr int kRowThreads = 128;

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
  const int64_t r = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  int hit1 = 0, hit5 = 0;
  if (r < n) {  // no early return: every thread takes part in the block sums
    const int k = c < 5 ? static_cast<int>(c) : 5;
    int32_t top[5];
    row_topk(logits + r * c, c, k, top);
    hit1 = top[0] == labels[r];
    for (int j = 0; j < k; ++j) hit5 |= top[j] == labels[r];
  }
  using BlockCount = cub::BlockReduce<int, kRowThreads>;
  __shared__ BlockCount::TempStorage tmp1, tmp5;
  const int block1 = BlockCount(tmp1).Sum(hit1);
  const int block5 = BlockCount(tmp5).Sum(hit5);
  if (threadIdx.x == 0) {
    if (block1) atomicAdd(&counts[0], block1);
    if (block5) atomicAdd(&counts[1], block5);
  }
}
}  // namespace

void topk(Context& ctx, const float* logits, int64_t n, int64_t c, int k, int32_t* out) {
  if (n == 0) return;
  topk_kernel<<<static_cast<unsigned>((n + 127) / 128), 128, 0, detail::stream_of(ctx)>>>(logits, n, c, k, out);
  DITTO_CHECK_LAUNCH(ctx);
}

void accumulate_correct(Context& ctx, const float* logits, const int32_t* labels, int64_t n, int64_t c, int32_t* counts) {
  if (n == 0) return;
  correct_kernel<<<static_cast<unsigned>((n + kRowThreads - 1) / kRowThreads), kRowThreads, 0, detail::stream_of(ctx)>>>(
      logits, labels, n, c, counts);
  DITTO_CHECK_LAUNCH(ctx);
}
}  // namespace ditto::cuda
