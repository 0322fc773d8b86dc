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
//                    Then the block counts itself in on the context's arrival counter of channel c
//                    (CudaState::arrivals); the channel's last block to arrive adds its P <= 256
//                    partials with BlockSum, as bias_db_final_kernel would, writes db[c] and resets
//                    the counter: one launch. Which block does it varies; the sum's order does not.
// bias_db_final_kernel: one block per channel adds its P <= 256 partials with BlockSum (the second
// launch, for more channels than there are arrival counters). P and the element-to-thread map depend
// only on (N, C, S): the deterministic variant gives the same bits for a shape on any GPU, in either
// form (CCCL's gpu_to_gpu).
#include "engine/detail/cuda_state.h"
#include "engine/detail/launch.cuh"
#include "kernels/detail/bias_cuda.h"
#include "kernels/detail/reduce.cuh"
#include "engine/detail/float_map.cuh"
#include "engine/error.h"

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

// The P partials of channel ch (written by other blocks of this launch or an earlier one) added in
// their fixed order; thread 0 holds the sum.
__device__ __forceinline__ float sum_partials(const float* partials, int64_t ch, int64_t parts,
                                              BlockSum<kThreads>::TempStorage& tmp) {
  const float v = threadIdx.x < parts ? __ldcg(partials + ch * parts + threadIdx.x) : 0.f;
  return BlockSum<kThreads>(tmp).Sum(v, static_cast<int>(parts));
}

// arrivals (deterministic form only): null for the two-launch form, else the counters by channel.
template <bool kAtomic>
__global__ void bias_db_partial_kernel(const float* dy, float* out, int64_t n, int64_t c, int64_t s,
                                       float* db = nullptr, int32_t* arrivals = nullptr) {
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
  if (!arrivals) {
    if (threadIdx.x == 0) out[ch * parts + p] = v;
    return;
  }
  __shared__ bool last;
  if (threadIdx.x == 0) {
    out[ch * parts + p] = v;
    __threadfence();  // the partial is visible device-wide before the block counts itself in
    last = atomicAdd(arrivals + ch, 1) == parts - 1;
  }
  __syncthreads();  // also: tmp is free again
  if (!last) return;
  __threadfence();  // every other block's partial is visible to this one
  const float sum = sum_partials(out, ch, parts, tmp);
  if (threadIdx.x == 0) {
    db[ch] = sum;
    arrivals[ch] = 0;
  }
}

__global__ void bias_db_final_kernel(const float* partials, float* db, int64_t parts) {
  __shared__ BlockSum<kThreads>::TempStorage tmp;
  const float sum = sum_partials(partials, blockIdx.x, parts, tmp);
  if (threadIdx.x == 0) db[blockIdx.x] = sum;
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
  if (c <= detail::CudaState::kArrivalSlots) {
    bias_db_partial_kernel<false><<<grid, kThreads, 0, st>>>(dy, partials, n, c, s, db,
                                                                 detail::arrival_counters(ctx));
    DITTO_CHECK_LAUNCH(ctx);
    return;
  }
  bias_db_partial_kernel<false><<<grid, kThreads, 0, st>>>(dy, partials, n, c, s);
  DITTO_CHECK_LAUNCH(ctx);
  bias_db_final_kernel<<<static_cast<unsigned>(c), kThreads, 0, st>>>(partials, db, parts);
  DITTO_CHECK_LAUNCH(ctx);
}

// ---- channels-last, any float dtype ----------------------------------------------------------------
namespace {
constexpr int kCols = 32, kLanes = 8;  // block: 32 channels x 8 row lanes (as kernels/batchnorm_nhwc.cu)
constexpr int64_t kRowsPerPart = 512, kMaxParts = 256;

struct AddBias {
  const float* b;
  __device__ __forceinline__ float operator()(float v, int64_t ch) const { return v + b[ch]; }
};

// Block (p, t): rows of part p, channels 32t..32t+31; the 8 lanes of a column take rows r, r+8, ...
// in increasing order, and their sums are added in lane order.
template <class T, bool kAtomic>
__global__ void __launch_bounds__(kCols* kLanes) bias_db_nhwc_kernel(const T* __restrict__ dy, int64_t rows, int64_t c,
                                                                     int64_t parts, float* __restrict__ out) {
  const int64_t ch = int64_t(blockIdx.y) * kCols + threadIdx.x;
  const int64_t len = (rows + parts - 1) / parts, r0 = int64_t(blockIdx.x) * len;
  const int64_t r1 = r0 + len < rows ? r0 + len : rows;
  float s = 0.f;
  if (ch < c)
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kLanes) s += to_f(dy[r * c + ch]);
  const float t = column_sum<kLanes>(s);
  if (threadIdx.y != 0 || ch >= c) return;
  if (kAtomic) atomicAdd(out + ch, t);
  else out[ch * parts + blockIdx.x] = t;
}

// One warp per channel: lane l adds partials l, l+32, ... in order, then a fixed xor-shuffle tree.
constexpr int kFinalWarps = 8;
__global__ void bias_db_nhwc_final_kernel(const float* __restrict__ partials, int64_t c, int64_t parts,
                                          float* __restrict__ db) {
  const int64_t ch = int64_t(blockIdx.x) * kFinalWarps + threadIdx.y;
  if (ch >= c) return;
  float s = 0.f;
  for (int64_t k = threadIdx.x; k < parts; k += 32) s += partials[ch * parts + k];
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
  if (threadIdx.x == 0) db[ch] = s;
}

}  // namespace

void bias_fwd_nhwc(Context& ctx, DType t, const void* x, const float* b, void* y, int64_t rows, int64_t c) {
  const int64_t total = rows * c;
  if (total == 0) return;
  cudaStream_t s = detail::stream_of(ctx);
  with_float_type(t, [&](auto tag) { launch_channel_map<decltype(tag)>(s, x, y, total, c, AddBias{b}); });
  DITTO_CHECK_LAUNCH(ctx);
}

int64_t bias_nhwc_partials(int64_t rows) {
  const int64_t p = (rows + kRowsPerPart - 1) / kRowsPerPart;
  return p < 1 ? 1 : (p > kMaxParts ? kMaxParts : p);
}

void bias_bwd_nhwc(Context& ctx, DType t, const void* dy, float* db, float* partials, bool atomic, int64_t rows,
                   int64_t c) {
  if (c == 0) return;
  cudaStream_t s = detail::stream_of(ctx);
  const int64_t parts = bias_nhwc_partials(rows);
  const dim3 grid(static_cast<unsigned>(parts), static_cast<unsigned>((c + kCols - 1) / kCols)), block(kCols, kLanes);
  if (atomic) DITTO_CUDA_CHECK(cudaMemsetAsync(db, 0, sizeof(float) * c, s));
  with_float_type(t, [&](auto tag) {
    using T = decltype(tag);
    if (atomic)
      bias_db_nhwc_kernel<T, true><<<grid, block, 0, s>>>(static_cast<const T*>(dy), rows, c, parts, db);
    else
      bias_db_nhwc_kernel<T, false><<<grid, block, 0, s>>>(static_cast<const T*>(dy), rows, c, parts, partials);
  });
  DITTO_CHECK_LAUNCH(ctx);
  if (!atomic) {
    bias_db_nhwc_final_kernel<<<static_cast<unsigned>((c + kFinalWarps - 1) / kFinalWarps), dim3(32, kFinalWarps), 0,
                                s>>>(partials, c, parts, db);
    DITTO_CHECK_LAUNCH(ctx);
  }
}

}  // namespace ditto::cuda
