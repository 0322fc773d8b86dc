// ditto's own convolution backward: which problems each variant takes and how ditto-gemm splits
// one (kernels/detail/conv2d_own.h). Host code only, so the CPU tests check the plans.
#include <fmt/format.h>

#include <algorithm>
#include <climits>
#include <vector>

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

bool winograd_supports(const ConvGeom& g, std::string* why) {
  auto no = [&](std::string s) {
    if (why) *why = std::move(s);
    return false;
  };
  if (g.R != 3 || g.S != 3 || g.sh != 1 || g.sw != 1 || g.dh != 1 || g.dw != 1 || g.G != 1)
    return no(fmt::format("ditto-winograd takes 3x3 filters with stride 1, dilation 1 and one group (this one: "
                          "{}x{}, stride {}x{}, dilation {}x{}, {} groups); ditto-gemm takes any",
                          g.R, g.S, g.sh, g.sw, g.dh, g.dw, g.G));
  if (g.ph > 2 || g.pw > 2)
    return no(fmt::format("ditto-winograd takes padding of at most 2 (this one: {}x{})", g.ph, g.pw));
  const WinogradPlan p = plan_winograd(g);
  if (p.part_positions() > INT_MAX || g.K > INT_MAX || g.C > INT_MAX || 16 * p.parts_per_chunk > INT_MAX ||
      int64_t(p.u_floats + p.v_floats) > INT64_MAX / 8)
    return no("a GEMM dimension exceeds cuBLAS's int range");
  return true;
}

WinogradPlan plan_winograd(const ConvGeom& g) {
  WinogradPlan p;
  p.tiles_h = ceil_div(g.Ho, 2);
  p.tiles_w = ceil_div(g.Wo, 2);
  const int64_t tiles = std::max<int64_t>(1, p.tiles());
  p.images_per_part = std::max<int64_t>(1, std::min(g.N, ceil_div(kWinogradPositions, tiles)));
  p.parts = std::max<int64_t>(1, ceil_div(g.N, p.images_per_part));
  // Transformed tiles of a part: 16 elements x (K + C) rows x the part's positions.
  const std::size_t per_part = std::size_t(16 * (g.K + g.C) * p.part_positions() + 16 * g.K * g.C) * sizeof(float);
  p.parts_per_chunk = std::max<int64_t>(1, std::min<int64_t>(p.parts, int64_t(kChunkBytes / std::max<std::size_t>(1, per_part))));
  p.u_floats = std::size_t(16 * p.parts_per_chunk * g.K * p.part_positions());
  p.v_floats = std::size_t(16 * p.parts_per_chunk * g.C * p.part_positions());
  p.m_floats = std::size_t(16 * p.parts_per_chunk * g.K * g.C);
  p.acc_floats = std::size_t(16 * g.K * g.C);
  return p;
}

WinogradConv winograd_conv_of(const ConvGeom& g, bool bwd_data) {
  WinogradConv c;
  c.N = g.N;
  if (bwd_data) {
    c.Ci = g.K, c.H = g.Ho, c.W = g.Wo, c.Co = g.C, c.Ho = g.H, c.Wo = g.W, c.ph = 2 - g.ph, c.pw = 2 - g.pw;
    c.flip = true;
  } else {
    c.Ci = g.C, c.H = g.H, c.W = g.W, c.Co = g.K, c.Ho = g.Ho, c.Wo = g.Wo, c.ph = g.ph, c.pw = g.pw;
  }
  return c;
}

WinogradConvPlan plan_winograd_conv(const WinogradConv& c) {
  WinogradConvPlan p;
  const int64_t per_image = 16 * (c.Ci + c.Co) * std::max<int64_t>(1, c.tiles());
  p.images_per_chunk = std::max<int64_t>(
      1, std::min<int64_t>(c.N, int64_t(kChunkBytes / sizeof(float)) / std::max<int64_t>(1, per_image)));
  p.chunks = std::max<int64_t>(1, ceil_div(c.N, p.images_per_chunk));
  const int64_t positions = p.images_per_chunk * c.tiles();
  p.u_floats = std::size_t(16 * c.Co * c.Ci);
  p.v_floats = std::size_t(16 * c.Ci * positions);
  p.m_floats = std::size_t(16 * c.Co * positions);
  return p;
}

bool winograd_conv_supports(const ConvGeom& g, std::string* why) {
  // The geometry the weight gradient's F(3x3, 2x2) takes is the one F(2x2, 3x3) takes both ways:
  // a 3x3 filter at stride 1 (the tiles step by 2), padding <= 2 (bwd_data pads by 2 - p).
  if (!winograd_supports(g, why)) return false;
  for (bool data : {false, true}) {
    const WinogradConv c = winograd_conv_of(g, data);
    const int64_t positions = plan_winograd_conv(c).images_per_chunk * c.tiles();
    if (positions > INT_MAX || 16 * c.Ci * positions > INT64_MAX / 8) {
      if (why) *why = "a GEMM dimension exceeds cuBLAS's int range";
      return false;
    }
  }
  return true;
}

