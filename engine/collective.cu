// The fixed-order and ring reduces' arithmetic on the GPU: one thread per element, float
// additions in the binary-counter tree order of ref::tree_sum or the ring's fold
// (engine/collective_ref.h), no FMA (additions only) and no atomics, on a grid that depends on the
// element count alone. Deterministic, the same bits on every GPU and as the CPU reference.
#include "engine/detail/collective_cuda.h"
#include "engine/detail/counter_tree.cuh"
#include "engine/detail/cuda_state.h"
#include "engine/detail/launch.cuh"

namespace ditto::cuda {
namespace {

struct PartPointers {
  const float* p[kTreeSumMaxParts];
};

__global__ void tree_sum_kernel(PartPointers parts, int count, int64_t n, float* out) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    out[i] = counter_tree<float>(count, [&](int k) { return parts.p[k][i]; });
  }
}

__global__ void fold_sum_kernel(PartPointers parts, int count, int64_t n, float* out) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    float acc = parts.p[0][i];
    for (int k = 1; k < count; ++k) acc = __fadd_rn(acc, parts.p[k][i]);
    out[i] = acc;
  }
}

__global__ void add_inplace_kernel(float* a, const float* b, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    a[i] = __fadd_rn(a[i], b[i]);
}

}  // namespace

void tree_sum(Context& ctx, const float* const* parts, int count, int64_t n, float* out) {
  if (n == 0) return;
  PartPointers pp{};
  for (int k = 0; k < count; ++k) pp.p[k] = parts[k];
  tree_sum_kernel<<<blocks_for(n), kThreads, 0, detail::stream_of(ctx)>>>(pp, count, n, out);
  DITTO_CHECK_LAUNCH(ctx);
}

void fold_sum(Context& ctx, const float* const* parts, int count, int64_t n, float* out) {
  if (n == 0) return;
  PartPointers pp{};
  for (int k = 0; k < count; ++k) pp.p[k] = parts[k];
  fold_sum_kernel<<<blocks_for(n), kThreads, 0, detail::stream_of(ctx)>>>(pp, count, n, out);
  DITTO_CHECK_LAUNCH(ctx);
}

void add_inplace(Context& ctx, float* a, const float* b, int64_t n) {
  if (n == 0) return;
  add_inplace_kernel<<<blocks_for(n), kThreads, 0, detail::stream_of(ctx)>>>(a, b, n);
  DITTO_CHECK_LAUNCH(ctx);
}

}  // namespace ditto::cuda
