// Internal: CUDA launchers of kernels/scatter.cu. Rows hold d floats; indices are i32.
#pragma once
#include <cstddef>
#include <cstdint>

namespace ditto { class Context; }

namespace ditto::cuda {

// One scatter-add: out[index[j]] += scale_j * src[row_j] for j < m, where row_j = j, or
// src_row[j] when src_row is set (a negative row contributes nothing), and scale_j = 1, or
// src_scale[j] when src_scale is set (the product is rounded before it is added). Positions whose
// index is outside [0, rows) contribute nothing and set *bad = 1 where bad is not null.
//
// key_period_log2 = s > 0 (rows of one float only; scatter_dim_add sets it): the caller promises that
// every in-range index[j] equals j modulo 2^s (a scatter along a dimension whose inner extent 2^s
// divides: the key's and the position's low bits are the same inner coordinate) and that 2^s divides m.
// The sorted variant then sorts bits [s, ...) only, of the [m / 2^s, 2^s] list transposed: the same
// sorted list, in fewer radix passes. An in-range index that breaks the promise sets *bad.
//
// dim (scatter_dim_add sets it where the index has the output's shape outside dim): the problem is a
// scatter along a dimension, positions [outer, extent, inner] row-major into an output [outer, rows,
// inner]. Only the privatized variant reads it, and for it index holds the index's own values along
// dim (i32, or with wide int64 values as (low, high) i32 words), not keys: position j of (a, i, b)
// adds into (a, index value, b).
// A scatter of rows (scatter_add of src {m, d}) is the same problem with outer 1, extent m, inner d and
// index_per_row: the index holds one value per position along dim, shared by its inner columns.
struct DimScatter {
  int64_t outer = 0, extent = 0, inner = 0, rows = 0;  // all zero: not a scatter along a dimension
  bool index_per_row = false;
};
struct ScatterRows {
  const float* src = nullptr;
  const int32_t* index = nullptr;
  const int32_t* src_row = nullptr;
  const float* src_scale = nullptr;
  int64_t m = 0, d = 0, rows = 0;
  int key_period_log2 = 0;
  DimScatter dim;
  bool wide = false;  // privatized only: index holds two words per value
};

// Both variants overwrite out (rows x d) entirely: zeros where no index points.
void scatter_atomic(Context& ctx, const ScatterRows& p, float* out, int32_t* bad);
// Workspace bytes scatter_sorted needs for this problem (keys, positions, the sort's scratch and the
// pieces of runs that cross tiles); a function of (m, d, rows, key_period_log2) only. No device work.
std::size_t scatter_sorted_workspace(const ScatterRows& p);
void scatter_sorted(Context& ctx, const ScatterRows& p, float* out, int32_t* bad, void* workspace,
                    std::size_t workspace_bytes);
// The privatized variant (a scatter along a dimension only, p.dim set): the positions along dim are cut
// into chunks whose count depends on the shape alone; one block per (chunk, outer, group of
// kPrivatizedCols inner columns) sums each destination's contributions in position order into shared
// memory, and one pass adds each destination's chunk sums in chunk order. No atomics, no sort: the same
// bits on any GPU where it runs. It runs where p.dim.inner is a multiple of kPrivatizedCols and the
// block's bins (p.dim.rows x kPrivatizedCols floats) and staging fit the device's shared memory per
// block; scatter_privatized_refusal says why not (empty where it runs).
constexpr int kPrivatizedCols = 8;
constexpr int kPrivatizedStageRows = 256;  // positions per column staged in shared memory at a time
// Shared memory per block for `rows` destinations along dim: each column's bins (rows + 1 floats), the
// staged values and keys (rows of kPrivatizedCols + 1 words against bank conflicts), and per warp a
// step's sorted order and plan (32 words each) and a one-byte stamp per destination.
inline std::size_t scatter_privatized_smem(int64_t rows) {
  return sizeof(float) * std::size_t((rows + 1) * kPrivatizedCols + 2 * kPrivatizedStageRows * (kPrivatizedCols + 1) +
                                     2 * kPrivatizedCols * 32) +
         std::size_t(kPrivatizedCols) * std::size_t((rows + 3) / 4 * 4);
}
// The chunks along dim (a function of the shape alone: the bounds decide the sums' grouping): chunk t
// holds positions [t * rows_per_chunk, min(extent, (t + 1) * rows_per_chunk)).
struct PrivatizedChunks {
  int64_t chunks = 1, rows_per_chunk = 0;
};
PrivatizedChunks scatter_privatized_chunks(const DimScatter& g);
// Blocks of the privatized kernel for p.dim (chunks x outer x inner / kPrivatizedCols).
int64_t scatter_privatized_blocks(const ScatterRows& p);
// Workspace bytes (the chunk sums: chunks x outer x rows x inner floats); a function of p.dim only.
std::size_t scatter_privatized_workspace(const ScatterRows& p);
// Overwrites out (outer x rows x inner) entirely. An index value outside [0, rows) (or past int32) adds
// nothing and sets *bad (poison_if_flagged then makes the output NaN, as for the other variants).
void scatter_privatized(Context& ctx, const ScatterRows& p, float* out, int32_t* bad, void* workspace,
                        std::size_t workspace_bytes);
// The gather along a dimension that is the privatized scatter's backward, for the same geometries:
// out[(a, i, b)] = table[(a, index value, b)] over positions [outer, extent, inner], NaN where the
// value is outside [0, rows) or past int32. One block per (chunk, outer, group of kPrivatizedCols
// columns) holds its columns of table (rows x kPrivatizedCols floats, less than the scatter's bins) in
// shared memory, so the random reads stay on the SM. A copy: deterministic.
void gather_dim(Context& ctx, const float* table, const int32_t* index, bool wide, const DimScatter& g, float* out);
// out[0 .. n) = NaN when *bad != 0 (read on the device).
void poison_if_flagged(Context& ctx, const int32_t* bad, float* out, int64_t n);

// scatter_dim_keys on the GPU (kernels/scatter.h): ranks up to kDimKeysMaxRank; index holds one i32
// word per element, or two (low, high) when wide.
constexpr int kDimKeysMaxRank = 8;
struct DimKeys {
  int rank = 0, dim = 0;
  bool wide = false;
  uint32_t ishape[kDimKeysMaxRank] = {};
  int64_t ostride[kDimKeysMaxRank] = {};
  int64_t extent = 0;      // out_shape[dim]
  int64_t dim_stride = 0;  // ostride[dim], kept apart: a kernel indexing a parameter array by a runtime
                           // value copies the whole struct to local memory in every thread
  int64_t n = 0;       // elements of the index
};
void scatter_dim_keys(Context& ctx, const int32_t* index, const DimKeys& k, int32_t* key);

// out[j] = table[index[j]] (rows of d), NaN where index[j] is outside [0, rows).
void gather_rows(Context& ctx, const float* table, const int32_t* index, float* out, int64_t m, int64_t d,
                 int64_t rows);

// Bags of embedding_bag: with offsets (length `bags`), bag b is [offsets[b], offsets[b+1]) (the
// last ends at m); without, bag b is [b * bag_size, (b + 1) * bag_size).
struct BagRows {
  const int32_t* offsets = nullptr;
  int64_t bag_size = 0, bags = 0, m = 0;
};
void embedding_bag_fwd(Context& ctx, const float* table, const int32_t* index, const BagRows& bags, int64_t d,
                       int64_t rows, bool mean, float* y);
// For the backward scatter: src_row[j] = the bag of position j (-1: none), and with mean
// src_scale[j] = 1 / (that bag's size) (src_scale may be null for sum).
void embedding_bag_sources(Context& ctx, const BagRows& bags, bool mean, int32_t* src_row, float* src_scale);

}  // namespace ditto::cuda
