#include "engine/context.h"

#include <fmt/format.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "engine/detail/capture_gate.h"
#include "engine/detail/cuda_state.h"
#include "engine/error.h"
#include "engine/profiler.h"
#include "engine/tensor_ops.h"

#ifndef DITTO_GIT_COMMIT
#define DITTO_GIT_COMMIT "unknown"
#endif
#ifndef DITTO_CUDNN_BUILD_VERSION
#define DITTO_CUDNN_BUILD_VERSION "unknown"
#endif

namespace ditto {

int cuda_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error for later calls
    return 0;
  }
  return count;
}

namespace detail {

CudaState::CudaState(int dev, cudaStream_t external) : device(dev), owns_stream(external == nullptr) {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0)
    throw CudaError(fmt::format("no CUDA device available for cuda:{} ({}); this machine can run on the CPU "
                                "(device cpu, or auto to take a GPU only where there is one)",
                                dev, e == cudaSuccess ? "0 devices" : cudaGetErrorString(e)));
  if (dev >= count) throw CudaError(fmt::format("cuda:{} requested, {} device(s) present", dev, count));
  DITTO_CUDA_CHECK(cudaSetDevice(dev));
  // Handle creation allocates, pool and stream creation may synchronize: not during a capture.
  DeviceSyncScope sync(dev);
  DITTO_CUDA_CHECK(cudaGetDeviceProperties(&props, dev));
  if (external)
    stream = external;
  else
    DITTO_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  DITTO_CUDNN_CHECK(cudnnCreate(&cudnn));
  DITTO_CUDNN_CHECK(cudnnSetStream(cudnn, stream));
  DITTO_CUBLAS_CHECK(cublasCreate(&cublas));
  DITTO_CUBLAS_CHECK(cublasSetStream(cublas, stream));
  // cuBLAS may not pick atomics-based reductions unless a layer's policy allows it.
  DITTO_CUBLAS_CHECK(cublasSetAtomicsMode(cublas, CUBLAS_ATOMICS_NOT_ALLOWED));
  DITTO_CUBLAS_CHECK(cublasSetPointerMode(cublas, CUBLAS_POINTER_MODE_HOST));
  cudaMemPoolProps pp{};
  pp.allocType = cudaMemAllocationTypePinned;
  pp.handleTypes = cudaMemHandleTypeNone;
  pp.location.type = cudaMemLocationTypeDevice;
  pp.location.id = dev;
  DITTO_CUDA_CHECK(cudaMemPoolCreate(&pool, &pp));
  DITTO_CUDA_CHECK(cudaMalloc(&arrivals, sizeof(int32_t) * kArrivalSlots));
  DITTO_CUDA_CHECK(cudaMemsetAsync(arrivals, 0, sizeof(int32_t) * kArrivalSlots, stream));  // before any kernel of the stream
  int least = 0, greatest = 0;
  DITTO_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  DITTO_CUDA_CHECK(cudaStreamCreateWithPriority(&side, cudaStreamNonBlocking, greatest));
  DITTO_CUDA_CHECK(cudaEventCreateWithFlags(&forked, cudaEventDisableTiming));
  DITTO_CUDA_CHECK(cudaEventCreateWithFlags(&joined, cudaEventDisableTiming));
  // Keep freed blocks cached: after the first step, no allocation reaches the driver.
  uint64_t keep = std::numeric_limits<uint64_t>::max();
  DITTO_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
}

CudaState::~CudaState() {
  cudaSetDevice(device);
  if (stream) DITTO_CUDA_CHECK_PRINT(cudaStreamSynchronize(stream));
  DeviceSyncScope sync(device);  // the handles free memory, the pool is destroyed: not during a capture
  if (cublas) cublasDestroy(cublas);
  if (cudnn) cudnnDestroy(cudnn);
  if (side) DITTO_CUDA_CHECK_PRINT(cudaStreamSynchronize(side));
  if (forked) DITTO_CUDA_CHECK_PRINT(cudaEventDestroy(forked));
  if (joined) DITTO_CUDA_CHECK_PRINT(cudaEventDestroy(joined));
  if (side) DITTO_CUDA_CHECK_PRINT(cudaStreamDestroy(side));
  if (arrivals) DITTO_CUDA_CHECK_PRINT(cudaFree(arrivals));
  if (pool) DITTO_CUDA_CHECK_PRINT(cudaMemPoolDestroy(pool));
  if (stream && owns_stream) DITTO_CUDA_CHECK_PRINT(cudaStreamDestroy(stream));
}

void* CudaState::try_alloc(std::size_t bytes) {
  if (bytes == 0) return nullptr;
  void* p = nullptr;
  cudaError_t e = cudaMallocFromPoolAsync(&p, bytes, pool, stream);
  if (e == cudaErrorMemoryAllocation) {
    cudaGetLastError();  // clear the sticky-free error so later checks do not see it
    return nullptr;
  }
  DITTO_CUDA_CHECK(e);
  return p;
}

