// ditto's sparse x dense kernels. Which are deterministic, and why, is said per kernel.
#include "engine/detail/cuda_state.h"
#include "engine/detail/launch.cuh"
#include "kernels/detail/segments.cuh"
#include "kernels/detail/spmm_cuda.h"

namespace ditto::cuda {
namespace {

constexpr unsigned kFull = 0xffffffffu;
constexpr int kWarps = kThreads / 32;
constexpr int kColsPerLane = 4;  // a pass covers 128 columns of the dense operand

unsigned warp_blocks(int64_t warps_needed) {
  const int64_t b = (warps_needed + kWarps - 1) / kWarps;
  return static_cast<unsigned>(b < 1 ? 1 : (b > 524280 ? 524280 : b));
}

// The entry range of CSR row r, or an empty one (and bad) where the pointers are not a valid
// range of the nnz entries: no read outside the arrays.
__device__ __forceinline__ bool row_range(const int32_t* ptr, int64_t r, int64_t nnz, int64_t& beg, int64_t& end) {
  beg = ptr[r];
  end = ptr[r + 1];
  const bool bad = beg < 0 || end < beg || end > nnz;
  if (bad) beg = end = 0;
  return !bad;
}

// One warp per output row. Lanes load 32 entries at a time and broadcast them; lane l owns
// columns c0 + l + 32q of the row and adds the entries' products in storage order. Each output
// element is one lane's sequential sum: deterministic, and the same on any GPU. An entry whose
// column is outside [0, in_rows) turns the row's outputs into NaN.
__global__ void spmm_rows_kernel(int64_t out_rows, int64_t in_rows, int64_t k, int64_t nnz,
                                 const int32_t* __restrict__ ptr, const int32_t* __restrict__ idx,
                                 const float* __restrict__ vals, const int32_t* __restrict__ perm,
                                 const float* __restrict__ b, float* __restrict__ c) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = int64_t(gridDim.x) * kWarps;
  for (int64_t r = blockIdx.x * int64_t(kWarps) + threadIdx.x / 32; r < out_rows; r += warps) {
    int64_t beg, end;
    const bool ok = row_range(ptr, r, nnz, beg, end);
    for (int64_t c0 = 0; c0 < k; c0 += 32 * kColsPerLane) {
      float acc[kColsPerLane];
      for (int q = 0; q < kColsPerLane; ++q) acc[q] = ok ? 0.f : NAN;
      for (int64_t e0 = beg; e0 < end; e0 += 32) {
        int32_t my_col = 0;
        float my_val = 0.f;
        if (e0 + lane < end) {
          my_col = idx[e0 + lane];
          my_val = vals[perm ? perm[e0 + lane] : e0 + lane];
        }
        const int cnt = end - e0 < 32 ? int(end - e0) : 32;
        for (int j = 0; j < cnt; ++j) {
          const int32_t col = __shfl_sync(kFull, my_col, j);
          const float v = __shfl_sync(kFull, my_val, j);
          if (col < 0 || col >= in_rows) {
            for (int q = 0; q < kColsPerLane; ++q) acc[q] = NAN;
            continue;
          }
          const float* brow = b + int64_t(col) * k;
          for (int q = 0; q < kColsPerLane; ++q) {
            const int64_t cc = c0 + lane + 32 * q;
            if (cc < k) acc[q] += v * brow[cc];
          }
        }
      }
      for (int q = 0; q < kColsPerLane; ++q) {
        const int64_t cc = c0 + lane + 32 * q;
        if (cc < k) c[r * k + cc] = acc[q];
      }
    }
  }
}

// Calls fn(r, e, col) for each entry e (column col) of each row r of this warp: one warp per row,
// rows in grid-stride order, a row's entries in storage order (all lanes alike).
template <class F>
__device__ __forceinline__ void for_each_entry_of_warp(int64_t rows, int64_t nnz, const int32_t* __restrict__ ptr,
                                                       const int32_t* __restrict__ idx, F&& fn) {
  const int64_t warps = int64_t(gridDim.x) * kWarps;
  for (int64_t r = blockIdx.x * int64_t(kWarps) + threadIdx.x / 32; r < rows; r += warps) {
    int64_t beg, end;
    row_range(ptr, r, nnz, beg, end);
    for (int64_t e = beg; e < end; ++e) fn(r, e, idx[e]);
  }
}

// dB += A^T dC by scatter: one warp per row r of A adds values[e] * dC[r, j] into dB[col[e], j]
// with atomicAdd. Rows sharing a column add into the same dB row in scheduling order: NOT
// deterministic. Entries with an out-of-range column are skipped.
__global__ void spmm_scatter_kernel(int64_t rows, int64_t cols, int64_t k, int64_t nnz, const int32_t* __restrict__ ptr,
                                    const int32_t* __restrict__ idx, const float* __restrict__ vals,
                                    const float* __restrict__ dc, float* __restrict__ db) {
  const int lane = threadIdx.x & 31;
  for_each_entry_of_warp(rows, nnz, ptr, idx, [&](int64_t r, int64_t e, int32_t col) {
    if (col < 0 || col >= cols) return;
    const float v = vals[e];
    for (int64_t cc = lane; cc < k; cc += 32) atomicAdd(db + int64_t(col) * k + cc, v * dc[r * k + cc]);
  });
}

// dvalues[e] = dC[row] . B[col[e]]: one warp per row; for each entry in turn, lane l adds the
// products of columns l, l + 32, ... in order, then a fixed xor-shuffle tree combines the lanes.
// Deterministic.
__global__ void spmm_values_grad_kernel(int64_t rows, int64_t cols, int64_t k, int64_t nnz,
                                        const int32_t* __restrict__ ptr, const int32_t* __restrict__ idx,
                                        const float* __restrict__ b, const float* __restrict__ dc,
                                        float* __restrict__ dvals) {
  const int lane = threadIdx.x & 31;
  for_each_entry_of_warp(rows, nnz, ptr, idx, [&](int64_t r, int64_t e, int32_t col) {
    const bool ok = col >= 0 && col < cols;
    float s = 0.f;
    if (ok)
      for (int64_t cc = lane; cc < k; cc += 32) s += dc[r * k + cc] * b[int64_t(col) * k + cc];
    for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(kFull, s, off);
    if (lane == 0) dvals[e] = ok ? s : NAN;
  });
}

// The row of CSR entry e: the last r with ptr[r] <= e (a binary search over ptr), clamped to
// [0, rows) so that pointers that are not a valid CSR structure still give an in-range row.
__device__ __forceinline__ int32_t row_of_entry(const int32_t* __restrict__ ptr, int64_t rows, int64_t e) {
  int64_t lo = 0, hi = rows + 1;  // first r in [0, rows + 1) with ptr[r] > e
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (ptr[mid] <= e)
      lo = mid + 1;
    else
      hi = mid;
  }
  const int64_t r = lo - 1;
  return static_cast<int32_t>(r < 0 ? 0 : (r >= rows ? rows - 1 : r));
}

