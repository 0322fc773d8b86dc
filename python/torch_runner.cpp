#include "python/torch_runner.h"

#include <cuda_runtime_api.h>

#include <map>
#include <tuple>

#include "engine/error.h"
#include "engine/external.h"
#include "engine/tensor_ops.h"
#include "kernels/scatter.h"

namespace ditto::py {

Policy torch_policy(bool deterministic) {
  if (!deterministic) return Policy::parse({"*=heuristic"});
  return Policy::parse({"*=deterministic", "conv2d.bwd_data=ditto-gemm", "conv2d.bwd_filter=ditto-gemm",
                        "conv2d_winograd.fwd=ditto-winograd", "conv2d_winograd.bwd_data=ditto-winograd",
                        "conv2d_winograd.bwd_filter=ditto-winograd",
                        "scatter_dim.scatter=privatized", "scatter_rows.scatter=privatized"});
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

Conv2dParams conv_params(const std::vector<int64_t>& stride, const std::vector<int64_t>& padding,
                         const std::vector<int64_t>& dilation, int64_t groups) {
  if (stride.size() != 2 || padding.size() != 2 || dilation.size() != 2)
    throw ShapeError("conv2d: stride, padding and dilation take two values each (height, width)");
  Conv2dParams p;
  p.stride_h = int(stride[0]), p.stride_w = int(stride[1]), p.pad_h = int(padding[0]), p.pad_w = int(padding[1]);
  p.dilation_h = int(dilation[0]), p.dilation_w = int(dilation[1]), p.groups = int(groups);
  return p;
}

BagMode bag_mode(const std::string& mode) {
  if (mode == "sum") return BagMode::Sum;
  if (mode == "mean") return BagMode::Mean;
  // No fmt here: this file is also built into the C++ operators, where PyTorch's own fmt headers come
  // first on the include path.
  throw ShapeError("embedding_bag: mode '" + mode + "'; ditto has sum and mean");
}

std::string scatter_rows_layer(const Context& ctx, int64_t m, int64_t d, int64_t num_rows) {
  return scatter_rows_privatized_refusal(ctx, m, d, num_rows).empty() ? "scatter_rows" : "scatter_add";
}

std::string conv2d_layer(bool deterministic, const Shape& x, const Shape& w, const Conv2dParams& p) {
  return deterministic && conv_winograd_refusal(x, w, p).empty() ? "conv2d_winograd" : "conv2d";
}

}  // namespace ditto::py
