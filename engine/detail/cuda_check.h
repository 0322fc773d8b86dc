// Internal: check macros for CUDA runtime, cuDNN and cuBLAS calls. Not installed; this is the
// only place that pulls the vendor headers into ditto's sources besides the kernels.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <fmt/format.h>

#include "engine/error.h"

namespace ditto::detail {

[[noreturn]] inline void throw_cuda(cudaError_t e, const char* expr, const char* file, int line) {
  throw CudaError(fmt::format("{}:{} {} failed: {} ({})", file, line, expr,
                              cudaGetErrorString(e), cudaGetErrorName(e)));
}
[[noreturn]] inline void throw_cudnn(cudnnStatus_t s, const char* expr, const char* file, int line) {
  char last[512] = {0};
  cudnnGetLastErrorString(last, sizeof(last));
  throw CudnnError(fmt::format("{}:{} {} failed: {}{}{}", file, line, expr,
                               cudnnGetErrorString(s), last[0] ? " — " : "", last));
}
[[noreturn]] inline void throw_cublas(cublasStatus_t s, const char* expr, const char* file, int line) {
  throw CublasError(fmt::format("{}:{} {} failed: {} ({})", file, line, expr,
                                cublasGetStatusString(s), cublasGetStatusName(s)));
}

}  // namespace ditto::detail

#define DITTO_CUDA_CHECK(expr)                                                  \
  do {                                                                          \
    cudaError_t ditto_e_ = (expr);                                              \
    if (ditto_e_ != cudaSuccess) ::ditto::detail::throw_cuda(ditto_e_, #expr, __FILE__, __LINE__); \
  } while (0)

#define DITTO_CUDNN_CHECK(expr)                                                 \
  do {                                                                          \
    cudnnStatus_t ditto_s_ = (expr);                                            \
    if (ditto_s_ != CUDNN_STATUS_SUCCESS) ::ditto::detail::throw_cudnn(ditto_s_, #expr, __FILE__, __LINE__); \
  } while (0)

#define DITTO_CUBLAS_CHECK(expr)                                                \
  do {                                                                          \
    cublasStatus_t ditto_s_ = (expr);                                           \
    if (ditto_s_ != CUBLAS_STATUS_SUCCESS) ::ditto::detail::throw_cublas(ditto_s_, #expr, __FILE__, __LINE__); \
  } while (0)

// After every kernel launch: picks up launch errors at once; with the context's debug switch
// (ContextOptions::sync_after_launch or DITTO_DEBUG_SYNC=1) also synchronizes the stream so an
// asynchronous fault is reported at the launch that caused it.
#define DITTO_CHECK_LAUNCH(ctx)                                                 \
  do {                                                                          \
    DITTO_CUDA_CHECK(cudaGetLastError());                                       \
    if ((ctx).debug_sync()) DITTO_CUDA_CHECK(cudaStreamSynchronize(::ditto::detail::stream_of(ctx))); \
  } while (0)

// Destructors must not throw: report and carry on.
#define DITTO_CUDA_CHECK_PRINT(expr)                                            \
  do {                                                                          \
    cudaError_t ditto_e_ = (expr);                                              \
    if (ditto_e_ != cudaSuccess)                                                \
      fmt::print(stderr, "{}:{} {} failed: {}\n", __FILE__, __LINE__, #expr, cudaGetErrorString(ditto_e_)); \
  } while (0)
