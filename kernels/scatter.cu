// Scatter and gather CUDA kernels. Which are deterministic, and why, is said per kernel.
//
// scatter_atomic_kernel: one thread per (position, column) atomicAdds into out[index, column].
//   Where indices repeat, the adds land in the order threads arrive: NOT deterministic
//   (CCCL's not_guaranteed).
// The sorted scatter (deterministic, CCCL's gpu_to_gpu):
//   1. sort_prep_kernel: key[j] = index[j] (rows for an out-of-range index, so those sort last),
//      value[j] = j.
//   2. cub::DeviceRadixSort::SortPairs over the key bits rows needs. The sort is stable ("DeviceRadix
//      Sort is stable", cub/device/device_radix_sort.cuh), so equal keys keep increasing positions,
//      and a stable sort's output is unique: it does not depend on the GPU or on scheduling.
//   3. segment_tiles_kernel: the sorted list is cut into tiles of kTile entries (bounds depend on m
//      alone); one warp per tile walks its entries in order with the lanes over columns and sums each
//      run of equal keys from 0.0f. A run wholly inside the tile is written to out[key]; the piece of
//      a run that began in an earlier tile goes to the tile's head slot, the piece of a run that
//      starts here and continues goes to its tail slot.
//   4. segment_fixup_kernel: one warp per tile where a run starts and continues adds the run's
//      pieces (tail of the first tile, then the heads of the following tiles) in eight groups (group
//      g: pieces g, g+8, ... in order), then the eight group sums in group order.
//   Rows of one float (d == 1) sort (key, contribution) pairs instead of (key, position)
//   (sort_prep_scalar_kernel), and take segment_tiles_scalar_kernel and segment_fixup_scalar_kernel:
//   a tile's 32 sorted values on the warp's lanes, each run's sum by a segmented scan, and one
//   thread per owning tile adding the pieces in tile order. A scatter along a dimension whose keys
//   repeat their positions' low s bits (ScatterRows::key_period_log2) writes the pairs transposed
//   (sort_prep_scalar_transposed_kernel) and sorts the key bits from s up: the same sorted list in
//   fewer radix passes (16.7M keys of 19 bits into a [4096, 64] output: 2 passes, not 3), so the
//   same sums.
//   Every sum's order is a function of the sorted list and of m, never of the grid's scheduling or
//   the GPU's SM count. No atomics.
// The privatized scatter along a dimension (deterministic, gpu_to_gpu; scatter_privatized_kernel says
//   how): per chunk of positions, per destination, a sum in position order in shared memory; then the
//   chunk sums in chunk order. Chunks depend on the shape alone. No atomics, no sort. It reads the
//   index's values along dim (no keys); gather_dim_kernel, its backward, too.
// gather_rows_kernel, embedding_bag_fwd_kernel (one warp per bag, rows added in position order),
// embedding_bag_sources_kernel: no cross-thread reductions, deterministic.
#include <cub/device/device_radix_sort.cuh>

#include <algorithm>
#include <cmath>
#include <optional>
#include <type_traits>

#include "engine/detail/cuda_state.h"
#include "engine/detail/int64_words.h"
#include "engine/detail/launch.cuh"
#include "kernels/index_math.h"
#include "kernels/detail/scatter_cuda.h"

