// Scatter-add and gather of rows: scatter_add (TensorFlow's unsorted_segment_sum / segment_sum,
// PyTorch's index_add_ along dim 0), embedding (a gather of table rows) and embedding_bag (sums or
// means of gathered rows per bag). The gradient of a gather is a scatter-add, so the three ops
// share one scatter engine and one policy knob, `scatter`, of op kinds scatter_add and embedding:
//   atomic  one thread per (position, column) atomicAdds its value into out[index[j], column]. Where
//           indices repeat, the float adds land in the order threads arrive: NOT deterministic
//           (Determinism no, not_guaranteed). What TensorFlow and JAX do for these gradients and
//           PyTorch for index_add_ / scatter_add_. (PyTorch's own embedding backward sorts.)
//   sorted  (index, position) pairs are radix-sorted by index (cub::DeviceRadixSort, stable, so
//           equal indices keep position order); the sorted list is cut into fixed tiles of 32
//           entries, one warp per tile sums each run of equal indices in position order, and a
//           run that crosses tiles is finished by one block that adds its per-tile pieces in tile
//           order. Every destination row is the sum of its contributions in increasing position
//           order, grouped by tiles whose bounds depend on the number of positions alone: the
//           same bits for a given input on any GPU (Determinism yes, gpu_to_gpu). The sort's
//           result does not depend on the GPU either: a stable sort's output is unique.
//   privatized  (scatter_add's knob only; no mode picks it, a rule names it) the positions along dim
//           (a scatter of rows: the rows) are cut into chunks fixed by the shape; a block per (chunk,
//           column group) sums each destination's contributions in position order in shared memory,
//           and each output adds its chunk sums in chunk order: no sort, no atomics, the same bits on
//           any GPU where it runs (gpu_to_gpu). It runs scatter_add of rows of a multiple of 8 floats,
//           and scatter_dim_add where the index has the output's shape outside dim and the extent after
//           dim is a multiple of 8, with the block's destinations in shared memory (40 bytes each:
//           4096 take 160 KB, an H100 or H200 holds about 5,300); elsewhere pinning it is a
//           PolicyError that says so (scatter_rows_privatized_refusal, scatter_dim_privatized_refusal).
// The CPU runs the double-accumulating reference (kernels/scatter_ref.h) whatever the policy says;
// the manifest then records variant "cpu-reference".
//
// Rows: src, table and out are {rows, D...}: dimension 0 is the row, the rest (D = their product,
// at least 1) is one row's payload. Indices are i32 tensors on the context's device.
//
// Out-of-range indices: on the CPU a DataError naming the position and the value. The GPU cannot
// check without a host copy, so the fault is made visible instead: scatter_add's whole output is
// NaN; embedding's output row for that position is NaN; embedding_bag's bag holding it is NaN.
// Their backward passes skip such positions (the forward already poisoned the result).
//
// Backward contributions are fresh tensors handed to accumulate_grad: gradients accumulate.
#pragma once
#include <cstdint>
#include <string>

#include "engine/context.h"
#include "engine/tape.h"
#include "engine/knob.h"

