// Internal: the RAII cuDNN tensor descriptor every op family uses (cudnn.h stays out of the
// public headers). Float NCHW, the only layout ditto hands to cuDNN.
#pragma once
#include <cstdint>

#include "engine/detail/cuda_check.h"
#include "engine/tensor.h"

namespace ditto::detail {

struct CudnnTensorDesc {
  cudnnTensorDescriptor_t d = nullptr;

  CudnnTensorDesc() { DITTO_CUDNN_CHECK(cudnnCreateTensorDescriptor(&d)); }
  CudnnTensorDesc(int64_t n, int64_t c, int64_t h, int64_t w) : CudnnTensorDesc() { set(n, c, h, w); }
  ~CudnnTensorDesc() { cudnnDestroyTensorDescriptor(d); }
  CudnnTensorDesc(const CudnnTensorDesc&) = delete;
  CudnnTensorDesc& operator=(const CudnnTensorDesc&) = delete;

  void set(int64_t n, int64_t c, int64_t h, int64_t w) {
    DITTO_CUDNN_CHECK(cudnnSetTensor4dDescriptor(d, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, int(n), int(c), int(h), int(w)));
  }
  void set(const Shape& s) { set(s[0], s[1], s[2], s[3]); }
  cudnnTensorDescriptor_t get() const { return d; }
};

}  // namespace ditto::detail
