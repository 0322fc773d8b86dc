// cuDNN's backend API for one convolution direction (kernels/detail/cudnn_engine.h).
#include "kernels/detail/cudnn_engine.h"

#include <fmt/format.h>

#include <algorithm>
#include <set>

#include "engine/detail/cudnn_desc.h"
#include "engine/error.h"

namespace ditto::detail {

namespace {

void check(cudnnStatus_t s, const char* what) {
  if (s != CUDNN_STATUS_SUCCESS) throw CudnnError(fmt::format("{} failed: {}", what, cudnnGetErrorString(s)));
}

constexpr int64_t kUidX = 1, kUidW = 2, kUidY = 3;

// Strides of a logical 4-D shape (N,C,H,W or K,C,R,S) in NCHW or channels-last memory.
std::vector<int64_t> strides_of(const Shape& d, bool nhwc) {
  if (!nhwc) return {d[1] * d[2] * d[3], d[2] * d[3], d[3], 1};
  return {d[1] * d[2] * d[3], 1, d[3] * d[1], d[1]};
}

BackendDesc tensor(int64_t uid, const Shape& dims, DType dtype, bool nhwc) {
  BackendDesc t(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  const std::vector<int64_t> strides = strides_of(dims, nhwc);
  const cudnnDataType_t type = cudnn_type(dtype);
  const int64_t align = 16;
  t.set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type);
  t.set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims.data());
  t.set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides.data());
  t.set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
  t.set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align);
  t.finalize();
  return t;
}

// Cross-correlation, fp32 compute, the spec's strides, padding and dilation.
BackendDesc convolution(const EngineConvSpec& s) {
  BackendDesc conv(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR);
  const cudnnDataType_t f = CUDNN_DATA_FLOAT;
  const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  const int64_t dims = 2;
  conv.set(CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f);
  conv.set(CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode);
  conv.set(CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &dims);
  conv.set(CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, 2, s.dilation);
  conv.set(CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, 2, s.stride);
  conv.set(CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, 2, s.pad);
  conv.set(CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, 2, s.pad);
  conv.finalize();
  return conv;
}

// The attributes of one direction's operation descriptor.
struct OperationAttrs {
  cudnnBackendDescriptorType_t type;
  cudnnBackendAttributeName_t x, w, y, conv, alpha, beta;
};

OperationAttrs operation_attrs(ConvDirection dir) {
  switch (dir) {
    case ConvDirection::Fwd:
      return {CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X,
              CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y,
              CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA,
              CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA};
    case ConvDirection::BwdData:
      return {CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA};
    case ConvDirection::BwdFilter: break;
  }
  return {CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X,
          CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY,
          CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA,
          CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA};
}

// The direction's operation over x, w, y (dx, dw, dy) and the convolution; alpha 1, beta 0.
BackendDesc operation(ConvDirection dir, const BackendDesc& x, const BackendDesc& w, const BackendDesc& y,
                      const BackendDesc& conv) {
  const float alpha = 1.f, beta = 0.f;
  auto xd = x.get(), wd = w.get(), yd = y.get(), cd = conv.get();
  const OperationAttrs a = operation_attrs(dir);
  BackendDesc op(a.type);
  op.set(a.x, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &xd);
  op.set(a.w, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &wd);
  op.set(a.y, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &yd);
  op.set(a.conv, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cd);
  op.set(a.alpha, CUDNN_TYPE_FLOAT, 1, &alpha);
  op.set(a.beta, CUDNN_TYPE_FLOAT, 1, &beta);
  op.finalize();
  return op;
}