void winograd_conv_cpu(const WinogradConv& c, const float* in, const float* w, float* out) {
  const WinogradConvPlan p = plan_winograd_conv(c);
  const int64_t T = c.tiles(), tw = c.tiles_w();
  std::vector<float> u(p.u_floats), v(std::size_t(16 * c.Ci)), m(16);
  for (int64_t o = 0; o < c.Co; ++o)
    for (int64_t i = 0; i < c.Ci; ++i) {
      float f[9], t[16];
      for (int r = 0; r < 3; ++r)
        for (int s = 0; s < 3; ++s) f[r * 3 + s] = w[c.tap(o, i, r, s)];
      winograd_filter_tile(f, t);
      for (int e = 0; e < 16; ++e) u[std::size_t((e * c.Co + o) * c.Ci + i)] = t[e];
    }
  for (int64_t n = 0; n < c.N; ++n)
    for (int64_t t = 0; t < T; ++t) {
      const int64_t h0 = 2 * (t / tw), w0 = 2 * (t % tw);
      for (int64_t i = 0; i < c.Ci; ++i) {
        float d[16], tt[16];
        winograd_window(in + (n * c.Ci + i) * c.H * c.W, h0 - c.ph, w0 - c.pw, c.H, c.W, d);
        winograd_input_tile(d, tt);
        for (int e = 0; e < 16; ++e) v[std::size_t(e * c.Ci + i)] = tt[e];
      }
      for (int64_t o = 0; o < c.Co; ++o) {
        for (int e = 0; e < 16; ++e) {
          float sum = 0.f;
          for (int64_t i = 0; i < c.Ci; ++i) sum += u[std::size_t((e * c.Co + o) * c.Ci + i)] * v[std::size_t(e * c.Ci + i)];
          m[std::size_t(e)] = sum;
        }
        float y[4];
        winograd_result_tile(m.data(), y);
        for (int a = 0; a < 2; ++a)
          for (int b = 0; b < 2; ++b)
            if (h0 + a < c.Ho && w0 + b < c.Wo) out[((n * c.Co + o) * c.Ho + h0 + a) * c.Wo + w0 + b] = y[a * 2 + b];
      }
    }
}

void winograd_filter_cpu(const ConvGeom& g, const float* x, const float* dy, float* dw) {
  const WinogradPlan p = plan_winograd(g);
  const int64_t T = p.tiles(), P = p.part_positions();
  std::vector<float> v(std::size_t(16 * g.C * P)), u(std::size_t(16 * g.K * P)), acc(std::size_t(16 * g.K * g.C));
  for (int64_t part = 0; part < p.parts; ++part) {
    // The part's transformed tiles: [16][C][P] and [16][K][P], zero for padding images.
    for (int64_t q = 0; q < P; ++q) {
      const int64_t n = part * p.images_per_part + q / T, t = q % T;
      const int64_t h0 = 2 * (t / p.tiles_w), w0 = 2 * (t % p.tiles_w);
      for (int64_t c = 0; c < g.C; ++c) {
        float d[16], tt[16];
        winograd_window(n < g.N ? x + (n * g.C + c) * g.H * g.W : nullptr, h0 - g.ph, w0 - g.pw, g.H, g.W, d);
        winograd_input_tile(d, tt);
        for (int e = 0; e < 16; ++e) v[std::size_t((e * g.C + c) * P + q)] = tt[e];
      }
      for (int64_t k = 0; k < g.K; ++k) {
        float gt[4], uu[16];
        for (int a = 0; a < 2; ++a)
          for (int b = 0; b < 2; ++b) {
            const int64_t h = h0 + a, w = w0 + b;
            gt[a * 2 + b] = n < g.N && h < g.Ho && w < g.Wo ? dy[((n * g.K + k) * g.Ho + h) * g.Wo + w] : 0.f;
          }
        winograd_grad_tile(gt, uu);
        for (int e = 0; e < 16; ++e) u[std::size_t((e * g.K + k) * P + q)] = uu[e];
      }
    }
    for (int e = 0; e < 16; ++e)
      for (int64_t k = 0; k < g.K; ++k)
        for (int64_t c = 0; c < g.C; ++c) {
          float sum = 0.f;
          for (int64_t q = 0; q < P; ++q) sum += u[std::size_t((e * g.K + k) * P + q)] * v[std::size_t((e * g.C + c) * P + q)];
          float& a = acc[std::size_t((e * g.K + k) * g.C + c)];
          a = part == 0 ? sum : a + sum;
        }
  }
  for (int64_t k = 0; k < g.K; ++k)
    for (int64_t c = 0; c < g.C; ++c) {
      float m[16], y[9];
      for (int e = 0; e < 16; ++e) m[e] = acc[std::size_t((e * g.K + k) * g.C + c)];
      winograd_output_tile(m, y);
      for (int r = 0; r < 9; ++r) dw[(k * g.C + c) * 9 + r] = y[r];
    }
}

}  // namespace ditto::own