namespace ditto::cuda {
namespace {

constexpr int kTile = 32;        // sorted entries per warp tile
constexpr int kWarps = 8;        // warps per block of the tile, fix-up and bag kernels
constexpr int kLaneCols = 2;     // columns per lane per pass: one pass covers 64 columns
constexpr int kPassCols = 32 * kLaneCols;
constexpr int kPrefetch = 8;     // entries whose rows are loaded before they are added
constexpr unsigned kFull = 0xffffffffu;
constexpr std::size_t kAlign = 256;

std::size_t aligned(std::size_t b) { return (b + kAlign - 1) / kAlign * kAlign; }

// Key bits that hold 0 .. rows (rows itself marks an out-of-range index).
int key_bits(int64_t rows) {
  int b = 1;
  while (b < 32 && (int64_t(1) << b) <= rows) ++b;
  return b;
}

__host__ __device__ inline int64_t tiles_for(int64_t m) { return (m + kTile - 1) / kTile; }

unsigned warp_blocks(int64_t warps) { return static_cast<unsigned>((warps + kWarps - 1) / kWarps); }

__device__ __forceinline__ bool in_range(int32_t k, int64_t rows) { return k >= 0 && int64_t(k) < rows; }

// (j, col) of flat element i of an m x d array.
__device__ __forceinline__ void split_row(int64_t i, int64_t d, int64_t& j, int64_t& col) {
  j = ref::div_nonneg(i, d);
  col = i - j * d;
}

__global__ void scatter_atomic_kernel(ScatterRows p, float* __restrict__ out, int32_t* bad) {
  const int64_t total = p.m * p.d;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    int64_t j, col;
    split_row(i, p.d, j, col);
    const int32_t k = p.index[j];
    if (!in_range(k, p.rows)) {
      if (bad) *bad = 1;
      continue;
    }
    const int64_t r = p.src_row ? p.src_row[j] : j;
    if (r < 0) continue;
    float v = p.src[r * p.d + col];
    if (p.src_scale) v = __fmul_rn(v, p.src_scale[j]);
    atomicAdd(out + int64_t(k) * p.d + col, v);
  }
}

__global__ void sort_prep_kernel(const int32_t* __restrict__ index, int64_t m, int64_t rows, uint32_t* __restrict__ keys,
                                 int32_t* __restrict__ positions, int32_t* bad) {
  for (int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; j < m; j += int64_t(gridDim.x) * blockDim.x) {
    const int32_t k = index[j];
    const bool ok = in_range(k, rows);
    keys[j] = ok ? static_cast<uint32_t>(k) : static_cast<uint32_t>(rows);
    positions[j] = static_cast<int32_t>(j);
    if (!ok && bad) *bad = 1;
  }
}

// Position j's contribution to a row of one float: its source value, times its scale where there is
// one; 0 for a position without a source row.
__device__ __forceinline__ float scalar_contribution(const ScatterRows& p, int64_t j) {
  const int32_t row = p.src_row ? p.src_row[j] : static_cast<int32_t>(j);
  if (row < 0) return 0.f;
  const float v = p.src[row];
  return p.src_scale ? __fmul_rn(v, p.src_scale[j]) : v;
}

// Step 1 for rows of one float: the sort carries each position's contribution itself (its source value,
// times its scale where there is one; 0 for a position without a source row) instead of the position,
// so that step 3 reads the sorted values in order rather than gathering them through the permutation.
// The stable sort keeps equal keys in increasing position, so the sums' order is the same.
__global__ void sort_prep_scalar_kernel(ScatterRows p, uint32_t* __restrict__ keys, float* __restrict__ values,
                                        int32_t* bad) {
  for (int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; j < p.m; j += int64_t(gridDim.x) * blockDim.x) {
    const int32_t k = p.index[j];
    const bool ok = in_range(k, p.rows);
    keys[j] = ok ? static_cast<uint32_t>(k) : static_cast<uint32_t>(p.rows);
    if (!ok && bad) *bad = 1;
    values[j] = ok ? scalar_contribution(p, j) : 0.f;
  }
}

// Step 1 for rows of one float with a key period 2^s (sort_bits: ScatterRows::key_period_log2, capped): the
// positions as an
// [R = m / 2^s, 2^s] matrix, written transposed (position j = r * 2^s + c goes to c * R + r), through
// 32 x 32 tiles in shared memory so that reads and writes are both contiguous. The sort then orders the
// key bits from s up: entries whose keys agree there keep this order, which is (low bits c, then r), and
// for equal keys (equal c) that is position order, so the sorted list is the one the full sort gives.
// Out-of-range entries get `marker` (rows rounded up to a multiple of 2^s: after every valid key in the
// sorted bits); an in-range key whose low bits are not its position's breaks the period and is flagged.
constexpr int kPrepTile = 32;
__global__ void __launch_bounds__(kPrepTile * 8)
    sort_prep_scalar_transposed_kernel(ScatterRows p, int period_log2, int64_t r_count, uint32_t marker,
                                       uint32_t* __restrict__ keys, float* __restrict__ values, int32_t* bad) {
  __shared__ uint32_t ktile[kPrepTile][kPrepTile + 1];
  __shared__ float vtile[kPrepTile][kPrepTile + 1];
  const int64_t period = int64_t(1) << period_log2;
  const int64_t tiles_c = (period + kPrepTile - 1) / kPrepTile, tiles_r = (r_count + kPrepTile - 1) / kPrepTile;
  const int tx = threadIdx.x % kPrepTile, ty = threadIdx.x / kPrepTile;
  for (int64_t tile = blockIdx.x; tile < tiles_c * tiles_r; tile += gridDim.x) {
    const int64_t c0 = (tile % tiles_c) * kPrepTile, r0 = (tile / tiles_c) * kPrepTile;
    for (int i = ty; i < kPrepTile; i += 8) {
      const int64_t r = r0 + i, c = c0 + tx;
      if (r >= r_count || c >= period) continue;
      const int64_t j = r * period + c;
      const int32_t k = p.index[j];
      // Out of range, or in range without the promised period (never summed out of order): flagged.
      const bool ok = in_range(k, p.rows) && (int64_t(k) & (period - 1)) == c;
      if (!ok && bad) *bad = 1;
      ktile[i][tx] = ok ? static_cast<uint32_t>(k) : marker;
      vtile[i][tx] = ok ? scalar_contribution(p, j) : 0.f;
    }
    __syncthreads();
    for (int i = ty; i < kPrepTile; i += 8) {
      const int64_t c = c0 + i, r = r0 + tx;
      if (c < period && r < r_count) {
        keys[c * r_count + r] = ktile[tx][i];
        values[c * r_count + r] = vtile[tx][i];
      }
    }
    __syncthreads();
  }
}

// The tile of the sorted list a warp of the tile kernels takes: one tile per warp, kWarps per block;
// its first entry and its entry count (kTile, fewer in the last tile). t may be past the last tile.
struct WarpTile {
  int64_t t, t0;
  int n;
};
__device__ __forceinline__ WarpTile warp_tile(int64_t m) {
  WarpTile w;
  w.t = blockIdx.x * int64_t(kWarps) + (threadIdx.x >> 5);
  w.t0 = w.t * kTile;
  w.n = static_cast<int>(m - w.t0 < kTile ? m - w.t0 : kTile);
  return w;
}

// Step 3 of the sorted scatter (see the file comment). carry holds two rows of d per tile: slot 0
// the head piece (a run that began in an earlier tile), slot 1 the tail piece (a run that starts in
// this tile and continues).
__global__ void __launch_bounds__(kWarps * 32)
    segment_tiles_kernel(const uint32_t* __restrict__ skey, const int32_t* __restrict__ perm, ScatterRows p,
                         float* __restrict__ out, float* __restrict__ carry, int64_t tiles) {
  const int lane = threadIdx.x & 31;
  const WarpTile w = warp_tile(p.m);
  if (w.t >= tiles) return;  // uniform across the warp
  const int64_t t = w.t, t0 = w.t0;
  const int n = w.n;
  const uint32_t rows = static_cast<uint32_t>(p.rows);

  // Lane e holds entry e's key, source row and scale; the walk below broadcasts them.
  uint32_t my_key = 0xffffffffu;
  int32_t my_row = -1;
  float my_scale = 1.f;
  if (lane < n) {
    my_key = skey[t0 + lane];
    if (my_key < rows) {
      const int32_t pos = perm[t0 + lane];
      my_row = p.src_row ? p.src_row[pos] : pos;
      if (p.src_scale) my_scale = p.src_scale[pos];
    }
  }
  const uint32_t prev_key = t0 > 0 ? skey[t0 - 1] : 0xffffffffu;
  const uint32_t next_key = t0 + n < p.m ? skey[t0 + n] : 0xffffffffu;
  // Out-of-range entries (key == rows) sort last: the valid ones are a prefix of nv entries.
  const int nv = __popc(__ballot_sync(kFull, lane < n && my_key < rows));
  const uint32_t key_after = __shfl_down_sync(kFull, my_key, 1);
  const unsigned run_ends = __ballot_sync(kFull, lane < nv && (lane == nv - 1 || key_after != my_key));

  for (int64_t c0 = 0; c0 < p.d; c0 += kPassCols) {
    float acc[kLaneCols];
#pragma unroll
    for (int c = 0; c < kLaneCols; ++c) acc[c] = 0.f;
    int run_start = 0;
    for (int e0 = 0; e0 < nv; e0 += kPrefetch) {
      // Load kPrefetch rows first (independent loads in flight), then add them in entry order.
      float v[kPrefetch][kLaneCols];
#pragma unroll
      for (int i = 0; i < kPrefetch; ++i) {
        const int e = e0 + i;
        const int32_t row = __shfl_sync(kFull, my_row, e & 31);
        const float scale = __shfl_sync(kFull, my_scale, e & 31);
#pragma unroll
        for (int c = 0; c < kLaneCols; ++c) {
          const int64_t col = c0 + lane + 32 * c;
          float x = 0.f;
          if (e < nv && row >= 0 && col < p.d) {
            x = p.src[int64_t(row) * p.d + col];
            if (p.src_scale) x = __fmul_rn(x, scale);
          }
          v[i][c] = x;
        }
      }
#pragma unroll
      for (int i = 0; i < kPrefetch; ++i) {
        const int e = e0 + i;
        if (e >= nv) break;  // uniform
#pragma unroll
        for (int c = 0; c < kLaneCols; ++c) acc[c] += v[i][c];
        if (!((run_ends >> e) & 1u)) continue;  // uniform
        const uint32_t key = __shfl_sync(kFull, my_key, e);
        const bool began_before = run_start == 0 && key == prev_key;
        const bool continues = e == n - 1 && key == next_key;
        float* dst = began_before ? carry + (t * 2) * p.d
                                  : continues ? carry + (t * 2 + 1) * p.d : out + int64_t(key) * p.d;
#pragma unroll
        for (int c = 0; c < kLaneCols; ++c) {
          const int64_t col = c0 + lane + 32 * c;
          if (col < p.d) dst[col] = acc[c];
          acc[c] = 0.f;
        }
        run_start = e + 1;
      }
    }
  }
}

// Shared by both fix-ups: the tile after the last one holding part of the run of `key` that tile t
// owns (it starts there and continues into t + 1). A later tile holds part of the run iff its first
// entry is the key, and (keys sorted) those tiles follow t without a gap: gallop over them from
// t + 1, then bisect the last step. A run of a few tiles (the common case) costs one or two reads, a
// long one the log of its length, where a bisection over all of [t1, m) cost the log of m, each
// read waiting on the one before.
__device__ __forceinline__ int64_t run_end_tile(const uint32_t* __restrict__ skey, int64_t m, uint32_t key, int64_t t) {
  const int64_t tiles = tiles_for(m);
  auto starts_with_key = [&](int64_t u) { return u < tiles && skey[u * kTile] == key; };
  int64_t known = t + 1, step = 1;  // starts_with_key(t + 1) holds: the owner checked skey[t1]
  while (starts_with_key(known + step)) {
    known += step;
    step *= 2;
  }
  int64_t lo = known + 1, hi = known + step;  // the first tile not starting with the key is in [lo, hi]
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (starts_with_key(mid))
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

// Tile t owns the run of its last key when that run continues past the tile and did not begin in an
// earlier tile that also owns it; the key, or rows (never a valid key) where t owns none.
__device__ __forceinline__ uint32_t owned_run_key(const uint32_t* __restrict__ skey, int64_t m, int64_t rows,
                                                  int64_t t) {
  const uint32_t none = static_cast<uint32_t>(rows);
  const int64_t t0 = t * kTile, t1 = t0 + kTile;
  if (t1 >= m) return none;  // the last tile: nothing continues past it
  const uint32_t key = skey[t1 - 1];
  if (key >= none || skey[t1] != key) return none;
  // The run holding the tile's last entry began in an earlier tile iff the whole tile is that key
  // and so is the entry before the tile: then that tile owns it.
  if (t0 > 0 && skey[t0] == key && skey[t0 - 1] == key) return none;
  return key;
}

// Step 4 of the sorted scatter: warp t finishes the run that starts in tile t and continues past it,
// if there is one (a run starts in exactly one tile, so each run has one owner). Its pieces are
// added in eight interleaved groups (group g: pieces g, g + 8, ..., in order, from 0.0f), then the
// eight group sums in group order (empty groups add 0.0f): an order fixed by the run's length. One
// warp per tile, lanes over columns, so the many tiles that own no run cost a warp each, not a block.
constexpr int kFixupGroups = 8;
__global__ void __launch_bounds__(kWarps * 32)
    segment_fixup_kernel(const uint32_t* __restrict__ skey, ScatterRows p, float* __restrict__ out,
                         const float* __restrict__ carry, int64_t tiles) {
  const int64_t t = blockIdx.x * int64_t(kWarps) + (threadIdx.x >> 5);
  if (t >= tiles) return;  // uniform across the warp
  const uint32_t key = owned_run_key(skey, p.m, p.rows, t);
  if (key >= static_cast<uint32_t>(p.rows)) return;
  const int64_t pieces = run_end_tile(skey, p.m, key, t) - t;  // tiles t .. end - 1, >= 2
  const int lane = threadIdx.x & 31;
  for (int64_t c0 = 0; c0 < p.d; c0 += kPassCols) {
    float sum[kLaneCols];
    for (int g = 0; g < kFixupGroups; ++g) {
      float acc[kLaneCols];
#pragma unroll
      for (int c = 0; c < kLaneCols; ++c) acc[c] = 0.f;
      for (int64_t q = g; q < pieces; q += kFixupGroups) {
        const float* piece = carry + ((t + q) * 2 + (q == 0 ? 1 : 0)) * p.d;  // tail of tile t, heads after
#pragma unroll
        for (int c = 0; c < kLaneCols; ++c) {
          const int64_t col = c0 + lane + 32 * c;
          if (col < p.d) acc[c] += piece[col];
        }
      }
#pragma unroll
      for (int c = 0; c < kLaneCols; ++c) sum[c] = g == 0 ? acc[c] : sum[c] + acc[c];
    }
#pragma unroll
    for (int c = 0; c < kLaneCols; ++c) {
      const int64_t col = c0 + lane + 32 * c;
      if (col < p.d) out[int64_t(key) * p.d + col] = sum[c];
    }
  }
}

// Rows of one float (PyTorch's scatter_add, TensorFlow's unsorted_segment_sum over scalars): the
// lanes of a warp take a tile's 32 entries themselves instead of walking them over a single column,
// reading the values the sort carried (sort_prep_scalar_kernel).
// Each run's sum within the tile is a segmented inclusive scan (lane l adds lane l - k's partial for
// k = 1, 2, 4, 8, 16 while that lane is in its run), an order fixed by the entries' positions; the run's
// last lane writes it where segment_tiles_kernel would (its head or tail slot, or the output).
__global__ void __launch_bounds__(kWarps * 32)
    segment_tiles_scalar_kernel(const uint32_t* __restrict__ skey, const float* __restrict__ svalue, ScatterRows p,
                                float* __restrict__ out, float* __restrict__ carry, int64_t tiles) {
  const int lane = threadIdx.x & 31;
  const WarpTile w = warp_tile(p.m);
  if (w.t >= tiles) return;  // uniform across the warp
  const int64_t t = w.t, t0 = w.t0;
  const int n = w.n;
  const uint32_t rows = static_cast<uint32_t>(p.rows);
  uint32_t key = 0xffffffffu;
  float v = 0.f;
  if (lane < n) {
    key = skey[t0 + lane];
    if (key < rows) v = svalue[t0 + lane];
  }
  const bool valid = lane < n && key < rows;  // the valid entries are a prefix (out-of-range keys sort last)
  const uint32_t key_before = __shfl_up_sync(kFull, key, 1);
  const unsigned heads = __ballot_sync(kFull, valid && (lane == 0 || key_before != key));
  const int run_start = 31 - __clz(heads & (0xffffffffu >> (31 - lane)));  // this lane's run's first lane
#pragma unroll
  for (int k = 1; k < 32; k *= 2) {
    const float other = __shfl_up_sync(kFull, v, k);
    if (lane - k >= run_start) v += other;
  }
  const uint32_t key_after = __shfl_down_sync(kFull, key, 1);
  const bool run_end = valid && (lane == 31 || lane == n - 1 || key_after != key);
  if (!run_end) return;
  const bool began_before = run_start == 0 && t0 > 0 && key == skey[t0 - 1];
  const bool continues = lane == n - 1 && t0 + n < p.m && key == skey[t0 + n];
  float* dst = began_before ? carry + t * 2 : continues ? carry + t * 2 + 1 : out + key;
  *dst = v;
}

// The scalar rows' fix-up: one thread per tile that owns a run crossing its end adds the run's pieces
// in tile order (its tail, then the following tiles' heads).
__global__ void segment_fixup_scalar_kernel(const uint32_t* __restrict__ skey, ScatterRows p, float* __restrict__ out,
                                            const float* __restrict__ carry, int64_t tiles) {
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < tiles; t += int64_t(gridDim.x) * blockDim.x) {
    const uint32_t key = owned_run_key(skey, p.m, p.rows, t);
    if (key >= static_cast<uint32_t>(p.rows)) continue;
    const int64_t end = run_end_tile(skey, p.m, key, t);
    float s = carry[t * 2 + 1];
    for (int64_t u = t + 1; u < end; ++u) s += carry[u * 2];
    out[key] = s;
  }
}

// One thread per index element: its coordinates by 32-bit divisions (fewer than 2^31 elements), the
// value widened from its word(s), the offset or -1.
__global__ void dim_keys_kernel(const int32_t* __restrict__ index, DimKeys k, int32_t* __restrict__ key) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < k.n; e += int64_t(gridDim.x) * blockDim.x) {
    int64_t v;
    if (k.wide) {
      const int2 w = reinterpret_cast<const int2*>(index)[e];
      v = detail::int64_words_fit_int32(w.x, w.y) ? int64_t(w.x) : int64_t(-1);  // past int32: out of range
    } else {
      v = index[e];
    }
    uint32_t rest = static_cast<uint32_t>(e);
    int64_t off = 0;
#pragma unroll
    for (int d = kDimKeysMaxRank - 1; d >= 0; --d) {
      if (d >= k.rank) continue;
      const uint32_t q = rest / k.ishape[d];
      if (d != k.dim) off += int64_t(rest - q * k.ishape[d]) * k.ostride[d];
      rest = q;
    }
    key[e] = v >= 0 && v < k.extent ? static_cast<int32_t>(off + v * k.dim_stride) : -1;
  }
}

