// The kernels behind ditto.torch (python/ditto/torch.py): ditto's ops on PyTorch's tensors, on
// PyTorch's current stream, forward and backward as separate calls (PyTorch's custom ops).
#pragma once
#include <nanobind/nanobind.h>

namespace ditto::py {

void bind_torch_ops(nanobind::module_& m);

}  // namespace ditto::py