// Sort records for the transpose: key = the entry's column (an out-of-range one: the sentinel
// `cols`, sorted past every real column), value = the entry's index; and each entry's row, found
// here in storage order, where neighbouring threads' searches take the same path through ptr
// (after the sort, neighbours' entries are scattered over A and each search would miss the cache).
__global__ void transpose_keys_kernel(const int32_t* __restrict__ ptr, int64_t rows, const int32_t* __restrict__ idx,
                                      int64_t nnz, int64_t cols, uint32_t* __restrict__ keys,
                                      int32_t* __restrict__ vals, int32_t* __restrict__ row_of) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < nnz; e += int64_t(gridDim.x) * blockDim.x) {
    const int32_t col = idx[e];
    keys[e] = (col >= 0 && col < cols) ? static_cast<uint32_t>(col) : static_cast<uint32_t>(cols);
    vals[e] = static_cast<int32_t>(e);
    row_of[e] = row_of_entry(ptr, rows, e);
  }
}

// t_idx[p] = the row of A entry t_perm[p].
__global__ void transpose_rows_kernel(const int32_t* __restrict__ row_of, const int32_t* __restrict__ perm, int64_t nnz,
                                      int32_t* __restrict__ t_idx) {
  for (int64_t p = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; p < nnz; p += int64_t(gridDim.x) * blockDim.x)
    t_idx[p] = row_of[perm[p]];
}

