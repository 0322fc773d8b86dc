// Pixel-wise cross-entropy CUDA kernels.
//
// pixel_xent_kernel: the fixed geometry of kernels/detail/fixed_sum.cuh over the N*H*W pixels. Each
//   thread takes its pixels in a fixed order; per pixel it reads the C logits once (stride H*W:
//   adjacent threads read adjacent pixels), computes the log-sum-exp with a running maximum (kept
//   for backward) and
//   adds lse - logit[label] unless the label is the ignore index. Then
//     kAtomic = true:  warp sums atomicAdded into loss[0]: NOT deterministic (not_guaranteed);
//                      divide_scalar_kernel then divides by the count.
//     kAtomic = false: block sums in a fixed order into partials; fixed_sum_final_kernel adds them
//                      and divides by the count: gpu_to_gpu.
//   The counted pixels are added as integers (warp sums, atomicAdd): exact in any order.
// pixel_xent_bwd_kernel: one thread per logit, no reduction: deterministic.
// The NLL (kNll: log-probabilities in) runs the same kernel reading one value per counted pixel,
// -log_probs[label], and no log-sum-exp; its backward writes -dl/count at the label's channel.
#include <cub/warp/warp_reduce.cuh>

#include <algorithm>
#include <cmath>

#include "engine/detail/cuda_state.h"
#include "engine/detail/launch.cuh"
#include "kernels/detail/fixed_sum.cuh"
#include "kernels/index_math.h"
#include "kernels/detail/pixel_xent_cuda.h"

