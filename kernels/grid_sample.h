// Spatial transformer: the affine grid generator and bilinear grid sampling with zero padding
// (PyTorch's F.affine_grid and F.grid_sample(mode="bilinear", padding_mode="zeros"), both values of
// align_corners; kernels/grid_sample_ref.h states the arithmetic).
//
// affine_grid: theta {N, 2, 3} -> grid {N, H, W, 2} (x, y in [-1, 1]). Forward: one thread per grid
// point, deterministic. Backward dtheta[n] = sum over the H*W points of dgrid (x) base, by the
// layer's AffineGridBwd (knob "bwd" of op kind affine_grid, manifest op "affine_grid"):
//   atomic         per-block partial sums (CUB warp reductions) atomicAdded into dtheta: NOT
//                  deterministic (not_guaranteed).
//   deterministic  per-block partials written to a workspace, then one block per image adds them
//                  with cub::BlockReduce; grid and tree depend on the shape only: gpu_to_gpu.
//                  The default under heuristic: PyTorch's affine_grid backward is a batched GEMM.
//   cudnn          cudnnSpatialTfGridGeneratorForward/Backward. cuDNN's base grid is the
//                  align_corners=True one, so the variant requires align_corners (PolicyError
//                  otherwise, naming the layer and listing atomic, deterministic). Not among the
//                  routines cuDNN documents as non-reproducible, yet its backward gave 10
//                  different dtheta in 10 calls on an H100 (cuDNN 9.14): not_guaranteed.
//
// grid_sample: x {N, C, H, W}, grid {N, OH, OW, 2} -> y {N, C, OH, OW}. Forward: one thread per
// output element, deterministic. Backward to x and to the grid by the layer's GridSampleBwd (knob
// "bwd" of op kind grid_sample, manifest op "grid_sample"):
//   atomic         PyTorch's scheme: one thread per output position loops over the channels,
//                  sums the grid gradient in channel order and atomicAdds dy * weight into the
//                  four corners of dx. Where outputs sample overlapping neighbourhoods (every
//                  zoom-in, and heavily where a grid squeezes many outputs onto a few pixels) the
//                  adds into one dx element land in scheduling order: NOT deterministic. The
//                  default (PyTorch's native kernel, which it runs for align_corners=False).
//   deterministic  the grid gradient by the same per-position channel loop, without the scatter;
//                  dx as a GATHER: the same kernel turns every (output position, corner) pair
//                  into a (target pixel, record) pair, CUB's stable radix sort orders them by
//                  pixel (one sort serves all channels: the grid is shared by them; records in
//                  output-position row-major, corner nw, ne, sw, se order within a pixel), and a
//                  segmented sum adds each pixel's dy * weight: tiles of 2048 sorted records,
//                  each thread folds 8 in order, a fixed-shape block scan (cub::BlockScan,
//                  warp scans; four channels' sums side by side in one scan, each with the joins
//                  a scan of its own would make) joins the threads, and a pixel whose records cross tiles gets its
//                  pieces added in tile order by one thread. No thread walks more than 8 records
//                  plus one piece per tile, so outputs squeezed onto a few pixels cost no long
//                  serial chain. A stable sort has one result whatever the GPU and every sum's
//                  shape depends on the sorted records alone: gpu_to_gpu. Workspace: 20 bytes
//                  per (output position, corner), 8 per (2048 records, channel), plus CUB's.
//   cudnn          cudnnSpatialTfSamplerForward/Backward (NCHW, grid in [-1, 1] as here). cuDNN
//                  samples with align_corners=True semantics (the case PyTorch hands to cuDNN), so
//                  the variant requires align_corners (PolicyError otherwise). cuDNN's
//                  Reproducibility notes list cudnnSpatialTfSamplerBackward among the routines
//                  that do not guarantee the same bits across runs: not_guaranteed.
// Grid coordinates that are NaN or infinite give NaN outputs and grid gradients (never a silent
// zero). The manifest gets (layer, op, "bwd") at forward and again when backward runs; on a CPU
// context the double-accumulating reference runs whatever the policy says and is recorded as
// variant "cpu-reference". The policy is resolved at the forward call, so a misconfigured layer
// fails there. Backward contributions are fresh tensors handed to accumulate_grad.
#pragma once
#include <string>

#include "engine/context.h"
#include "engine/tape.h"
#include "engine/knob.h"

namespace ditto {

namespace op {
inline constexpr OpKind grid_sample{"grid_sample"};
inline constexpr OpKind affine_grid{"affine_grid"};
}  // namespace op

// Knobs grid_sample.bwd and affine_grid.bwd (kernels/grid_sample.cpp).
enum class GridSampleBwd { Cudnn, Atomic, Deterministic };
enum class AffineGridBwd { Cudnn, Atomic, Deterministic };
const KnobSpec& grid_sample_bwd_knob();
const KnobSpec& affine_grid_bwd_knob();
const char* name_of(GridSampleBwd v);
const char* name_of(AffineGridBwd v);
inline const char* knob_name(GridSampleBwd) { return "bwd"; }
inline const char* knob_name(AffineGridBwd) { return "bwd"; }

Var affine_grid(Context& ctx, const std::string& layer, const Var& theta, int64_t height, int64_t width,
                bool align_corners);

Var grid_sample(Context& ctx, const std::string& layer, const Var& x, const Var& grid, bool align_corners);


// The backward passes alone, as the tape entries run them (ditto.torch calls them with another
// library's tensors): by the layer's `bwd` variant, recorded under (layer, "bwd"), the same checks
// as the forward's. affine_grid: dtheta {N, 2, 3} from dgrid {N, H, W, 2}. grid_sample: dx and
// dgrid from dy {N, C, OH, OW}; an unwanted one is left undefined (cuDNN computes both anyway).
Tensor affine_grid_backward(Context& ctx, const std::string& layer, const Tensor& dgrid, bool align_corners);
struct GridSampleGrads {
  Tensor dx, dgrid;
};
GridSampleGrads grid_sample_backward(Context& ctx, const std::string& layer, const Tensor& dy, const Tensor& x,
                                     const Tensor& grid, bool align_corners, bool want_dx, bool want_dgrid);

}  // namespace ditto