void* CudaState::alloc(std::size_t bytes) {
  if (bytes == 0) return nullptr;
  void* p = try_alloc(bytes);
  if (!p)
    throw CudaError(fmt::format("out of device memory: {} bytes on cuda:{} could not be allocated", bytes, device));
  return p;
}

void CudaState::free(void* p) noexcept {
  if (p) DITTO_CUDA_CHECK_PRINT(cudaFreeAsync(p, stream));
}

cudaStream_t stream_of(const Context& ctx) { return detail::cuda_state(ctx).stream; }
int32_t* arrival_counters(const Context& ctx) { return detail::cuda_state(ctx).arrivals; }

SideBranch::SideBranch(const Context& ctx) : s_(detail::cuda_state(ctx)), debug_sync_(ctx.debug_sync()) {
  DITTO_CUDA_CHECK(cudaEventRecord(s_.forked, s_.stream));
  DITTO_CUDA_CHECK(cudaStreamWaitEvent(s_.side, s_.forked, 0));
}

void SideBranch::join() {
  if (!open_) return;
  open_ = false;
  if (debug_sync_) DITTO_CUDA_CHECK(cudaStreamSynchronize(s_.side));
  DITTO_CUDA_CHECK(cudaEventRecord(s_.joined, s_.side));
  DITTO_CUDA_CHECK(cudaStreamWaitEvent(s_.stream, s_.joined, 0));
}

SideBranch::~SideBranch() {
  if (!open_) return;
  DITTO_CUDA_CHECK_PRINT(cudaEventRecord(s_.joined, s_.side));
  DITTO_CUDA_CHECK_PRINT(cudaStreamWaitEvent(s_.stream, s_.joined, 0));
}

}  // namespace detail

Context::Context(Device device, Policy policy, ContextOptions options)
    : device_(device), policy_(std::move(policy)), debug_sync_(options.sync_after_launch) {
  if (const char* env = std::getenv("DITTO_DEBUG_SYNC"); env && std::strcmp(env, "0") != 0 && *env) debug_sync_ = true;
  if (device_.is_cuda())
    cuda_ = std::make_shared<detail::CudaState>(device_.index, static_cast<cudaStream_t>(options.stream));
  else if (options.stream)
    throw Error("a CUDA stream was given for a context on the CPU");
}

Context::~Context() = default;

detail::CudaState& detail::cuda_state(const Context& ctx) {
  if (!ctx.cuda_) throw Error("CUDA state requested from a CPU context");
  return *ctx.cuda_;
}

Tensor Context::empty(const Shape& shape, DType dtype, Layout layout) {
  auto st = std::make_shared<detail::Storage>();
  st->device = device_;
  st->bytes = static_cast<std::size_t>(shape_numel(shape)) * dtype_size(dtype);
  if (cuda_) {
    st->cuda = cuda_;
    st->ptr = cuda_->alloc(st->bytes);
  } else if (st->bytes) {
    // 64-byte alignment for vectorized CPU loops; aligned_alloc needs a multiple of the alignment.
    std::size_t rounded = (st->bytes + 63) / 64 * 64;
    st->ptr = std::aligned_alloc(64, rounded);
    if (!st->ptr) throw Error(fmt::format("out of host memory: {} bytes", st->bytes));
  }
  return Tensor(std::move(st), shape, dtype, layout);
}

Tensor Context::zeros(const Shape& shape, DType dtype, Layout layout) {
  Tensor t = empty(shape, dtype, layout);
  if (t.nbytes() == 0) return t;
  if (cuda_)
    DITTO_CUDA_CHECK(cudaMemsetAsync(t.raw(), 0, t.nbytes(), cuda_->stream));
  else
    std::memset(t.raw(), 0, t.nbytes());
  return t;
}

Tensor Context::full(const Shape& shape, float value) {
  Tensor t = empty(shape, DType::F32);
  fill(*this, t, value);
  return t;
}

namespace {
void copy_bytes(const detail::CudaState* ctx_cuda, Tensor& dst, const Tensor& src) {
  std::size_t n = src.nbytes();
  if (n == 0) return;
  const auto& ds = detail::storage_of(dst);
  const auto& ss = detail::storage_of(src);
  if (!ds->cuda && !ss->cuda) {
    std::memcpy(dst.raw(), src.raw(), n);
    return;
  }
  // Device-side copies are queued on the context's stream. The source's own stream is waited
  // for when it differs, so a tensor from another context is complete before it is read.
  const detail::CudaState* owner = ctx_cuda ? ctx_cuda : (ds->cuda ? ds->cuda.get() : ss->cuda.get());
  cudaStream_t stream = owner->stream;
  if (ss->cuda && ss->cuda->stream != stream) DITTO_CUDA_CHECK(cudaStreamSynchronize(ss->cuda->stream));
  // The copy is queued with the stream's device current (a CPU context copying a GPU tensor runs
  // on that tensor's stream, whichever GPU the calling thread was on), and the thread's device is
  // given back after.
  int current = 0;
  DITTO_CUDA_CHECK(cudaGetDevice(&current));
  if (current != owner->device) DITTO_CUDA_CHECK(cudaSetDevice(owner->device));
  const cudaError_t e = cudaMemcpyAsync(dst.raw(), src.raw(), n, cudaMemcpyDefault, stream);
  // A device-to-host copy is only useful once it has landed.
  const cudaError_t w = e == cudaSuccess && !ds->cuda ? cudaStreamSynchronize(stream) : cudaSuccess;
  if (current != owner->device) DITTO_CUDA_CHECK(cudaSetDevice(current));
  DITTO_CUDA_CHECK(e);
  DITTO_CUDA_CHECK(w);
}
}  // namespace

