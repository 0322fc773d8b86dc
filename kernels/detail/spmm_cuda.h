// Internal: CUDA launchers of kernels/spmm.cu (ditto's sparse x dense kernels and the transpose
// plan; the cuSPARSE variants are called from kernels/spmm.cpp).
#pragma once
#include <cstddef>
#include <cstdint>

namespace ditto { class Context; }

namespace ditto::cuda {

// c {out_rows, k} = the CSR rows (ptr, idx) times b {in_rows, k}; entry e's value is
// vals[perm ? perm[e] : e].
void spmm_rows(Context& ctx, int64_t out_rows, int64_t in_rows, int64_t k, int64_t nnz, const int32_t* ptr,
               const int32_t* idx, const float* vals, const int32_t* perm, const float* b, float* c);
// db {cols, k} (zeroed by the caller) += A^T dc by atomicAdd.
void spmm_scatter_atomic(Context& ctx, int64_t rows, int64_t cols, int64_t k, int64_t nnz, const int32_t* ptr,
                         const int32_t* idx, const float* vals, const float* dc, float* db);
// dvals[e] = dc[row(e)] . b[col(e)].
void spmm_values_grad(Context& ctx, int64_t rows, int64_t cols, int64_t k, int64_t nnz, const int32_t* ptr,
                      const int32_t* idx, const float* b, const float* dc, float* dvals);

std::size_t csr_transpose_workspace(int64_t nnz, int64_t cols);
// t_ptr {cols + 1}, t_idx {nnz} (A's row of each A^T entry), t_perm {nnz} (A's entry index).
void csr_transpose(Context& ctx, int64_t rows, int64_t cols, int64_t nnz, const int32_t* ptr, const int32_t* idx,
                   int32_t* t_ptr, int32_t* t_idx, int32_t* t_perm, void* workspace);

}  // namespace ditto::cuda
