// ditto's own spatial-transformer kernels. Which are deterministic, and why, is said per kernel.
// Positions in a plane are int (the op checks H*W and OH*OW < 2^31); totals are int64.
#include "engine/detail/cuda_state.h"
#include "engine/detail/launch.cuh"
#include "kernels/detail/grid_sample_cuda.h"
#include "kernels/detail/reduce.cuh"
#include "kernels/detail/segments.cuh"

namespace ditto::cuda {
namespace {
static_assert(kThreads == 256, "the dtheta kernels reduce 8 warps per block");

// ---- affine grid ----------------------------------------------------------------------------

__device__ __forceinline__ float affine_base_f(int64_t i, int64_t size, bool align_corners) {
  return ref::affine_base<float>(i, size, align_corners);
}

// One thread per grid point; no reduction: deterministic.
__global__ void affine_grid_fwd_kernel(const float* __restrict__ theta, float* __restrict__ grid, int64_t n,
                                       int64_t h, int64_t w, bool ac) {
  const int64_t total = n * h * w;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t j = i % w, r = (i / w) % h, b = i / (w * h);
    const float bx = affine_base_f(j, w, ac), by = affine_base_f(r, h, ac);
    const float* th = theta + b * 6;
    grid[i * 2] = th[0] * bx + th[1] * by + th[2];
    grid[i * 2 + 1] = th[3] * bx + th[4] * by + th[5];
  }
}

constexpr int64_t kPointsPerThread = 4;
constexpr int64_t kMaxParts = 256;

// dtheta partials: grid (N, P). Block (n, p) owns the points j = p*256 + t + k*P*256 of image n;
// each thread adds its points' six products in increasing k.
//   kAtomic = true:  each warp's six sums (cub::WarpReduce) are atomicAdded into dtheta[n] by lane 0,
//                    in the order the warps finish: NOT deterministic.
//   kAtomic = false: cub::BlockReduce (fixed order) writes partials[(n*P + p)*6 + r].
template <bool kAtomic>
__global__ void affine_grid_bwd_partial_kernel(const float* __restrict__ dgrid, float* __restrict__ out, int64_t h,
                                               int64_t w, bool ac) {
  const int64_t b = blockIdx.x, p = blockIdx.y, parts = gridDim.y, hw = h * w;
  float acc[6] = {0, 0, 0, 0, 0, 0};
  for (int64_t j = p * kThreads + threadIdx.x; j < hw; j += parts * kThreads) {
    const float bx = affine_base_f(j % w, w, ac), by = affine_base_f(j / w, h, ac);
    const float* g = dgrid + (b * hw + j) * 2;
    const float gx = g[0], gy = g[1];
    acc[0] += gx * bx;
    acc[1] += gx * by;
    acc[2] += gx;
    acc[3] += gy * bx;
    acc[4] += gy * by;
    acc[5] += gy;
  }
  if constexpr (kAtomic) {
    __shared__ WarpSum::TempStorage warp_tmp[kThreads / 32];
    for (int r = 0; r < 6; ++r) {
      const float s = WarpSum(warp_tmp[threadIdx.x >> 5]).Sum(acc[r]);
      if ((threadIdx.x & 31) == 0) atomicAdd(out + b * 6 + r, s);
      __syncwarp();
    }
  } else {
    __shared__ BlockSum<kThreads>::TempStorage tmp;
    for (int r = 0; r < 6; ++r) {
      const float s = BlockSum<kThreads>(tmp).Sum(acc[r]);
      if (threadIdx.x == 0) out[(b * parts + p) * 6 + r] = s;
      __syncthreads();  // tmp is reused by the next reduction
    }
  }
}

// One block per image adds its P <= 256 partials of each of the six entries with BlockSum.
__global__ void affine_grid_bwd_final_kernel(const float* __restrict__ partials, float* __restrict__ dtheta,
                                             int64_t parts) {
  const int64_t b = blockIdx.x;
  __shared__ BlockSum<kThreads>::TempStorage tmp;
  for (int r = 0; r < 6; ++r) {
    const float v = threadIdx.x < parts ? partials[(b * parts + threadIdx.x) * 6 + r] : 0.f;
    const float s = BlockSum<kThreads>(tmp).Sum(v, static_cast<int>(parts));
    if (threadIdx.x == 0) dtheta[b * 6 + r] = s;
    __syncthreads();
  }
}

// ---- bilinear sampling ----------------------------------------------------------------------

// The four corners (nw, ne, sw, se) of a sample: kernels/grid_sample_ref.h's bilinear_at in float
// (PyTorch's weight expressions), with in-plane indices.
struct Corners {
  int idx[4];  // iy * W + ix; only meaningful where valid
  ref::Bilinear<float> b;
};

__device__ __forceinline__ Corners corners_at(const float* g, int64_t h, int64_t w, bool ac) {
  Corners c;
  c.b = ref::bilinear_at<float>(g[0], g[1], h, w, ac);
  for (int k = 0; k < 4; ++k) c.idx[k] = static_cast<int>(c.b.iy[k] * w + c.b.ix[k]);
  return c;
}

// Forward: one thread per output element (position fastest), the four corners in a fixed order.
// No reduction across threads: deterministic.
__global__ void grid_sample_fwd_kernel(const float* __restrict__ x, const float* __restrict__ grid,
                                       float* __restrict__ y, ref::GridSampleDims d) {
  const int64_t plane = d.oh * d.ow, total = d.n * d.c * plane, in_plane = d.h * d.w;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t p = i % plane, nc = i / plane, n = nc / d.c;
    const Corners c = corners_at(grid + (n * plane + p) * 2, d.h, d.w, d.align_corners);
    const float* xp = x + nc * in_plane;
    float s = 0.f;
    for (int k = 0; k < 4; ++k)
      if (c.b.valid[k]) s += c.b.weight[k] * xp[c.idx[k]];
    y[i] = c.b.finite ? s : NAN;
  }
}

