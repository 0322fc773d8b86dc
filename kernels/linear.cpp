#include "kernels/linear.h"

#include <fmt/format.h>

#include <cublasLt.h>

#include <climits>
#include <cstdlib>
#include <map>
#include <memory>

#include "engine/detail/capture_gate.h"
#include "engine/detail/cuda_state.h"
#include "engine/profiler.h"
#include "engine/operand_check.h"
#include "engine/tensor_ops.h"
#include "kernels/detail/cublas_modes.h"
#include "kernels/detail/linear_cuda.h"
#include "kernels/linear_ref.h"

namespace ditto {

namespace {
constexpr Guarantee kNot = Guarantee::NotGuaranteed, kRun = Guarantee::RunToRun, kGpu = Guarantee::GpuToGpu;
constexpr Impl kLib = Impl::Library, kOwn = Impl::Ditto;
}  // namespace

DITTO_KNOB(linear_precision_knob, {op::linear, "precision", precision_variants(), "fp32", false,
                                   "where the GEMMs round: fp32, tf32, bf16, fp16 (PyTorch's matmul default is fp32)"})
DITTO_KNOB(linear_cublas_atomics_knob,
           {op::linear, "cublas_atomics",
            {{"off", kRun, kLib, "cuBLAS with atomics disallowed, its default"},
             {"on", kNot, kLib, "cuBLAS allowed atomics (split-K reductions in arrival order)"}},
            "off", false, "whether cuBLAS may reduce with atomics"})

DITTO_KNOB(linear_gemm_knob,
           {op::linear, "gemm",
            {{"cublas", kRun, kLib, "cublasGemmEx: cuBLAS picks its algorithm per call, split-K included"},
             {"cublaslt", kRun, kLib,
              "cuBLASLt with one algorithm per layer and shape, fixed on first use and recorded; split-K only "
              "with a separate fixed-order fp32 reduction, never in place or by atomics"},
             {"ditto", kGpu, kOwn,
              "ditto's fixed-order GEMM, no library: every output summed over k in ascending order, "
              "batch-invariant; fp32 only, asked for by name",
              false, /*by_name_only=*/true}},
            "cublas", false, "which interface runs the layer's GEMMs, and who picks their algorithm"})

const char* name_of(CublasAtomics c) { return variant_name(linear_cublas_atomics_knob(), c); }
const char* name_of(LinearGemm g) { return variant_name(linear_gemm_knob(), g); }

namespace {

struct GemmModes {
  Precision precision;
  CublasAtomics atomics;
  LinearGemm gemm = LinearGemm::Cublas;
};

// One GEMM of one shape under cuBLASLt: its descriptors and the algorithm fixed for it on first use.
struct LtPlan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  std::size_t workspace = 0;
  std::string description;  // the algorithm's configuration, as the manifest records it
  LtPlan() = default;
  LtPlan(const LtPlan&) = delete;
  LtPlan& operator=(const LtPlan&) = delete;
  ~LtPlan() {  // destructors do not throw; destroying live descriptors cannot fail
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

// A context's cuBLASLt handle and plans (ctx.op_state("linear.cublaslt")).
struct LtState {
  cublasLtHandle_t handle = nullptr;
  std::map<std::string, std::unique_ptr<LtPlan>> plans;
  int device = 0;
  ~LtState() {
    plans.clear();
    if (!handle) return;
    detail::DeviceSyncScope sync(device);  // the handle frees what it allocated: not during a capture
    cublasLtDestroy(handle);
  }
};

LtState& lt_state(Context& ctx) {
  auto& slot = ctx.op_state("linear.cublaslt");
  if (!slot) {
    auto st = std::make_shared<LtState>();
    st->device = ctx.device().index;
    detail::DeviceSyncScope sync(st->device);
    DITTO_CUBLAS_CHECK(cublasLtCreate(&st->handle));
    slot = st;
  }
  return *static_cast<LtState*>(slot.get());
}

// The largest workspace a cuBLASLt algorithm may ask for (split-K's fp32 parts live there); the
// cap keeps a layer's footprint known.
constexpr std::size_t kLtWorkspaceCap = std::size_t(32) << 20;

template <class T>
T algo_config(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoConfigAttributes_t attr) {
  T v{};
  std::size_t written = 0;
  DITTO_CUBLAS_CHECK(cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, &v, sizeof v, &written));
  return v;
}

cudaDataType_t cuda_type(Precision p) {
  return p == Precision::Bf16 ? CUDA_R_16BF : p == Precision::Fp16 ? CUDA_R_16F : CUDA_R_32F;
}

int as_int(int64_t v, const std::string& layer, const char* what) {
  if (v > INT_MAX)
    throw ShapeError(fmt::format("linear (layer '{}'): {} = {} exceeds cuBLAS's int range", layer, what, v));
  return static_cast<int>(v);
}

// Column-major C (m x n, leading dimension ldc) = op(A) op(B), op = transpose when ta / tb. A, B
// and C are in the precision's dtype; the sum is fp32 in every precision (COMPUTE_32F: bf16/f16
// products accumulate in fp32, and C is rounded once, at the end).
// Where one GEMM of a layer sits, for cuBLASLt's plan and the manifest: the product ("y", "dx",
// "dw") and the layer's x shape.
struct GemmSite {
  const std::string& layer;
  const char* product;
  const std::string& x_shape;
};

// The plan of one cuBLASLt GEMM, made on first use: the heuristic's best algorithm among those
// that either do not split K (reduction scheme none) or write each part's fp32 sums to the
// workspace and add them in a separate pass (compute_type), so every output element is summed in
// an order the recorded algorithm fixes. The in-place scheme (parts added into the output in its
// own, possibly bf16/f16, type) and output_type (parts rounded to the output type before they are
// added) are excluded. Errors name the layer and the product.
LtPlan& lt_plan(Context& ctx, const GemmSite& site, Precision precision, bool ta, bool tb, int64_t m, int64_t n,
                int64_t k, int64_t lda, int64_t ldb, int64_t ldc) {
  LtState& st = lt_state(ctx);
  const std::string key = fmt::format("{}{} {}x{}x{} {} {} {} {}", int(ta), int(tb), m, n, k, lda, ldb, ldc,
                                      name_of(precision));
  auto it = st.plans.find(key);
  if (it != st.plans.end()) return *it->second;
  auto plan = std::make_unique<LtPlan>();
  const cublasComputeType_t compute = precision == Precision::Tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  const cudaDataType_t type = cuda_type(precision);
  DITTO_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan->op, compute, CUDA_R_32F));
  const cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  DITTO_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
  DITTO_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
  // Column-major storage: op(A) is m x k, op(B) k x n, C m x n.
  DITTO_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->a, type, ta ? k : m, ta ? m : k, lda));
  DITTO_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->b, type, tb ? n : k, tb ? k : n, ldb));
  DITTO_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->c, type, m, n, ldc));
  cublasLtMatmulPreference_t pref = nullptr;
  DITTO_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t cap = kLtWorkspaceCap;
  const uint32_t schemes = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
  cublasLtMatmulHeuristicResult_t best{};
  int found = 0;
  cublasStatus_t status = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &cap, sizeof cap);
  if (status == CUBLAS_STATUS_SUCCESS)
    status = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &schemes,
                                                  sizeof schemes);
  if (status == CUBLAS_STATUS_SUCCESS)
    status = cublasLtMatmulAlgoGetHeuristic(st.handle, plan->op, plan->a, plan->b, plan->c, plan->c, pref, 1, &best,
                                            &found);
  cublasLtMatmulPreferenceDestroy(pref);
  const std::string what = fmt::format("linear (layer '{}'): gemm=cublaslt for {} (m {} n {} k {}, {})", site.layer,
                                       site.product, m, n, k, name_of(precision));
  if (status != CUBLAS_STATUS_SUCCESS && status != CUBLAS_STATUS_NOT_SUPPORTED)
    throw CublasError(fmt::format("{}: cuBLASLt's heuristic failed: {}", what, cublasGetStatusString(status)));
  if (found == 0 || best.state != CUBLAS_STATUS_SUCCESS)
    throw PolicyError(fmt::format("{}: cuBLASLt offers no algorithm without split-K or with a separate fp32 "
                                  "reduction within {} MiB of workspace; gemm=cublas runs this layer (cuBLAS's own pick)",
                                  what, kLtWorkspaceCap >> 20));
  plan->algo = best.algo;
  plan->workspace = best.workspaceSize;
  const auto id = algo_config<int32_t>(best.algo, CUBLASLT_ALGO_CONFIG_ID);
  const auto splitk = algo_config<int32_t>(best.algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM);
  const auto reduction = algo_config<uint32_t>(best.algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME);
  // An algorithm the preference excluded would sum in another way than the one promised: it is
  // refused rather than run.
  const bool unsplit = splitk <= 1 && reduction == CUBLASLT_REDUCTION_SCHEME_NONE;
  if (!unsplit && reduction != CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE)
    throw Error(fmt::format("{}: cuBLASLt returned algorithm {} with split-K {} and reduction scheme {}, which the "
                            "preference excluded",
                            what, id, splitk, reduction));
  plan->description =
      fmt::format("{}: id {} tile {} stages {} splitk {} reduction {} swizzle {} custom {} workspace {}", site.product,
                  id, algo_config<uint32_t>(best.algo, CUBLASLT_ALGO_CONFIG_TILE_ID),
                  algo_config<uint32_t>(best.algo, CUBLASLT_ALGO_CONFIG_STAGES_ID), splitk,
                  unsplit ? "none" : "fp32-separate",
                  algo_config<uint32_t>(best.algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING),
                  algo_config<uint32_t>(best.algo, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION), best.workspaceSize);
  return *st.plans.emplace(key, std::move(plan)).first->second;
}

