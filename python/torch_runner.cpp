#include "python/torch_runner.h"

#include <cuda_runtime_api.h>

#include <map>
#include <tuple>

#include "engine/external.h"
#include "engine/tensor_ops.h"

namespace ditto::py {

Policy torch_policy(bool deterministic) {
  if (!deterministic) return Policy::parse({"*=heuristic"});
  return Policy::parse({"*=deterministic", "conv2d.bwd_data=ditto-gemm", "conv2d.bwd_filter=ditto-gemm",
                        "conv2d_winograd.bwd_data=ditto-gemm", "conv2d_winograd.bwd_filter=ditto-winograd",
                        "scatter_dim.scatter=privatized"});
}

Runner& torch_runner(const std::string& device, std::intptr_t stream, bool deterministic) {
  static std::mutex mu;
  static auto* cache = new std::map<std::tuple<std::string, std::intptr_t, bool>, std::unique_ptr<Runner>>();
  std::lock_guard<std::mutex> lock(mu);
  auto& r = (*cache)[{device, stream, deterministic}];
  if (!r) {
    auto fresh = std::make_unique<Runner>();
    ContextOptions o;
    const Device d = Device::parse(device);
    // PyTorch's default stream is the legacy one, handle 0, which ContextOptions reads as "make a
    // stream"; its named handle orders ditto's work with it instead.
    if (d.is_cuda()) o.stream = stream == 0 ? static_cast<void*>(cudaStreamLegacy) : reinterpret_cast<void*>(stream);
    fresh->ctx = std::make_unique<Context>(d, torch_policy(deterministic), o);
    r = std::move(fresh);
  }
  return *r;
}

Tensor borrow_int64(Context& ctx, void* data, const Shape& shape) {
  return narrow_int64_words(ctx, wrap_external(ctx, data, {2 * shape_numel(shape)}, DType::I32, {}), shape);
}

}  // namespace ditto::py