// Backward per output position (PyTorch's grid_sampler_2d_backward scheme): one thread per (n, p)
// loops over the channels in order. The grid gradient is that thread's own sum: deterministic.
//   kScatter = true:  also atomicAdds dy * weight into the four corners of dx (dx zeroed first):
//                     several positions share corners, so the adds land in scheduling order: NOT
//                     deterministic.
//   kScatter = false: the grid gradient only.
template <bool kScatter>
__global__ void grid_sample_bwd_position_kernel(const float* __restrict__ x, const float* __restrict__ grid,
                                                const float* __restrict__ dy, float* __restrict__ dx,
                                                float* __restrict__ dgrid, ref::GridSampleDims d) {
  const int64_t plane = d.oh * d.ow, total = d.n * plane, in_plane = d.h * d.w;
  const float sx = d.align_corners ? float(d.w - 1) / 2.f : float(d.w) / 2.f;
  const float sy = d.align_corners ? float(d.h - 1) / 2.f : float(d.h) / 2.f;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t p = i % plane, n = i / plane;
    const Corners c = corners_at(grid + i * 2, d.h, d.w, d.align_corners);
    const float fx = c.b.fx, fy = c.b.fy;
    float gx = 0.f, gy = 0.f;
    for (int64_t ch = 0; ch < d.c; ++ch) {
      const int64_t nc = n * d.c + ch;
      const float go = dy[nc * plane + p];
      if (dgrid) {
        const float* xp = x + nc * in_plane;
        float v[4];
        for (int k = 0; k < 4; ++k) v[k] = c.b.valid[k] ? xp[c.idx[k]] : 0.f;
        gx += go * ((v[1] - v[0]) * (1.f - fy) + (v[3] - v[2]) * fy);
        gy += go * ((v[2] - v[0]) * (1.f - fx) + (v[3] - v[1]) * fx);
      }
      if (kScatter && dx)
        for (int k = 0; k < 4; ++k)
          if (c.b.valid[k]) atomicAdd(dx + nc * in_plane + c.idx[k], go * c.b.weight[k]);
    }
    if (dgrid) {
      dgrid[i * 2] = c.b.finite ? gx * sx : NAN;
      dgrid[i * 2 + 1] = c.b.finite ? gy * sy : NAN;
    }
  }
}

