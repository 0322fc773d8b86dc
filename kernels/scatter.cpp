#include "kernels/scatter.h"

#include <fmt/format.h>

#include <algorithm>
#include <climits>
#include <functional>

#include "engine/detail/cuda_state.h"
#include "engine/detail/int64_words.h"
#include "engine/error.h"
#include "engine/operand_check.h"
#include "kernels/detail/own_knob.h"
#include "kernels/detail/scatter_cuda.h"
#include "kernels/scatter_ref.h"

namespace ditto {

namespace {
constexpr Guarantee kNot = Guarantee::NotGuaranteed, kRun = Guarantee::RunToRun, kGpu = Guarantee::GpuToGpu;
constexpr Impl kLib = Impl::Library, kOwn = Impl::Ditto;
const std::vector<VariantSpec> kScatterVariants = {
    {"atomic", kNot, kOwn, "atomicAdd per element (TensorFlow's, JAX's and PyTorch's scatter-add)"},
    {"sorted", kGpu, kOwn, "stable radix sort by row, fixed-order segment sums"}};
// scatter_add's own knob adds the privatized scatter along a dimension: faster than the sort where its
// bins fit shared memory, refused elsewhere, so no mode picks it (the sort runs every problem).
const std::vector<VariantSpec> kScatterAddVariants = {
    kScatterVariants[0], kScatterVariants[1],
    {"privatized", kGpu, kOwn,
     "scatter along a dimension: per-chunk sums in shared memory in position order, chunks added in order",
     false, /*by_name_only=*/true}};
}  // namespace

DITTO_KNOB(scatter_add_knob, {op::scatter_add, "scatter", kScatterAddVariants, "atomic", false, "the scatter's sums"})
DITTO_KNOB(embedding_scatter_knob, {op::embedding, "scatter", kScatterVariants, "atomic", false,
                                    "the weight gradient's scatter",
                                    // PyTorch's embedding backward sorts the indices and sums segments.
                                    "sorted"})

const char* name_of(ScatterAlgo s) { return variant_name(scatter_add_knob(), s); }

namespace {

constexpr const char* kKnob = "scatter";

std::string where(const char* op, const std::string& layer) { return fmt::format("{} (layer '{}')", op, layer); }

// The payload of one row of a {rows, ...} tensor: the product of its dimensions after the first.
int64_t row_width(const Shape& s) {
  int64_t d = 1;
  for (std::size_t i = 1; i < s.size(); ++i) d *= s[i];
  return d;
}

// Positions are i32 on the GPU (the sort's values) and rows are named by i32 indices.
void check_counts(const std::string& op, int64_t m, int64_t rows) {
  if (m > INT_MAX) throw ShapeError(fmt::format("{}: {} indices; at most 2^31-1 are supported", op, m));
  if (rows < 0 || rows > INT_MAX)
    throw ShapeError(fmt::format("{}: {} rows; between 0 and 2^31-1 are supported", op, rows));
}

void check_range_cpu(const Tensor& index, int64_t rows, const std::string& op) {
  const int32_t* idx = index.i32();
  for (int64_t j = 0; j < index.numel(); ++j)
    if (idx[j] < 0 || idx[j] >= rows)
      throw DataError(fmt::format("{}: position {} has index {}, outside [0, {})", op, j, idx[j], rows));
}

// Why the privatized variant cannot run this problem on ctx's device (empty where it can).
std::string privatized_refusal(const Context& ctx, const cuda::DimScatter& g) {
  if (g.outer == 0 && g.extent == 0 && g.inner == 0 && g.rows == 0)
    return "runs a scatter of rows or along a dimension whose index has the output's shape outside dim (this "
           "scatter's index is smaller)";
  if (g.inner % cuda::kPrivatizedCols != 0)
    return g.index_per_row ? fmt::format("needs rows of a multiple of {} floats (these have {})",
                                         cuda::kPrivatizedCols, g.inner)
                           : fmt::format("needs the extent after dim ({}) to be a multiple of {}", g.inner,
                                         cuda::kPrivatizedCols);
  const int64_t limit = static_cast<int64_t>(detail::cuda_state(ctx).props.sharedMemPerBlockOptin);
  const std::size_t need = cuda::scatter_privatized_smem(g.rows);
  if (need > static_cast<std::size_t>(limit)) {
    int64_t most = (limit - static_cast<int64_t>(cuda::scatter_privatized_smem(0))) / (5 * cuda::kPrivatizedCols);
    while (most > 0 && cuda::scatter_privatized_smem(most) > static_cast<std::size_t>(limit)) --most;
    return fmt::format("needs {} bytes of shared memory per block for {} destinations along dim; this GPU has {} "
                       "(at most {} destinations)",
                       need, g.rows, limit, most);
  }
  cuda::ScatterRows p;
  p.dim = g;
  if (cuda::scatter_privatized_blocks(p) > INT_MAX) return "needs more blocks than one launch holds";
  return "";
}

// Runs the layer's `scatter` variant for one problem into out (rows x d, overwritten) and records
// what ran. bad (device, zeroed) is set where an index is out of range; may be null.
void run_scatter(Context& ctx, const std::string& layer, const char* op, OpKind kind, const cuda::ScatterRows& p,
                 float* out, int32_t* bad) {
  const ScatterAlgo algo = ctx.policy().variant<ScatterAlgo>(layer, kind);
  const std::string requested = ctx.policy().requested(layer, kKnob, kind);
  std::size_t ws_bytes = 0;
  if (algo == ScatterAlgo::Atomic) {
    cuda::scatter_atomic(ctx, p, out, bad);
  } else {
    if (algo == ScatterAlgo::Privatized) {
      const std::string why = privatized_refusal(ctx, p.dim);
      if (!why.empty())
        throw PolicyError(fmt::format("{}: scatter=privatized {}; scatter=sorted and scatter=atomic run every "
                                      "scatter", where(op, layer), why));
    }
    ws_bytes = algo == ScatterAlgo::Sorted ? cuda::scatter_sorted_workspace(p) : cuda::scatter_privatized_workspace(p);
    detail::Workspace ws(detail::cuda_state(ctx), ws_bytes);
    if (!ws.ok())
      throw PolicyError(fmt::format("{}: scatter={} needs a workspace of {} bytes for {} indices into {} rows of "
                                    "{}, which could not be allocated; scatter=atomic needs none",
                                    where(op, layer), name_of(algo), ws_bytes, p.m, p.rows, p.d));
    if (algo == ScatterAlgo::Sorted)
      cuda::scatter_sorted(ctx, p, out, bad, ws.get(), ws_bytes);
    else
      cuda::scatter_privatized(ctx, p, out, bad, ws.get(), ws_bytes);
  }
  detail::record_own_knob(ctx, layer, op, kKnob, name_of(algo), requested, algo != ScatterAlgo::Atomic, ws_bytes);
}

// Resolves (and so validates) the layer's knob on any device and records it; on the GPU the
// variant the backward pass will run.
void record_planned(Context& ctx, const std::string& layer, const char* op, OpKind kind) {
  const ScatterAlgo algo = ctx.policy().variant<ScatterAlgo>(layer, kind);
  detail::record_own_knob(ctx, layer, op, kKnob, name_of(algo), ctx.policy().requested(layer, kKnob, kind),
                          algo == ScatterAlgo::Sorted);
}

struct BagShape {
  int64_t bags = 0, m = 0, bag_size = 0;
  bool has_offsets = false;
};

BagShape bag_shape(const Context& ctx, const Tensor& index, const Tensor& offsets, const std::string& op) {
  check_i32_on(ctx, index, op, "index");
  BagShape b;
  if (offsets.defined()) {
    check_i32_on(ctx, offsets, op, "offsets");
    if (index.ndim() != 1 || offsets.ndim() != 1)
      throw ShapeError(fmt::format("{}: with offsets, index and offsets must be 1-D, have shapes {} and {}", op,
                                   shape_str(index.shape()), shape_str(offsets.shape())));
    b.bags = offsets.shape()[0];
    b.m = index.shape()[0];
    b.has_offsets = true;
  } else {
    if (index.ndim() != 2)
      throw ShapeError(fmt::format("{}: without offsets, index must be {{bags, bag size}}, has shape {}", op,
                                   shape_str(index.shape())));
    b.bags = index.shape()[0];
    b.bag_size = index.shape()[1];
    b.m = b.bags * b.bag_size;
  }
  return b;
}

void check_offsets_cpu(const Tensor& offsets, int64_t m, const std::string& op) {
  const int32_t* off = offsets.i32();
  const int64_t bags = offsets.numel();
  if (bags > 0 && off[0] != 0) throw DataError(fmt::format("{}: offsets[0] is {}; the first bag starts at 0", op, off[0]));
  for (int64_t b = 0; b < bags; ++b) {
    if (b > 0 && off[b] < off[b - 1])
      throw DataError(fmt::format("{}: offsets[{}] = {} is below offsets[{}] = {}; offsets must not decrease", op, b,
                                  off[b], b - 1, off[b - 1]));
    if (off[b] > m)
      throw DataError(fmt::format("{}: offsets[{}] = {} is past the {} indices", op, b, off[b], m));
  }
}

ref::Bags ref_bags(const BagShape& s, const Tensor& offsets) {
  ref::Bags b;
  b.m = s.m;
  b.count = s.bags;
  b.bag_size = s.bag_size;
  b.offsets = s.has_offsets ? offsets.i32() : nullptr;
  return b;
}

cuda::BagRows cuda_bags(const BagShape& s, const Tensor& offsets) {
  cuda::BagRows b;
  b.offsets = s.has_offsets ? offsets.i32() : nullptr;
  b.bag_size = s.bag_size;
  b.bags = s.bags;
  b.m = s.m;
  return b;
}

// dsrc[j] = dout[index[j]]: the backward pass of scatter_add (NaN rows for out-of-range indices on the GPU).
Tensor gather_of(Context& ctx, const Tensor& table, const Tensor& index, int64_t m, int64_t d, int64_t rows,
                 const Shape& out_shape) {
  Tensor out = ctx.empty(out_shape);
  if (ctx.is_cuda())
    cuda::gather_rows(ctx, table.f32(), index.i32(), out.f32(), m, d, rows);
  else
    ref::gather_rows(table.f32(), index.i32(), out.f32(), m, d);
  return out;
}

// The checks a scatter along a dimension shares (scatter_dim_keys, scatter_dim_add): ranks, extents and
// counts; returns the index's element count.
int64_t check_dim_geometry(const std::string& op, const Shape& index_shape, int dim, const Shape& out_shape) {
  const int rank = static_cast<int>(out_shape.size());
  if (static_cast<int>(index_shape.size()) != rank || rank < 1 || rank > cuda::kDimKeysMaxRank)
    throw ShapeError(fmt::format("{}: index of shape {} into {}: the same rank, 1 to {}, expected", op,
                                 shape_str(index_shape), shape_str(out_shape), cuda::kDimKeysMaxRank));
  if (dim < 0 || dim >= rank) throw ShapeError(fmt::format("{}: dim {} of a rank-{} tensor", op, dim, rank));
  int64_t n = 1, total = 1;
  for (int d = 0; d < rank; ++d) {
    if (index_shape[d] < 0 || (d != dim && index_shape[d] > out_shape[d]))
      throw ShapeError(fmt::format("{}: index of shape {} is larger than {} outside dim {}", op,
                                   shape_str(index_shape), shape_str(out_shape), dim));
    n *= index_shape[d];
    total *= out_shape[d];
  }
  if (n > INT_MAX || total > INT_MAX)
    throw ShapeError(fmt::format("{}: index {} into {}: fewer than 2^31 elements in each are supported", op,
                                 shape_str(index_shape), shape_str(out_shape)));
  return n;
}

// The privatized variant's view of a scatter along dim: [outer, extent, inner] positions into [outer, rows,
// inner], where the index has the output's shape outside dim; all zero (not such a scatter) otherwise.
cuda::DimScatter dim_scatter(const Shape& index_shape, int dim, const Shape& out_shape) {
  cuda::DimScatter g;
  for (std::size_t d = 0; d < out_shape.size(); ++d)
    if (static_cast<int>(d) != dim && index_shape[d] != out_shape[d]) return g;
  g.outer = g.inner = 1;
  for (int d = 0; d < dim; ++d) g.outer *= out_shape[d];
  for (std::size_t d = static_cast<std::size_t>(dim) + 1; d < out_shape.size(); ++d) g.inner *= out_shape[d];
  g.extent = index_shape[dim];
  g.rows = out_shape[dim];
  return g;
}

// A scatter of m rows of d floats into num_rows as the privatized scatter sees it (cuda::DimScatter).
cuda::DimScatter row_scatter(int64_t m, int64_t d, int64_t num_rows) {
  cuda::DimScatter g;
  g.outer = 1, g.extent = m, g.inner = d, g.rows = num_rows, g.index_per_row = true;
  return g;
}

// dsrc from dout, as a scatter's tape closure computes it (a gather: deterministic).
using GatherBack = std::function<Tensor(Context&, const Tensor& dout)>;

// out (out_shape: num_rows rows of d) = the scatter-add of src's m rows by index, under the layer's
// `scatter` knob; recorded on the tape with `back` as its backward. key_period_log2, dim and wide: see
// cuda::ScatterRows (scatter_dim_add's promise about its keys, or the privatized scatter's geometry and
// index words).
Var scatter_rows(Context& ctx, const std::string& layer, const std::string& op, const Var& src, const Tensor& index,
                 int64_t m, int64_t d, int64_t num_rows, const Shape& out_shape, int key_period_log2,
                 GatherBack back, const cuda::DimScatter& dim = {}, bool wide = false) {
  Tensor out = ctx.empty(out_shape);
  if (ctx.is_cuda()) {
    Tensor bad = ctx.zeros({1}, DType::I32);
    cuda::ScatterRows p;
    p.src = src.value().f32();
    p.index = index.i32();
    p.m = m;
    p.d = d;
    p.rows = num_rows;
    p.key_period_log2 = key_period_log2;
    p.dim = dim;
    p.wide = wide;
    run_scatter(ctx, layer, "scatter_add", op::scatter_add, p, out.f32(), bad.i32());
    cuda::poison_if_flagged(ctx, bad.i32(), out.f32(), out.numel());
  } else {
    check_range_cpu(index, num_rows, op);
    ref::scatter_add_rows(src.value().f32(), index.i32(), out.f32(), m, d, num_rows);
    record_planned(ctx, layer, "scatter_add", op::scatter_add);
  }

  const bool grad = needs_grad(ctx, {&src});
  Var y(std::move(out), grad);
  if (grad) {
    ctx.tape().record("scatter_add", layer, {{"src", src}, {"index", Var(index)}}, y, [src, y, back](Context& c) {
      if (!y.grad().defined()) return;
      accumulate_grad(c, src, back(c, y.grad()));
    });
  }
  return y;
}

}  // namespace

const char* bag_mode_name(BagMode m) { return m == BagMode::Sum ? "sum" : "mean"; }

Var scatter_add(Context& ctx, const std::string& layer, const Var& src, const Tensor& index, int64_t num_rows) {
  const std::string op = where("scatter_add", layer);
  check_f32_on(ctx, src.value(), op, "src");
  check_i32_on(ctx, index, op, "index");
  const Shape& ss = src.shape();
  if (ss.empty()) throw ShapeError(fmt::format("{}: src must have at least one dimension (the row)", op));
  if (index.ndim() != 1 || index.shape()[0] != ss[0])
    throw ShapeError(fmt::format("{}: index has shape {} but src has {} rows: one index per row of src expected", op,
                                 shape_str(index.shape()), ss[0]));
  const int64_t m = ss[0], d = row_width(ss);
  check_counts(op, m, num_rows);
  Shape out_shape = ss;
  out_shape[0] = num_rows;
  const Shape src_shape = ss;
  return scatter_rows(ctx, layer, op, src, index, m, d, num_rows, out_shape, 0,
                      [index, m, d, num_rows, src_shape](Context& c, const Tensor& dout) {
                        return gather_of(c, dout, index, m, d, num_rows, src_shape);
                      },
                      row_scatter(m, d, num_rows));
}

std::string scatter_rows_privatized_refusal(const Context& ctx, int64_t m, int64_t d, int64_t num_rows) {
  return ctx.is_cuda() ? privatized_refusal(ctx, row_scatter(m, d, num_rows)) : std::string();
}

Var scatter_dim_add(Context& ctx, const std::string& layer, const Var& src, const Tensor& index, bool wide,
                    const Shape& index_shape, int dim, const Shape& out_shape) {
  const std::string op = where("scatter_add", layer);
  const int64_t n = check_dim_geometry(op, index_shape, dim, out_shape);
  check_f32_on(ctx, src.value(), op, "src");
  check_i32_on(ctx, index, op, "index");
  if (src.value().numel() != n || index.numel() != (wide ? 2 * n : n))
    throw ShapeError(fmt::format("{}: src {} and index {} ({} words per element) for an index of shape {}: one "
                                 "value of each per index element",
                                 op, shape_str(src.shape()), shape_str(index.shape()), wide ? 2 : 1,
                                 shape_str(index_shape)));
  const int64_t total = shape_numel(out_shape);
  const Shape src_shape = src.shape();
  // The privatized scatter reads the index's values itself; run_scatter raises where it cannot run.
  if (ctx.is_cuda() && ctx.policy().variant<ScatterAlgo>(layer, op::scatter_add) == ScatterAlgo::Privatized)
    return scatter_rows(ctx, layer, op, src, index, n, 1, total, out_shape, 0,
                        [index, wide, index_shape, dim, src_shape](Context& c, const Tensor& dout) {
                          return gather_dim(c, dout, index, wide, index_shape, dim).reshape(src_shape);
                        },
                        dim_scatter(index_shape, dim, out_shape), wide);
  const Tensor keys = scatter_dim_keys(ctx, index, wide, index_shape, dim, out_shape);
  // Keys repeat their positions' coordinates after dim (index and output agree there), so their low bits
  // agree modulo the largest power of two dividing that inner extent (cuda::ScatterRows).
  int64_t inner = 1;
  bool same_inner = true;
  for (std::size_t d = static_cast<std::size_t>(dim) + 1; d < out_shape.size(); ++d) {
    inner *= out_shape[d];
    same_inner = same_inner && index_shape[d] == out_shape[d];
  }
  int period_log2 = 0;
  while (same_inner && inner > 0 && period_log2 < 30 && inner % (int64_t(2) << period_log2) == 0) ++period_log2;
  return scatter_rows(ctx, layer, op, src, keys, n, 1, total, out_shape, period_log2,
                      [keys, n, total, src_shape](Context& c, const Tensor& dout) {
                        return gather_of(c, dout, keys, n, 1, total, src_shape);
                      });
}

Tensor gather_dim(Context& ctx, const Tensor& table, const Tensor& index, bool wide, const Shape& index_shape,
                  int dim) {
  const std::string op = "gather_dim";
  const Shape& ts = table.shape();
  const int64_t n = check_dim_geometry(op, index_shape, dim, ts);
  check_f32_on(ctx, table, op, "table");
  check_i32_on(ctx, index, op, "index");
  if (index.numel() != (wide ? 2 * n : n))
    throw ShapeError(fmt::format("{}: {} words for an index of shape {} ({} per element)", op, index.numel(),
                                 shape_str(index_shape), wide ? 2 : 1));
  if (ctx.is_cuda() && privatized_refusal(ctx, dim_scatter(index_shape, dim, ts)).empty()) {
    Tensor out = ctx.empty(index_shape);
    cuda::gather_dim(ctx, table.f32(), index.i32(), wide, dim_scatter(index_shape, dim, ts), out.f32());
    return out;
  }
  const Tensor keys = scatter_dim_keys(ctx, index, wide, index_shape, dim, ts);
  return gather_of(ctx, table, keys, n, 1, table.numel(), index_shape);
}

std::string scatter_dim_privatized_refusal(const Context& ctx, const Shape& index_shape, int dim,
                                           const Shape& out_shape) {
  // A geometry no scatter takes is scatter_dim_add's error to raise, with its own words.
  try {
    check_dim_geometry("scatter_add", index_shape, dim, out_shape);
  } catch (const ShapeError& e) {
    return e.what();
  }
  return ctx.is_cuda() ? privatized_refusal(ctx, dim_scatter(index_shape, dim, out_shape)) : std::string();
}

Tensor scatter_dim_keys(Context& ctx, const Tensor& index, bool wide, const Shape& index_shape, int dim,
                        const Shape& out_shape) {
  const std::string op = "scatter_dim_keys";
  check_i32_on(ctx, index, op, "index");
  const int rank = static_cast<int>(out_shape.size());
  const int64_t n = check_dim_geometry(op, index_shape, dim, out_shape);
  if (index.numel() != (wide ? 2 * n : n))
    throw ShapeError(fmt::format("{}: {} words for an index of shape {} ({} per element)", op, index.numel(),
                                 shape_str(index_shape), wide ? 2 : 1));
  Tensor key = ctx.empty({n}, DType::I32);
  if (n == 0) return key;
  if (ctx.is_cuda()) {
    cuda::DimKeys k;
    k.rank = rank, k.dim = dim, k.wide = wide, k.extent = out_shape[dim], k.n = n;
    int64_t stride = 1;
    for (int d = rank - 1; d >= 0; --d) {
      k.ishape[d] = static_cast<uint32_t>(index_shape[d]);
      k.ostride[d] = stride;
      stride *= out_shape[d];
    }
    k.dim_stride = k.ostride[dim];
    cuda::scatter_dim_keys(ctx, index.i32(), k, key.i32());
    return key;
  }
  const int32_t* w = index.i32();
  const auto value = [&](int64_t e) { return wide ? detail::int64_of_words(w[2 * e], w[2 * e + 1]) : int64_t(w[e]); };
  ref::scatter_dim_keys(index_shape, out_shape, dim, value, key.i32());
  const int32_t* k = key.i32();
  for (int64_t e = 0; e < n; ++e)
    if (k[e] < 0)
      throw DataError(fmt::format("scatter along dim {}: index element {} (row-major in {}) is {}, outside [0, {})",
                                  dim, e, shape_str(index_shape), value(e), out_shape[dim]));
  return key;
}

Var embedding(Context& ctx, const std::string& layer, const Var& weight, const Tensor& index) {
  const std::string op = where("embedding", layer);
  check_f32_on(ctx, weight.value(), op, "weight");
  check_ndim(weight.value(), 2, op, "weight");
  check_i32_on(ctx, index, op, "index");
  const int64_t rows = weight.shape()[0], d = weight.shape()[1], m = index.numel();
  check_counts(op, m, rows);
  Shape out_shape = index.shape();
  out_shape.push_back(d);

  Tensor out = ctx.empty(out_shape);
  if (ctx.is_cuda()) {
    cuda::gather_rows(ctx, weight.value().f32(), index.i32(), out.f32(), m, d, rows);
  } else {
    check_range_cpu(index, rows, op);
    ref::gather_rows(weight.value().f32(), index.i32(), out.f32(), m, d);
  }
  record_planned(ctx, layer, "embedding", op::embedding);  // resolved now: a bad rule fails here

  const bool grad = needs_grad(ctx, {&weight});
  Var y(std::move(out), grad);
  if (grad) {
    ctx.tape().record("embedding", layer, {{"weight", weight}, {"index", Var(index)}}, y, [weight, index, y, layer, rows](Context& c) {
      if (!y.grad().defined()) return;
      accumulate_grad(c, weight, embedding_backward(c, layer, y.grad(), index, rows));
    });
  }
  return y;
}

Tensor gather_rows(Context& ctx, const Tensor& table, const Tensor& index) {
  const std::string op = "gather_rows";
  check_f32_on(ctx, table, op, "table");
  check_i32_on(ctx, index, op, "index");
  if (table.ndim() < 1) throw ShapeError(fmt::format("{}: table must have at least one dimension (the row)", op));
  const int64_t rows = table.shape()[0], d = row_width(table.shape()), m = index.numel();
  check_counts(op, m, rows);
  Shape out_shape = index.shape();
  out_shape.insert(out_shape.end(), table.shape().begin() + 1, table.shape().end());
  if (!ctx.is_cuda()) check_range_cpu(index, rows, op);
  return gather_of(ctx, table, index, m, d, rows, out_shape);
}

Tensor embedding_backward(Context& ctx, const std::string& layer, const Tensor& dy, const Tensor& index,
                          int64_t num_rows) {
  const std::string op = where("embedding backward", layer);
  check_f32_on(ctx, dy, op, "dy");
  check_i32_on(ctx, index, op, "index");
  const int64_t m = index.numel();
  check_counts(op, m, num_rows);
  Shape want = index.shape();
  if (dy.ndim() != index.ndim() + 1 || !std::equal(want.begin(), want.end(), dy.shape().begin()))
    throw ShapeError(fmt::format("{}: dy has shape {}, index {}: dy must be index's shape plus the row width", op,
                                 shape_str(dy.shape()), shape_str(index.shape())));
  const int64_t d = dy.shape().back();
  Tensor dw = ctx.empty({num_rows, d});
  if (ctx.is_cuda()) {
    cuda::ScatterRows p;
    p.src = dy.f32();
    p.index = index.i32();
    p.m = m;
    p.d = d;
    p.rows = num_rows;
    run_scatter(ctx, layer, "embedding", op::embedding, p, dw.f32(), nullptr);
  } else {
    check_range_cpu(index, num_rows, op);
    ref::scatter_add_rows(dy.f32(), index.i32(), dw.f32(), m, d, num_rows);
    record_planned(ctx, layer, "embedding", op::embedding);
  }
  return dw;
}

Var embedding_bag(Context& ctx, const std::string& layer, const Var& weight, const Tensor& index,
                  const Tensor& offsets, BagMode mode) {
  const std::string op = where("embedding_bag", layer);
  check_f32_on(ctx, weight.value(), op, "weight");
  check_ndim(weight.value(), 2, op, "weight");
  const BagShape bs = bag_shape(ctx, index, offsets, op);
  const int64_t rows = weight.shape()[0], d = weight.shape()[1];
  check_counts(op, bs.m, rows);
  const bool mean = mode == BagMode::Mean;

  Tensor out = ctx.empty({bs.bags, d});
  if (ctx.is_cuda()) {
    cuda::embedding_bag_fwd(ctx, weight.value().f32(), index.i32(), cuda_bags(bs, offsets), d, rows, mean, out.f32());
  } else {
    if (bs.has_offsets) check_offsets_cpu(offsets, bs.m, op);
    check_range_cpu(index, rows, op);
    ref::embedding_bag_fwd(weight.value().f32(), index.i32(), out.f32(), d, ref_bags(bs, offsets), mean);
  }
  record_planned(ctx, layer, "embedding_bag", op::embedding);

  const bool grad = needs_grad(ctx, {&weight});
  Var y(std::move(out), grad);
  if (grad) {
    ctx.tape().record("embedding_bag", layer, {{"weight", weight}, {"index", Var(index)}}, y,
                      [weight, index, offsets, y, layer, mode, rows](Context& c) {
                        if (!y.grad().defined()) return;
                        accumulate_grad(c, weight, embedding_bag_backward(c, layer, y.grad(), index, offsets, mode, rows));
                      });
  }
  return y;
}

Tensor embedding_bag_backward(Context& ctx, const std::string& layer, const Tensor& dy, const Tensor& index,
                              const Tensor& offsets, BagMode mode, int64_t num_rows) {
  const std::string op = where("embedding_bag backward", layer);
  check_f32_on(ctx, dy, op, "dy");
  const BagShape bs = bag_shape(ctx, index, offsets, op);
  check_counts(op, bs.m, num_rows);
  if (dy.ndim() != 2 || dy.shape()[0] != bs.bags)
    throw ShapeError(fmt::format("{}: dy has shape {} for {} bags: {{bags, D}} expected", op, shape_str(dy.shape()),
                                 bs.bags));
  const int64_t d = dy.shape()[1];
  const bool mean = mode == BagMode::Mean;
  Tensor dw = ctx.empty({num_rows, d});
  if (ctx.is_cuda()) {
    Tensor src_row = ctx.empty({bs.m}, DType::I32);
    Tensor src_scale = mean ? ctx.empty({bs.m}) : Tensor();
    cuda::embedding_bag_sources(ctx, cuda_bags(bs, offsets), mean, src_row.i32(), mean ? src_scale.f32() : nullptr);
    cuda::ScatterRows p;
    p.src = dy.f32();
    p.index = index.i32();
    p.src_row = src_row.i32();
    p.src_scale = mean ? src_scale.f32() : nullptr;
    p.m = bs.m;
    p.d = d;
    p.rows = num_rows;
    run_scatter(ctx, layer, "embedding_bag", op::embedding, p, dw.f32(), nullptr);
  } else {
    if (bs.has_offsets) check_offsets_cpu(offsets, bs.m, op);
    check_range_cpu(index, num_rows, op);
    ref::embedding_bag_bwd(dy.f32(), index.i32(), dw.f32(), d, num_rows, ref_bags(bs, offsets), mean);
    record_planned(ctx, layer, "embedding_bag", op::embedding);
  }
  return dw;
}

}  // namespace ditto
