// ditto's ROI align kernels, in torchvision's float arithmetic (kernels/roi_align_ref.h states it).
// Which are deterministic, and why, is said per kernel.
#include "engine/detail/cuda_state.h"
#include "engine/detail/launch.cuh"
#include "kernels/detail/roi_align_cuda.h"

namespace ditto::cuda {
namespace {

constexpr int kTile = 8;   // pixels per tile side of the deterministic gather's roi masks
constexpr int kGroup = 8;  // channels per gather thread

// The geometry and bilinear helpers are kernels/roi_align_ref.h's, here with G = float:
// torchvision's float arithmetic.
using Geometry = ref::RoiGeometry<float>;
using Sample = ref::RoiBilinear<float>;

__device__ __forceinline__ Geometry geometry(const float* roi, const ref::RoiAlignDims& d) {
  return ref::roi_geometry<float>(roi, d);
}

// Forward: one thread per output element (k, c, ph, pw); its samples row-major, then the division.
// No reduction across threads: deterministic.
__global__ void roi_align_fwd_kernel(const float* __restrict__ x, const float* __restrict__ rois,
                                     float* __restrict__ y, ref::RoiAlignDims d) {
  const int64_t bins = d.ph * d.pw, total = d.rois * d.c * bins;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t px = i % d.pw, py = (i / d.pw) % d.ph, c = (i / bins) % d.c, k = i / (bins * d.c);
    const Geometry g = geometry(rois + k * 5, d);
    if (!g.ok) {
      y[i] = NAN;
      continue;
    }
    const float* xp = x + (g.batch * d.c + c) * d.h * d.w;
    float s = 0.f;
    ref::roi_for_each_sample(g, py, px, d, [&](const Sample& b) {
      s += b.w[0] * xp[b.y_low * d.w + b.x_low] + b.w[1] * xp[b.y_low * d.w + b.x_high] +
           b.w[2] * xp[b.y_high * d.w + b.x_low] + b.w[3] * xp[b.y_high * d.w + b.x_high];
    });
    y[i] = s / g.count;
  }
}

// Backward by scatter (torchvision's roi_align_backward_kernel): one thread per output element
// atomicAdds dy / count * weight into the four corners of each sample. Overlapping rois, bins and
// samples share dx elements and their adds land in scheduling order: NOT deterministic.
__global__ void roi_align_bwd_atomic_kernel(const float* __restrict__ rois, const float* __restrict__ dy,
                                            float* __restrict__ dx, ref::RoiAlignDims d) {
  const int64_t bins = d.ph * d.pw, total = d.rois * d.c * bins;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t px = i % d.pw, py = (i / d.pw) % d.ph, c = (i / bins) % d.c, k = i / (bins * d.c);
    const Geometry g = geometry(rois + k * 5, d);
    if (!g.ok) continue;
    float* dxp = dx + (g.batch * d.c + c) * d.h * d.w;
    const float gy = dy[i] / g.count;
    ref::roi_for_each_sample(g, py, px, d, [&](const Sample& b) {
      atomicAdd(dxp + b.y_low * d.w + b.x_low, gy * b.w[0]);
      atomicAdd(dxp + b.y_low * d.w + b.x_high, gy * b.w[1]);
      atomicAdd(dxp + b.y_high * d.w + b.x_low, gy * b.w[2]);
      atomicAdd(dxp + b.y_high * d.w + b.x_high, gy * b.w[3]);
    });
  }
}

struct MaskDims {
  int64_t tiles_y, tiles_x, words;
};

MaskDims mask_dims(const ref::RoiAlignDims& d) {
  return {(d.h + kTile - 1) / kTile, (d.w + kTile - 1) / kTile, (d.rois + 31) / 32};
}

// The pixels [lo, hi] (clamped to [0, size)) that samples at coordinates within [a, b] can reach
// through their bilinear corners, with two pixels of margin for float rounding.
__device__ __forceinline__ void footprint(float a, float b, int64_t size, int64_t& lo, int64_t& hi) {
  const float mn = fmaxf(fminf(a, b), -4.f), mx = fminf(fmaxf(a, b), float(size) + 4.f);
  lo = static_cast<int64_t>(floorf(mn)) - 2;
  hi = static_cast<int64_t>(floorf(mx)) + 3;
  if (lo < 0) lo = 0;
  if (hi > size - 1) hi = size - 1;
}

