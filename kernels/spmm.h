// Sparse x dense matrix product: C {rows, k} = A B with A sparse (CSR, rows x cols) and B dense
// {cols, k}, row-major; kernels/spmm_ref.h states the sums. Gradients: dB = A^T dC (the transpose
// product, where atomics appear) and, when A's values require grad, dvalues[e] = dC[row(e)] .
// B[col(e)] (one warp per row, a fixed shuffle tree per entry: deterministic, no knob).
//
// Forward by the layer's SpmmFwd (knob "fwd" of op kind spmm, manifest op "spmm"):
//   ditto             one warp per row of A; lanes own columns of C, each adds the row's entries in
//                     storage order: deterministic, gpu_to_gpu.
//   cusparse-default  cusparseSpMM, CUSPARSE_SPMM_ALG_DEFAULT. What frameworks call (heuristic).
//   cusparse-alg1/2/3 cusparseSpMM with CUSPARSE_SPMM_CSR_ALG1/2/3. cuSPARSE documents bit-wise
//                     reproducible results among the CSR algorithms for CSR_ALG3 only: alg3 is
//                     run_to_run, the others (and default) not_guaranteed.
// Backward to B by the layer's SpmmBwd (knob "bwd"):
//   atomic         one warp per row of A scatters values[e] * dC[row] into dB[col[e]] with
//                  atomicAdd: entries of one column of A from different rows land in scheduling
//                  order: NOT deterministic.
//   deterministic  the same row kernel as ditto's forward, run on A^T: A's entries sorted by
//                  column with CUB's stable radix sort (so within a column by row), then one warp
//                  per column of A adds its entries in row order. A stable sort has one result on
//                  any GPU: gpu_to_gpu. The transpose's structure is built in backward unless the
//                  matrix carries it (csr_plan_transpose, once for a fixed pattern).
//   cusparse       cusparseSpMM with opA = TRANSPOSE (CUSPARSE_SPMM_ALG_DEFAULT); cuSPARSE says a
//                  transposed sparse operand may give slightly different results between runs:
//                  not_guaranteed. The default (heuristic), as frameworks do.
// cuSPARSE errors are CudaErrors naming the call; a pinned algorithm cuSPARSE refuses for the shape
// is a PolicyError naming the layer and listing the other variants.
// A's structure must be valid CSR (csr_check, or csr_from_host, validates it; on a CPU context the
// op validates it, DataError). The GPU cannot check without a host copy: ditto's kernels turn an
// out-of-range column into NaN in the affected outputs and never read outside the arrays; what
// cuSPARSE does with a bad structure is cuSPARSE's.
// On a CPU context the double-accumulating reference runs, recorded as "cpu-reference".
#pragma once
#include <string>
#include <vector>

#include "engine/context.h"
#include "engine/tape.h"
#include "engine/knob.h"

namespace ditto {

namespace op { inline constexpr OpKind spmm{"spmm"}; }

// Knobs spmm.fwd and spmm.bwd (kernels/spmm.cpp).
enum class SpmmFwd { Ditto, CusparseDefault, CusparseAlg1, CusparseAlg2, CusparseAlg3 };
enum class SpmmBwd { Atomic, Deterministic, Cusparse };
const KnobSpec& spmm_fwd_knob();
const KnobSpec& spmm_bwd_knob();
const char* name_of(SpmmFwd v);
const char* name_of(SpmmBwd v);
inline const char* knob_name(SpmmFwd) { return "fwd"; }
inline const char* knob_name(SpmmBwd) { return "bwd"; }

struct CsrMatrix {
  int64_t rows = 0, cols = 0;
  Tensor row_ptr;  // {rows + 1} i32
  Tensor col_idx;  // {nnz} i32, ascending within a row
  Var values;      // {nnz} f32; set requires_grad for a learned sparse matrix
  // The transpose's structure (csr_plan_transpose): A^T's row pointers {cols + 1}, its column
  // indices (A's rows) {nnz} and, per A^T entry, the index of the A entry it is {nnz}.
  Tensor t_row_ptr, t_col_idx, t_perm;
  int64_t nnz() const { return col_idx.defined() ? col_idx.numel() : 0; }
};

// A CsrMatrix on ctx's device from host arrays; validates the structure (DataError naming the row
// or entry).
CsrMatrix csr_from_host(Context& ctx, int64_t rows, int64_t cols, const std::vector<int32_t>& row_ptr,
                        const std::vector<int32_t>& col_idx, const std::vector<float>& values,
                        bool values_require_grad = false);

// Validates a's structure and shapes (copies the index arrays to the host, so it waits for the
// device): ShapeError for shapes and dtypes, DataError for the structure.
void csr_check(const CsrMatrix& a);

// Builds a's transpose structure on ctx's device (deterministic: a stable sort), so backward
// with bwd=deterministic need not build it on every call.
void csr_plan_transpose(Context& ctx, CsrMatrix& a);

Var spmm(Context& ctx, const std::string& layer, const CsrMatrix& a, const Var& b);

// The dense operand's gradient alone, as the tape entry computes it (ditto.torch calls it with
// another library's tensors): dB {cols, k} = A^T dc for dc {rows, k}, by the layer's `bwd`
// variant, recorded under (layer, "bwd").
Tensor spmm_backward_dense(Context& ctx, const std::string& layer, const CsrMatrix& a, const Tensor& dc,
                           const Shape& b_shape);

}  // namespace ditto