// Gather records: entry e = (n*plane + p)*4 + k for corner k of position p of image n. Its key is
// the global target pixel n*H*W + idx (or the sentinel n_images*H*W for a corner outside the image
// or a non-finite position, sorted past every real target), its weight the corner's weight.
__global__ void grid_sample_entries_kernel(const float* __restrict__ grid, uint32_t* __restrict__ keys,
                                           int32_t* __restrict__ vals, float* __restrict__ wts,
                                           ref::GridSampleDims d) {
  const int64_t plane = d.oh * d.ow, total = d.n * plane, in_plane = d.h * d.w;
  const uint32_t sentinel = static_cast<uint32_t>(d.n * in_plane);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t n = i / plane;
    const Corners c = corners_at(grid + i * 2, d.h, d.w, d.align_corners);
    for (int k = 0; k < 4; ++k) {
      const int64_t e = i * 4 + k;
      keys[e] = c.b.valid[k] ? static_cast<uint32_t>(n * in_plane + c.idx[k]) : sentinel;
      vals[e] = static_cast<int32_t>(e);
      wts[e] = c.b.weight[k];
    }
  }
}

// dx by gather: one thread per dx element (n, c, t) adds, over its target's run of sorted entries
// (ascending e: positions row-major, corners nw, ne, sw, se), weight * dy[n, c, p]. Each dx is
// written by one thread in an order fixed by the sort: deterministic, no atomics.
__global__ void grid_sample_dx_gather_kernel(const float* __restrict__ dy, const int32_t* __restrict__ starts,
                                             const int32_t* __restrict__ sorted_vals, const float* __restrict__ wts,
                                             float* __restrict__ dx, ref::GridSampleDims d) {
  const int64_t plane = d.oh * d.ow, in_plane = d.h * d.w, total = d.n * d.c * in_plane;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i % in_plane, nc = i / in_plane, n = nc / d.c;
    const int64_t target = n * in_plane + t;
    const int32_t beg = starts[target], end = starts[target + 1];
    const float* dyp = dy + nc * plane;
    const int64_t first = n * plane;
    float s = 0.f;
    for (int32_t j = beg; j < end; ++j) {
      const int32_t e = sorted_vals[j];
      s += wts[e] * dyp[int64_t(e / 4) - first];
    }
    dx[i] = s;
  }
}

struct GatherLayout {
  uint32_t *keys_in, *keys_out;
  int32_t *vals_in, *vals_out, *starts;
  float* wts;
  void* sort_temp;
  std::size_t sort_temp_bytes, bytes;
  int end_bit;
  int64_t entries;
};

GatherLayout gather_layout(void* base, const ref::GridSampleDims& d) {
  GatherLayout l;
  l.entries = d.n * d.oh * d.ow * 4;
  const int64_t targets = d.n * d.h * d.w;
  l.end_bit = key_bits(static_cast<uint64_t>(targets));
  l.sort_temp_bytes = sort_pairs_temp_bytes(l.entries, l.end_bit);
  WorkspaceCarve carve{static_cast<char*>(base)};
  l.keys_in = carve.take<uint32_t>(l.entries);
  l.keys_out = carve.take<uint32_t>(l.entries);
  l.vals_in = carve.take<int32_t>(l.entries);
  l.vals_out = carve.take<int32_t>(l.entries);
  l.wts = carve.take<float>(l.entries);
  l.starts = carve.take<int32_t>(targets + 1);
  l.sort_temp = carve.take<char>(static_cast<int64_t>(l.sort_temp_bytes));
  l.bytes = carve.bytes;
  return l;
}

}  // namespace

void affine_grid_fwd(Context& ctx, const float* theta, float* grid, int64_t n, int64_t h, int64_t w,
                     bool align_corners) {
  const int64_t total = n * h * w;
  if (total == 0) return;
  affine_grid_fwd_kernel<<<blocks_for(total), kThreads, 0, detail::stream_of(ctx)>>>(theta, grid, n, h, w,
                                                                                      align_corners);
  DITTO_CHECK_LAUNCH(ctx);
}

int64_t affine_grid_bwd_partials(int64_t hw) {
  const int64_t parts = (hw + kThreads * kPointsPerThread - 1) / (kThreads * kPointsPerThread);
  return parts < 1 ? 1 : (parts > kMaxParts ? kMaxParts : parts);
}

