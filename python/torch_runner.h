// The contexts ditto.torch's ops run under, shared by the nanobind functions (torch_ops.cpp) and the
// libtorch operators (torch_native.cpp): one per (device, stream, deterministic), made on first use
// and kept for the process. Each borrows the caller's stream (PyTorch's current stream), so its
// kernels are ordered with PyTorch's work and its outputs are ready for PyTorch without a wait; each
// holds a cuDNN and a cuBLAS handle and the memory pool that serves the outputs handed to PyTorch.
// They are never destroyed: at exit the CUDA runtime may already be gone.
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include <vector>

#include "engine/context.h"
#include "kernels/conv2d.h"
#include "kernels/scatter.h"

namespace ditto::py {

struct Runner {
  std::unique_ptr<Context> ctx;
  std::mutex mu;  // PyTorch's autograd runs backward on a thread of its own
};

// deterministic=True: every knob by the mode word `deterministic` (gather and sorted scatters,
// fixed-order reductions, ditto's CTC), convolution backward by ditto's own GEMM form (layer "conv2d")
// or, for layer "conv2d_winograd" (conv2d_layer), all three directions by ditto's Winograd, and
// for layers "scatter_dim" and "scatter_rows" (scatter_add along a dimension, and of rows, where the
// privatized scatter runs it) that scatter.
// deterministic=False: what frameworks run (atomics, cuDNN's heuristics).
Policy torch_policy(bool deterministic);

// The runner of `device` ("cpu" or "cuda:N"), `stream` (a cudaStream_t as an integer; 0 is the legacy
// default stream) and the policy. Each library that links this file keeps its own runners.
Runner& torch_runner(const std::string& device, std::intptr_t stream, bool deterministic);

// An int64 tensor of PyTorch's (indices, labels) at `data` as ditto's int32 tensor of `shape`: its
// (low, high) words narrowed in one kernel queued on ctx's stream (engine/tensor_ops.h,
// narrow_int64_words: out-of-int32 values saturate on the GPU and are a DataError on the CPU).
Tensor borrow_int64(Context& ctx, void* data, const Shape& shape);

// F.conv2d's stride, padding and dilation (two values each) and groups (ShapeError otherwise).
Conv2dParams conv_params(const std::vector<int64_t>& stride, const std::vector<int64_t>& padding,
                         const std::vector<int64_t>& dilation, int64_t groups);
// F.embedding_bag's mode, "sum" or "mean" (ShapeError otherwise).
BagMode bag_mode(const std::string& mode);
// The layer a scatter of m rows of d floats into num_rows (index_add) runs under: "scatter_rows" where the
// privatized scatter runs it on ctx's device, "scatter_add" (the sorted scatter) otherwise.
std::string scatter_rows_layer(const Context& ctx, int64_t m, int64_t d, int64_t num_rows);
// The layer a conv2d runs under (forward and backward): "conv2d_winograd" where deterministic and ditto's
// Winograd runs the geometry, "conv2d" otherwise.
std::string conv2d_layer(bool deterministic, const Shape& x, const Shape& w, const Conv2dParams& p);

}  // namespace ditto::py
