// Internal (CUDA only): the fixed-order reductions ditto's own kernels are built on, from CUB
// (CCCL 3.0, shipped with the toolkit).
//
// BlockSum<kBlock> is cub::BlockReduce<float, kBlock, BLOCK_REDUCE_WARP_REDUCTIONS>. Its order,
// as CUB documents the algorithm: each warp reduces its 32 inputs with a warp-synchronous
// shuffle tree, then the warp aggregates are combined in warp-index order. The order depends on
// the block size alone, never on scheduling, so a BlockSum of the same inputs gives the same bits
// every run. Every kernel that uses it launches a grid whose shape is a function of the tensor
// shape only (not of the GPU's SM count), so its result is the same on any GPU running the same
// code: CCCL 3.1's `gpu_to_gpu` guarantee, which CCCL 3.0's cub::DeviceReduce does not give (its
// grid follows the SM count: `run_to_run` only). That is why these are block-level, not
// DeviceReduce calls.
//
// WarpSum is cub::WarpReduce<float>: the per-warp sums the atomic (nondeterministic) variants add
// into their outputs; the atomicAdd order is what makes those variants `not_guaranteed`.
#pragma once
#include <cub/block/block_reduce.cuh>
#include <cub/warp/warp_reduce.cuh>

namespace ditto::cuda {

template <int kBlock>
using BlockSum = cub::BlockReduce<float, kBlock, cub::BLOCK_REDUCE_WARP_REDUCTIONS>;

using WarpSum = cub::WarpReduce<float>;

// Walks one channel's values of an {N, C, S} tensor at j = first, first + stride, ... (j runs
// over the channel's N*S values, n-major) with one 64-bit division up front instead of two per
// element: each step adds the stride's quotient and remainder with one carry. The order of the
// visited elements is that of j, so sums over a walk are what the plain loop gives, bit for bit.
struct ChannelWalk {
  int64_t n, s;
  const int64_t len, dn, ds;
  __device__ __forceinline__ ChannelWalk(int64_t first, int64_t s_len, int64_t stride)
      : n(first / s_len), s(first % s_len), len(s_len), dn(stride / s_len), ds(stride % s_len) {}
  __device__ __forceinline__ int64_t offset(int64_t ch, int64_t c) const { return (n * c + ch) * len + s; }
  __device__ __forceinline__ void next() {
    n += dn;
    s += ds;
    if (s >= len) {
      s -= len;
      ++n;
    }
  }
};

// The channel of flat index i in an {N, C, S} tensor, in 32-bit arithmetic when the tensor has
// fewer than 2^32 elements (`narrow`, uniform across the grid): 64-bit division is several times
// slower, and elementwise kernels do one per element.
__device__ __forceinline__ int64_t channel_of(int64_t i, int64_t s, int64_t c, bool narrow) {
  if (narrow) return static_cast<uint32_t>(i) / static_cast<uint32_t>(s) % static_cast<uint32_t>(c);
  return (i / s) % c;
}
inline bool narrow_index(int64_t total) { return total <= int64_t(0xffffffff); }

}  // namespace ditto::cuda