// The manifest's entry for the layer and its x shape names every product's algorithm. Plans are
// shared by the layers of one shape and outlive a cleared manifest, so each call checks that its
// layer's entry names this product's algorithm (one lookup when it does).
void record_algorithm(Context& ctx, const GemmSite& site, Precision precision, const LtPlan& plan) {
  const ManifestEntry* prior = ctx.manifest().find(site.layer, "gemm", site.x_shape);
  if (prior && prior->algorithm.find(plan.description) != std::string::npos) return;
  ManifestEntry e{site.layer, "linear", "gemm", name_of(LinearGemm::Cublaslt),
                  ctx.policy().requested(site.layer, "gemm", op::linear), Determinism::Yes, name_of(precision), 0,
                  ctx.device().str(), site.x_shape, Guarantee::RunToRun};
  if (prior) e = *prior;
  e.algorithm = e.algorithm.empty() ? plan.description : e.algorithm + "; " + plan.description;
  e.workspace_bytes = std::max(e.workspace_bytes, plan.workspace);
  ctx.manifest().record(e);
}

void gemm(Context& ctx, const GemmSite& site, GemmModes modes, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
          const void* A, int64_t lda, const void* B, int64_t ldb, void* C, int64_t ldc) {
  const std::string& layer = site.layer;
  if (m == 0 || n == 0) return;
  auto& cs = detail::cuda_state(ctx);
  const DType dtype = precision_dtype(modes.precision);
  if (k == 0) {  // an empty sum: cuBLAS's k = 0 behaviour with beta = 0 is not something to lean on
    DITTO_CUDA_CHECK(cudaMemsetAsync(C, 0, dtype_size(dtype) * static_cast<size_t>(m * n), cs.stream));
    return;
  }
  if (modes.gemm == LinearGemm::Ditto) {  // fp32 only (linear() checks)
    cuda::linear_gemm_fixed(ctx, ta, tb, m, n, k, static_cast<const float*>(A), lda, static_cast<const float*>(B), ldb,
                            static_cast<float*>(C), ldc);
    return;
  }
  const float alpha = 1.0f, beta = 0.0f;
  if (modes.gemm == LinearGemm::Cublaslt) {
    LtPlan& plan = lt_plan(ctx, site, modes.precision, ta, tb, m, n, k, lda, ldb, ldc);
    record_algorithm(ctx, site, modes.precision, plan);
    detail::Workspace ws(cs, plan.workspace);
    if (!ws.ok())
      throw CudaError(fmt::format("linear (layer '{}'): gemm=cublaslt for {} needs {} bytes of workspace, which could "
                                  "not be allocated",
                                  layer, site.product, plan.workspace));
    DITTO_CUBLAS_CHECK(cublasLtMatmul(lt_state(ctx).handle, plan.op, &alpha, A, plan.a, B, plan.b, &beta, C, plan.c, C,
                                      plan.c, &plan.algo, ws.get(), plan.workspace, cs.stream));
    return;
  }
  detail::CublasModes guard(cs.cublas, modes.atomics == CublasAtomics::On);
  const cublasComputeType_t compute =
      modes.precision == Precision::Tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  const cudaDataType_t type = cuda_type(modes.precision);
  DITTO_CUBLAS_CHECK(cublasGemmEx(cs.cublas, ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                                  as_int(m, layer, "m"), as_int(n, layer, "n"), as_int(k, layer, "k"), &alpha, A,
                                  type, as_int(lda, layer, "lda"), B, type, as_int(ldb, layer, "ldb"), &beta, C, type,
                                  as_int(ldc, layer, "ldc"), compute, CUBLAS_GEMM_DEFAULT));
}