void affine_grid_bwd_atomic(Context& ctx, const float* dgrid, float* dtheta, int64_t n, int64_t h, int64_t w,
                            bool align_corners) {
  if (n == 0) return;
  cudaStream_t st = detail::stream_of(ctx);
  DITTO_CUDA_CHECK(cudaMemsetAsync(dtheta, 0, sizeof(float) * 6 * static_cast<std::size_t>(n), st));
  if (h * w == 0) return;
  dim3 grid(static_cast<unsigned>(n), static_cast<unsigned>(affine_grid_bwd_partials(h * w)));
  affine_grid_bwd_partial_kernel<true><<<grid, kThreads, 0, st>>>(dgrid, dtheta, h, w, align_corners);
  DITTO_CHECK_LAUNCH(ctx);
}

void affine_grid_bwd_deterministic(Context& ctx, const float* dgrid, float* dtheta, float* partials, int64_t n,
                                   int64_t h, int64_t w, bool align_corners) {
  if (n == 0) return;
  cudaStream_t st = detail::stream_of(ctx);
  const int64_t parts = affine_grid_bwd_partials(h * w);
  dim3 grid(static_cast<unsigned>(n), static_cast<unsigned>(parts));
  affine_grid_bwd_partial_kernel<false><<<grid, kThreads, 0, st>>>(dgrid, partials, h, w, align_corners);
  DITTO_CHECK_LAUNCH(ctx);
  affine_grid_bwd_final_kernel<<<static_cast<unsigned>(n), kThreads, 0, st>>>(partials, dtheta, parts);
  DITTO_CHECK_LAUNCH(ctx);
}

void grid_sample_fwd(Context& ctx, const float* x, const float* grid, float* y, const ref::GridSampleDims& d) {
  const int64_t total = d.n * d.c * d.oh * d.ow;
  if (total == 0) return;
  grid_sample_fwd_kernel<<<blocks_for(total), kThreads, 0, detail::stream_of(ctx)>>>(x, grid, y, d);
  DITTO_CHECK_LAUNCH(ctx);
}

void grid_sample_bwd_atomic(Context& ctx, const float* x, const float* grid, const float* dy, float* dx,
                            float* dgrid, const ref::GridSampleDims& d) {
  const int64_t total = d.n * d.oh * d.ow;
  if (total == 0) return;
  grid_sample_bwd_position_kernel<true><<<blocks_for(total), kThreads, 0, detail::stream_of(ctx)>>>(x, grid, dy, dx,
                                                                                                     dgrid, d);
  DITTO_CHECK_LAUNCH(ctx);
}

std::size_t grid_sample_bwd_deterministic_workspace(const ref::GridSampleDims& d, bool want_dx) {
  return want_dx ? gather_layout(nullptr, d).bytes : 0;
}

void grid_sample_bwd_deterministic(Context& ctx, const float* x, const float* grid, const float* dy, float* dx,
                                   float* dgrid, void* workspace, const ref::GridSampleDims& d) {
  cudaStream_t st = detail::stream_of(ctx);
  const int64_t positions = d.n * d.oh * d.ow;
  if (dgrid && positions > 0) {
    grid_sample_bwd_position_kernel<false><<<blocks_for(positions), kThreads, 0, st>>>(x, grid, dy, nullptr, dgrid,
                                                                                        d);
    DITTO_CHECK_LAUNCH(ctx);
  }
  if (!dx) return;
  const int64_t dx_total = d.n * d.c * d.h * d.w;
  if (dx_total == 0) return;
  if (positions == 0) {
    DITTO_CUDA_CHECK(cudaMemsetAsync(dx, 0, sizeof(float) * static_cast<std::size_t>(dx_total), st));
    return;
  }
  const GatherLayout l = gather_layout(workspace, d);
  grid_sample_entries_kernel<<<blocks_for(positions), kThreads, 0, st>>>(grid, l.keys_in, l.vals_in, l.wts, d);
  DITTO_CHECK_LAUNCH(ctx);
  sort_pairs(l.sort_temp, l.sort_temp_bytes, l.keys_in, l.keys_out, l.vals_in, l.vals_out, l.entries, l.end_bit, st);
  const int64_t targets = d.n * d.h * d.w;
  segment_starts_kernel<<<blocks_for(targets + 1), kThreads, 0, st>>>(l.keys_out, l.entries, l.starts, targets);
  DITTO_CHECK_LAUNCH(ctx);
  grid_sample_dx_gather_kernel<<<blocks_for(dx_total), kThreads, 0, st>>>(dy, l.starts, l.vals_out, l.wts, dx, d);
  DITTO_CHECK_LAUNCH(ctx);
}

}  // namespace ditto::cuda
