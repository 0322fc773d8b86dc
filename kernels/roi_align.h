// ROI align (torchvision.ops.roi_align; kernels/roi_align_ref.h states the arithmetic): x {N, C, H,
// W} and rois {K, 5} (batch index, x1, y1, x2, y2; f32, on the context's device, no gradient) ->
// y {K, C, out_h, out_w}, each bin the average of its bilinear samples.
//
// Forward: one thread per output element, its samples in row-major order: deterministic.
// Backward to x by the layer's RoiAlignBwd (knob "bwd" of op kind roi_align, manifest op
// "roi_align"):
//   atomic         torchvision's scheme: one thread per output element atomicAdds dy / count *
//                  weight into the four corners of each of its samples. Overlapping rois (the
//                  rule in detection: hundreds of proposals around each object), neighbouring bins
//                  and samples closer than a pixel all add into the same dx elements in scheduling
//                  order: NOT deterministic. The default.
//   deterministic  a GATHER: the image is cut into 8x8-pixel tiles and a bit mask records which
//                  rois' sample footprints touch which tile (set with atomicOr: integer OR, the
//                  same bits in any order); one thread per (pixel, group of 8 channels) walks its
//                  tile's rois in ascending index and, for each, exactly the samples whose bilinear
//                  corners reach the pixel (their index range is solved from the sample spacing,
//                  each weight recomputed with the forward's arithmetic), in ascending bin and
//                  sample order. Each dx element is written by one thread in an order fixed by the
//                  inputs: gpu_to_gpu. Workspace: N * ceil(H/8) * ceil(W/8) * ceil(K/32) words.
// The roi's batch index and coordinates are checked on the CPU (DataError naming the roi); the GPU
// cannot check without a host copy, so a bad roi there gives NaN outputs and no dx contribution.
// On a CPU context the double-accumulating reference runs and is recorded as "cpu-reference".
// Backward contributions are fresh tensors handed to accumulate_grad.
#pragma once
#include <string>

#include "engine/context.h"
#include "engine/tape.h"
#include "engine/knob.h"

namespace ditto {

namespace op { inline constexpr OpKind roi_align{"roi_align"}; }

// Knob roi_align.bwd (kernels/roi_align.cpp).
enum class RoiAlignBwd { Atomic, Deterministic };
const KnobSpec& roi_align_bwd_knob();
const char* name_of(RoiAlignBwd v);
inline const char* knob_name(RoiAlignBwd) { return "bwd"; }

struct RoiAlignParams {
  int64_t out_h = 7, out_w = 7;
  float spatial_scale = 1.f;  // input coordinates -> feature-map coordinates
  int sampling_ratio = -1;    // samples per bin and axis; <= 0: adaptive, ceil(roi size / out size)
  bool aligned = false;       // torchvision's default; true shifts by half a pixel (Detectron2)
};

Var roi_align(Context& ctx, const std::string& layer, const Var& x, const Tensor& rois, const RoiAlignParams& p);

// The backward pass alone, as the tape entry runs it (ditto.torch calls it with another library's
// tensors): dx of shape x_shape from dy {K, C, out_h, out_w}, by the layer's `bwd` variant,
// recorded under (layer, "bwd"), with the forward's checks.
Tensor roi_align_backward(Context& ctx, const std::string& layer, const Tensor& dy, const Shape& x_shape,
                          const Tensor& rois, const RoiAlignParams& p);

}  // namespace ditto
