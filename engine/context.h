// Context: everything an op needs to run on one device — the device, its stream, cuDNN and
// cuBLAS handles, the stream-ordered memory arena (tensors and workspaces), the Policy, the
// Manifest and the autodiff Tape. The caller owns it; nothing in ditto is global.
//
// Op paths on a CUDA context never synchronize the host, never call cudaMalloc and never copy
// to the host: memory comes from a cudaMemPool (cudaMallocFromPoolAsync on the context's
// stream, cached with an unlimited release threshold), so a training step can be captured in
// a CUDA graph.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/manifest.h"
#include "engine/policy.h"
#include "engine/tape.h"
#include "engine/tensor.h"

namespace ditto {

class Context;
namespace detail {
struct CudaState;
// The CUDA state of a CUDA context (internal: kernels reach their stream and handles through it);
// throws ditto::Error on a CPU context.
CudaState& cuda_state(const Context& ctx);
}  // namespace detail
class Profiler;
class TuningTable;

struct ContextOptions {
  // Synchronize the stream after every kernel launch check, so an asynchronous fault is
  // reported at the launch that caused it. Also switched on by the environment variable
  // DITTO_DEBUG_SYNC=1 when the context is made.
  bool sync_after_launch = false;
  // A CUDA stream to run on instead of a stream of the context's own (a cudaStream_t, here as
  // void* so this header needs no CUDA): another library's stream, so ditto's work is ordered with
  // its work (PyTorch's current stream, for ditto.torch). Borrowed: ditto never destroys it, and
  // the caller keeps it alive while the context or any of its tensors lives. nullptr: ditto makes
  // its own non-blocking stream.
  void* stream = nullptr;
};

// Versions and names for run manifests.
struct RuntimeInfo {
  std::string device;       // "cpu" or "cuda:0"
  std::string gpu_name;     // "" on the CPU
  std::string driver;       // CUDA driver version, e.g. "13.0"
  std::string cuda_runtime; // runtime linked into ditto
  std::string cudnn;        // cuDNN loaded at run time, e.g. "9.14.0"
  std::string cudnn_build;  // cuDNN headers ditto was built against
  std::string cublas;       // cuBLAS loaded at run time
  std::string git_commit;   // source commit ditto was built from
};

class Context {
 public:
  explicit Context(Device device = Device::cpu(), Policy policy = {}, ContextOptions options = {});
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  Device device() const { return device_; }
  bool is_cuda() const { return device_.is_cuda(); }
  Policy& policy() { return policy_; }
  const Policy& policy() const { return policy_; }
  Manifest& manifest() { return manifest_; }
  // The table `deterministic` convolutions read or fill (engine/tuning.h); null: none. A table
  // being filled must not be shared by contexts that run at the same time.
  void set_tuning(std::shared_ptr<TuningTable> t) { tuning_ = std::move(t); }
  TuningTable* tuning() const { return tuning_.get(); }
  Tape& tape() { return tape_; }
  // Observer of every op (engine/tracer.h); the caller owns it. nullptr: no tracing.
  void set_tracer(Tracer* t) { tape_.set_tracer(t); }
  // Per-op timing of training steps (engine/profiler.h); the caller owns it, and it must have
  // been made for this context (Error otherwise). nullptr: none, and an op's only cost is the
  // test of this pointer.
  void set_profiler(Profiler* p);
  Profiler* profiler() const { return profiler_; }
  bool debug_sync() const { return debug_sync_; }

  bool grad_enabled() const { return grad_enabled_; }
  void set_grad_enabled(bool on) { grad_enabled_ = on; }

  // Tensor creation on this context's device (stream-ordered on CUDA).
  Tensor empty(const Shape& shape, DType dtype = DType::F32, Layout layout = Layout::Nchw);
  Tensor zeros(const Shape& shape, DType dtype = DType::F32, Layout layout = Layout::Nchw);
  Tensor full(const Shape& shape, float value);
  Tensor from_host(const std::vector<float>& data, const Shape& shape);
  Tensor from_host(const std::vector<int32_t>& data, const Shape& shape);
  // A copy of t (from any device) on this context's device.
  Tensor to_device(const Tensor& t);
  // dst <- src; same dtype and element count, any devices, ordered on this context's stream.
  void copy(Tensor& dst, const Tensor& src);

  // Waits for all work queued on this context's stream.
  void synchronize();

  // The most device memory this context's pool has had in use at once (tensors, workspaces)
  // since it was made or since reset_memory_peak(); it leaves out cuDNN's and cuBLAS's own
  // allocations and the CUDA context. 0 on the CPU.
  std::size_t memory_peak() const;
  void reset_memory_peak();

  RuntimeInfo runtime_info() const;

  // Per-context state an op family keeps between calls (e.g. cached algorithm choices per
  // shape), under a key the family owns. Lives as long as the context.
  std::shared_ptr<void>& op_state(const std::string& key) { return op_state_[key]; }

 private:
  friend detail::CudaState& detail::cuda_state(const Context& ctx);

  Device device_;
  Policy policy_;
  Manifest manifest_;
  Tape tape_;
  bool debug_sync_ = false;
  bool grad_enabled_ = true;
  std::shared_ptr<detail::CudaState> cuda_;
  std::shared_ptr<TuningTable> tuning_;
  Profiler* profiler_ = nullptr;
  std::map<std::string, std::shared_ptr<void>> op_state_;
};

// CUDA devices this process can use; 0 without a driver or device (never throws).
int cuda_device_count();

// Evaluation scope: ops record nothing on the tape while it lives.
class NoGradGuard {
 public:
  explicit NoGradGuard(Context& ctx) : ctx_(ctx), prev_(ctx.grad_enabled()) { ctx.set_grad_enabled(false); }
  ~NoGradGuard() { ctx_.set_grad_enabled(prev_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  Context& ctx_;
  bool prev_;
};

}  // namespace ditto