__global__ void poison_kernel(const int32_t* bad, float* out, int64_t n) {
  if (*bad == 0) return;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = NAN;
}

__global__ void gather_rows_kernel(const float* __restrict__ table, const int32_t* __restrict__ index,
                                   float* __restrict__ out, int64_t m, int64_t d, int64_t rows) {
  const int64_t total = m * d;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    int64_t j, col;
    split_row(i, d, j, col);
    const int32_t k = index[j];
    out[i] = in_range(k, rows) ? table[int64_t(k) * d + col] : NAN;
  }
}

// Bag b's positions [j0, j1); false for malformed offsets (negative, decreasing, past m, or a first
// offset other than 0).
__device__ __forceinline__ bool bag_range(const BagRows& g, int64_t b, int64_t& j0, int64_t& j1) {
  if (!g.offsets) {
    j0 = b * g.bag_size;
    j1 = j0 + g.bag_size;
    return true;
  }
  j0 = g.offsets[b];
  j1 = b + 1 < g.bags ? g.offsets[b + 1] : g.m;
  return j0 >= 0 && j0 <= j1 && j1 <= g.m && (b > 0 || j0 == 0);
}

// One warp per bag, lanes over columns; the bag's rows are added in position order from 0.0f, then
// divided by the bag's size for mean. An out-of-range index or a malformed bag gives NaN.
__global__ void __launch_bounds__(kWarps * 32)
    embedding_bag_fwd_kernel(const float* __restrict__ table, const int32_t* __restrict__ index, BagRows g,
                             int64_t d, int64_t rows, bool mean, float* __restrict__ y) {
  const int lane = threadIdx.x & 31;
  const int64_t b = blockIdx.x * int64_t(kWarps) + (threadIdx.x >> 5);
  if (b >= g.bags) return;
  int64_t j0, j1;
  const bool ok = bag_range(g, b, j0, j1);
  for (int64_t col = lane; col < d; col += 32) {
    float s = ok ? 0.f : NAN;
    if (ok) {
#pragma unroll 4
      for (int64_t j = j0; j < j1; ++j) {
        const int32_t k = index[j];
        s += in_range(k, rows) ? table[int64_t(k) * d + col] : NAN;
      }
    }
    y[b * d + col] = mean && j1 > j0 ? s / static_cast<float>(j1 - j0) : s;
  }
}