struct TransposeLayout {
  uint32_t *keys_in, *keys_out;
  int32_t *vals_in, *row_of;
  void* sort_temp;
  std::size_t sort_bytes, bytes;
  int end_bit;
};

TransposeLayout transpose_layout(void* base, int64_t nnz, int64_t cols) {
  TransposeLayout l;
  l.end_bit = key_bits(static_cast<uint64_t>(cols));
  l.sort_bytes = sort_pairs_temp_bytes(nnz, l.end_bit);
  WorkspaceCarve carve{static_cast<char*>(base)};
  l.keys_in = carve.take<uint32_t>(nnz);
  l.keys_out = carve.take<uint32_t>(nnz);
  l.vals_in = carve.take<int32_t>(nnz);
  l.row_of = carve.take<int32_t>(nnz);
  l.sort_temp = carve.take<char>(static_cast<int64_t>(l.sort_bytes));
  l.bytes = carve.bytes;
  return l;
}

}  // namespace

void spmm_rows(Context& ctx, int64_t out_rows, int64_t in_rows, int64_t k, int64_t nnz, const int32_t* ptr,
               const int32_t* idx, const float* vals, const int32_t* perm, const float* b, float* c) {
  if (out_rows == 0 || k == 0) return;
  spmm_rows_kernel<<<warp_blocks(out_rows), kThreads, 0, detail::stream_of(ctx)>>>(out_rows, in_rows, k, nnz, ptr, idx,
                                                                                   vals, perm, b, c);
  DITTO_CHECK_LAUNCH(ctx);
}

void spmm_scatter_atomic(Context& ctx, int64_t rows, int64_t cols, int64_t k, int64_t nnz, const int32_t* ptr,
                         const int32_t* idx, const float* vals, const float* dc, float* db) {
  if (rows == 0 || k == 0 || nnz == 0) return;
  spmm_scatter_kernel<<<warp_blocks(rows), kThreads, 0, detail::stream_of(ctx)>>>(rows, cols, k, nnz, ptr, idx, vals,
                                                                                  dc, db);
  DITTO_CHECK_LAUNCH(ctx);
}

void spmm_values_grad(Context& ctx, int64_t rows, int64_t cols, int64_t k, int64_t nnz, const int32_t* ptr,
                      const int32_t* idx, const float* b, const float* dc, float* dvals) {
  if (rows == 0 || nnz == 0) return;
  spmm_values_grad_kernel<<<warp_blocks(rows), kThreads, 0, detail::stream_of(ctx)>>>(rows, cols, k, nnz, ptr, idx, b,
                                                                                      dc, dvals);
  DITTO_CHECK_LAUNCH(ctx);
}

std::size_t csr_transpose_workspace(int64_t nnz, int64_t cols) { return transpose_layout(nullptr, nnz, cols).bytes; }

void csr_transpose(Context& ctx, int64_t rows, int64_t cols, int64_t nnz, const int32_t* ptr, const int32_t* idx,
                   int32_t* t_ptr, int32_t* t_idx, int32_t* t_perm, void* workspace) {
  cudaStream_t st = detail::stream_of(ctx);
  if (nnz == 0) {
    DITTO_CUDA_CHECK(cudaMemsetAsync(t_ptr, 0, sizeof(int32_t) * static_cast<std::size_t>(cols + 1), st));
    return;
  }
  const TransposeLayout l = transpose_layout(workspace, nnz, cols);
  transpose_keys_kernel<<<blocks_for(nnz), kThreads, 0, st>>>(ptr, rows, idx, nnz, cols, l.keys_in, l.vals_in,
                                                              l.row_of);
  DITTO_CHECK_LAUNCH(ctx);
  sort_pairs(l.sort_temp, l.sort_bytes, l.keys_in, l.keys_out, l.vals_in, t_perm, nnz, l.end_bit, st);
  segment_starts_kernel<<<blocks_for(cols + 1), kThreads, 0, st>>>(l.keys_out, nnz, t_ptr, cols);
  DITTO_CHECK_LAUNCH(ctx);
  transpose_rows_kernel<<<blocks_for(nnz), kThreads, 0, st>>>(l.row_of, t_perm, nnz, t_idx);
  DITTO_CHECK_LAUNCH(ctx);
}

}  // namespace ditto::cuda