namespace ditto::cuda {
namespace {

constexpr int64_t kPerThread = 4;  // pixels per thread before another block is opened
using WarpCount = cub::WarpReduce<int>;

template <bool kAtomic, bool kNll>
__global__ void __launch_bounds__(kSumBlock)
    pixel_xent_kernel(const float* __restrict__ logits, const int32_t* __restrict__ labels, int64_t pixels, int64_t c,
                      int64_t hw, int ignore, float* __restrict__ lse_out, int32_t* count, float* out) {
  const int64_t stride = int64_t(gridDim.x) * kSumBlock;
  float acc = 0.f;
  int counted = 0;
  for (int64_t p = blockIdx.x * int64_t(kSumBlock) + threadIdx.x; p < pixels; p += stride) {
    const int64_t n = ref::div_nonneg(p, hw), s = p - n * hw;
    const float* x = logits + n * c * hw + s;
    if constexpr (kNll) {
      const int32_t label = labels[p];
      if (label == ignore) continue;
      ++counted;
      acc += (label >= 0 && label < c) ? -x[label * hw] : NAN;
      continue;
    }
    // One pass over the channels (the logits are read once): a running maximum m and the sum e of
    // exp(x - m), rescaled when m grows. A NaN logit makes e NaN.
    float m = -INFINITY, e = 0.f;
    for (int64_t k = 0; k < c; ++k) {
      const float v = x[k * hw];
      if (v > m) {
        e = e * expf(m - v) + 1.f;
        m = v;
      } else {
        e += expf(v - m);
      }
    }
    const float lse = m + logf(e);
    lse_out[p] = lse;
    const int32_t label = labels[p];
    if (label == ignore) continue;
    ++counted;
    acc += (label >= 0 && label < c) ? lse - x[label * hw] : NAN;
  }
  __shared__ WarpCount::TempStorage count_tmp[kSumBlock / 32];
  const int warp_count = WarpCount(count_tmp[threadIdx.x >> 5]).Sum(counted);
  if ((threadIdx.x & 31) == 0 && warp_count) atomicAdd(count, warp_count);
  fixed_sum_block<kAtomic>(acc, out);
}

// The backward kernels walk the {n * c, hw} plane: grid rows over the (image, channel) planes,
// threads along each plane's pixels, so no element index is divided.
__global__ void pixel_xent_bwd_kernel(const float* __restrict__ logits, const int32_t* __restrict__ labels,
                                      const float* __restrict__ lse, const float* dl, const int32_t* count, int64_t n,
                                      int64_t c, int64_t hw, int ignore, float* __restrict__ dlogits) {
  const float scale = dl[0] / static_cast<float>(*count);
  for (int64_t q = blockIdx.y; q < n * c; q += gridDim.y) {  // q = image * c + channel
    const int64_t img = ref::div_nonneg(q, c), ch = q - img * c;
    const int32_t* lab = labels + img * hw;
    const float* pl = lse + img * hw;
    for (int64_t s = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; s < hw; s += int64_t(gridDim.x) * blockDim.x) {
      const int32_t label = lab[s];
      float g;
      if (label == ignore)
        g = 0.f;
      else if (label < 0 || label >= c)
        g = NAN;
      else
        g = (expf(logits[q * hw + s] - pl[s]) - (ch == label ? 1.f : 0.f)) * scale;
      dlogits[q * hw + s] = g;
    }
  }
}

__global__ void pixel_nll_bwd_kernel(const int32_t* __restrict__ labels, const float* dl, const int32_t* count,
                                     int64_t n, int64_t c, int64_t hw, int ignore, float* __restrict__ dlog_probs) {
  const float g = -dl[0] / static_cast<float>(*count);
  for (int64_t q = blockIdx.y; q < n * c; q += gridDim.y) {  // q = image * c + channel
    const int64_t img = ref::div_nonneg(q, c), ch = q - img * c;
    const int32_t* lab = labels + img * hw;
    for (int64_t s = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; s < hw; s += int64_t(gridDim.x) * blockDim.x) {
      const int32_t label = lab[s];
      dlog_probs[q * hw + s] = label == ignore ? 0.f : (label < 0 || label >= c) ? NAN : ch == label ? g : 0.f;
    }
  }
}

// The {pixels, planes} grid of the backward kernels: about 4096 blocks in all, each thread
// striding along its plane (one block per 256 elements made tens of thousands of blocks that
// each wrote 1 KiB: block scheduling, not bandwidth, bounded the kernel).
dim3 plane_grid(int64_t planes, int64_t hw) {
  const int64_t y = std::min<int64_t>(planes, 65535);
  const int64_t x = std::clamp<int64_t>(4096 / y, 1, (hw + kThreads - 1) / kThreads);
  return dim3(static_cast<unsigned>(x), static_cast<unsigned>(y));
}

// The forward of either loss: the atomic or the fixed-order sum, then the division by the count.
template <bool kNll>
void pixel_loss_fwd(Context& ctx, const float* x, const int32_t* labels, int64_t n, int64_t c, int64_t hw, int ignore,
                    Reduction r, float* lse, int32_t* count, float* partials, float* loss) {
  cudaStream_t st = detail::stream_of(ctx);
  const int64_t pixels = n * hw;
  const unsigned parts = static_cast<unsigned>(fixed_sum_parts(pixels, kPerThread));
  DITTO_CUDA_CHECK(cudaMemsetAsync(count, 0, sizeof(int32_t), st));
  if (r == Reduction::Atomic) {
    DITTO_CUDA_CHECK(cudaMemsetAsync(loss, 0, sizeof(float), st));
    pixel_xent_kernel<true, kNll><<<parts, kSumBlock, 0, st>>>(x, labels, pixels, c, hw, ignore, lse, count, loss);
    DITTO_CHECK_LAUNCH(ctx);
    divide_scalar_kernel<<<1, 1, 0, st>>>(loss, count, 1.f);
    DITTO_CHECK_LAUNCH(ctx);
    return;
  }
  pixel_xent_kernel<false, kNll><<<parts, kSumBlock, 0, st>>>(x, labels, pixels, c, hw, ignore, lse, count, partials);
  DITTO_CHECK_LAUNCH(ctx);
  fixed_sum_final_kernel<<<1, kSumMaxParts, 0, st>>>(partials, parts, count, 1.f, loss);
  DITTO_CHECK_LAUNCH(ctx);
}

}  // namespace

std::size_t pixel_xent_workspace_floats(int64_t pixels, Reduction r) {
  return r == Reduction::Deterministic ? static_cast<std::size_t>(fixed_sum_parts(pixels, kPerThread)) : 0;
}

void pixel_xent_fwd(Context& ctx, const float* logits, const int32_t* labels, int64_t n, int64_t c, int64_t hw,
                    int ignore, Reduction r, float* lse, int32_t* count, float* partials, float* loss) {
  pixel_loss_fwd<false>(ctx, logits, labels, n, c, hw, ignore, r, lse, count, partials, loss);
}

void pixel_nll_fwd(Context& ctx, const float* log_probs, const int32_t* labels, int64_t n, int64_t c, int64_t hw,
                   int ignore, Reduction r, int32_t* count, float* partials, float* loss) {
  pixel_loss_fwd<true>(ctx, log_probs, labels, n, c, hw, ignore, r, nullptr, count, partials, loss);
}

void pixel_nll_bwd(Context& ctx, const int32_t* labels, const float* dl, const int32_t* count, int64_t n, int64_t c,
                   int64_t hw, int ignore, float* dlog_probs) {
  const int64_t total = n * c * hw;
  if (total == 0) return;
  pixel_nll_bwd_kernel<<<plane_grid(n * c, hw), kThreads, 0, detail::stream_of(ctx)>>>(labels, dl, count, n, c, hw,
                                                                                       ignore, dlog_probs);
  DITTO_CHECK_LAUNCH(ctx);
}

void pixel_xent_bwd(Context& ctx, const float* logits, const int32_t* labels, const float* lse, const float* dl,
                    const int32_t* count, int64_t n, int64_t c, int64_t hw, int ignore, float* dlogits) {
  const int64_t total = n * c * hw;
  if (total == 0) return;
  pixel_xent_bwd_kernel<<<plane_grid(n * c, hw), kThreads, 0, detail::stream_of(ctx)>>>(logits, labels, lse, dl, count,
                                                                                        n, c, hw, ignore, dlogits);
  DITTO_CHECK_LAUNCH(ctx);
}

}  // namespace ditto::cuda