__global__ void embedding_bag_sources_kernel(BagRows g, bool mean, int32_t* __restrict__ src_row,
                                             float* __restrict__ src_scale) {
  for (int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; j < g.m; j += int64_t(gridDim.x) * blockDim.x) {
    int64_t b;
    if (g.offsets) {  // the last bag whose offset is <= j
      int64_t lo = 0, hi = g.bags;
      while (lo < hi) {
        const int64_t mid = lo + (hi - lo) / 2;
        if (g.offsets[mid] <= j)
          lo = mid + 1;
        else
          hi = mid;
      }
      b = lo - 1;
    } else {
      b = ref::div_nonneg(j, g.bag_size);
    }
    int64_t j0 = 0, j1 = 0;
    const bool ok = b >= 0 && bag_range(g, b, j0, j1) && j >= j0 && j < j1;
    src_row[j] = ok ? static_cast<int32_t>(b) : -1;
    if (src_scale) src_scale[j] = ok ? 1.f / static_cast<float>(j1 - j0) : 0.f;
  }
}

struct SortedLayout {
  std::size_t keys0 = 0, keys1 = 0, pos0 = 0, pos1 = 0, carry = 0, cub = 0, cub_bytes = 0, total = 0;
};

// The key bits the sort orders and the out-of-range marker: bits [0, key_bits(rows)) and rows, or with a
// key period 2^s (rows of one float), bits [s, key_bits(marker)) and marker = rows rounded up to a
// multiple of 2^s, so that the marker's sorted bits exceed every valid key's. s is capped below the
// key's width (at least one bit is sorted), and a period that does not divide m is not used: both leave
// the sorted list what the full sort gives.
struct SortBits {
  int begin = 0, end = 0;
  uint32_t marker = 0;
  int64_t r_count = 0;  // m / 2^s: the rows of the transposed list (begin > 0)
};
SortBits sort_bits(const ScatterRows& p) {
  SortBits b;
  b.end = key_bits(p.rows);
  b.marker = static_cast<uint32_t>(p.rows);
  const int s = std::min(p.key_period_log2, b.end - 1);
  if (p.d != 1 || s <= 0 || p.m % (int64_t(1) << s) != 0) return b;
  const int64_t period = int64_t(1) << s;
  const int64_t marker = (p.rows + period - 1) / period * period;
  b.begin = s;
  b.end = key_bits(marker);
  b.marker = static_cast<uint32_t>(marker);
  b.r_count = p.m >> s;
  return b;
}