// One thread per roi sets its bit in the mask word of every tile its samples can touch. The bits
// are set with atomicOr: an integer OR, so the mask is the same whatever the order.
__global__ void roi_mask_kernel(const float* __restrict__ rois, uint32_t* __restrict__ mask, ref::RoiAlignDims d,
                                MaskDims m) {
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < d.rois; k += int64_t(gridDim.x) * blockDim.x) {
    const Geometry g = geometry(rois + k * 5, d);
    if (!g.ok || g.grid_h <= 0 || g.grid_w <= 0) continue;
    int64_t r0, r1, c0, c1;
    footprint(g.start_h, g.start_h + float(d.ph) * g.bin_h, d.h, r0, r1);
    footprint(g.start_w, g.start_w + float(d.pw) * g.bin_w, d.w, c0, c1);
    if (r0 > r1 || c0 > c1) continue;
    const uint32_t bit = 1u << (k % 32);
    for (int64_t ty = r0 / kTile; ty <= r1 / kTile; ++ty)
      for (int64_t tx = c0 / kTile; tx <= c1 / kTile; ++tx)
        atomicOr(mask + ((g.batch * m.tiles_y + ty) * m.tiles_x + tx) * m.words + k / 32, bit);
  }
}

// The sample indices j (j = bin * grid + i along one axis) whose coordinate can lie within one
// pixel of `pix`: solved from the spacing step = bin / grid with a margin for rounding. Zero,
// negative or non-finite spacing (degenerate aligned rois): every index.
__device__ __forceinline__ void sample_range(float start, float bin, int64_t grid, int64_t pooled, int64_t pix,
                                             int64_t& lo, int64_t& hi) {
  const int64_t total = pooled * grid;
  lo = 0;
  hi = total - 1;
  const float step = bin / float(grid);
  if (!(step > 0.f) || !isfinite(step)) return;
  const float lim = float(total) + 2.f;
  const float a = fminf(fmaxf((float(pix) - 1.f - start) / step - 0.5f, -2.f), lim);
  const float b = fminf(fmaxf((float(pix) + 1.f - start) / step - 0.5f, -2.f), lim);
  // The exact coordinates (sample_coord) differ from start + (j + 0.5) * step by rounding of
  // numbers as large as |start| + |bin| * pooled: cover that, in units of step.
  const float slack = 4.f * 1.1920929e-7f * (fabsf(start) + fabsf(bin) * float(pooled) + float(pix) + 2.f) / step;
  const int64_t margin = 1 + static_cast<int64_t>(fminf(slack, lim));
  const int64_t l = static_cast<int64_t>(floorf(a)) - margin, h = static_cast<int64_t>(ceilf(b)) + margin;
  if (l > lo) lo = l;
  if (h < hi) hi = h;
}

