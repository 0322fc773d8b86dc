#include "engine/graph.h"

#include <fmt/format.h>

#include "engine/detail/capture_gate.h"
#include "engine/detail/cuda_state.h"
#include "engine/error.h"

namespace ditto {

struct StepGraph::Impl {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  std::size_t nodes = 0;
  int device = -1;
  ~Impl() {
    if (!exec && !graph) return;
    detail::DeviceSyncScope sync(device);  // destroying a graph frees its memory: not during a capture
    if (exec) DITTO_CUDA_CHECK_PRINT(cudaGraphExecDestroy(exec));
    if (graph) DITTO_CUDA_CHECK_PRINT(cudaGraphDestroy(graph));
  }
};

StepGraph::StepGraph() : impl_(std::make_unique<Impl>()) {}
StepGraph::~StepGraph() = default;

void StepGraph::capture(Context& ctx, const std::function<void()>& fn) {
  if (ctx.profiler())
    throw Error("CUDA graphs: a profiler is attached to the context; its events would be captured into the graph "
                "and time the replay, not the ops. Detach it (set_profiler(nullptr)) to capture, and profile eager "
                "steps");
  if (!ctx.is_cuda()) throw Error("CUDA graphs need a CUDA context; this one is on the CPU");
  if (ctx.debug_sync())
    throw Error("CUDA graphs: the debug switch (DITTO_DEBUG_SYNC=1) synchronizes after every launch, which a "
                "capture forbids; unset it to capture");
  impl_ = std::make_unique<Impl>();
  impl_->device = ctx.device().index;
  cudaStream_t stream = detail::stream_of(ctx);
  {
    // Other threads' device-synchronizing calls on this GPU wait until the capture has ended
    // (engine/detail/capture_gate.h).
    detail::CaptureScope capturing(impl_->device);
    DITTO_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    try {
      fn();
    } catch (...) {
      cudaGraph_t broken = nullptr;
      cudaStreamEndCapture(stream, &broken);  // ends capture mode; the first error is the one to report
      if (broken) cudaGraphDestroy(broken);
      cudaGetLastError();
      throw;
    }
    DITTO_CUDA_CHECK(cudaStreamEndCapture(stream, &impl_->graph));
  }
  DITTO_CUDA_CHECK(cudaGraphGetNodes(impl_->graph, nullptr, &impl_->nodes));
  detail::DeviceSyncScope sync(impl_->device);  // instantiation allocates the graph's memory
  DITTO_CUDA_CHECK(cudaGraphInstantiate(&impl_->exec, impl_->graph, 0));
}

void StepGraph::launch(Context& ctx) {
  if (!impl_->exec) throw Error("StepGraph::launch: nothing captured");
  DITTO_CUDA_CHECK(cudaGraphLaunch(impl_->exec, detail::stream_of(ctx)));
}

bool StepGraph::captured() const { return impl_->exec != nullptr; }
std::size_t StepGraph::nodes() const { return impl_->nodes; }

}  // namespace ditto