SortedLayout sorted_layout(int64_t m, int64_t d, const SortBits& bits) {
  SortedLayout l;
  const std::size_t ints = aligned(sizeof(int32_t) * static_cast<std::size_t>(m));
  l.keys0 = 0;
  l.keys1 = l.keys0 + ints;
  l.pos0 = l.keys1 + ints;
  l.pos1 = l.pos0 + ints;
  l.carry = l.pos1 + ints;
  l.cub = l.carry + aligned(sizeof(float) * static_cast<std::size_t>(tiles_for(m) * 2 * d));
  cub::DoubleBuffer<uint32_t> keys(nullptr, nullptr);
  if (d == 1) {  // rows of one float sort their values, not positions (scatter_sorted)
    cub::DoubleBuffer<float> vals(nullptr, nullptr);
    DITTO_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, l.cub_bytes, keys, vals, static_cast<int>(m), bits.begin,
                                                     bits.end));
  } else {
    cub::DoubleBuffer<int32_t> pos(nullptr, nullptr);
    DITTO_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, l.cub_bytes, keys, pos, static_cast<int>(m), bits.begin,
                                                     bits.end));
  }
  l.total = l.cub + aligned(l.cub_bytes);
  return l;
}

// ---- the privatized scatter along a dimension -------------------------------------------------------

constexpr int kPrivThreads = kPrivatizedCols * 32;  // one warp per column of the block's group
constexpr int kStagePitch = kPrivatizedCols + 1;    // a staged row's words: odd, so a warp's column reads
                                                    // (32 rows, one word each) fall in 32 banks
// Blocks wanted over the whole grid: chunks along dim are added until the columns fill about this many.
constexpr int64_t kPrivBlocksWanted = 256;
constexpr int kGatherDimThreads = 1024;  // the gather's block: its slice allows one block per SM at 4096 rows
constexpr int kGatherDimUnroll = 8;      // positions per thread whose index words load together

struct PrivatizedGrid {
  int64_t chunks = 1, chunk_rows = 0, groups = 0;
};

// A function of the shape alone (never of the GPU): the chunk bounds decide the sums' grouping.
PrivatizedGrid privatized_grid(const DimScatter& g) {
  PrivatizedGrid pg;
  pg.groups = g.inner / kPrivatizedCols;
  const int64_t columns = std::max<int64_t>(1, g.outer * pg.groups);
  const int64_t most = std::max<int64_t>(1, (g.extent + kPrivatizedStageRows - 1) / kPrivatizedStageRows);
  pg.chunks = std::min(most, std::max<int64_t>(1, (kPrivBlocksWanted + columns - 1) / columns));
  pg.chunk_rows = (g.extent + pg.chunks - 1) / pg.chunks;
  return pg;
}

// The grid's blocks (chunks x outer x column groups) and which one a block is: the privatized scatter
// and gather_dim run on the same grid.
int64_t privatized_blocks(const DimScatter& g, const PrivatizedGrid& pg) { return pg.chunks * g.outer * pg.groups; }
struct PrivatizedBlock {
  int64_t chunk, a, group;
};
__device__ __forceinline__ PrivatizedBlock privatized_block(const DimScatter& g, const PrivatizedGrid& pg) {
  return {int64_t(blockIdx.x) / (pg.groups * g.outer), (int64_t(blockIdx.x) / pg.groups) % g.outer,
          int64_t(blockIdx.x) % pg.groups};
}

// One block per (chunk, outer coordinate a, group of kPrivatizedCols inner columns); warp c owns column
// b0 + c and its bins. Per stage the block loads kPrivatizedStageRows positions of its columns (coalesced:
// a row's columns are adjacent); then each warp takes its column 32 positions (a step) at a time. Where
// the step's lanes name distinct destinations (stamps in shared memory tell), each adds its value to its
// bin; otherwise the lanes' (destination, lane) pairs are sorted across the warp (a bitonic network of
// shuffles), so each destination's lanes are adjacent and in lane order, and the last lane of each run
// adds the run's values in lane order and adds that sum to the destination's bin. Steps, stages and lanes follow position order,
// so each bin is its destination's sum over the chunk in position order, grouped by 32-position steps
// (the bits scatter_privatized promises; gpu_scatter computes them on the host). An index value outside
// [0, rows) flags bad and adds nothing.
// The index's words at a position (one i32, or an int64's (low, high) pair), loaded as they are so that a
// prefetch does not wait for them; dim_value then checks them: the value, or -1 where it is outside
// [0, rows) (or past int32).
template <bool kWide>
using DimWord = std::conditional_t<kWide, int2, int32_t>;

template <bool kWide>
__device__ __forceinline__ DimWord<kWide> dim_word(const int32_t* __restrict__ index, int64_t pos) {
  return reinterpret_cast<const DimWord<kWide>*>(index)[pos];
}

__device__ __forceinline__ int32_t dim_value(int32_t v, uint32_t rows) {
  return static_cast<uint32_t>(v) < rows ? v : -1;
}
__device__ __forceinline__ int32_t dim_value(int2 w, uint32_t rows) {
  // In range needs 0 <= value < rows < 2^31: a high word of 0.
  return w.y == 0 && static_cast<uint32_t>(w.x) < rows ? w.x : -1;
}

constexpr uint32_t kNoBin = 0x07ffffffu;  // sorts after every destination (rows < 2^27)
// A scatter of rows plans each step of a stage on its own warp.
static_assert(kPrivatizedStageRows / 32 <= kPrivatizedCols, "a stage's steps outnumber the block's warps");

// The destination of staged position r's column c: kNoBin past the stage's n positions, or for a value
// that was out of range (which flags the problem).
__device__ __forceinline__ uint32_t staged_bin(const int32_t* skey, int r, int n, int c, bool& flagged) {
  if (r >= n) return kNoBin;
  const int32_t dest = skey[r * kStagePitch + c];
  if (dest >= 0) return static_cast<uint32_t>(dest);
  flagged = true;
  return kNoBin;
}

// One step's plan over a warp's 32 lanes (bin: the lane's destination, kNoBin for none). Where the lanes
// name distinct destinations (each stamps its destination's slot and reads it back; a lane that reads
// another lane's stamp shares its destination) every lane is a run of one: returns true. Otherwise the
// (destination, lane) pairs are sorted across the lanes (a bitonic network of shuffles, ascending), so
// each destination's lanes are adjacent and in lane order: order[j] = the lane of sorted entry j, and the
// lane holding a run's last entry gets its destination in *end_bin and the run's first entry in *from
// (the others kNoBin); returns false.
__device__ __forceinline__ bool plan_step(uint32_t bin, int lane, uint8_t* stamp, int32_t* order, uint32_t* end_bin,
                                          int* from) {
  if (bin != kNoBin) stamp[bin] = static_cast<uint8_t>(lane);
  __syncwarp();
  const bool shared_dest = bin != kNoBin && stamp[bin] != lane;
  if (__ballot_sync(kFull, shared_dest) == 0u) return true;
  uint32_t k = (bin << 5) | static_cast<uint32_t>(lane);
#pragma unroll
  for (int size = 2; size <= 32; size <<= 1)
#pragma unroll
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      const uint32_t other = __shfl_xor_sync(kFull, k, stride);
      k = ((lane & stride) == 0) == ((lane & size) == 0) ? min(k, other) : max(k, other);
    }
  const uint32_t sorted_bin = k >> 5;
  const uint32_t prev = __shfl_up_sync(kFull, sorted_bin, 1), next = __shfl_down_sync(kFull, sorted_bin, 1);
  const unsigned heads = __ballot_sync(kFull, lane == 0 || prev != sorted_bin);
  order[lane] = static_cast<int32_t>(k & 31u);
  const bool run_end = sorted_bin != kNoBin && (lane == 31 || next != sorted_bin);
  *end_bin = run_end ? sorted_bin : kNoBin;
  *from = 31 - __clz(heads & (kFull >> (31 - lane)));
  __syncwarp();
  return false;
}