// Backward by gather: one thread per (n, group of kGroup channels, y, x). It walks the rois of its
// tile's mask in ascending index; for each, the samples in its candidate index ranges in
// ascending (row index, column index) order, recomputing each sample's weights with the forward's
// arithmetic and adding dy / count * (the weight of this pixel's corner). Each dx element is
// written by one thread in an order fixed by the inputs: deterministic, no atomics.
__global__ void roi_align_bwd_gather_kernel(const float* __restrict__ rois, const float* __restrict__ dy,
                                            const uint32_t* __restrict__ mask, float* __restrict__ dx,
                                            ref::RoiAlignDims d, MaskDims m) {
  const int64_t groups = (d.c + kGroup - 1) / kGroup, plane = d.h * d.w, bins = d.ph * d.pw;
  const int64_t total = d.n * groups * plane;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t x = i % d.w, y = (i / d.w) % d.h, grp = (i / plane) % groups, n = i / (plane * groups);
    const int64_t c0 = grp * kGroup, nc = d.c - c0 < kGroup ? d.c - c0 : kGroup;
    const uint32_t* words = mask + ((n * m.tiles_y + y / kTile) * m.tiles_x + x / kTile) * m.words;
    float acc[kGroup];
    for (int cc = 0; cc < kGroup; ++cc) acc[cc] = 0.f;
    for (int64_t wi = 0; wi < m.words; ++wi) {
      uint32_t bits = words[wi];
      while (bits) {
        const int b = __ffs(bits) - 1;
        bits &= bits - 1;
        const int64_t k = wi * 32 + b;
        const Geometry g = geometry(rois + k * 5, d);
        if (!g.ok) continue;
        int64_t jy0, jy1, jx0, jx1;
        sample_range(g.start_h, g.bin_h, g.grid_h, d.ph, y, jy0, jy1);
        sample_range(g.start_w, g.bin_w, g.grid_w, d.pw, x, jx0, jx1);
        const float* dyk = dy + k * d.c * bins;
        // The bilinear weight separates into a row and a column factor (ref::roi_axis), so rows
        // whose samples miss this pixel are dropped before their columns are visited. Each
        // product wy * wx is bit for bit the corner weight (hy * hx, hy * lx, ...) the atomic
        // variant adds.
        for (int64_t jy = jy0; jy <= jy1; ++jy) {
          const int64_t py = jy / g.grid_h, iy = jy % g.grid_h;
          const ref::RoiAxis<float> ay =
              ref::roi_axis(ref::roi_sample_coord(g.start_h, py, g.bin_h, iy, g.grid_h), d.h);
          if (!ay.valid) continue;
          const float wy = (ay.low == y ? ay.h : 0.f) + (ay.high == y ? ay.l : 0.f);
          if (wy == 0.f) continue;
          for (int64_t jx = jx0; jx <= jx1; ++jx) {
            const int64_t px = jx / g.grid_w, ix = jx % g.grid_w;
            const ref::RoiAxis<float> ax =
                ref::roi_axis(ref::roi_sample_coord(g.start_w, px, g.bin_w, ix, g.grid_w), d.w);
            if (!ax.valid) continue;
            const float wx = (ax.low == x ? ax.h : 0.f) + (ax.high == x ? ax.l : 0.f);
            if (wx == 0.f) continue;
            const float wsum = wy * wx;
            const float* g0 = dyk + c0 * bins + py * d.pw + px;
            for (int cc = 0; cc < kGroup; ++cc)
              if (cc < nc) acc[cc] += (g0[cc * bins] / g.count) * wsum;
          }
        }
      }
    }
    for (int cc = 0; cc < kGroup; ++cc)
      if (cc < nc) dx[((n * d.c + c0 + cc) * d.h + y) * d.w + x] = acc[cc];
  }
}

}  // namespace

void roi_align_fwd(Context& ctx, const float* x, const float* rois, float* y, const ref::RoiAlignDims& d) {
  const int64_t total = d.rois * d.c * d.ph * d.pw;
  if (total == 0) return;
  roi_align_fwd_kernel<<<blocks_for(total), kThreads, 0, detail::stream_of(ctx)>>>(x, rois, y, d);
  DITTO_CHECK_LAUNCH(ctx);
}

void roi_align_bwd_atomic(Context& ctx, const float* rois, const float* dy, float* dx, const ref::RoiAlignDims& d) {
  const int64_t total = d.rois * d.c * d.ph * d.pw;
  if (total == 0) return;
  roi_align_bwd_atomic_kernel<<<blocks_for(total), kThreads, 0, detail::stream_of(ctx)>>>(rois, dy, dx, d);
  DITTO_CHECK_LAUNCH(ctx);
}

std::size_t roi_align_bwd_deterministic_workspace(const ref::RoiAlignDims& d) {
  const MaskDims m = mask_dims(d);
  return sizeof(uint32_t) * static_cast<std::size_t>(d.n * m.tiles_y * m.tiles_x * m.words);
}

void roi_align_bwd_deterministic(Context& ctx, const float* rois, const float* dy, float* dx, void* workspace,
                                 const ref::RoiAlignDims& d) {
  const int64_t total = d.n * ((d.c + kGroup - 1) / kGroup) * d.h * d.w;
  if (total == 0) return;
  cudaStream_t st = detail::stream_of(ctx);
  const MaskDims m = mask_dims(d);
  auto* mask = static_cast<uint32_t*>(workspace);
  const std::size_t mask_bytes = roi_align_bwd_deterministic_workspace(d);
  if (mask_bytes) DITTO_CUDA_CHECK(cudaMemsetAsync(mask, 0, mask_bytes, st));
  if (d.rois > 0) {
    roi_mask_kernel<<<blocks_for(d.rois), kThreads, 0, st>>>(rois, mask, d, m);
    DITTO_CHECK_LAUNCH(ctx);
  }
  roi_align_bwd_gather_kernel<<<blocks_for(total), kThreads, 0, st>>>(rois, dy, mask, dx, d, m);
  DITTO_CHECK_LAUNCH(ctx);
}

}  // namespace ditto::cuda
