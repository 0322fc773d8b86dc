// Activation CUDA kernels (ReLU, sigmoid, SiLU, ReLU6): one thread per element, no
// reductions, so bit-reproducible whatever the launch shape. The formulas are the CPU
// reference's (kernels/activation_ref.h), evaluated in float with expf.
#include "engine/detail/cuda_state.h"
#include "engine/detail/launch.cuh"
#include "engine/detail/float_map.cuh"
#include "kernels/detail/activation_cuda.h"

namespace ditto::cuda {
namespace {
__global__ void relu_fwd_kernel(const float* x, float* y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] = x[i] > 0.f ? x[i] : 0.f;
}
__global__ void relu_bwd_kernel(const float* y, const float* dy, float* dx, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    dx[i] = y[i] > 0.f ? dy[i] : 0.f;
}

// The same two overflow-free branches as ref::sigmoid_of.
__device__ __forceinline__ float sigmoid_dev(float x) {
  if (x >= 0.f) return 1.f / (1.f + expf(-x));
  const float e = expf(x);
  return e / (1.f + e);
}

__global__ void sigmoid_fwd_kernel(const float* x, float* y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] = sigmoid_dev(x[i]);
}
__global__ void sigmoid_bwd_kernel(const float* y, const float* dy, float* dx, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    dx[i] = dy[i] * (y[i] * (1.f - y[i]));
}
__global__ void silu_fwd_kernel(const float* x, float* y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] = x[i] * sigmoid_dev(x[i]);
}
__global__ void silu_bwd_kernel(const float* x, const float* dy, float* dx, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float s = sigmoid_dev(x[i]);
    dx[i] = dy[i] * (s + x[i] * s * (1.f - s));
  }
}
__global__ void relu6_fwd_kernel(const float* x, float* y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] = x[i] < 0.f ? 0.f : (x[i] > 6.f ? 6.f : x[i]);
}
__global__ void relu6_bwd_kernel(const float* x, const float* dy, float* dx, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    dx[i] = (x[i] > 0.f && x[i] < 6.f) ? dy[i] : 0.f;
}
}  // namespace

#define DITTO_UNARY_LAUNCHER(name, kernel)                                               \
  void name(Context& ctx, const float* a, float* out, int64_t n) {                       \
    if (n == 0) return;                                                                  \
    kernel<<<blocks_for(n), kThreads, 0, detail::stream_of(ctx)>>>(a, out, n);           \
    DITTO_CHECK_LAUNCH(ctx);                                                             \
  }
#define DITTO_BINARY_LAUNCHER(name, kernel)                                              \
  void name(Context& ctx, const float* a, const float* dy, float* dx, int64_t n) {       \
    if (n == 0) return;                                                                  \
    kernel<<<blocks_for(n), kThreads, 0, detail::stream_of(ctx)>>>(a, dy, dx, n);        \
    DITTO_CHECK_LAUNCH(ctx);                                                             \
  }

DITTO_UNARY_LAUNCHER(relu_fwd, relu_fwd_kernel)
DITTO_BINARY_LAUNCHER(relu_bwd, relu_bwd_kernel)
DITTO_UNARY_LAUNCHER(sigmoid_fwd, sigmoid_fwd_kernel)
DITTO_BINARY_LAUNCHER(sigmoid_bwd, sigmoid_bwd_kernel)
DITTO_UNARY_LAUNCHER(silu_fwd, silu_fwd_kernel)
DITTO_BINARY_LAUNCHER(silu_bwd, silu_bwd_kernel)
DITTO_UNARY_LAUNCHER(relu6_fwd, relu6_fwd_kernel)
DITTO_BINARY_LAUNCHER(relu6_bwd, relu6_bwd_kernel)

#undef DITTO_UNARY_LAUNCHER
#undef DITTO_BINARY_LAUNCHER

namespace {
// The per-element formulas of the float kernels above, as functors for float_map.
struct ReluF {
  __device__ float operator()(float x) const { return x > 0.f ? x : 0.f; }
};
struct ReluB {
  __device__ float operator()(float y, float dy) const { return y > 0.f ? dy : 0.f; }
};
struct SigmoidF {
  __device__ float operator()(float x) const { return sigmoid_dev(x); }
};
struct SigmoidB {
  __device__ float operator()(float y, float dy) const { return dy * (y * (1.f - y)); }
};
struct SiluF {
  __device__ float operator()(float x) const { return x * sigmoid_dev(x); }
};
struct SiluB {
  __device__ float operator()(float x, float dy) const {
    const float s = sigmoid_dev(x);
    return dy * (s + x * s * (1.f - s));
  }
};
struct Relu6F {
  __device__ float operator()(float x) const { return x < 0.f ? 0.f : (x > 6.f ? 6.f : x); }
};
struct Relu6B {
  __device__ float operator()(float x, float dy) const { return (x > 0.f && x < 6.f) ? dy : 0.f; }
};
}  // namespace

void act_fwd_half(Context& ctx, Act a, DType t, const void* x, void* y, int64_t n) {
  cudaStream_t s = detail::stream_of(ctx);
  switch (a) {
    case Act::Relu: map1(s, t, x, y, n, ReluF{}); break;
    case Act::Sigmoid: map1(s, t, x, y, n, SigmoidF{}); break;
    case Act::Silu: map1(s, t, x, y, n, SiluF{}); break;
    case Act::Relu6: map1(s, t, x, y, n, Relu6F{}); break;
  }
  DITTO_CHECK_LAUNCH(ctx);
}

// dy and dx are in t, and so is the saved tensor (the activation's input or output).
void act_bwd_half(Context& ctx, Act a, DType t, const void* saved, const void* dy, void* dx, int64_t n) {
  cudaStream_t s = detail::stream_of(ctx);
  switch (a) {
    case Act::Relu: map2(s, t, saved, dy, dx, n, ReluB{}); break;
    case Act::Sigmoid: map2(s, t, saved, dy, dx, n, SigmoidB{}); break;
    case Act::Silu: map2(s, t, saved, dy, dx, n, SiluB{}); break;
    case Act::Relu6: map2(s, t, saved, dy, dx, n, Relu6B{}); break;
  }
  DITTO_CHECK_LAUNCH(ctx);
}
}  // namespace ditto::cuda