// A row-major {r, c} matrix is the column-major {c, r} matrix of its transpose (ld = c), so each
// row-major product below is written as the column-major product of transposes.

// y {N,out} = x {N,in} w^T:  y^T (out x N) = w_cm^T (out x in) * x_cm (in x N)
void gemm_fwd(Context& ctx, const std::string& layer, GemmModes md, const void* x, const void* w, void* y,
              int64_t n, int64_t in, int64_t out) {
  const std::string xs = shape_str({n, in});
  gemm(ctx, {layer, "y", xs}, md, true, false, out, n, in, w, in, x, in, y, out);
}
// dx {N,in} = dy {N,out} w {out,in}:  dx^T (in x N) = w_cm (in x out) * dy_cm (out x N)
void gemm_bwd_x(Context& ctx, const std::string& layer, GemmModes md, const void* dy, const void* w, void* dx,
                int64_t n, int64_t in, int64_t out) {
  const std::string xs = shape_str({n, in});
  gemm(ctx, {layer, "dx", xs}, md, false, false, in, n, out, w, in, dy, out, dx, in);
}
// dw {out,in} = dy^T x:  dw^T (in x out) = x_cm (in x N) * dy_cm^T (N x out)
void gemm_bwd_w(Context& ctx, const std::string& layer, GemmModes md, const void* dy, const void* x, void* dw,
                int64_t n, int64_t in, int64_t out) {
  const std::string xs = shape_str({n, in});
  gemm(ctx, {layer, "dw", xs}, md, false, true, in, out, n, x, in, dy, out, dw, in);
}

