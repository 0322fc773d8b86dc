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

}  // namespace ditto::cuda
