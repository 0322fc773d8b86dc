// Internal: one convolution direction through cuDNN's backend (graph) API — the operation graph,
// the engine configurations cuDNN's heuristics list for it with their numerical notes, an
// execution plan for one of them, and its execution. conv2d's `engine` variant runs these
// (kernels/conv2d.cpp); bench/conv_candidates lists and times every configuration.
//
// The graph is a single convolution with fp32 compute (bf16/f16 data: fp32 accumulation, as the
// legacy descriptors in conv2d.cpp), data in the layer's dtype, NCHW or channels-last strides.
// Tensor uids: 1 = x (dx), 2 = w (dw), 3 = y (dy), whatever the direction.
#pragma once
#include <cudnn.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/tensor.h"

namespace ditto::detail {

// RAII over one backend descriptor. Setters throw CudnnError naming the call.
class BackendDesc {
 public:
  explicit BackendDesc(cudnnBackendDescriptorType_t t);
  ~BackendDesc();
  BackendDesc(BackendDesc&& o) noexcept : d_(o.d_) { o.d_ = nullptr; }
  BackendDesc(const BackendDesc&) = delete;
  BackendDesc& operator=(const BackendDesc&) = delete;
  void set(cudnnBackendAttributeName_t a, cudnnBackendAttributeType_t t, int64_t n, const void* v);
  void finalize();
  cudnnStatus_t try_finalize();
  cudnnBackendDescriptor_t get() const { return d_; }
  cudnnBackendDescriptor_t* ptr() { return &d_; }

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
};

enum class ConvDirection { Fwd, BwdData, BwdFilter };

// One convolution problem as the backend graph describes it. x, w, y are the logical N,C,H,W /
// K,C/groups,R,S / N,K,Ho,Wo shapes (groups follow from them); nhwc: channels-last memory.
struct EngineConvSpec {
  ConvDirection direction = ConvDirection::Fwd;
  Shape x, w, y;
  int64_t stride[2] = {1, 1}, pad[2] = {0, 0}, dilation[2] = {1, 1};
  DType dtype = DType::F32;
  bool nhwc = false;
};

// One engine configuration: cuDNN's engine (global index), its knob choices (type, value),
// sorted, and its numerical notes (cudnnBackendNumericalNote_t).
struct EngineConfig {
  std::shared_ptr<BackendDesc> cfg;
  int64_t engine = -1;
  std::vector<std::pair<int, int64_t>> knobs;
  std::vector<int> notes;
  std::string name() const;  // "eng12[k2=3,k5=1]"
  bool has(int note) const;
  std::vector<std::string> note_names() const;
};
const char* numerical_note_name(int note);

// The operation graph of one direction and the configurations heuristic modes A then FALLBACK
// list for it (in their order, without duplicates). Throws CudnnError when cuDNN cannot build the
// graph for the problem.
struct EngineGraph {
  std::vector<BackendDesc> keep;  // tensors, convolution, operation: alive as long as the graph
  std::shared_ptr<BackendDesc> graph;
  std::vector<EngineConfig> configs;
};
EngineGraph engine_graph(cudnnHandle_t handle, const EngineConvSpec& spec);

// An execution plan for one configuration, and the workspace it needs.
struct EnginePlan {
  std::shared_ptr<BackendDesc> plan;
  EngineConfig config;
  int64_t workspace_bytes = 0;
};
// CUDNN_STATUS_SUCCESS and *out filled, or the status cuDNN refused the plan with.
cudnnStatus_t engine_plan(cudnnHandle_t handle, const EngineConfig& config, EnginePlan* out);

// Runs the plan on the direction's operands (x, w, y: two read, the direction's result written;
// alpha 1, beta 0). Returns cuDNN's status.
cudnnStatus_t engine_execute(cudnnHandle_t handle, const EnginePlan& plan, const void* x, const void* w, const void* y,
                             void* workspace);

}  // namespace ditto::detail
