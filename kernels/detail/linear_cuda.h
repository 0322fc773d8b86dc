// Internal: the CUDA launcher of kernels/linear.cu, the linear layer's gemm=ditto variant.
#pragma once
#include <cstdint>

namespace ditto { class Context; }

namespace ditto::cuda {
// C = op(A) op(B) in cuBLAS's column-major terms (op transposes where ta / tb): C is m x n with
// leading dimension ldc, op(A) m x k, op(B) k x n, all f32 device memory, beta = 0. Every element
// of C is summed over k in ascending order by one thread (kernels/detail/fixed_gemm.cuh): its bits
// depend on its own row and column and k, never on m or n. k = 0 writes zeros.
void linear_gemm_fixed(Context& ctx, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* A, int64_t lda,
                       const float* B, int64_t ldb, float* C, int64_t ldc);
}  // namespace ditto::cuda
