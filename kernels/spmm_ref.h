// CPU reference of kernels/spmm: C = A B for a sparse A (CSR, rows x cols, nnz entries) and a
// dense row-major B (cols x k), and its gradients, in double accumulation:
//   C[r, j]    = sum over the entries e of row r, in storage order, of values[e] * B[col[e], j]
//   dB[c, j]   = sum over the entries e with col[e] = c, in storage order, of values[e] * dC[row(e), j]
//   dvalues[e] = sum over j in order of dC[row(e), j] * B[col[e], j]
#pragma once
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

namespace ditto::ref {

struct SpmmDims {
  int64_t rows = 0, cols = 0, k = 0, nnz = 0;
};

// "" when row_ptr and col_idx form a valid CSR structure (row_ptr[0] = 0, non-decreasing,
// row_ptr[rows] = nnz, column indices in [0, cols) and strictly ascending within each row), else
// what is wrong, naming the row or entry.
inline std::string csr_problem(const int32_t* row_ptr, const int32_t* col_idx, const SpmmDims& d) {
  if (row_ptr[0] != 0) return "row_ptr[0] is " + std::to_string(row_ptr[0]) + ", not 0";
  if (row_ptr[d.rows] != d.nnz)
    return "row_ptr[" + std::to_string(d.rows) + "] is " + std::to_string(row_ptr[d.rows]) + " but there are " +
           std::to_string(d.nnz) + " entries";
  for (int64_t r = 0; r < d.rows; ++r) {
    if (row_ptr[r + 1] < row_ptr[r] || row_ptr[r + 1] > d.nnz)
      return "row_ptr decreases or overruns at row " + std::to_string(r);
    for (int64_t e = row_ptr[r]; e < row_ptr[r + 1]; ++e) {
      if (col_idx[e] < 0 || col_idx[e] >= d.cols)
        return "entry " + std::to_string(e) + " (row " + std::to_string(r) + ") has column " +
               std::to_string(col_idx[e]) + ", outside [0, " + std::to_string(d.cols) + ")";
      if (e > row_ptr[r] && col_idx[e] <= col_idx[e - 1])
        return "row " + std::to_string(r) + " has columns out of ascending order at entry " + std::to_string(e);
    }
  }
  return "";
}

template <class T>
void spmm_fwd(const int32_t* row_ptr, const int32_t* col_idx, const T* values, const T* b, T* c, const SpmmDims& d) {
  std::vector<double> acc(static_cast<std::size_t>(d.k));
  for (int64_t r = 0; r < d.rows; ++r) {
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int64_t e = row_ptr[r]; e < row_ptr[r + 1]; ++e)
      for (int64_t j = 0; j < d.k; ++j) acc[j] += double(values[e]) * double(b[int64_t(col_idx[e]) * d.k + j]);
    for (int64_t j = 0; j < d.k; ++j) c[r * d.k + j] = static_cast<T>(acc[j]);
  }
}

// dB (cols x k) from dC (rows x k).
template <class T>
void spmm_bwd_dense(const int32_t* row_ptr, const int32_t* col_idx, const T* values, const T* dc, T* db,
                    const SpmmDims& d) {
  std::vector<double> acc(static_cast<std::size_t>(d.cols * d.k), 0.0);
  for (int64_t r = 0; r < d.rows; ++r)
    for (int64_t e = row_ptr[r]; e < row_ptr[r + 1]; ++e)
      for (int64_t j = 0; j < d.k; ++j)
        acc[int64_t(col_idx[e]) * d.k + j] += double(values[e]) * double(dc[r * d.k + j]);
  for (std::size_t i = 0; i < acc.size(); ++i) db[i] = static_cast<T>(acc[i]);
}

template <class T>
void spmm_bwd_values(const int32_t* row_ptr, const int32_t* col_idx, const T* b, const T* dc, T* dvalues,
                     const SpmmDims& d) {
  for (int64_t r = 0; r < d.rows; ++r)
    for (int64_t e = row_ptr[r]; e < row_ptr[r + 1]; ++e) {
      double s = 0;
      for (int64_t j = 0; j < d.k; ++j) s += double(dc[r * d.k + j]) * double(b[int64_t(col_idx[e]) * d.k + j]);
      dvalues[e] = static_cast<T>(s);
    }
}

}  // namespace ditto::ref