std::vector<std::pair<int, int64_t>> knob_choices(const BackendDesc& cfg) {
  std::vector<std::pair<int, int64_t>> knobs;
  int64_t count = 0;
  if (cudnnBackendGetAttribute(cfg.get(), CUDNN_ATTR_ENGINECFG_KNOB_CHOICES, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count,
                               nullptr) != CUDNN_STATUS_SUCCESS || count <= 0)
    return knobs;
  std::vector<BackendDesc> choices;
  std::vector<cudnnBackendDescriptor_t> raw;
  for (int64_t j = 0; j < count; ++j) {
    choices.emplace_back(CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR);
    raw.push_back(choices.back().get());
  }
  int64_t got = 0;
  if (cudnnBackendGetAttribute(cfg.get(), CUDNN_ATTR_ENGINECFG_KNOB_CHOICES, CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got,
                               raw.data()) != CUDNN_STATUS_SUCCESS)
    return knobs;
  for (int64_t j = 0; j < std::min(got, count); ++j) {
    cudnnBackendKnobType_t type;
    int64_t value = 0, n = 0;
    cudnnBackendGetAttribute(raw[j], CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE, CUDNN_TYPE_KNOB_TYPE, 1, &n, &type);
    cudnnBackendGetAttribute(raw[j], CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE, CUDNN_TYPE_INT64, 1, &n, &value);
    knobs.push_back({int(type), value});
  }
  std::sort(knobs.begin(), knobs.end());
  return knobs;
}

// The configuration's engine and notes; false where cuDNN does not say which engine it is.
bool describe(EngineConfig& c) {
  BackendDesc eng(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
  int64_t n = 0;
  if (cudnnBackendGetAttribute(c.cfg->get(), CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n,
                               eng.ptr()) != CUDNN_STATUS_SUCCESS)
    return false;
  if (cudnnBackendGetAttribute(eng.get(), CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &n, &c.engine) !=
      CUDNN_STATUS_SUCCESS)
    return false;
  cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
  int64_t nn = 0;
  if (cudnnBackendGetAttribute(eng.get(), CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                               CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &nn, notes) == CUDNN_STATUS_SUCCESS)
    for (int64_t j = 0; j < nn; ++j) c.notes.push_back(int(notes[j]));
  c.knobs = knob_choices(*c.cfg);
  return true;
}

std::vector<std::shared_ptr<BackendDesc>> heuristic_configs(const BackendDesc& graph, cudnnBackendHeurMode_t mode) {
  BackendDesc heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
  auto gd = graph.get();
  heur.set(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &gd);
  heur.set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
  if (heur.try_finalize() != CUDNN_STATUS_SUCCESS) return {};
  int64_t count = 0;
  if (cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count,
                               nullptr) != CUDNN_STATUS_SUCCESS || count <= 0)
    return {};
  std::vector<std::shared_ptr<BackendDesc>> cfgs;
  std::vector<cudnnBackendDescriptor_t> raw;
  for (int64_t i = 0; i < count; ++i) {
    cfgs.push_back(std::make_shared<BackendDesc>(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR));
    raw.push_back(cfgs.back()->get());
  }
  int64_t got = 0;
  check(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got,
                                 raw.data()),
        "cudnnBackendGetAttribute(ENGINEHEUR_RESULTS)");
  cfgs.resize(static_cast<std::size_t>(std::min(got, count)));
  return cfgs;
}

}  // namespace

BackendDesc::BackendDesc(cudnnBackendDescriptorType_t t) {
  check(cudnnBackendCreateDescriptor(t, &d_), "cudnnBackendCreateDescriptor");
}
BackendDesc::~BackendDesc() {
  if (d_) cudnnBackendDestroyDescriptor(d_);
}
void BackendDesc::set(cudnnBackendAttributeName_t a, cudnnBackendAttributeType_t t, int64_t n, const void* v) {
  const cudnnStatus_t s = cudnnBackendSetAttribute(d_, a, t, n, v);
  if (s != CUDNN_STATUS_SUCCESS)
    throw CudnnError(fmt::format("cudnnBackendSetAttribute (attribute {}) failed: {}", int(a), cudnnGetErrorString(s)));
}
void BackendDesc::finalize() { check(cudnnBackendFinalize(d_), "cudnnBackendFinalize"); }
cudnnStatus_t BackendDesc::try_finalize() { return cudnnBackendFinalize(d_); }

