// StepGraph: the work one call of a function queues on a CUDA context's stream, recorded once
// as a CUDA graph and replayed with one launch. What a training step gains: the host work per
// op (tape closures, descriptor set-up, algorithm look-ups, kernel launches) is paid once at
// capture, so a launch-bound step runs at the GPU's pace.
//
// Rules for a function that is captured (the capture fails with an error naming the call that
// broke one of them, never silently):
//  - it runs only stream-ordered work on the context's stream: no host synchronization, no
//    cudaMalloc, no copy to pageable host memory (ditto's op paths obey this; see context.h);
//  - everything it allocates it also frees before it returns (its temporaries become the
//    graph's own memory, reused by every replay);
//  - what varies per replay lives in device memory at fixed addresses (input buffers, the
//    optimizer's step table): a replay repeats the captured kernel arguments exactly.
// A replay does the same arithmetic in the same order as the captured calls, so a graphed run is
// bit-identical to the eager one (tests/gpu_graph.cpp).
#pragma once
#include <cstddef>
#include <functional>
#include <memory>

namespace ditto {

class Context;

class StepGraph {
 public:
  StepGraph();
  ~StepGraph();
  StepGraph(const StepGraph&) = delete;
  StepGraph& operator=(const StepGraph&) = delete;

  // Runs fn with ctx's stream capturing (thread-local mode, so other threads' loaders and
  // replicas may keep calling CUDA) and instantiates the graph. Nothing runs on the GPU until
  // launch(). Throws Error when a profiler is attached to ctx (engine/profiler.h) or on a CPU
  // context, CudaError when the capture or instantiation fails; a throw from fn ends the
  // capture and is rethrown.
  void capture(Context& ctx, const std::function<void()>& fn);
  // Queues one replay on ctx's stream (asynchronous).
  void launch(Context& ctx);
  bool captured() const;
  std::size_t nodes() const;  // kernels, copies, memsets and memory nodes in the graph

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ditto
