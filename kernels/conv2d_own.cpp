// ditto's own convolution backward: which problems each variant takes and how ditto-gemm splits
// one (kernels/detail/conv2d_own.h). Host code only, so the CPU tests check the plans.
#include <fmt/format.h>

#include <algorithm>
#include <climits>

#include "kernels/detail/conv2d_own.h"

namespace ditto::own {
namespace {
constexpr int64_t kMaxDirectSide = 7;  // the direct filter kernel's largest R and S
}

bool gemm_supports(const ConvGeom& g, std::string* why) {
  auto no = [&](std::string s) {
    if (why) *why = std::move(s);
    return false;
  };
  if (g.G > kMaxGemmGroups)
    return no(fmt::format("ditto-gemm runs one GEMM per group and takes at most {} groups (this convolution "
                          "has {}); ditto-direct takes depthwise ones",
                          kMaxGemmGroups, g.G));
  // cuBLAS takes int dimensions, leading dimensions and batch counts.
  const GemmPlan p = plan_gemm(g, true);
  const int64_t positions = p.images_per_item * g.HoWo();
  if (positions > INT_MAX || g.CRSg() > INT_MAX || g.Kg() > INT_MAX || g.N * g.C * g.HW() > INT64_MAX / 4)
    return no("a GEMM dimension exceeds cuBLAS's int range");
  return true;
}

bool direct_supports(const ConvGeom& g, bool bwd_filter, std::string* why) {
  if (!g.depthwise()) {
    if (bwd_filter) {  // the implicit GEMM takes any convolution
      if (g.N * g.HoWo() > INT64_MAX / 2) {
        if (why) *why = "too many positions";
        return false;
      }
      return true;
    }
    if (why) *why = fmt::format("ditto-direct's bwd_data takes depthwise convolutions (one input channel per group); "
                                "this one has {} per group", g.Cg());
    return false;
  }
  if (g.R > kMaxDirectSide || g.S > kMaxDirectSide) {
    if (why) *why = fmt::format("ditto-direct takes kernels of at most {}x{}; this one is {}x{}", kMaxDirectSide,
                                kMaxDirectSide, g.R, g.S);
    return false;
  }
  return true;
}

bool direct_fwd_supports(const ConvGeom& g, std::string* why) {
  // One launch per group walks the output positions along the grid's x dimension and the group's
  // output channels along y (at most 65535 tiles of 64).
  if (g.Kg() > int64_t(65535) * 64) {
    if (why) *why = fmt::format("ditto-direct's forward takes at most {} output channels per group; this one has {}",
                                int64_t(65535) * 64, g.Kg());
    return false;
  }
  if (g.N * g.HoWo() > INT64_MAX / 2) {
    if (why) *why = "too many positions";
    return false;
  }
  return true;
}

GemmPlan plan_gemm(const ConvGeom& g, bool bwd_filter) {
  GemmPlan p;
  // Images per item: enough positions that each GEMM's inner (bwd_filter) or outer (bwd_data)
  // dimension fills cuBLAS's tiles; powers of two, at most N.
  const int64_t target = bwd_filter ? kItemPositions : kItemPositionsData;
  int64_t b = 1;
  while (b * g.HoWo() < target && b * 2 <= g.N) b *= 2;
  p.images_per_item = b;
  p.in_place = g.pointwise() && b == 1;
  p.transpose_dy = b > 1;
  const int64_t positions = b * g.HoWo();
  const std::size_t cols = p.in_place ? 0 : std::size_t(g.CRSg() * positions);
  const std::size_t dy = p.transpose_dy ? std::size_t(g.Kg() * positions) : 0;
  const std::size_t partial = bwd_filter ? std::size_t(g.Kg() * g.CRSg()) : 0;
  const std::size_t per_item = cols + dy + partial;
  const int64_t items = (g.N + b - 1) / b;
  int64_t chunk = per_item ? int64_t(kChunkBytes / (per_item * sizeof(float))) : items;
  chunk = std::max<int64_t>(1, std::min(chunk, items));
  p.items_per_chunk = chunk;
  p.cols_floats = cols * std::size_t(chunk);
  p.dy_floats = dy * std::size_t(chunk);
  p.partial_floats = partial * std::size_t(chunk);
  return p;
}

namespace {
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
// Blocks of the implicit kernel per part: its tiles of (k, crs) over all groups.
int64_t implicit_tiles(const ConvGeom& g) {
  return ceil_div(g.Kg(), kImplicitTile) * ceil_div(g.CRSg(), kImplicitTile) * g.G;
}
}  // namespace

int64_t implicit_part_length(const ConvGeom& g) {
  // About 2048 blocks in all (a large GPU's worth several times over), each part at least 8
  // stages long; a multiple of the stage.
  const int64_t positions = g.N * g.HoWo();
  const int64_t want_parts = std::max<int64_t>(1, 2048 / implicit_tiles(g));
  int64_t len = std::max<int64_t>(ceil_div(positions, want_parts), 8 * kImplicitStage);
  return ceil_div(len, kImplicitStage) * kImplicitStage;
}

int64_t direct_filter_parts(const ConvGeom& g) {
  if (!g.depthwise()) return ceil_div(g.N * g.HoWo(), implicit_part_length(g));
  // Enough blocks to fill a large GPU (K * parts around 4096), each part at least one image.
  const int64_t want = (4096 + g.K - 1) / g.K;
  return std::max<int64_t>(1, std::min(want, g.N));
}

std::size_t direct_filter_workspace_bytes(const ConvGeom& g) {
  return std::size_t(direct_filter_parts(g) * g.K * g.CRSg()) * sizeof(float);
}

}  // namespace ditto::own
