// Bias CUDA kernels.
//
// bias_fwd_kernel: one thread per element, no reduction: deterministic.
// bias_db_partial_kernel: grid (C, P). Block (c, p) owns the elements j = p*256 + t + k*P*256 of
// channel c (j runs over the N*S positions of that channel); each thread adds its elements in
// increasing k.
//   kAtomic = true:  each warp's 32 sums are combined by cub::WarpReduce and lane 0 atomicAdds the
//                    warp sum into db[c]. The order in which the 8*P warps of a channel arrive
//                    depends on scheduling, and float addition is not associative: NOT
//                    deterministic (CCCL's not_guaranteed). This is what frameworks do by default.
//   kAtomic = false: the block's 256 sums are combined by cub::BlockReduce (BlockSum, see
//                    kernels/detail/reduce.cuh: fixed order) and written to partials[c*P + p].
// bias_db_final_kernel: one block per channel adds its P <= 256 partials with BlockSum. P and the
// element-to-thread map depend only on (N, C, S): the deterministic variant gives the same bits
// for a shape on any GPU (CCCL's gpu_to_gpu).
#include "engine/detail/cuda_state.h"
#include "engine/detail/launch.cuh"
#include "kernels/detail/bias_cuda.h"
#include "kernels/detail/reduce.cuh"

namespace ditto::cuda {
namespace {
static_assert(kThreads == 256, "the db kernels reduce 8 warps per block");

constexpr int64_t kPerThread = 4;   // target elements per thread before a new partial is opened
constexpr int64_t kMaxPartials = 256;


__global__ void bias_fwd_kernel(const float* x, const float* b, float* y, int64_t n, int64_t c, int64_t s,
                                bool narrow) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] = x[i] + b[channel_of(i, s, c, narrow)];
}

template <bool kAtomic>
__global__ void bias_db_partial_kernel(const float* dy, float* out, int64_t n, int64_t c, int64_t s) {
  const int64_t ch = blockIdx.x, p = blockIdx.y, parts = gridDim.y;
  const int64_t m = n * s;
  float acc = 0.f;
  ChannelWalk w(p * kThreads + threadIdx.x, s, parts * kThreads);
  for (int64_t j = p * kThreads + threadIdx.x; j < m; j += parts * kThreads, w.next()) acc += dy[w.offset(ch, c)];
  if (kAtomic) {
    __shared__ WarpSum::TempStorage warp_tmp[kThreads / 32];
    const float w = WarpSum(warp_tmp[threadIdx.x >> 5]).Sum(acc);
    if ((threadIdx.x & 31) == 0) atomicAdd(out + ch, w);
    return;
  }
  __shared__ BlockSum<kThreads>::TempStorage tmp;
  const float v = BlockSum<kThreads>(tmp).Sum(acc);
  if (threadIdx.x == 0) out[ch * parts + p] = v;
}

__global__ void bias_db_final_kernel(const float* partials, float* db, int64_t parts) {
  const int64_t ch = blockIdx.x;
  __shared__ BlockSum<kThreads>::TempStorage tmp;
  const float v = threadIdx.x < parts ? partials[ch * parts + threadIdx.x] : 0.f;
  const float sum = BlockSum<kThreads>(tmp).Sum(v, static_cast<int>(parts));
  if (threadIdx.x == 0) db[ch] = sum;
}

}  // namespace

void bias_fwd(Context& ctx, const float* x, const float* b, float* y, int64_t n, int64_t c, int64_t s) {
  const int64_t total = n * c * s;
  if (total == 0) return;
  bias_fwd_kernel<<<blocks_for(total), kThreads, 0, detail::stream_of(ctx)>>>(x, b, y, total, c, s, narrow_index(total));
  DITTO_CHECK_LAUNCH(ctx);
}

int64_t bias_bwd_partials(int64_t n, int64_t s) {
  int64_t parts = (n * s + kThreads * kPerThread - 1) / (kThreads * kPerThread);
  return parts < 1 ? 1 : (parts > kMaxPartials ? kMaxPartials : parts);
}

void bias_bwd_atomic(Context& ctx, const float* dy, float* db, int64_t n, int64_t c, int64_t s) {
  if (c == 0) return;
  cudaStream_t st = detail::stream_of(ctx);
  DITTO_CUDA_CHECK(cudaMemsetAsync(db, 0, sizeof(float) * static_cast<size_t>(c), st));
  if (n * s == 0) return;
  dim3 grid(static_cast<unsigned>(c), static_cast<unsigned>(bias_bwd_partials(n, s)));
  bias_db_partial_kernel<true><<<grid, kThreads, 0, st>>>(dy, db, n, c, s);
  DITTO_CHECK_LAUNCH(ctx);
}

void bias_bwd_deterministic(Context& ctx, const float* dy, float* db, float* partials, int64_t n, int64_t c,
                            int64_t s) {
  if (c == 0) return;
  cudaStream_t st = detail::stream_of(ctx);
  const int64_t parts = bias_bwd_partials(n, s);
  dim3 grid(static_cast<unsigned>(c), static_cast<unsigned>(parts));
  bias_db_partial_kernel<false><<<grid, kThreads, 0, st>>>(dy, partials, n, c, s);
  DITTO_CHECK_LAUNCH(ctx);
  bias_db_final_kernel<<<static_cast<unsigned>(c), kThreads, 0, st>>>(partials, db, parts);
  DITTO_CHECK_LAUNCH(ctx);
}

}  // namespace ditto::cuda
