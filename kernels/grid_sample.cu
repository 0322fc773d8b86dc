// ditto's own spatial-transformer kernels. Which are deterministic, and why, is said per kernel.
// Positions in a plane are int (the op checks H*W and OH*OW < 2^31); totals are int64.
#include <cub/block/block_scan.cuh>

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

// Records of the deterministic dx (kernels/grid_sample.h): one per (position, corner), record
// e = (n*plane + p)*4 + k. keys[e]: the corner's pixel n*H*W + iy*W + ix, clamped into the image
// for a corner outside it (the record still sorts next to real ones, but adds nothing); ents[e]:
// e, or -1 where the corner adds nothing (outside the image, or a non-finite position); wts[e]:
// the corner's weight.
struct GatherRecords {
  uint32_t* keys;
  int32_t* ents;
  float* wts;
};

// Backward per output position (PyTorch's grid_sampler_2d_backward scheme): one thread per (n, p)
// loops over the channels in order. The grid gradient is that thread's own sum: deterministic.
//   kScatter = true:  also atomicAdds dy * weight into the four corners of dx (dx zeroed first):
//                     several positions share corners, so the adds land in scheduling order: NOT
//                     deterministic.
//   kScatter = false: the grid gradient, and the position's four dx records where rec.keys is
//                     set (no reduction: each record is this thread's own).
template <bool kScatter>
__global__ void grid_sample_bwd_position_kernel(const float* __restrict__ x, const float* __restrict__ grid,
                                                const float* __restrict__ dy, float* __restrict__ dx,
                                                float* __restrict__ dgrid, GatherRecords rec, ref::GridSampleDims d) {
  const int64_t plane = d.oh * d.ow, total = d.n * plane, in_plane = d.h * d.w;
  const float sx = d.align_corners ? float(d.w - 1) / 2.f : float(d.w) / 2.f;
  const float sy = d.align_corners ? float(d.h - 1) / 2.f : float(d.h) / 2.f;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t p = i % plane, n = i / plane;
    const Corners c = corners_at(grid + i * 2, d.h, d.w, d.align_corners);
    const float fx = c.b.fx, fy = c.b.fy;
    if (!kScatter && rec.keys)
      for (int k = 0; k < 4; ++k) {
        const int64_t e = i * 4 + k;
        const int64_t cx = c.b.ix[k] < 0 ? 0 : (c.b.ix[k] >= d.w ? d.w - 1 : c.b.ix[k]);
        const int64_t cy = c.b.iy[k] < 0 ? 0 : (c.b.iy[k] >= d.h ? d.h - 1 : c.b.iy[k]);
        rec.keys[e] = static_cast<uint32_t>(n * in_plane + cy * d.w + cx);
        rec.ents[e] = c.b.valid[k] ? static_cast<int32_t>(e) : -1;
        rec.wts[e] = c.b.weight[k];
      }
    if (!dgrid && !(kScatter && dx)) continue;
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

// ---- deterministic dx: a segmented sum over the records sorted by pixel ----------------------
// The sorted records are cut into tiles of kTile (bounds depend on the record count alone). Block
// (tile, channel) gives each thread kTileItems consecutive records; each thread folds its items in
// order, a block-wide exclusive scan (cub::BlockScan, BLOCK_SCAN_WARP_SCANS: warp-synchronous
// Kogge-Stone scans, then the warp totals in warp order; a fixed shape for a fixed block size)
// hands each thread the sum of its segment's records before it, and the thread that holds a
// segment's last record writes it. A segment wholly inside the tile goes to dx; the piece of one
// that began in an earlier tile goes to the tile's head slot, the piece of one that starts here and
// goes on to its tail slot. grid_sample_dx_fixup_kernel then adds, for each segment that crosses
// tiles, its tail piece and the following head pieces in tile order. Every sum's shape is a
// function of the sorted records and the constants below: the same bits on any GPU, and no thread
// walks more than kTileItems records or (per crossing segment) one piece per tile, however many
// outputs squeeze onto one pixel.
constexpr int kTileThreads = 256;
constexpr int kTileItems = 8;
constexpr int64_t kTile = int64_t(kTileThreads) * kTileItems;
constexpr int64_t kTileBlocksWanted = 2048;  // channels are spread over blocks until about this many

// Channels one block scan carries: the scan's latency (a block-wide exchange per scan) is paid once
// for kTileChannels channels, and their dy loads are in flight together. Each channel's sums take the
// same joins in the same tree as a scan of that channel alone: the bits do not depend on it.
constexpr int kTileChannels = 4;

// A run of records: per channel, the sum since the last segment start in it (or since its first
// record), and whether a segment starts in it.
struct SegSum {
  float sum[kTileChannels];
  int starts;
};
// Joins run a with the run b right after it. Associative, not commutative, as a scan needs.
struct JoinSegSum {
  __device__ __forceinline__ SegSum operator()(const SegSum& a, const SegSum& b) const {
    if (b.starts) return b;
    SegSum r;
#pragma unroll
    for (int j = 0; j < kTileChannels; ++j) r.sum[j] = a.sum[j] + b.sum[j];
    r.starts = a.starts;
    return r;
  }
};
using TileScan = cub::BlockScan<SegSum, kTileThreads, cub::BLOCK_SCAN_WARP_SCANS>;

// Offset: the type of dy's element offsets (uint32_t where dy has fewer than 2^32 elements: fewer
// registers per record).
template <class Offset>
__global__ void __launch_bounds__(kTileThreads, 2)
    grid_sample_dx_tiles_kernel(const uint32_t* __restrict__ keys, const int32_t* __restrict__ ents,
                                const float* __restrict__ wts, const float* __restrict__ dy, float* __restrict__ dx,
                                float* __restrict__ head_part, float* __restrict__ tail_part, int64_t records,
                                ref::GridSampleDims d) {
  __shared__ typename TileScan::TempStorage scan_tmp;
  const int64_t tile = blockIdx.x, tile_beg = tile * kTile;
  const int64_t tile_end = tile_beg + kTile < records ? tile_beg + kTile : records;
  const int64_t first = tile_beg + int64_t(threadIdx.x) * kTileItems;
  const uint32_t plane = static_cast<uint32_t>(d.oh * d.ow), in_plane = static_cast<uint32_t>(d.h * d.w);
  constexpr uint32_t kNone = 0xffffffffu;  // above every key (the op keeps N*H*W < 2^32 - 1)

  // This thread's records: key, whether a segment starts there, whether it adds anything, its
  // weight and dy's offset in channel 0.
  uint32_t key[kTileItems];
  bool start[kTileItems], adds[kTileItems];
  float w[kTileItems];
  Offset dy_at[kTileItems];
  uint32_t prev = first > 0 && first < tile_end ? keys[first - 1] : kNone;
#pragma unroll
  for (int i = 0; i < kTileItems; ++i) {
    const int64_t j = first + i;
    key[i] = j < tile_end ? keys[j] : kNone;
    const int32_t e = j < tile_end ? ents[j] : -1;
    start[i] = j >= tile_end || key[i] != prev;
    prev = key[i];
    adds[i] = e >= 0;
    w[i] = adds[i] ? wts[e] : 0.f;
    const uint32_t pos = adds[i] ? static_cast<uint32_t>(e) >> 2 : 0u, n = pos / plane;
    dy_at[i] = static_cast<Offset>((int64_t(n) * d.c) * plane + (pos - n * plane));
  }
  const uint32_t key_after = first + kTileItems < tile_end ? keys[first + kTileItems] : kNone;
  const uint32_t next_tile_key = tile_end < records ? keys[tile_end] : kNone;

  for (int64_t c0 = int64_t(blockIdx.y) * kTileChannels; c0 < d.c; c0 += int64_t(gridDim.y) * kTileChannels) {
    float v[kTileChannels][kTileItems];
#pragma unroll
    for (int k = 0; k < kTileChannels; ++k) {
      const bool here = c0 + k < d.c;
      const float* dyc = dy + (c0 + k) * plane;
#pragma unroll
      for (int i = 0; i < kTileItems; ++i) v[k][i] = here && adds[i] ? __fmul_rn(w[i], dyc[dy_at[i]]) : 0.f;
    }
    auto item = [&](int i) {
      SegSum r;
#pragma unroll
      for (int k = 0; k < kTileChannels; ++k) r.sum[k] = v[k][i];
      r.starts = start[i];
      return r;
    };
    SegSum zero;  // no sum, no start
#pragma unroll
    for (int k = 0; k < kTileChannels; ++k) zero.sum[k] = 0.f;
    zero.starts = 0;
    SegSum own = zero;
#pragma unroll
    for (int i = 0; i < kTileItems; ++i) own = JoinSegSum()(own, item(i));
    SegSum run;
    TileScan(scan_tmp).ExclusiveScan(own, run, zero, JoinSegSum());
#pragma unroll
    for (int i = 0; i < kTileItems; ++i) {
      const int64_t j = first + i;
      if (j >= tile_end) break;
      run = JoinSegSum()(run, item(i));
      const bool last = j + 1 == tile_end;
      const uint32_t next = i + 1 < kTileItems ? key[i + 1] : key_after;
      if (!last && next == key[i]) continue;  // the segment goes on inside the tile
      const bool goes_on = last && next_tile_key == key[i];
      const uint32_t n = key[i] / in_plane;
#pragma unroll
      for (int k = 0; k < kTileChannels; ++k) {
        const int64_t c = c0 + k;
        if (c >= d.c) break;
        if (!run.starts) head_part[tile * d.c + c] = run.sum[k];
        else if (goes_on) tail_part[tile * d.c + c] = run.sum[k];
        else dx[(int64_t(n) * d.c + c) * in_plane + (key[i] - n * in_plane)] = run.sum[k];
      }
    }
    __syncthreads();  // scan_tmp is reused for the next channels
  }
}

// One thread per (tile, channel): where a segment starts in the tile and goes on past it, adds its
// tail piece and the head pieces of the tiles it reaches, in tile order, into dx.
__global__ void grid_sample_dx_fixup_kernel(const uint32_t* __restrict__ keys, const float* __restrict__ head_part,
                                            const float* __restrict__ tail_part, float* __restrict__ dx,
                                            int64_t records, int64_t tiles, ref::GridSampleDims d) {
  const int64_t total = tiles * d.c, in_plane = d.h * d.w;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t tile = i / d.c, c = i - tile * d.c;
    const int64_t beg = tile * kTile, end = beg + kTile;
    if (end >= records) continue;  // the last tile: nothing goes on past it
    const uint32_t key = keys[end - 1];
    if (keys[end] != key) continue;
    // Keys are sorted: if the record before the tile has this key, so does the whole tile, and the
    // segment began in an earlier tile, which owns it.
    if (beg > 0 && keys[beg - 1] == key) continue;
    int64_t lo = end, hi = records;  // the segment's end: the first record with a larger key
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (keys[mid] <= key)
        lo = mid + 1;
      else
        hi = mid;
    }
    const int64_t last_tile = (lo - 1) / kTile;
    float s = tail_part[tile * d.c + c];
    for (int64_t k = tile + 1; k <= last_tile; ++k) s += head_part[k * d.c + c];
    const int64_t n = key / in_plane;
    dx[(n * d.c + c) * in_plane + (key - n * in_plane)] = s;
  }
}