template <bool kWide, bool kRows>
__global__ void __launch_bounds__(kPrivThreads)
    scatter_privatized_kernel(const float* __restrict__ src, const int32_t* __restrict__ index, DimScatter g,
                              PrivatizedGrid pg, float* __restrict__ partials, int32_t* bad) {
  extern __shared__ float smem[];
  const int rows = static_cast<int>(g.rows);
  const int pitch = rows + 1;  // a column's bins; odd-ish pitch spreads the final copy over the banks
  float* bins = smem;          // [kPrivatizedCols][pitch]
  float* sval = bins + kPrivatizedCols * pitch;
  int32_t* skey = reinterpret_cast<int32_t*>(sval + kPrivatizedStageRows * kStagePitch);
  const int lane = threadIdx.x & 31, col = threadIdx.x >> 5;
  // Per warp: a step's sorted lanes (which staged position each sorted entry is), a step's plan (rows:
  // each lane's run end and start, read by every warp), and a stamp per destination (the lane that last
  // named it).
  int32_t* orders = skey + kPrivatizedStageRows * kStagePitch;
  int32_t* order = orders + col * 32;
  uint32_t* plans = reinterpret_cast<uint32_t*>(orders + kPrivatizedCols * 32);
  uint8_t* stamp = reinterpret_cast<uint8_t*>(plans + kPrivatizedCols * 32) + col * ((rows + 3) / 4 * 4);
  const PrivatizedBlock blk = privatized_block(g, pg);
  const int64_t chunk = blk.chunk, a = blk.a, group = blk.group;
  for (int e = threadIdx.x; e < kPrivatizedCols * pitch; e += kPrivThreads) bins[e] = 0.0f;
  float* my_bins = bins + col * pitch;
  const int64_t i0 = chunk * pg.chunk_rows, i1 = min(g.extent, i0 + pg.chunk_rows);
  const int64_t b0 = group * kPrivatizedCols;
  const int64_t first = a * g.extent * g.inner + b0;  // position (a, 0, b0)
  bool flagged = false;
  // Each thread moves kLoads (value, destination) pairs of a stage; the next stage's are loaded into registers
  // while the warps work on this one, so the loads' latency hides behind the sorting.
  constexpr int kLoads = kPrivatizedStageRows * kPrivatizedCols / kPrivThreads;
  float next_val[kLoads];
  DimWord<kWide> next_word[kLoads];
  const auto load_stage = [&](int64_t s0) {
    const int n = static_cast<int>(min(int64_t(kPrivatizedStageRows), i1 - s0));
#pragma unroll
    for (int q = 0; q < kLoads; ++q) {
      const int e = threadIdx.x + q * kPrivThreads, r = e / kPrivatizedCols, c = e % kPrivatizedCols;
      if (r < n) {
        const int64_t pos = first + (s0 + r) * g.inner + c;
        next_val[q] = src[pos];
        next_word[q] = dim_word<kWide>(index, g.index_per_row ? a * g.extent + s0 + r : pos);
      }
    }
  };
  if (i0 < i1) load_stage(i0);
  for (int64_t s0 = i0; s0 < i1; s0 += kPrivatizedStageRows) {
    const int n = static_cast<int>(min(int64_t(kPrivatizedStageRows), i1 - s0));
    __syncthreads();  // the bins are zeroed, or the previous stage is consumed
#pragma unroll
    for (int q = 0; q < kLoads; ++q) {
      const int e = threadIdx.x + q * kPrivThreads, r = e / kPrivatizedCols, c = e % kPrivatizedCols;
      if (r < n) {
        sval[r * kStagePitch + c] = next_val[q];
        skey[r * kStagePitch + c] = dim_value(next_word[q], static_cast<uint32_t>(rows));
      }
    }
    __syncthreads();
    if (s0 + kPrivatizedStageRows < i1) load_stage(s0 + kPrivatizedStageRows);
    if (kRows) {
      // Every column shares its position's destination: warp w plans step w of the stage once for all
      // columns, then each warp adds its column's runs by the plans, step by step.
      if (col * 32 < n) {
        const uint32_t bin = staged_bin(skey, col * 32 + lane, n, 0, flagged);
        uint32_t end_bin;
        int from;
        if (plan_step(bin, lane, stamp, order, &end_bin, &from)) {
          order[lane] = lane;
          end_bin = bin;
          from = lane;
        }
        plans[col * 32 + lane] = (end_bin << 5) | static_cast<uint32_t>(from);
      }
      __syncthreads();
      for (int r0 = 0; r0 < n; r0 += 32) {
        const uint32_t plan = plans[r0 + lane], end_bin = plan >> 5;
        if (end_bin != kNoBin) {
          const int32_t* ord = orders + r0;
          const int from = static_cast<int>(plan & 31u);
          float sum = sval[(r0 + ord[from]) * kStagePitch + col];
          for (int j = from + 1; j <= lane; ++j) sum += sval[(r0 + ord[j]) * kStagePitch + col];
          my_bins[end_bin] += sum;
        }
        __syncwarp();
      }
    } else {
      for (int r0 = 0; r0 < n; r0 += 32) {
        const int r = r0 + lane;
        const uint32_t bin = staged_bin(skey, r, n, col, flagged);
        // Most steps name 32 distinct destinations: each lane adds its value to its bin. Otherwise the last
        // lane of each run sums the run in lane order and adds that to the destination's bin.
        uint32_t end_bin;
        int from;
        if (plan_step(bin, lane, stamp, order, &end_bin, &from)) {
          if (bin != kNoBin) my_bins[bin] += sval[r * kStagePitch + col];  // a run of one
        } else if (end_bin != kNoBin) {
          float sum = sval[(r0 + order[from]) * kStagePitch + col];
          for (int j = from + 1; j <= lane; ++j) sum += sval[(r0 + order[j]) * kStagePitch + col];
          my_bins[end_bin] += sum;
        }
        __syncwarp();
      }
    }
  }
  if (flagged && bad) *bad = 1;
  __syncthreads();
  float* dst = partials + (chunk * g.outer + a) * g.rows * g.inner + b0;
  for (int e = threadIdx.x; e < rows * kPrivatizedCols; e += kPrivThreads) {
    const int r = e / kPrivatizedCols, c = e % kPrivatizedCols;
    dst[int64_t(r) * g.inner + c] = bins[c * pitch + r];
  }
}

