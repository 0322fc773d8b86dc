// The linear layer's gemm=ditto: ditto's fixed-order GEMM (kernels/detail/fixed_gemm.cuh) on
// column-major strided operands, as kernels/linear.cpp hands cuBLAS its products.
#include "engine/detail/cuda_state.h"
#include "engine/detail/launch.cuh"
#include "kernels/detail/fixed_gemm.cuh"
#include "kernels/detail/linear_cuda.h"

namespace ditto::cuda {
namespace {

// op(M)(r, c) of a column-major matrix with leading dimension ld (transposed: M(c, r)).
template <bool T>
struct ColMajor {
  const float* p;
  int64_t ld;
  __device__ float operator()(int64_t r, int64_t c) const { return __ldg(T ? p + c + r * ld : p + r + c * ld); }
};
struct ColMajorStore {
  float* p;
  int64_t ld;
  __device__ void operator()(int64_t r, int64_t c, float v) const { p[r + c * ld] = v; }
};

// A not transposed is contiguous along its rows' index i; B not transposed along l.
template <bool TA, bool TB>
void launch(Context& ctx, int64_t m, int64_t n, int64_t k, const float* A, int64_t lda, const float* B, int64_t ldb,
            float* C, int64_t ldc) {
  fixed_gemm::kernel<!TA, !TB, int64_t><<<fixed_gemm::grid(m, n), fixed_gemm::kThreads, 0, detail::stream_of(ctx)>>>(
      m, n, k, ColMajor<TA>{A, lda}, ColMajor<TB>{B, ldb}, ColMajorStore{C, ldc});
  DITTO_CHECK_LAUNCH(ctx);
}

}  // namespace

void linear_gemm_fixed(Context& ctx, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* A, int64_t lda,
                       const float* B, int64_t ldb, float* C, int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (ta && tb) launch<true, true>(ctx, m, n, k, A, lda, B, ldb, C, ldc);
  else if (ta) launch<true, false>(ctx, m, n, k, A, lda, B, ldb, C, ldc);
  else if (tb) launch<false, true>(ctx, m, n, k, A, lda, B, ldb, C, ldc);
  else launch<false, false>(ctx, m, n, k, A, lda, B, ldb, C, ldc);
}

}  // namespace ditto::cuda