struct GatherLayout {
  GatherRecords in;  // as the position kernel writes them
  uint32_t* keys_out;
  int32_t* ents_out;
  float *head_part, *tail_part;
  void* sort_temp;
  std::size_t sort_temp_bytes, bytes;
  int end_bit;
  int64_t records, tiles;
};

GatherLayout gather_layout(void* base, const ref::GridSampleDims& d) {
  GatherLayout l;
  l.records = d.n * d.oh * d.ow * 4;
  l.tiles = (l.records + kTile - 1) / kTile;
  const int64_t targets = d.n * d.h * d.w;
  l.end_bit = key_bits(static_cast<uint64_t>(targets > 0 ? targets - 1 : 0));
  l.sort_temp_bytes = sort_pairs_temp_bytes(l.records, l.end_bit);
  WorkspaceCarve carve{static_cast<char*>(base)};
  l.in.keys = carve.take<uint32_t>(l.records);
  l.keys_out = carve.take<uint32_t>(l.records);
  l.in.ents = carve.take<int32_t>(l.records);
  l.ents_out = carve.take<int32_t>(l.records);
  l.in.wts = carve.take<float>(l.records);
  l.head_part = carve.take<float>(l.tiles * d.c);
  l.tail_part = carve.take<float>(l.tiles * d.c);
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
  grid_sample_bwd_position_kernel<true><<<blocks_for(total), kThreads, 0, detail::stream_of(ctx)>>>(
      x, grid, dy, dx, dgrid, GatherRecords{nullptr, nullptr, nullptr}, d);
  DITTO_CHECK_LAUNCH(ctx);
}