// An operand widened to float for the CPU reference (exact; the tensor itself when f32). The
// pointer stays valid to the end of the full expression that made it: the reference call.
const float* as_f32(Context& ctx, const Tensor& t, Tensor&& widened = Tensor()) {
  widened = to_dtype(ctx, t, DType::F32);
  return widened.f32();
}

// One product in the precision's dtype, handed on as `handed` (fp32, or the dtype of the variable
// a gradient belongs to): on CUDA `gpu` writes it (cuBLAS rounds its output), on the CPU
// `reference` writes it in float and it is rounded where cuBLAS rounds.
template <class Gpu, class Ref>
Tensor product(Context& ctx, DType dtype, const Shape& shape, DType handed, Gpu&& gpu, Ref&& reference) {
  if (!ctx.is_cuda()) return to_dtype(ctx, rounded_reference(ctx, dtype, shape, reference), handed);
  Tensor out = ctx.empty(shape, dtype);
  gpu(out.raw());
  return to_dtype(ctx, out, handed);
}

void record_manifest(Context& ctx, const std::string& layer, GemmModes md) {
  const Policy& p = ctx.policy();
  const std::string dev = ctx.device().str();
  if (!ctx.is_cuda()) {
    // The reference rounds where bf16/fp16 say (it does not emulate tf32).
    const bool rounds = is_reduced(md.precision);
    ctx.manifest().record({layer, "linear", "precision", rounds ? name_of(md.precision) : "reference",
                           p.requested(layer, "precision", op::linear), Determinism::Yes,
                           rounds ? name_of(md.precision) : "", 0, dev, "",
                           guarantee_of(Determinism::Yes, Impl::CpuReference)});
    for (const char* knob : {"cublas_atomics", "gemm"})
      ctx.manifest().record({layer, "linear", knob, "reference", p.requested(layer, knob, op::linear),
                             Determinism::Yes, "", 0, dev, "", guarantee_of(Determinism::Yes, Impl::CpuReference)});
    return;
  }
  // cuBLASLt's algorithms are recorded per shape as the layer first runs them (lt_plan).
  ctx.manifest().record({layer, "linear", "gemm", name_of(md.gemm), p.requested(layer, "gemm", op::linear),
                         Determinism::Yes, name_of(md.precision), 0, dev, "",
                         md.gemm == LinearGemm::Ditto ? Guarantee::GpuToGpu : Guarantee::RunToRun});
  // Every precision is run-to-run deterministic on one GPU (it changes the bits, not their
  // reproducibility); atomics allowed: cuBLAS promises nothing (see linear.h).
  ctx.manifest().record({layer, "linear", "precision", name_of(md.precision),
                         p.requested(layer, "precision", op::linear), Determinism::Yes, name_of(md.precision), 0, dev,
                         "", Guarantee::RunToRun});
  ctx.manifest().record({layer, "linear", "cublas_atomics", name_of(md.atomics),
                         p.requested(layer, "cublas_atomics", op::linear),
                         md.atomics == CublasAtomics::Off ? Determinism::Yes : Determinism::Unknown,
                         name_of(md.precision), 0, dev, "",
                         md.atomics == CublasAtomics::Off ? Guarantee::RunToRun : Guarantee::NotGuaranteed});
}

}  // namespace

