// ditto's ROI align kernels, in torchvision's float arithmetic (kernels/roi_align_ref.h states it).
// Which are deterministic, and why, is said per kernel.
#include <fmt/format.h>

#include "engine/detail/cuda_state.h"
#include "engine/detail/launch.cuh"
#include "engine/error.h"
#include "kernels/detail/roi_align_cuda.h"

namespace ditto::cuda {
namespace {

constexpr int kTile = 16;   // pixels per side of the deterministic gather's tiles (and of its roi masks)
constexpr int kChunk = 32;  // channels per gather block
// dy / count of a chunk's channels is staged in shared memory when it fits beside the row and column
// sums in a block's shared memory without opting in (pooled sizes up to 19x19); larger pooled
// sizes read it from global memory, with the same bits.
constexpr std::size_t kDefaultSharedBytes = 48 * 1024;

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

// Backward by gather, one block per (image, kTile x kTile pixel tile, kChunk channels), one thread
// per pixel holding its kChunk sums. The bilinear weight of a sample's corner separates into a row
// factor and a column factor (ref::roi_axis), and every sample of a bin uses the bin's dy, so a
// roi's contribution to pixel (y, x) is
//   sum over bins (py, px) of (dy[k, c, py, px] / count) * (A[y][py] * B[x][px]),
// with A[y][py] the sum of the row factors that bin py's samples give row y (likewise B for
// columns). For each roi of the tile's mask, in ascending index, the block computes A for its rows
// and B for its columns (each entry by one thread, its samples in ascending order: roi_sample_coord,
// roi_axis, the forward's arithmetic) and stages dy / count; then every thread adds the bins whose
// A and B are both nonzero in ascending (py, px). Each dx element is written by one thread in an
// order fixed by the inputs, whatever the block size or the GPU: deterministic, no atomics. The
// roi's work is shared by the tile's pixels and channels instead of redone per pixel.
template <bool Staged>
__global__ void __launch_bounds__(kTile * kTile)
    roi_align_bwd_gather_kernel(const float* __restrict__ rois, const float* __restrict__ dy,
                                const uint32_t* __restrict__ mask, float* __restrict__ dx, ref::RoiAlignDims d,
                                MaskDims m, int64_t chunks) {
  extern __shared__ float smem[];
  float* const a_row = smem;                     // [kTile][ph]
  float* const b_col = a_row + kTile * d.ph;      // [kTile][pw]
  int* const win = reinterpret_cast<int*>(b_col + kTile * d.pw);  // row lo, row hi, col lo, col hi: [4][kTile]
  float* const dys = reinterpret_cast<float*>(win + 4 * kTile);  // [kChunk][ph * pw] when Staged
  const int64_t bins = d.ph * d.pw;
  int64_t b = blockIdx.x;
  const int64_t chunk = b % chunks;
  b /= chunks;
  const int64_t tx = b % m.tiles_x;
  b /= m.tiles_x;
  const int64_t ty = b % m.tiles_y, n = b / m.tiles_y;
  const int t = threadIdx.x, r = t / kTile, q = t % kTile;
  const int64_t y = ty * kTile + r, x = tx * kTile + q, c0 = chunk * kChunk;
  const int nc = d.c - c0 < kChunk ? static_cast<int>(d.c - c0) : kChunk;
  const int row_tasks = kTile * static_cast<int>(d.ph), tasks = row_tasks + kTile * static_cast<int>(d.pw);
  float acc[kChunk];
  for (int cc = 0; cc < kChunk; ++cc) acc[cc] = 0.f;
  const uint32_t* words = mask + ((n * m.tiles_y + ty) * m.tiles_x + tx) * m.words;
  for (int64_t wi = 0; wi < m.words; ++wi) {
    uint32_t bits = words[wi];
    while (bits) {
      const int bit = __ffs(bits) - 1;
      bits &= bits - 1;
      const int64_t k = wi * 32 + bit;
      const Geometry g = geometry(rois + k * 5, d);
      if (!g.ok) continue;  // the same for the whole block
      const float* dyk = dy + (k * d.c + c0) * bins;
      for (int task = t; task < tasks; task += blockDim.x) {
        const bool row = task < row_tasks;
        const int rest = row ? task : task - row_tasks;
        const int64_t pooled = row ? d.ph : d.pw, size = row ? d.h : d.w;
        const int64_t bin = rest % pooled, pix = (row ? ty : tx) * kTile + rest / pooled;
        const float start = row ? g.start_h : g.start_w, bin_size = row ? g.bin_h : g.bin_w;
        const int64_t grid = row ? g.grid_h : g.grid_w;
        float s = 0.f;
        if (pix < size) {
          int64_t lo, hi;
          sample_range(start, bin_size, grid, pooled, pix, lo, hi);
          if (lo < bin * grid) lo = bin * grid;
          if (hi > bin * grid + grid - 1) hi = bin * grid + grid - 1;
          for (int64_t j = lo; j <= hi; ++j) {
            const ref::RoiAxis<float> a =
                ref::roi_axis(ref::roi_sample_coord(start, bin, bin_size, j - bin * grid, grid), size);
            if (a.valid) s += (a.low == pix ? a.h : 0.f) + (a.high == pix ? a.l : 0.f);
          }
        }
        (row ? a_row : b_col)[rest] = s;
      }
      if (Staged)
        for (int64_t e = t; e < nc * bins; e += blockDim.x) dys[e] = dyk[e] / g.count;
      __syncthreads();
      // The nonzero window of each row's A and each column's B.
      if (t < 2 * kTile) {
        const bool row = t < kTile;
        const int64_t pooled = row ? d.ph : d.pw;
        const float* f = (row ? a_row : b_col) + (t % kTile) * pooled;
        int lo = 0, hi = -1;
        for (int i = 0; i < pooled; ++i)
          if (f[i] != 0.f) {
            if (hi < lo) lo = i;
            hi = i;
          }
        win[(row ? 0 : 2) * kTile + t % kTile] = lo;
        win[(row ? 1 : 3) * kTile + t % kTile] = hi;
      }
      __syncthreads();
      if (y < d.h && x < d.w) {
        const int py1 = win[kTile + r], px0 = win[2 * kTile + q], px1 = win[3 * kTile + q];
        for (int py = win[r]; py <= py1; ++py) {
          const float wy = a_row[r * d.ph + py];
          if (wy == 0.f) continue;
          for (int px = px0; px <= px1; ++px) {
            const float wx = b_col[q * d.pw + px];
            if (wx == 0.f) continue;
            const float w = wy * wx;
            const int64_t at = py * d.pw + px;
#pragma unroll
            for (int cc = 0; cc < kChunk; ++cc)
              if (cc < nc) acc[cc] += (Staged ? dys[cc * bins + at] : dyk[cc * bins + at] / g.count) * w;
          }
        }
      }
      __syncthreads();
    }
  }
  if (y < d.h && x < d.w)
    for (int cc = 0; cc < nc; ++cc) dx[((n * d.c + c0 + cc) * d.h + y) * d.w + x] = acc[cc];
}

std::size_t gather_shared_bytes(const ref::RoiAlignDims& d, bool staged) {
  return sizeof(float) * static_cast<std::size_t>(kTile * (d.ph + d.pw)) + sizeof(int) * 4 * kTile +
         (staged ? sizeof(float) * static_cast<std::size_t>(kChunk * d.ph * d.pw) : 0);
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
  if (d.n * d.c * d.h * d.w == 0) return;
  if (d.ph + d.pw > kRoiGatherMaxPooledSum)
    throw Error(fmt::format("roi_align_bwd_deterministic: pooled size {}x{} beyond the gather's limit (the op "
                            "checks it first)", d.ph, d.pw));
  cudaStream_t st = detail::stream_of(ctx);
  const MaskDims m = mask_dims(d);
  auto* mask = static_cast<uint32_t*>(workspace);
  const std::size_t mask_bytes = roi_align_bwd_deterministic_workspace(d);
  if (mask_bytes) DITTO_CUDA_CHECK(cudaMemsetAsync(mask, 0, mask_bytes, st));
  if (d.rois > 0) {
    roi_mask_kernel<<<blocks_for(d.rois), kThreads, 0, st>>>(rois, mask, d, m);
    DITTO_CHECK_LAUNCH(ctx);
  }
  const int64_t chunks = (d.c + kChunk - 1) / kChunk, blocks = d.n * m.tiles_y * m.tiles_x * chunks;
  const bool staged = gather_shared_bytes(d, true) <= kDefaultSharedBytes;
  const std::size_t shared = gather_shared_bytes(d, staged);
  if (staged)
    roi_align_bwd_gather_kernel<true><<<blocks, kTile * kTile, shared, st>>>(rois, dy, mask, dx, d, m, chunks);
  else
    roi_align_bwd_gather_kernel<false><<<blocks, kTile * kTile, shared, st>>>(rois, dy, mask, dx, d, m, chunks);
  DITTO_CHECK_LAUNCH(ctx);
}

}  // namespace ditto::cuda