std::size_t grid_sample_bwd_deterministic_workspace(const ref::GridSampleDims& d, bool want_dx) {
  return want_dx ? gather_layout(nullptr, d).bytes : 0;
}

void grid_sample_bwd_deterministic(Context& ctx, const float* x, const float* grid, const float* dy, float* dx,
                                   float* dgrid, void* workspace, const ref::GridSampleDims& d) {
  cudaStream_t st = detail::stream_of(ctx);
  const int64_t positions = d.n * d.oh * d.ow, dx_total = d.n * d.c * d.h * d.w;
  // Pixels no record reaches keep this zero.
  if (dx && dx_total > 0)
    DITTO_CUDA_CHECK(cudaMemsetAsync(dx, 0, sizeof(float) * static_cast<std::size_t>(dx_total), st));
  const bool records = dx && dx_total > 0 && positions > 0;
  if (positions == 0 || (!dgrid && !records)) return;
  const GatherLayout l = gather_layout(records ? workspace : nullptr, d);
  grid_sample_bwd_position_kernel<false><<<blocks_for(positions), kThreads, 0, st>>>(
      x, grid, dy, nullptr, dgrid, records ? l.in : GatherRecords{nullptr, nullptr, nullptr}, d);
  DITTO_CHECK_LAUNCH(ctx);
  if (!records) return;
  sort_pairs(l.sort_temp, l.sort_temp_bytes, l.in.keys, l.keys_out, l.in.ents, l.ents_out, l.records, l.end_bit, st);
  const int64_t spread = (kTileBlocksWanted + l.tiles - 1) / l.tiles;
  const int64_t groups = (d.c + kTileChannels - 1) / kTileChannels;
  const int64_t gy = spread < 1 ? 1 : (spread > groups ? groups : (spread > 65535 ? 65535 : spread));
  const dim3 tiles_grid(static_cast<unsigned>(l.tiles), static_cast<unsigned>(gy));
  if (d.n * d.c * d.oh * d.ow <= int64_t(UINT32_MAX))
    grid_sample_dx_tiles_kernel<uint32_t><<<tiles_grid, kTileThreads, 0, st>>>(
        l.keys_out, l.ents_out, l.in.wts, dy, dx, l.head_part, l.tail_part, l.records, d);
  else
    grid_sample_dx_tiles_kernel<int64_t><<<tiles_grid, kTileThreads, 0, st>>>(
        l.keys_out, l.ents_out, l.in.wts, dy, dx, l.head_part, l.tail_part, l.records, d);
  DITTO_CHECK_LAUNCH(ctx);
  if (l.tiles > 1) {
    grid_sample_dx_fixup_kernel<<<blocks_for(l.tiles * d.c), kThreads, 0, st>>>(l.keys_out, l.head_part, l.tail_part,
                                                                                 dx, l.records, l.tiles, d);
    DITTO_CHECK_LAUNCH(ctx);
  }
}

}  // namespace ditto::cuda