Var linear(Context& ctx, const std::string& layer, const Var& x, const Var& w) {
  const std::string op = fmt::format("linear (layer '{}')", layer);
  check_float_on(ctx, x.value(), op, "x");
  check_float_on(ctx, w.value(), op, "w");
  check_ndim(x.value(), 2, op, "x");
  check_ndim(w.value(), 2, op, "w");
  if (x.shape()[1] != w.shape()[1])
    throw ShapeError(fmt::format("{}: x has shape {} and w has shape {}: x's dim 1 (in features) must equal "
                                 "w's dim 1",
                                 op, shape_str(x.shape()), shape_str(w.shape())));
  const int64_t n = x.shape()[0], in = x.shape()[1], out = w.shape()[0];
  GemmModes md{ctx.policy().variant<Precision>(layer, op::linear),
               ctx.policy().variant<CublasAtomics>(layer, op::linear),
               ctx.policy().variant<LinearGemm>(layer, op::linear)};
  // cuBLASLt has no atomics mode and ditto excludes its split-K: atomics allowed by a pin cannot
  // apply, so the two pins contradict each other; a mode's pick of atomics yields to the pinned
  // interface, and the manifest records what ran (off).
  if (md.gemm != LinearGemm::Cublas && md.atomics == CublasAtomics::On) {
    if (ctx.policy().requested(layer, "cublas_atomics", op::linear) == select_mode_name(SelectMode::Pinned))
      throw PolicyError(fmt::format("{}: cublas_atomics=on applies to gemm=cublas; gemm={} runs without split-K "
                                    "or atomics. Pin one of them",
                                    op, name_of(md.gemm)));
    md.atomics = CublasAtomics::Off;
  }
  // ditto's GEMM reads and writes float and multiplies in fp32: under another precision it would
  // not round where the layer says.
  if (ctx.is_cuda() && md.gemm == LinearGemm::Ditto && md.precision != Precision::Fp32)
    throw PolicyError(fmt::format("{}: gemm=ditto computes in fp32, but the layer's precision is {}; supported under {}: "
                                  "cublas, cublaslt (or pin precision=fp32)",
                                  op, name_of(md.precision), name_of(md.precision)));
  // NVIDIA_TF32_OVERRIDE=0 turns TF32 off inside NVIDIA's libraries: a pinned tf32 would silently
  // run as fp32 while the manifest said tf32.
  if (ctx.is_cuda() && md.precision == Precision::Tf32) {
    const char* env = std::getenv("NVIDIA_TF32_OVERRIDE");
    if (env && std::string(env) == "0")
      throw PolicyError(fmt::format("{}: precision=tf32 cannot run while NVIDIA_TF32_OVERRIDE=0 disables TF32 in "
                                    "cuBLAS; unset it or use precision=fp32",
                                    op));
  }
  record_manifest(ctx, layer, md);

  // Rounded once: the forward reads these, backward the same (kernels/precision.h's rules).
  const DType dtype = precision_dtype(md.precision);
  const Tensor xr = to_dtype(ctx, x.value(), dtype), wr = to_dtype(ctx, w.value(), dtype);
  Tensor y;
  {
    ProfileScope timed(ctx, ProfileKind::LinearFwd);
    y = product(ctx, dtype, {n, out}, DType::F32, [&](void* yp) { gemm_fwd(ctx, layer, md, xr.raw(), wr.raw(), yp, n, in, out); },
                [&](float* yp) { ref::linear_fwd(as_f32(ctx, xr), as_f32(ctx, wr), yp, n, in, out); });
  }

  bool grad = needs_grad(ctx, {&x, &w});
  Var result(std::move(y), grad);
  if (grad) {
    // dW reads x, dX reads w: each is kept only when that gradient is wanted.
    Tensor saved_x = w.requires_grad() ? xr : Tensor();
    Tensor saved_w = x.requires_grad() ? wr : Tensor();
    // dx comes in x's dtype (a bf16 x, e.g. flattened native activations, gets a bf16 gradient),
    // dw in the fp32 master's.
    ctx.tape().record("linear", layer, {{"x", x}, {"w", w}}, result,
                      [saved_x, saved_w, xr = x.grad_ref(), wr = w.grad_ref(), outr = result.grad_ref(), layer, md, n,
                       in, o = out, dtype, x_dtype = x.value().dtype(), w_dtype = w.value().dtype()](Context& c) {
      if (!outr.grad().defined()) return;
      Tensor dx, dw;
      {
        ProfileScope timed(c, ProfileKind::LinearBwd);
        const Tensor dy = to_dtype(c, outr.grad(), dtype);
        if (xr.requires_grad())
          dx = product(c, dtype, {n, in}, x_dtype, [&](void* p) { gemm_bwd_x(c, layer, md, dy.raw(), saved_w.raw(), p, n, in, o); },
                       [&](float* p) { ref::linear_bwd_x(as_f32(c, dy), as_f32(c, saved_w), p, n, in, o); });
        if (wr.requires_grad())
          dw = product(c, dtype, {o, in}, w_dtype, [&](void* p) { gemm_bwd_w(c, layer, md, dy.raw(), saved_x.raw(), p, n, in, o); },
                       [&](float* p) { ref::linear_bwd_w(as_f32(c, dy), as_f32(c, saved_x), p, n, in, o); });
      }
      accumulate_grad(c, xr, std::move(dx));
      accumulate_grad(c, wr, std::move(dw));
    });
  }
  return result;
}

}  // namespace ditto
