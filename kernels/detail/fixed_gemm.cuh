// Internal (CUDA only): ditto's fixed-order GEMM, the kernel behind the batch-invariant variants
// (conv2d fwd `ditto-direct`, kernels/conv2d_own.cu; linear gemm `ditto`, kernels/linear.cu).
//
//   C(i, j) = sum over l = 0, 1, ..., K-1 of A(i, l) * B(l, j)
//
// Every output element is one thread's register, started at +0.0f and updated by one fmaf per
// term in ascending l. Its bits are therefore a function of its own row of A, its own column of B
// and K: not of M or N (how many rows or columns there are: the batch size), not of the tile the
// element falls in (its position in the batch), not of the grid or the GPU. That is the property
// cuBLAS and cuDNN do not give: they pick kernels (tile shapes, split-K) per problem size, so one
// example's result changes with the batch it is computed in.
//
// Tiling: 64 x 64 outputs per block of 256 threads, each thread 4 x 4 of them (rows tx + 16 r,
// columns ty + 16 q: neighbouring threads write neighbouring rows, so i should be C's contiguous
// index; blockIdx.x walks i, the long dimension); A and B pass through shared
// memory in stages of 16 values of l. The operands are read through loader functors
// (a(i, l), b(l, j) -> float, 0 outside the matrix) and written through a store functor
// (c(i, j, v)), so one kernel serves dense strided operands and an implicit im2col.
// A_ALONG_I / B_ALONG_L say which index of each operand is contiguous in memory, so that a warp's
// loads of a stage read neighbouring addresses.
#pragma once
#include <cstdint>

namespace ditto::cuda::fixed_gemm {

constexpr int kTile = 64, kStage = 16, kThreads = 256;

template <bool A_ALONG_I, bool B_ALONG_L, class I, class LoadA, class LoadB, class Store>
__global__ void __launch_bounds__(kThreads) kernel(I M, I N, I K, LoadA a, LoadB b, Store c) {
  __shared__ float as[kStage][kTile + 1];  // as[l][i]
  __shared__ float bs[kStage][kTile + 1];  // bs[l][j]
  const int t = threadIdx.x, tx = t % 16, ty = t / 16;
  const I i0 = I(blockIdx.x) * kTile, j0 = I(blockIdx.y) * kTile;
  float acc[4][4];
#pragma unroll
  for (int r = 0; r < 4; ++r)
#pragma unroll
    for (int q = 0; q < 4; ++q) acc[r][q] = 0.f;
  for (I l0 = 0; l0 < K; l0 += kStage) {
    // 64 x 16 values of each operand, 4 per thread.
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int v = t + e * kThreads;
      const int ai = A_ALONG_I ? v % kTile : v / kStage, al = A_ALONG_I ? v / kTile : v % kStage;
      const I gi = i0 + ai, gl = l0 + al;
      as[al][ai] = gi < M && gl < K ? a(gi, gl) : 0.f;
      const int bj = B_ALONG_L ? v / kStage : v % kTile, bl = B_ALONG_L ? v % kStage : v / kTile;
      const I gj = j0 + bj, gl2 = l0 + bl;
      bs[bl][bj] = gj < N && gl2 < K ? b(gl2, gj) : 0.f;
    }
    __syncthreads();
    // The terms past K are never added (a stage's tail is skipped, not added as zeros): an
    // output's sum is the same K terms in the same order whatever the tile.
    const int len = K - l0 < kStage ? int(K - l0) : kStage;
    for (int l = 0; l < len; ++l) {
      float av[4], bv[4];
#pragma unroll
      for (int r = 0; r < 4; ++r) av[r] = as[l][tx + 16 * r];
#pragma unroll
      for (int q = 0; q < 4; ++q) bv[q] = bs[l][ty + 16 * q];
#pragma unroll
      for (int r = 0; r < 4; ++r)
#pragma unroll
        for (int q = 0; q < 4; ++q) acc[r][q] = fmaf(av[r], bv[q], acc[r][q]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int r = 0; r < 4; ++r)
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const I i = i0 + tx + 16 * r, j = j0 + ty + 16 * q;
      if (i < M && j < N) c(i, j, acc[r][q]);
    }
}

// The grid of an M x N product.
inline dim3 grid(int64_t M, int64_t N) {
  return dim3(static_cast<unsigned>((M + kTile - 1) / kTile), static_cast<unsigned>((N + kTile - 1) / kTile));
}

}  // namespace ditto::cuda::fixed_gemm
