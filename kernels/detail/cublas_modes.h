// Internal: the cuBLAS handle's math and atomics modes for one op's calls. A context's ops share
// one cuBLAS handle, so each op that calls cuBLAS sets the modes its policy asks for and restores
// the previous ones once its calls are queued (the modes are read at call time, not at run time).
// The math mode is always CUBLAS_DEFAULT_MATH: TF32 is chosen by each call's compute type alone,
// never by the handle behind the policy's back.
#pragma once
#include <cublas_v2.h>

#include "engine/detail/cuda_check.h"

namespace ditto::detail {

class CublasModes {
 public:
  CublasModes(cublasHandle_t h, bool allow_atomics) : h_(h) {
    DITTO_CUBLAS_CHECK(cublasGetMathMode(h_, &prev_math_));
    DITTO_CUBLAS_CHECK(cublasGetAtomicsMode(h_, &prev_atomics_));
    DITTO_CUBLAS_CHECK(cublasSetMathMode(h_, CUBLAS_DEFAULT_MATH));
    DITTO_CUBLAS_CHECK(cublasSetAtomicsMode(h_, allow_atomics ? CUBLAS_ATOMICS_ALLOWED : CUBLAS_ATOMICS_NOT_ALLOWED));
  }
  ~CublasModes() {
    cublasSetMathMode(h_, prev_math_);  // destructors do not throw; these cannot fail on a live handle
    cublasSetAtomicsMode(h_, prev_atomics_);
  }
  CublasModes(const CublasModes&) = delete;
  CublasModes& operator=(const CublasModes&) = delete;

 private:
  cublasHandle_t h_;
  cublasMath_t prev_math_ = CUBLAS_DEFAULT_MATH;
  cublasAtomicsMode_t prev_atomics_ = CUBLAS_ATOMICS_NOT_ALLOWED;
};

}  // namespace ditto::detail