// out[e] = the chunks' sums of e in chunk order.
__global__ void privatized_combine_kernel(const float* __restrict__ partials, int64_t chunks, int64_t n,
                                          float* __restrict__ out) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    float s = partials[e];
    for (int64_t t = 1; t < chunks; ++t) s += partials[t * n + e];
    out[e] = s;
  }
}

// One block per (chunk, outer coordinate a, group of kPrivatizedCols columns), the privatized scatter's
// grid: the group's columns of table along dim in shared memory ([rows][kPrivatizedCols]), then each
// position of the chunk reads its value's entry there.
template <bool kWide>
__global__ void __launch_bounds__(kGatherDimThreads)
    gather_dim_kernel(const float* __restrict__ table, const int32_t* __restrict__ index, DimScatter g,
                      PrivatizedGrid pg, float* __restrict__ out) {
  extern __shared__ float slice[];
  const PrivatizedBlock blk = privatized_block(g, pg);
  const int64_t chunk = blk.chunk, a = blk.a, group = blk.group;
  const int64_t b0 = group * kPrivatizedCols;
  const uint32_t rows = static_cast<uint32_t>(g.rows);
  const float* tab = table + a * g.rows * g.inner + b0;
  for (int e = threadIdx.x; e < static_cast<int>(rows) * kPrivatizedCols; e += kGatherDimThreads)
    slice[e] = tab[int64_t(e / kPrivatizedCols) * g.inner + e % kPrivatizedCols];
  __syncthreads();
  const int64_t i0 = chunk * pg.chunk_rows, i1 = min(g.extent, i0 + pg.chunk_rows);
  const int64_t first = (a * g.extent + i0) * g.inner + b0;
  const int64_t n = (i1 - i0) * kPrivatizedCols;
  // kGatherDimUnroll positions' index words in flight per thread before any is used: the loads' latency,
  // not the bandwidth, bounds a loop that waits for each.
  const auto pos_of = [&](int64_t e) { return first + (e / kPrivatizedCols) * g.inner + e % kPrivatizedCols; };
  for (int64_t e0 = threadIdx.x; e0 < n; e0 += int64_t(kGatherDimThreads) * kGatherDimUnroll) {
    DimWord<kWide> w[kGatherDimUnroll];
#pragma unroll
    for (int u = 0; u < kGatherDimUnroll; ++u) {
      const int64_t e = e0 + int64_t(u) * kGatherDimThreads;
      if (e < n) w[u] = dim_word<kWide>(index, pos_of(e));
    }
#pragma unroll
    for (int u = 0; u < kGatherDimUnroll; ++u) {
      const int64_t e = e0 + int64_t(u) * kGatherDimThreads;
      if (e < n) {
        const int32_t v = dim_value(w[u], rows);
        out[pos_of(e)] = v >= 0 ? slice[v * kPrivatizedCols + e % kPrivatizedCols] : NAN;
      }
    }
  }
}

}  // namespace

void scatter_atomic(Context& ctx, const ScatterRows& p, float* out, int32_t* bad) {
  cudaStream_t st = detail::stream_of(ctx);
  if (p.rows * p.d > 0) DITTO_CUDA_CHECK(cudaMemsetAsync(out, 0, sizeof(float) * std::size_t(p.rows * p.d), st));
  const int64_t total = p.m * p.d;
  if (total == 0) return;
  scatter_atomic_kernel<<<blocks_for(total), kThreads, 0, st>>>(p, out, bad);
  DITTO_CHECK_LAUNCH(ctx);
}

std::size_t scatter_sorted_workspace(const ScatterRows& p) {
  if (p.m == 0) return 0;
  return sorted_layout(p.m, p.d, sort_bits(p)).total;
}

// Outputs at least this large get their zero fill beside the sort (scatter_sorted).
constexpr std::size_t kFillBesideSortBytes = std::size_t(16) << 20;

void scatter_sorted(Context& ctx, const ScatterRows& p, float* out, int32_t* bad, void* workspace,
                    std::size_t workspace_bytes) {
  cudaStream_t st = detail::stream_of(ctx);
  const std::size_t out_bytes = sizeof(float) * std::size_t(p.rows * p.d);
  if (p.m == 0 || p.d == 0) {
    if (out_bytes) DITTO_CUDA_CHECK(cudaMemsetAsync(out, 0, out_bytes, st));
    return;
  }
  const SortBits bits = sort_bits(p);
  const SortedLayout l = sorted_layout(p.m, p.d, bits);
  if (workspace_bytes < l.total)
    throw Error("scatter_sorted: the workspace is smaller than scatter_sorted_workspace() says");
  // The key preparation and the sort read the indices (and values), never the output: with a large
  // output (an embedding table's gradient, 256 MB in op_noise's row: a fill of ~80 us against a sort
  // of ~40) they run on the context's high-priority side stream beside the output's zero fill, and
  // the segment kernels wait for both. The fill is queued first, so the GPU starts it while the host
  // is still queuing the sort's launches; the sort's higher priority gets its blocks SMs as the
  // fill's retire. Stream order alone decides what each kernel sees: the bits are those of the fill
  // before the sort. A small fill is not worth the branch's four API calls.
  std::optional<detail::SideBranch> beside;
  cudaStream_t sort_st = st;
  if (out_bytes >= kFillBesideSortBytes) {
    beside.emplace(ctx);  // the side stream waits for what the main stream holds so far, not the fill
    sort_st = beside->stream();
  }
  if (out_bytes) DITTO_CUDA_CHECK(cudaMemsetAsync(out, 0, out_bytes, st));
  char* ws = static_cast<char*>(workspace);
  auto* keys0 = reinterpret_cast<uint32_t*>(ws + l.keys0);
  auto* keys1 = reinterpret_cast<uint32_t*>(ws + l.keys1);
  auto* pos0 = reinterpret_cast<int32_t*>(ws + l.pos0);
  auto* pos1 = reinterpret_cast<int32_t*>(ws + l.pos1);
  auto* carry = reinterpret_cast<float*>(ws + l.carry);

  cub::DoubleBuffer<uint32_t> keys(keys0, keys1);
  std::size_t cub_bytes = l.cub_bytes;
  const int64_t tiles = tiles_for(p.m);
  if (p.d == 1) {
    // The values ride along in the positions' buffers (both 4 bytes; the scratch size is the same).
    cub::DoubleBuffer<float> vals(reinterpret_cast<float*>(pos0), reinterpret_cast<float*>(pos1));
    if (bits.begin > 0) {
      const int64_t period = int64_t(1) << bits.begin;
      const int64_t prep_tiles = (period + kPrepTile - 1) / kPrepTile * ((bits.r_count + kPrepTile - 1) / kPrepTile);
      sort_prep_scalar_transposed_kernel<<<static_cast<unsigned>(std::min<int64_t>(prep_tiles, 65535)), kPrepTile * 8, 0,
                                           sort_st>>>(p, bits.begin, bits.r_count, bits.marker, keys0, vals.Current(),
                                                      bad);
    } else {
      sort_prep_scalar_kernel<<<blocks_for(p.m), kThreads, 0, sort_st>>>(p, keys0, vals.Current(), bad);
    }
    DITTO_CHECK_LAUNCH(ctx);
    DITTO_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(ws + l.cub, cub_bytes, keys, vals, static_cast<int>(p.m),
                                                     bits.begin, bits.end, sort_st));
    DITTO_CHECK_LAUNCH(ctx);
    if (beside) beside->join();
    segment_tiles_scalar_kernel<<<warp_blocks(tiles), kWarps * 32, 0, st>>>(keys.Current(), vals.Current(), p, out,
                                                                             carry, tiles);
    DITTO_CHECK_LAUNCH(ctx);
    if (tiles > 1) {
      segment_fixup_scalar_kernel<<<blocks_for(tiles), kThreads, 0, st>>>(keys.Current(), p, out, carry, tiles);
      DITTO_CHECK_LAUNCH(ctx);
    }
    return;
  }
  sort_prep_kernel<<<blocks_for(p.m), kThreads, 0, sort_st>>>(p.index, p.m, p.rows, keys0, pos0, bad);
  DITTO_CHECK_LAUNCH(ctx);
  cub::DoubleBuffer<int32_t> pos(pos0, pos1);
  DITTO_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(ws + l.cub, cub_bytes, keys, pos, static_cast<int>(p.m), bits.begin,
                                                   bits.end, sort_st));
  DITTO_CHECK_LAUNCH(ctx);
  if (beside) beside->join();
  segment_tiles_kernel<<<warp_blocks(tiles), kWarps * 32, 0, st>>>(keys.Current(), pos.Current(), p, out, carry,
                                                                    tiles);
  DITTO_CHECK_LAUNCH(ctx);
  if (tiles > 1) {
    segment_fixup_kernel<<<warp_blocks(tiles), kWarps * 32, 0, st>>>(keys.Current(), p, out, carry, tiles);
    DITTO_CHECK_LAUNCH(ctx);
  }
}