const char* numerical_note_name(int note) {
  switch (note) {
    case CUDNN_NUMERICAL_NOTE_TENSOR_CORE: return "TENSOR_CORE";
    case CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS: return "DOWN_CONVERT_INPUTS";
    case CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION: return "REDUCED_PRECISION_REDUCTION";
    case CUDNN_NUMERICAL_NOTE_FFT: return "FFT";
    case CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC: return "NONDETERMINISTIC";
    case CUDNN_NUMERICAL_NOTE_WINOGRAD: return "WINOGRAD";
    case CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_4x4: return "WINOGRAD_TILE_4x4";
    case CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_6x6: return "WINOGRAD_TILE_6x6";
    case CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_13x13: return "WINOGRAD_TILE_13x13";
    case CUDNN_NUMERICAL_NOTE_STRICT_NAN_PROP: return "STRICT_NAN_PROP";
  }
  return "?";
}

std::string EngineConfig::name() const {
  std::string s;
  for (const auto& [k, v] : knobs) s += fmt::format("{}k{}={}", s.empty() ? "" : ",", k, v);
  return fmt::format("eng{}[{}]", engine, s);
}
bool EngineConfig::has(int note) const { return std::find(notes.begin(), notes.end(), note) != notes.end(); }
std::vector<std::string> EngineConfig::note_names() const {
  std::vector<std::string> out;
  for (int n : notes) out.push_back(numerical_note_name(n));
  return out;
}

EngineGraph engine_graph(cudnnHandle_t handle, const EngineConvSpec& s) {
  EngineGraph g;
  g.keep.push_back(tensor(kUidX, s.x, s.dtype, s.nhwc));
  g.keep.push_back(tensor(kUidW, s.w, s.dtype, s.nhwc));
  g.keep.push_back(tensor(kUidY, s.y, s.dtype, s.nhwc));
  g.keep.push_back(convolution(s));
  g.keep.push_back(operation(s.direction, g.keep[0], g.keep[1], g.keep[2], g.keep[3]));
  g.graph = std::make_shared<BackendDesc>(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  auto opd = g.keep.back().get();
  g.graph->set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &opd);
  g.graph->set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
  g.graph->finalize();
  std::set<std::string> seen;
  for (cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK})
    for (auto& cfg : heuristic_configs(*g.graph, mode)) {
      EngineConfig c;
      c.cfg = std::move(cfg);
      if (!describe(c)) continue;
      if (seen.insert(c.name()).second) g.configs.push_back(std::move(c));
    }
  return g;
}

cudnnStatus_t engine_plan(cudnnHandle_t handle, const EngineConfig& config, EnginePlan* out) {
  auto plan = std::make_shared<BackendDesc>(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
  plan->set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
  auto cd = config.cfg->get();
  plan->set(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cd);
  if (const cudnnStatus_t s = plan->try_finalize(); s != CUDNN_STATUS_SUCCESS) return s;
  int64_t bytes = 0, n = 0;
  if (const cudnnStatus_t s = cudnnBackendGetAttribute(plan->get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                                       CUDNN_TYPE_INT64, 1, &n, &bytes);
      s != CUDNN_STATUS_SUCCESS)
    return s;
  out->plan = std::move(plan);
  out->config = config;
  out->workspace_bytes = bytes;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t engine_execute(cudnnHandle_t handle, const EnginePlan& plan, const void* x, const void* w, const void* y,
                             void* workspace) {
  void* ptrs[3] = {const_cast<void*>(x), const_cast<void*>(w), const_cast<void*>(y)};
  const int64_t uids[3] = {kUidX, kUidW, kUidY};
  BackendDesc pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  pack.set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, 3, ptrs);
  pack.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, 3, uids);
  pack.set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
  if (const cudnnStatus_t s = pack.try_finalize(); s != CUDNN_STATUS_SUCCESS) return s;
  return cudnnBackendExecute(handle, plan.plan->get(), pack.get());
}

}  // namespace ditto::detail
