// Internal: the CUDA half of a Context and the storage behind tensors.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>

#include "engine/context.h"
#include "engine/detail/cuda_check.h"

namespace ditto::detail {

struct CudaState {
  int device = 0;
  cudaStream_t stream = nullptr;
  cudnnHandle_t cudnn = nullptr;
  cublasHandle_t cublas = nullptr;
  cudaMemPool_t pool = nullptr;
  cudaDeviceProp props{};

  bool owns_stream = true;  // false for a borrowed stream (ContextOptions::stream)

  // Arrival counters of single-launch fixed-order reductions: the blocks of a slot's reduction each
  // count themselves in, the last one to arrive adds the partials in their fixed order and sets the
  // counter back to zero. Zero between kernels; kernels of one context run in stream order, so one set
  // serves them all. Allocated with the context (never during a capture) and never moved, so graphs
  // captured against it stay valid. A reduction over more slots takes its two-launch form.
  static constexpr int64_t kArrivalSlots = 65536;
  int32_t* arrivals = nullptr;

  // A second stream, of the device's highest priority, for short latency-bound work that can run
  // beside a long bandwidth-bound pass of the main stream (a sort beside a large zero fill that it
  // does not read): the block scheduler gives it an SM whenever one frees, so it is not queued behind
  // every block of the fill. Made with the context, so no capture creates one; a capture forks into it
  // (SideBranch), and the graph gets the branch.
  cudaStream_t side = nullptr;
  cudaEvent_t forked = nullptr, joined = nullptr;

  // external: a borrowed stream to run on; nullptr makes one of the state's own.
  explicit CudaState(int device, cudaStream_t external = nullptr);
  ~CudaState();
  CudaState(const CudaState&) = delete;
  CudaState& operator=(const CudaState&) = delete;

  // Stream-ordered allocation from the context's pool. alloc throws CudaError; try_alloc
  // returns nullptr when the memory is not there (so callers can name what needed it).
  void* alloc(std::size_t bytes);
  void* try_alloc(std::size_t bytes);
  void free(void* p) noexcept;
};

cudaStream_t stream_of(const Context& ctx);
int32_t* arrival_counters(const Context& ctx);  // CudaState::arrivals

// Work on the context's side stream beside the main stream's: the constructor makes the side stream
// wait for everything queued on the main stream so far; join() makes the main stream wait for
// everything queued on the side stream since. The destructor joins a branch not yet joined (an
// error path), so no memory the branch uses goes back to the pool while it runs, and a capture
// never ends with an open branch. One branch per context at a time. Under the context's debug switch
// (DITTO_CHECK_LAUNCH synchronizes the main stream after each launch) join() also synchronizes the
// side stream, so a fault there is reported at the branch's end, not at a later main-stream launch.
class SideBranch {
 public:
  explicit SideBranch(const Context& ctx);
  ~SideBranch();
  SideBranch(const SideBranch&) = delete;
  SideBranch& operator=(const SideBranch&) = delete;
  cudaStream_t stream() const { return s_.side; }
  void join();

 private:
  CudaState& s_;
  bool debug_sync_;
  bool open_ = true;
};

// Device memory of one asynchronous call's workspace: released in stream order after the
// work queued before its destruction, so it stays alive across that call.
class Workspace {
 public:
  Workspace() = default;
  Workspace(CudaState& s, std::size_t bytes) : s_(&s), bytes_(bytes) { ptr_ = bytes ? s.try_alloc(bytes) : nullptr; }
  ~Workspace() { if (s_ && ptr_) s_->free(ptr_); }
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
  bool ok() const { return bytes_ == 0 || ptr_ != nullptr; }
  void* get() const { return ptr_; }
  std::size_t bytes() const { return bytes_; }

 private:
  CudaState* s_ = nullptr;
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
};

struct Storage {
  void* ptr = nullptr;
  std::size_t bytes = 0;
  Device device;
  std::shared_ptr<CudaState> cuda;  // keeps the pool and stream alive while the tensor lives
  Storage() = default;
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  ~Storage();
};

}  // namespace ditto::detail