namespace ditto {

namespace op {
inline constexpr OpKind scatter_add{"scatter_add"};
inline constexpr OpKind embedding{"embedding"};
}  // namespace op

// Knob `scatter` of scatter_add and embedding layers (kernels/scatter.cpp): atomicAdd per
// element, or a stable radix sort by destination row and fixed-order segment sums.
enum class ScatterAlgo { Atomic, Sorted, Privatized };
const KnobSpec& scatter_add_knob();
const KnobSpec& embedding_scatter_knob();
const char* name_of(ScatterAlgo s);
inline const char* knob_name(ScatterAlgo) { return "scatter"; }

// out[r] = sum of src[j] over the positions j with index[j] == r; out is {num_rows, src dims 1..}
// (rows no index names are zero). index is {M} with M = src's dimension 0. Knob `scatter` of op
// kind scatter_add, recorded under layer `layer`. Backward: dsrc[j] = dout[index[j]] (a gather,
// deterministic).
Var scatter_add(Context& ctx, const std::string& layer, const Var& src, const Tensor& index, int64_t num_rows);

// Why scatter=privatized cannot run scatter_add of m rows of d floats into num_rows on ctx's device:
// empty where it can (and on a CPU context, which runs its reference whatever the variant).
std::string scatter_rows_privatized_refusal(const Context& ctx, int64_t m, int64_t d, int64_t num_rows);

// TensorFlow's names for the same op (data, segment_ids, num_segments). ditto does not require
// segment_sum's ids to be sorted: sorted ids only make the sort's input already ordered.
inline Var unsorted_segment_sum(Context& ctx, const std::string& layer, const Var& data, const Tensor& segment_ids,
                                int64_t num_segments) {
  return scatter_add(ctx, layer, data, segment_ids, num_segments);
}
inline Var segment_sum(Context& ctx, const std::string& layer, const Var& data, const Tensor& segment_ids,
                       int64_t num_segments) {
  return scatter_add(ctx, layer, data, segment_ids, num_segments);
}

// The destinations of PyTorch's scatter along a dimension (torch.scatter_add(input, dim, index, src)) as
// scatter_add's row index over input and src flattened to rows of one float: for each element of an
// index of shape index_shape (row-major), the row-major offset into a tensor of shape out_shape whose
// coordinate along dim is the element's value and whose other coordinates are the element's own.
// index is i32 holding the values, or with wide = true int64 values as (low, high) i32 words (index
// then has 2 * numel(index_shape) elements), so that int64 indices cross without a conversion; a value
// outside int32 is outside the extent like any other. Out of range (outside [0, out_shape[dim])): -1 on
// the GPU, so that scatter_add poisons its output as for any bad index; a DataError naming the element
// and its value on the CPU. Needs the same rank, index_shape[d] <= out_shape[d] for d != dim, and fewer
// than 2^31 elements in each (ShapeError otherwise). Result: {numel(index_shape)} i32. Deterministic (a
// map, no reductions).
Tensor scatter_dim_keys(Context& ctx, const Tensor& index, bool wide, const Shape& index_shape, int dim,
                        const Shape& out_shape);

// PyTorch's scatter_add along dim: out (out_shape) = the sum into each element named by the index (of
// shape index_shape; i32 values, or with wide = true int64 values as (low, high) i32 words, as
// scatter_dim_keys takes it) of src's values (src of any shape with one value per index element,
// row-major). Knob `scatter` (kind scatter_add) under layer `layer`:
// - privatized (GPU): sums straight from the index's values (no keys; scatter_dim_privatized_refusal
//   says where it runs);
// - sorted, atomic (and any variant on the CPU): scatter_dim_keys' keys, then the same result, bit for
//   bit, as scatter_add of src as rows of one float by those keys into numel(out_shape) rows; where the
//   index covers the output's whole extent after dim, keys repeat their positions' low bits and the
//   sorted variant sorts fewer key bits (cuda::ScatterRows::key_period_log2).
// A value outside [0, out_shape[dim]) makes the GPU's output NaN; the CPU raises a DataError naming it.
// Backward: dsrc = gather_dim of dout by the index (deterministic).
Var scatter_dim_add(Context& ctx, const std::string& layer, const Var& src, const Tensor& index, bool wide,
                    const Shape& index_shape, int dim, const Shape& out_shape);

// torch.gather(table, dim, index) with the index as scatter_dim_add takes it: out (index_shape)[e] = the
// element of table at e's coordinates with the one along dim replaced by index[e]; NaN where that value is
// outside [0, table.shape()[dim]) on the GPU, a DataError naming it on the CPU. Where the privatized
// scatter runs the geometry, one kernel reads the index and keeps table's columns in shared memory;
// elsewhere scatter_dim_keys then gather_rows. A copy: deterministic.
Tensor gather_dim(Context& ctx, const Tensor& table, const Tensor& index, bool wide, const Shape& index_shape, int dim);

// Why scatter=privatized cannot run scatter_dim_add for this geometry on ctx's device: empty where it
// can (a CPU context runs its reference whatever the variant: empty there too). A geometry that no
// scatter takes is answered with scatter_dim_add's ShapeError message, not thrown.
std::string scatter_dim_privatized_refusal(const Context& ctx, const Shape& index_shape, int dim,
                                           const Shape& out_shape);

// y[j...] = weight[index[j...]]: index of any shape S (i32), weight {rows, D}, y of shape S + {D}.
// Forward: one thread per output element, deterministic. Backward: dweight = scatter_add of dy by
// index, by the layer's `scatter` variant (op kind embedding).
Var embedding(Context& ctx, const std::string& layer, const Var& weight, const Tensor& index);

enum class BagMode { Sum, Mean };
const char* bag_mode_name(BagMode m);

// PyTorch's EmbeddingBag (mode sum or mean, include_last_offset=False): y {B, D}; bag b gathers
// index[offsets[b] .. offsets[b+1]) (the last bag runs to M). index is {M} and offsets {B} i32
// with offsets[0] == 0, non-decreasing, at most M; or offsets is undefined and index is {B, L}:
// B bags of L positions each. An empty bag gives a zero row (sum and mean). Forward: one warp per
// bag adds its rows in position order (deterministic); mean divides the sum by the bag's size.
// Backward: dweight[index[j]] += dy[bag(j)] (sum) or dy[bag(j)] * (1 / size of bag(j)) (mean), by
// the layer's `scatter` variant (op kind embedding). Malformed offsets on the GPU make the bags
// they touch NaN (a CPU context raises a DataError).
Var embedding_bag(Context& ctx, const std::string& layer, const Var& weight, const Tensor& index,
                  const Tensor& offsets, BagMode mode);

// Tensor-level backward passes, as the ops' tape closures run them (and bench/op_noise times
// them): the layer's `scatter` variant, recorded in the manifest under (layer, "scatter").
// embedding: dy is index's shape + {D}; returns dweight {num_rows, D}.
Tensor embedding_backward(Context& ctx, const std::string& layer, const Tensor& dy, const Tensor& index,
                          int64_t num_rows);
// scatter_add's: rows of table ({rows, D...}) gathered by index (i32, any shape S): {S..., D...}; NaN rows
// for out-of-range indices on the GPU, a DataError naming the position on the CPU. No knob, nothing
// recorded (a gather has one source per output).
Tensor gather_rows(Context& ctx, const Tensor& table, const Tensor& index);
// embedding_bag: dy {B, D}; index and offsets as embedding_bag took them.
Tensor embedding_bag_backward(Context& ctx, const std::string& layer, const Tensor& dy, const Tensor& index,
                              const Tensor& offsets, BagMode mode, int64_t num_rows);

}  // namespace ditto
