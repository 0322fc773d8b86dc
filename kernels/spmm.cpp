#include "kernels/spmm.h"

#include <cusparse.h>
#include <fmt/format.h>

#include <climits>
#include <memory>

#include "engine/detail/cuda_state.h"
#include "engine/error.h"
#include "engine/operand_check.h"
#include "kernels/detail/op_record.h"
#include "kernels/detail/spmm_cuda.h"
#include "kernels/spmm_ref.h"

namespace ditto {

namespace {
constexpr Guarantee kNot = Guarantee::NotGuaranteed, kRun = Guarantee::RunToRun, kGpu = Guarantee::GpuToGpu;
constexpr Impl kLib = Impl::Library, kOwn = Impl::Ditto;
}  // namespace

// cuSPARSE documents bit-wise reproducible SpMM for CSR only with CSR_ALG3, and says a
// transposed sparse operand may give different results between runs.
DITTO_KNOB(spmm_fwd_knob, {op::spmm, "fwd",
                           {{"ditto", kGpu, kOwn, "one thread per output adds its row in order"},
                            {"cusparse-default", kNot, kLib, "CUSPARSE_SPMM_ALG_DEFAULT"},
                            {"cusparse-alg1", kNot, kLib, "CUSPARSE_SPMM_CSR_ALG1"},
                            {"cusparse-alg2", kNot, kLib, "CUSPARSE_SPMM_CSR_ALG2"},
                            {"cusparse-alg3", kRun, kLib, "CUSPARSE_SPMM_CSR_ALG3"}},
                           "cusparse-default", false, "sparse x dense forward"})
DITTO_KNOB(spmm_bwd_knob, {op::spmm, "bwd",
                           {{"atomic", kNot, kOwn, "atomicAdd per nonzero"},
                            {"deterministic", kGpu, kOwn, "transposed structure, fixed-order row sums"},
                            {"cusparse", kNot, kLib, "cuSPARSE with the sparse operand transposed"}},
                           "cusparse", false, "the dense operand's gradient"})

const char* name_of(SpmmFwd v) { return variant_name(spmm_fwd_knob(), v); }
const char* name_of(SpmmBwd v) { return variant_name(spmm_bwd_knob(), v); }

namespace {

constexpr const char* kOp = "spmm";

// ---- cuSPARSE: a handle per context (kept in the context's op state), RAII descriptors ------
[[noreturn]] void throw_cusparse(cusparseStatus_t s, const char* expr, const char* file, int line) {
  throw CudaError(fmt::format("{}:{} {} failed: {} (cuSPARSE status {})", file, line, expr, cusparseGetErrorString(s),
                              int(s)));
}
#define DITTO_CUSPARSE_CHECK(expr)                                                  \
  do {                                                                              \
    cusparseStatus_t ditto_s_ = (expr);                                             \
    if (ditto_s_ != CUSPARSE_STATUS_SUCCESS) throw_cusparse(ditto_s_, #expr, __FILE__, __LINE__); \
  } while (0)

struct CusparseHandle {
  cusparseHandle_t h = nullptr;
  ~CusparseHandle() {
    if (h) cusparseDestroy(h);
  }
};

cusparseHandle_t cusparse_of(Context& ctx) {
  auto& slot = ctx.op_state("spmm.cusparse_handle");
  if (!slot) {
    auto handle = std::make_shared<CusparseHandle>();
    DITTO_CUSPARSE_CHECK(cusparseCreate(&handle->h));
    slot = handle;
  }
  cusparseHandle_t h = static_cast<CusparseHandle*>(slot.get())->h;
  DITTO_CUSPARSE_CHECK(cusparseSetStream(h, detail::stream_of(ctx)));
  return h;
}

struct SpMatDesc {
  cusparseConstSpMatDescr_t d = nullptr;
  explicit SpMatDesc(const CsrMatrix& a) {
    DITTO_CUSPARSE_CHECK(cusparseCreateConstCsr(&d, a.rows, a.cols, a.nnz(), a.row_ptr.raw(), a.col_idx.raw(),
                                                a.values.value().raw(), CUSPARSE_INDEX_32I, CUSPARSE_INDEX_32I,
                                                CUSPARSE_INDEX_BASE_ZERO, CUDA_R_32F));
  }
  ~SpMatDesc() { cusparseDestroySpMat(d); }
  SpMatDesc(const SpMatDesc&) = delete;
  SpMatDesc& operator=(const SpMatDesc&) = delete;
};

struct DnMatDesc {
  cusparseDnMatDescr_t d = nullptr;  // also passed where a const descriptor is expected
  DnMatDesc(int64_t rows, int64_t cols, const float* data) {
    DITTO_CUSPARSE_CHECK(cusparseCreateDnMat(&d, rows, cols, cols, const_cast<float*>(data), CUDA_R_32F,
                                             CUSPARSE_ORDER_ROW));
  }
  ~DnMatDesc() { cusparseDestroyDnMat(d); }
  DnMatDesc(const DnMatDesc&) = delete;
  DnMatDesc& operator=(const DnMatDesc&) = delete;
};

// C (op(A) rows x k) = op(A) B with cuSPARSE. A refusal of the algorithm for this shape
// (NOT_SUPPORTED, INVALID_VALUE) is a PolicyError listing the other variants.
std::size_t cusparse_spmm(Context& ctx, const std::string& where, const std::string& what,
                          const std::string& alternatives, cusparseOperation_t op_a, cusparseSpMMAlg_t alg,
                          const CsrMatrix& a, const float* b, int64_t b_rows, float* c, int64_t c_rows, int64_t k) {
  cusparseHandle_t h = cusparse_of(ctx);
  SpMatDesc ad(a);
  DnMatDesc bd(b_rows, k, b), cd(c_rows, k, c);
  const float one = 1.f, zero = 0.f;
  auto call = [&](cusparseStatus_t s, const char* expr) {
    if (s == CUSPARSE_STATUS_SUCCESS) return;
    if (s == CUSPARSE_STATUS_NOT_SUPPORTED || s == CUSPARSE_STATUS_INVALID_VALUE)
      throw PolicyError(fmt::format("{}: {} is not supported by cuSPARSE for A {}x{} ({} entries) times {}x{}: {} "
                                    "({}); supported variants: {}",
                                    where, what, a.rows, a.cols, a.nnz(), b_rows, k, cusparseGetErrorString(s), expr,
                                    alternatives));
    throw_cusparse(s, expr, __FILE__, __LINE__);
  };
  std::size_t bytes = 0;
  call(cusparseSpMM_bufferSize(h, op_a, CUSPARSE_OPERATION_NON_TRANSPOSE, &one, ad.d, bd.d, &zero, cd.d, CUDA_R_32F,
                               alg, &bytes),
       "cusparseSpMM_bufferSize");
  detail::Workspace ws(detail::cuda_state(ctx), bytes);
  detail::require_workspace(ws, where, what, alternatives);
  call(cusparseSpMM(h, op_a, CUSPARSE_OPERATION_NON_TRANSPOSE, &one, ad.d, bd.d, &zero, cd.d, CUDA_R_32F, alg,
                    ws.get()),
       "cusparseSpMM");
  return bytes;
}

cusparseSpMMAlg_t cusparse_alg(SpmmFwd v) {
  switch (v) {
    case SpmmFwd::CusparseAlg1: return CUSPARSE_SPMM_CSR_ALG1;
    case SpmmFwd::CusparseAlg2: return CUSPARSE_SPMM_CSR_ALG2;
    case SpmmFwd::CusparseAlg3: return CUSPARSE_SPMM_CSR_ALG3;
    default: return CUSPARSE_SPMM_ALG_DEFAULT;
  }
}

Determinism determinism_of(SpmmFwd v) {
  return v == SpmmFwd::Ditto || v == SpmmFwd::CusparseAlg3 ? Determinism::Yes : Determinism::No;
}
Determinism determinism_of(SpmmBwd v) { return v == SpmmBwd::Deterministic ? Determinism::Yes : Determinism::No; }

void record_fwd(Context& ctx, const std::string& layer, SpmmFwd v, const std::string& requested, std::size_t ws = 0) {
  detail::record_knob(ctx, layer, kOp, "fwd", name_of(v), requested, determinism_of(v),
                      v == SpmmFwd::Ditto ? Impl::Ditto : Impl::Library, ws);
}
void record_bwd(Context& ctx, const std::string& layer, SpmmBwd v, const std::string& requested, std::size_t ws = 0) {
  detail::record_knob(ctx, layer, kOp, "bwd", name_of(v), requested, determinism_of(v),
                      v == SpmmBwd::Cusparse ? Impl::Library : Impl::Ditto, ws);
}

ref::SpmmDims dims_of(const CsrMatrix& a, int64_t k) { return {a.rows, a.cols, k, a.nnz()}; }

void check_shapes(const Context* ctx, const CsrMatrix& a, const std::string& op) {
  if (a.rows < 0 || a.cols < 0 || a.rows > INT_MAX || a.cols > INT_MAX)
    throw ShapeError(fmt::format("{}: A is {}x{}; dimensions must be in [0, 2^31-1]", op, a.rows, a.cols));
  auto idx = [&](const Tensor& t, const Shape& s, const char* what) {
    if (!t.defined() || t.dtype() != DType::I32 || t.shape() != s)
      throw ShapeError(fmt::format("{}: A's {} must be i32 {}, is {}", op, what, shape_str(s),
                                   t.defined() ? std::string(dtype_name(t.dtype())) + " " + shape_str(t.shape())
                                               : "undefined"));
    if (ctx && t.device() != ctx->device())
      throw ShapeError(fmt::format("{}: A's {} is on {} but the context is on {}", op, what, t.device().str(),
                                   ctx->device().str()));
  };
  if (!a.col_idx.defined() || a.col_idx.ndim() != 1)
    throw ShapeError(fmt::format("{}: A's col_idx must be a 1-D i32 tensor", op));
  const int64_t nnz = a.col_idx.numel();
  if (nnz > INT_MAX) throw ShapeError(fmt::format("{}: A has {} entries, more than 2^31-1", op, nnz));
  idx(a.row_ptr, {a.rows + 1}, "row_ptr");
  idx(a.col_idx, {nnz}, "col_idx");
  if (!a.values.defined() || a.values.value().dtype() != DType::F32 || a.values.shape() != Shape{nnz})
    throw ShapeError(fmt::format("{}: A's values must be f32 {{{}}}", op, nnz));
  if (ctx && a.values.value().device() != ctx->device())
    throw ShapeError(fmt::format("{}: A's values are on {} but the context is on {}", op,
                                 a.values.value().device().str(), ctx->device().str()));
  if (a.t_row_ptr.defined() || a.t_col_idx.defined() || a.t_perm.defined()) {
    idx(a.t_row_ptr, {a.cols + 1}, "t_row_ptr");
    idx(a.t_col_idx, {nnz}, "t_col_idx");
    idx(a.t_perm, {nnz}, "t_perm");
  }
}

void check_structure(const CsrMatrix& a, const std::string& op) {
  const auto ptr = a.row_ptr.to_host_i32(), idx = a.col_idx.to_host_i32();
  const std::string problem = ref::csr_problem(ptr.data(), idx.data(), dims_of(a, 0));
  if (!problem.empty()) throw DataError(fmt::format("{}: A is not a valid CSR matrix: {}", op, problem));
}

}  // namespace

CsrMatrix csr_from_host(Context& ctx, int64_t rows, int64_t cols, const std::vector<int32_t>& row_ptr,
                        const std::vector<int32_t>& col_idx, const std::vector<float>& values,
                        bool values_require_grad) {
  if (static_cast<int64_t>(row_ptr.size()) != rows + 1 || values.size() != col_idx.size())
    throw ShapeError(fmt::format("csr_from_host: {} row pointers for {} rows (need rows + 1), {} values for {} column "
                                 "indices",
                                 row_ptr.size(), rows, values.size(), col_idx.size()));
  const ref::SpmmDims d{rows, cols, 0, static_cast<int64_t>(col_idx.size())};
  const std::string problem = ref::csr_problem(row_ptr.data(), col_idx.data(), d);
  if (!problem.empty()) throw DataError("csr_from_host: not a valid CSR matrix: " + problem);
  CsrMatrix a;
  a.rows = rows;
  a.cols = cols;
  a.row_ptr = ctx.from_host(row_ptr, {rows + 1});
  a.col_idx = ctx.from_host(col_idx, {d.nnz});
  a.values = Var(ctx.from_host(values, {d.nnz}), values_require_grad);
  return a;
}

void csr_check(const CsrMatrix& a) {
  check_shapes(nullptr, a, "csr_check");
  check_structure(a, "csr_check");
}

void csr_plan_transpose(Context& ctx, CsrMatrix& a) {
  check_shapes(&ctx, a, "csr_plan_transpose");
  const int64_t nnz = a.nnz();
  Tensor t_ptr = ctx.empty({a.cols + 1}, DType::I32), t_idx = ctx.empty({nnz}, DType::I32),
         t_perm = ctx.empty({nnz}, DType::I32);
  if (ctx.is_cuda()) {
    detail::Workspace ws(detail::cuda_state(ctx), cuda::csr_transpose_workspace(nnz, a.cols));
    detail::require_workspace(ws, "csr_plan_transpose", "the transpose plan", "none without it");
    cuda::csr_transpose(ctx, a.rows, a.cols, nnz, a.row_ptr.i32(), a.col_idx.i32(), t_ptr.i32(), t_idx.i32(),
                        t_perm.i32(), ws.get());
  } else {
    check_structure(a, "csr_plan_transpose");
    // A counting sort by column, entries in storage order: the same stable order as the GPU's.
    const int32_t *ptr = a.row_ptr.i32(), *idx = a.col_idx.i32();
    int32_t *tp = t_ptr.i32(), *ti = t_idx.i32(), *tq = t_perm.i32();
    std::vector<int64_t> fill(static_cast<std::size_t>(a.cols + 1), 0);
    for (int64_t e = 0; e < nnz; ++e) ++fill[idx[e] + 1];
    for (int64_t c = 0; c < a.cols; ++c) fill[c + 1] += fill[c];
    for (int64_t c = 0; c <= a.cols; ++c) tp[c] = static_cast<int32_t>(fill[c]);
    for (int64_t r = 0; r < a.rows; ++r)
      for (int64_t e = ptr[r]; e < ptr[r + 1]; ++e) {
        const int64_t p = fill[idx[e]]++;
        ti[p] = static_cast<int32_t>(r);
        tq[p] = static_cast<int32_t>(e);
      }
  }
  a.t_row_ptr = std::move(t_ptr);
  a.t_col_idx = std::move(t_idx);
  a.t_perm = std::move(t_perm);
}

namespace {

// C = A b by the layer's fwd variant; returns the workspace it took.
std::size_t spmm_forward(Context& ctx, const std::string& op, SpmmFwd fwd, const CsrMatrix& a, const Var& b,
                         const ref::SpmmDims& d, Tensor& c) {
  const int64_t k = d.k;
  if (!ctx.is_cuda()) {
    ref::spmm_fwd(a.row_ptr.i32(), a.col_idx.i32(), a.values.value().f32(), b.value().f32(), c.f32(), d);
  } else if (fwd == SpmmFwd::Ditto) {
    cuda::spmm_rows(ctx, a.rows, a.cols, k, d.nnz, a.row_ptr.i32(), a.col_idx.i32(), a.values.value().f32(), nullptr,
                    b.value().f32(), c.f32());
  } else if (c.numel() > 0 && d.nnz == 0) {
    DITTO_CUDA_CHECK(cudaMemsetAsync(c.raw(), 0, c.nbytes(), detail::stream_of(ctx)));
  } else if (c.numel() > 0) {
    return cusparse_spmm(ctx, op, fmt::format("fwd={}", name_of(fwd)), "ditto and the other cusparse-* ones",
                         CUSPARSE_OPERATION_NON_TRANSPOSE, cusparse_alg(fwd), a, b.value().f32(), a.cols, c.f32(),
                         a.rows, k);
  }
  return 0;
}

// db = A^T dc by the layer's bwd variant; returns the workspace it took.
std::size_t spmm_dense_grad(Context& cx, const std::string& op, SpmmBwd bwd, const CsrMatrix& a,
                            const Shape& b_shape, const ref::SpmmDims& d, const float* dc, Tensor& db) {
  if (!cx.is_cuda()) {
    db = cx.empty(b_shape);
    ref::spmm_bwd_dense(a.row_ptr.i32(), a.col_idx.i32(), a.values.value().f32(), dc, db.f32(), d);
    return 0;
  }
  if (bwd == SpmmBwd::Atomic) {
    db = cx.zeros(b_shape);
    cuda::spmm_scatter_atomic(cx, a.rows, a.cols, d.k, d.nnz, a.row_ptr.i32(), a.col_idx.i32(), a.values.value().f32(),
                              dc, db.f32());
    return 0;
  }
  if (bwd == SpmmBwd::Deterministic) {
    std::size_t ws_bytes = 0;
    db = cx.empty(b_shape);
    CsrMatrix plan = a;
    if (!plan.t_perm.defined()) {
      ws_bytes = cuda::csr_transpose_workspace(d.nnz, a.cols) + sizeof(int32_t) * (a.cols + 1 + 2 * d.nnz);
      csr_plan_transpose(cx, plan);
    }
    cuda::spmm_rows(cx, a.cols, a.rows, d.k, d.nnz, plan.t_row_ptr.i32(), plan.t_col_idx.i32(), a.values.value().f32(),
                    plan.t_perm.i32(), dc, db.f32());
    return ws_bytes;
  }
  db = cx.empty(b_shape);
  if (db.numel() > 0 && d.nnz == 0)
    DITTO_CUDA_CHECK(cudaMemsetAsync(db.raw(), 0, db.nbytes(), detail::stream_of(cx)));
  else if (db.numel() > 0)
    return cusparse_spmm(cx, op, "bwd=cusparse", "atomic, deterministic", CUSPARSE_OPERATION_TRANSPOSE,
                         CUSPARSE_SPMM_ALG_DEFAULT, a, dc, a.rows, db.f32(), a.cols, d.k);
  return 0;
}

}  // namespace

Var spmm(Context& ctx, const std::string& layer, const CsrMatrix& a, const Var& b) {
  const std::string op = detail::op_where(kOp, layer);
  check_shapes(&ctx, a, op);
  check_f32_on(ctx, b.value(), op, "b");
  check_ndim(b.value(), 2, op, "b");
  if (b.shape()[0] != a.cols)
    throw ShapeError(fmt::format("{}: A is {}x{} but b has shape {}: b needs {} rows", op, a.rows, a.cols,
                                 shape_str(b.shape()), a.cols));
  const int64_t k = b.shape()[1];
  const ref::SpmmDims d = dims_of(a, k);
  if (!ctx.is_cuda()) check_structure(a, op);

  const SpmmFwd fwd = ctx.policy().variant<SpmmFwd>(layer, op::spmm);
  const SpmmBwd bwd = ctx.policy().variant<SpmmBwd>(layer, op::spmm);
  const std::string fwd_req = ctx.policy().requested(layer, "fwd", op::spmm);
  const std::string bwd_req = ctx.policy().requested(layer, "bwd", op::spmm);

  Tensor c = ctx.empty({a.rows, k});
  const std::size_t ws_bytes = spmm_forward(ctx, op, fwd, a, b, d, c);
  record_fwd(ctx, layer, fwd, fwd_req, ws_bytes);
  record_bwd(ctx, layer, bwd, bwd_req);

  const Var& values = a.values;
  const bool grad = needs_grad(ctx, {&b, &values});
  Var out(std::move(c), grad);
  if (grad) {
    ctx.tape().record(kOp, layer, {{"values", values}, {"b", b}}, out, [a, b, out, d, bwd, bwd_req, layer, op](Context& cx) {
      if (!out.grad().defined()) return;
      const float* dc = out.grad().f32();
      Tensor db, dvals;
      if (b.requires_grad()) record_bwd(cx, layer, bwd, bwd_req, spmm_dense_grad(cx, op, bwd, a, b.shape(), d, dc, db));
      if (a.values.requires_grad()) {
        dvals = cx.empty(a.values.shape());
        if (cx.is_cuda())
          cuda::spmm_values_grad(cx, a.rows, a.cols, d.k, d.nnz, a.row_ptr.i32(), a.col_idx.i32(), b.value().f32(),
                                 dc, dvals.f32());
        else
          ref::spmm_bwd_values(a.row_ptr.i32(), a.col_idx.i32(), b.value().f32(), dc, dvals.f32(), d);
      }
      accumulate_grad(cx, b, std::move(db));
      accumulate_grad(cx, a.values, std::move(dvals));
    });
  }
  return out;
}

Tensor spmm_backward_dense(Context& ctx, const std::string& layer, const CsrMatrix& a, const Tensor& dc,
                           const Shape& b_shape) {
  const std::string op = detail::op_where(kOp, layer);
  check_shapes(&ctx, a, op);
  check_f32_on(ctx, dc, op, "dc");
  if (b_shape.size() != 2 || b_shape[0] != a.cols || dc.shape() != Shape{a.rows, b_shape[1]})
    throw ShapeError(fmt::format("{}: A is {}x{}, b {} and dc {}: b needs {} rows and dc is {{A's rows, b's columns}}",
                                 op, a.rows, a.cols, shape_str(b_shape), shape_str(dc.shape()), a.cols));
  const ref::SpmmDims d = dims_of(a, b_shape[1]);
  if (!ctx.is_cuda()) check_structure(a, op);
  const SpmmBwd bwd = ctx.policy().variant<SpmmBwd>(layer, op::spmm);
  const std::string bwd_req = ctx.policy().requested(layer, "bwd", op::spmm);
  Tensor db;
  record_bwd(ctx, layer, bwd, bwd_req, spmm_dense_grad(ctx, op, bwd, a, b_shape, d, dc.f32(), db));
  return db;
}

}  // namespace ditto
