// Internal: the RAII cuDNN tensor descriptor every op family uses (cudnn.h stays out of the
// public headers). NCHW, or channels-last where a convolution's layout knob asks; float, or
// bf16/f16 where a convolution computes in reduced precision.
#pragma once
#include <cstdint>

#include "engine/detail/cuda_check.h"
#include "engine/tensor.h"

namespace ditto::detail {

inline cudnnDataType_t cudnn_type(DType t) {
  return t == DType::BF16 ? CUDNN_DATA_BFLOAT16 : t == DType::F16 ? CUDNN_DATA_HALF : CUDNN_DATA_FLOAT;
}

struct CudnnTensorDesc {
  cudnnTensorDescriptor_t d = nullptr;

  CudnnTensorDesc() { DITTO_CUDNN_CHECK(cudnnCreateTensorDescriptor(&d)); }
  CudnnTensorDesc(int64_t n, int64_t c, int64_t h, int64_t w) : CudnnTensorDesc() { set(n, c, h, w); }
  ~CudnnTensorDesc() { cudnnDestroyTensorDescriptor(d); }
  CudnnTensorDesc(const CudnnTensorDesc&) = delete;
  CudnnTensorDesc& operator=(const CudnnTensorDesc&) = delete;

  // Dimensions are always given as N, C, H, W; channels_last says the memory is N, H, W, C.
  void set(int64_t n, int64_t c, int64_t h, int64_t w, DType t = DType::F32, bool channels_last = false) {
    DITTO_CUDNN_CHECK(cudnnSetTensor4dDescriptor(d, channels_last ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW,
                                                 cudnn_type(t), int(n), int(c), int(h), int(w)));
  }
  void set(const Shape& s, DType t = DType::F32, bool channels_last = false) {
    set(s[0], s[1], s[2], s[3], t, channels_last);
  }
  cudnnTensorDescriptor_t get() const { return d; }
};

}  // namespace ditto::detail