PrivatizedChunks scatter_privatized_chunks(const DimScatter& g) {
  const PrivatizedGrid pg = privatized_grid(g);
  return {pg.chunks, pg.chunk_rows};
}

int64_t scatter_privatized_blocks(const ScatterRows& p) {
  const PrivatizedGrid pg = privatized_grid(p.dim);
  return privatized_blocks(p.dim, pg);
}

std::size_t scatter_privatized_workspace(const ScatterRows& p) {
  const PrivatizedGrid pg = privatized_grid(p.dim);
  return sizeof(float) * std::size_t(pg.chunks * p.dim.outer * p.dim.rows * p.dim.inner);
}

void scatter_privatized(Context& ctx, const ScatterRows& p, float* out, int32_t* bad, void* workspace,
                        std::size_t workspace_bytes) {
  const DimScatter& g = p.dim;
  const int64_t n = g.outer * g.rows * g.inner;
  if (n == 0) return;
  if (workspace_bytes < scatter_privatized_workspace(p))
    throw Error("scatter_privatized: the workspace is smaller than scatter_privatized_workspace() says");
  cudaStream_t st = detail::stream_of(ctx);
  const PrivatizedGrid pg = privatized_grid(g);
  const std::size_t smem = scatter_privatized_smem(g.rows);
  if (p.wide && g.index_per_row) throw Error("scatter_privatized: an index per row is read as i32 words only");
  const auto kernel = g.index_per_row ? scatter_privatized_kernel<false, true>
                      : p.wide        ? scatter_privatized_kernel<true, false>
                                      : scatter_privatized_kernel<false, false>;
  DITTO_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  auto* partials = static_cast<float*>(workspace);
  kernel<<<static_cast<unsigned>(scatter_privatized_blocks(p)), kPrivThreads, smem, st>>>(p.src, p.index, g, pg,
                                                                                          partials, bad);
  DITTO_CHECK_LAUNCH(ctx);
  privatized_combine_kernel<<<blocks_for(n), kThreads, 0, st>>>(partials, pg.chunks, n, out);
  DITTO_CHECK_LAUNCH(ctx);
}

void gather_dim(Context& ctx, const float* table, const int32_t* index, bool wide, const DimScatter& g, float* out) {
  if (g.outer * g.extent * g.inner == 0) return;
  const PrivatizedGrid pg = privatized_grid(g);
  const std::size_t smem = sizeof(float) * std::size_t(g.rows * kPrivatizedCols);
  const auto kernel = wide ? gather_dim_kernel<true> : gather_dim_kernel<false>;
  DITTO_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  kernel<<<static_cast<unsigned>(privatized_blocks(g, pg)), kGatherDimThreads, smem, detail::stream_of(ctx)>>>(
      table, index, g, pg, out);
  DITTO_CHECK_LAUNCH(ctx);
}

void scatter_dim_keys(Context& ctx, const int32_t* index, const DimKeys& k, int32_t* key) {
  if (k.n == 0) return;
  dim_keys_kernel<<<blocks_for(k.n), kThreads, 0, detail::stream_of(ctx)>>>(index, k, key);
  DITTO_CHECK_LAUNCH(ctx);
}

void poison_if_flagged(Context& ctx, const int32_t* bad, float* out, int64_t n) {
  if (n == 0) return;
  // A small fixed grid: when nothing is flagged (the normal case) the kernel costs one launch.
  poison_kernel<<<n < 256 * kThreads ? blocks_for(n) : 256, kThreads, 0, detail::stream_of(ctx)>>>(bad, out, n);
  DITTO_CHECK_LAUNCH(ctx);
}

void gather_rows(Context& ctx, const float* table, const int32_t* index, float* out, int64_t m, int64_t d,
                 int64_t rows) {
  const int64_t total = m * d;
  if (total == 0) return;
  gather_rows_kernel<<<blocks_for(total), kThreads, 0, detail::stream_of(ctx)>>>(table, index, out, m, d, rows);
  DITTO_CHECK_LAUNCH(ctx);
}

void embedding_bag_fwd(Context& ctx, const float* table, const int32_t* index, const BagRows& bags, int64_t d,
                       int64_t rows, bool mean, float* y) {
  if (bags.bags == 0 || d == 0) return;
  embedding_bag_fwd_kernel<<<warp_blocks(bags.bags), kWarps * 32, 0, detail::stream_of(ctx)>>>(table, index, bags, d,
                                                                                               rows, mean, y);
  DITTO_CHECK_LAUNCH(ctx);
}

void embedding_bag_sources(Context& ctx, const BagRows& bags, bool mean, int32_t* src_row, float* src_scale) {
  if (bags.m == 0) return;
  embedding_bag_sources_kernel<<<blocks_for(bags.m), kThreads, 0, detail::stream_of(ctx)>>>(bags, mean, src_row,
                                                                                            mean ? src_scale : nullptr);
  DITTO_CHECK_LAUNCH(ctx);
}

}  // namespace ditto::cuda
