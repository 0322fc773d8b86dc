// 2-D upsampling of NCHW tensors (PyTorch's F.interpolate with size=(out_h, out_w), modes nearest
// and bilinear, align_corners either way); any output size of at least 1x1, so scale factors 2 and
// non-integer ones (and downsampling) alike. Geometry: kernels/upsample_ref.h.
//
// Forward: one thread per output, no reduction: deterministic.
// Backward (knob `bwd` of op kind upsample) — each input's gradient sums the output gradients
// whose taps name it, weighted by the tap weights:
//   atomic  one thread per OUTPUT sends its contributions to its taps with atomicAdd (four per
//           output for bilinear, one for nearest). Where outputs share a tap (every upsampling) the
//           float adds land in the order threads arrive: NOT deterministic (Determinism no,
//           not_guaranteed). PyTorch's bilinear backward (upsample_bilinear2d_backward).
//   gather  one thread per INPUT finds the output rows and columns whose taps can name it and adds
//           their contributions in a fixed order (rows ascending, columns ascending, tap i0 before
//           i1): no atomics, no cross-thread reduction, the same bits on any GPU (Determinism yes,
//           gpu_to_gpu). PyTorch's nearest backward is also a gather.
// The knob's framework default (what `heuristic` picks) is atomic for both modes: PyTorch's
// bilinear backward scatters with atomics.
// The CPU runs the double-precision reference whatever the policy says; its manifest entry reads
// variant "cpu-reference".
//
// Backward contributions are fresh tensors handed to accumulate_grad: gradients accumulate.
#pragma once
#include <cstdint>
#include <string>

#include "engine/context.h"
#include "engine/tape.h"
#include "engine/knob.h"

namespace ditto {

namespace op { inline constexpr OpKind upsample{"upsample"}; }

// Knob upsample.bwd (kernels/upsample.cpp): atomicAdd scatter from every output gradient, or a
// gather per input pixel in a fixed order.
enum class UpsampleBwd { Atomic, Gather };
const KnobSpec& upsample_bwd_knob();
const char* name_of(UpsampleBwd u);
inline const char* knob_name(UpsampleBwd) { return "bwd"; }

enum class UpsampleMode { Nearest, Bilinear };
const char* upsample_mode_name(UpsampleMode m);

struct UpsampleParams {
  UpsampleMode mode = UpsampleMode::Nearest;
  int64_t out_h = 0, out_w = 0;  // at least 1 each
  bool align_corners = false;    // bilinear only (set with nearest: a ShapeError, as in PyTorch)
};

// floor(in * scale): PyTorch's output size for scale_factor. ShapeError unless scale > 0 and the
// size is at least 1.
int64_t upsample_size(int64_t in, double scale);

Var upsample2d(Context& ctx, const std::string& layer, const Var& x, const UpsampleParams& p);

// The backward pass alone (what upsample2d's tape entry runs, and bench/op_noise times): dx of shape
// x_shape from dy {N, C, out_h, out_w}, by the layer's `bwd` variant, recorded under (layer, "bwd").
Tensor upsample2d_backward(Context& ctx, const std::string& layer, const Tensor& dy, const Shape& x_shape,
                           const UpsampleParams& p);

}  // namespace ditto
