// 2-D pooling on NCHW tensors: max pool (with a per-layer choice of backward kernel), average
// pool and global average pool.
//
// Output size (floor mode, as cuDNN and PyTorch's default): OH = (H + 2*pad_h - kernel_h) /
// stride_h + 1, likewise OW. Parameters must satisfy kernel >= 1, stride >= 1 and
// 0 <= pad < kernel (so every window holds at least one real element), and H + 2*pad_h >=
// kernel_h (likewise W); anything else is a ShapeError naming the op, layer and parameter.
//
// Max pool: padding counts as -inf. Ties go to the FIRST maximum in row-major window scan order
// (kernel row, then column) in the CPU reference and in ditto's own kernels; NaN propagates.
// cuDNN's tie-breaking is its own. The backward kernel is chosen per layer by the knob
// maxpool2d.bwd (declared in pool.cpp):
//   cudnn                cudnnPoolingForward/Backward, CUDNN_POOLING_MAX. NOT deterministic:
//                        cuDNN's "Reproducibility" notes list cudnnPoolingBackward with
//                        CUDNN_POOLING_MAX among the routines that use atomics.
//   cudnn-deterministic  the same calls with CUDNN_POOLING_MAX_DETERMINISTIC. Deterministic.
//   atomic-scatter       ditto's forward records each output's argmax (an int32 tensor kept for
//                        backward); backward runs one thread per OUTPUT and atomicAdds dy into
//                        dx[argmax]. NOT deterministic where windows overlap (stride < kernel):
//                        several outputs can share an argmax and their adds land in any order.
//   gather               ditto's argmax forward; backward runs one thread per INPUT, visits the
//                        outputs whose windows cover it in a fixed order and sums the dy whose
//                        argmax is this input (Caffe's scheme). Deterministic, no atomics.
// The manifest gets (layer, "maxpool2d", "bwd") at forward and again when the backward runs. On
// a CPU context the CPU reference (argmax semantics above, deterministic) runs whatever the
// policy says; its manifest entry reads variant "cpu-reference" so the record stays truthful.
//
// Average pool: the divisor is kernel_h*kernel_w everywhere — padded positions COUNT (cuDNN's
// CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING, PyTorch's count_include_pad=True). Forward and
// backward are deterministic (fixed-order window sums, backward gathers; no atomics), so there
// is no policy knob and no manifest entry.
// Global average pool: N,C,H,W -> N,C; each plane is summed in a fixed order. Deterministic.
// Adaptive average pool (PyTorch's AdaptiveAvgPool2d): N,C,H,W -> N,C,out_h,out_w; output row
// i averages input rows [floor(i*H/out_h), ceil((i+1)*H/out_h)), likewise columns, each output
// divided by its own window's size (windows may overlap). Forward: one thread per output,
// window summed row-major. Backward: a gather, one thread per input summing dy / window size
// over the windows containing it in ascending (row, column) order. No atomics, no cross-thread
// reductions: deterministic, so no policy knob and no manifest entry.
//
// Max pooling and average pooling also read x of any float dtype in either layout (a native bf16
// channels-last result): the same window orders, sums in float, y and dx rounded once to x's
// dtype in x's layout (the max is exact). The tuning file times f32 NCHW max pooling only.
//
// Backward contributions are fresh tensors handed to accumulate_grad: gradients accumulate.
#pragma once
#include <string>

#include "engine/context.h"
#include "engine/tape.h"
#include "engine/knob.h"

namespace ditto {

namespace op { inline constexpr OpKind maxpool2d{"maxpool2d"}; }

// Knob maxpool2d.bwd (kernels/pool.cpp).
enum class PoolBwd { Cudnn, CudnnDeterministic, AtomicScatter, Gather };
const KnobSpec& pool_bwd_knob();
const char* name_of(PoolBwd p);
inline const char* knob_name(PoolBwd) { return "bwd"; }

struct PoolParams {
  int kernel_h = 2, kernel_w = 2, stride_h = 2, stride_w = 2, pad_h = 0, pad_w = 0;
};

// Output shape for an NCHW input; throws ShapeError (naming `op`) where the parameters or the
// input do not fit.
Shape pool_output_shape(const Shape& x, const PoolParams& p, const std::string& op = "pool");

Var max_pool2d(Context& ctx, const std::string& layer, const Var& x, const PoolParams& p);
Var avg_pool2d(Context& ctx, const Var& x, const PoolParams& p);
Var global_avg_pool(Context& ctx, const Var& x);
Var adaptive_avg_pool2d(Context& ctx, const Var& x, int64_t out_h, int64_t out_w);

}  // namespace ditto