void Context::copy(Tensor& dst, const Tensor& src) {
  if (dst.dtype() != src.dtype() || dst.numel() != src.numel() || dst.layout() != src.layout())
    throw ShapeError(fmt::format("copy: destination {} {} does not match source {} {}", dst.type_tag(),
                                 shape_str(dst.shape()), src.type_tag(), shape_str(src.shape())));
  copy_bytes(cuda_.get(), dst, src);
}

Tensor Context::from_host(const std::vector<float>& data, const Shape& shape) {
  if (static_cast<int64_t>(data.size()) != shape_numel(shape))
    throw ShapeError(fmt::format("from_host: {} values for shape {}", data.size(), shape_str(shape)));
  Tensor t = empty(shape, DType::F32);
  if (t.nbytes() == 0) return t;
  if (cuda_)
    DITTO_CUDA_CHECK(cudaMemcpyAsync(t.raw(), data.data(), t.nbytes(), cudaMemcpyHostToDevice, cuda_->stream));
  else
    std::memcpy(t.raw(), data.data(), t.nbytes());
  if (cuda_) DITTO_CUDA_CHECK(cudaStreamSynchronize(cuda_->stream));  // the vector may die on return
  return t;
}

Tensor Context::from_host(const std::vector<int32_t>& data, const Shape& shape) {
  if (static_cast<int64_t>(data.size()) != shape_numel(shape))
    throw ShapeError(fmt::format("from_host: {} values for shape {}", data.size(), shape_str(shape)));
  Tensor t = empty(shape, DType::I32);
  if (t.nbytes() == 0) return t;
  if (cuda_) {
    DITTO_CUDA_CHECK(cudaMemcpyAsync(t.raw(), data.data(), t.nbytes(), cudaMemcpyHostToDevice, cuda_->stream));
    DITTO_CUDA_CHECK(cudaStreamSynchronize(cuda_->stream));
  } else {
    std::memcpy(t.raw(), data.data(), t.nbytes());
  }
  return t;
}

Tensor Context::to_device(const Tensor& t) {
  Tensor out = empty(t.shape(), t.dtype(), t.layout());
  copy(out, t);
  return out;
}

void Context::synchronize() {
  if (cuda_) DITTO_CUDA_CHECK(cudaStreamSynchronize(cuda_->stream));
}

void Context::set_profiler(Profiler* p) {
  if (p && &p->context() != this)
    throw Error("set_profiler: the profiler was made for another context; make one per context");
  profiler_ = p;
}

std::size_t Context::memory_peak() const {
  if (!cuda_) return 0;
  uint64_t high = 0;
  DITTO_CUDA_CHECK(cudaMemPoolGetAttribute(cuda_->pool, cudaMemPoolAttrUsedMemHigh, &high));
  return static_cast<std::size_t>(high);
}

void Context::reset_memory_peak() {
  if (!cuda_) return;
  uint64_t zero = 0;  // the only value accepted: resets the mark to what is in use now
  DITTO_CUDA_CHECK(cudaMemPoolSetAttribute(cuda_->pool, cudaMemPoolAttrUsedMemHigh, &zero));
}

RuntimeInfo Context::runtime_info() const {
  RuntimeInfo info;
  info.device = device_.str();
  info.git_commit = DITTO_GIT_COMMIT;
  info.cudnn_build = DITTO_CUDNN_BUILD_VERSION;
  std::size_t v = cudnnGetVersion();
  info.cudnn = fmt::format("{}.{}.{}", v / 10000, (v % 10000) / 100, v % 100);
  int rt = 0;
  if (cudaRuntimeGetVersion(&rt) == cudaSuccess) info.cuda_runtime = fmt::format("{}.{}", rt / 1000, (rt % 1000) / 10);
  int drv = 0;
  if (cudaDriverGetVersion(&drv) == cudaSuccess && drv > 0) info.driver = fmt::format("{}.{}", drv / 1000, (drv % 1000) / 10);
  if (cuda_) {
    info.gpu_name = cuda_->props.name;
    int cb = 0;
    if (cublasGetVersion(cuda_->cublas, &cb) == CUBLAS_STATUS_SUCCESS)
      info.cublas = fmt::format("{}.{}.{}", cb / 10000, (cb % 10000) / 100, cb % 100);
  }
  return info;
}

}  // namespace ditto
