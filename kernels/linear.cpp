#include "kernels/linear.h"

#include <fmt/format.h>

#include <climits>
#include <cstdlib>

#include "engine/detail/cuda_state.h"
#include "engine/profiler.h"
#include "engine/operand_check.h"
#include "kernels/detail/cublas_modes.h"
#include "kernels/linear_ref.h"

namespace ditto {

namespace {
constexpr Guarantee kNot = Guarantee::NotGuaranteed, kRun = Guarantee::RunToRun, kGpu = Guarantee::GpuToGpu;
constexpr Impl kLib = Impl::Library, kOwn = Impl::Ditto;
}  // namespace

DITTO_KNOB(linear_math_knob, {op::linear, "math", math_mode_variants(), "fma", false,
                              "fp32 FMA or TF32 tensor cores for the GEMMs (PyTorch's matmul default is fma)"})
DITTO_KNOB(linear_cublas_atomics_knob,
           {op::linear, "cublas_atomics",
            {{"off", kRun, kLib, "cuBLAS with atomics disallowed, its default"},
             {"on", kNot, kLib, "cuBLAS allowed atomics (split-K reductions in arrival order)"}},
            "off", false, "whether cuBLAS may reduce with atomics"})

const char* name_of(CublasAtomics c) { return variant_name(linear_cublas_atomics_knob(), c); }

namespace {

struct GemmModes {
  MathMode math;
  CublasAtomics atomics;
};

int as_int(int64_t v, const std::string& layer, const char* what) {
  if (v > INT_MAX)
    throw ShapeError(fmt::format("linear (layer '{}'): {} = {} exceeds cuBLAS's int range", layer, what, v));
  return static_cast<int>(v);
}

// Column-major C (m x n, leading dimension ldc) = op(A) op(B), op = transpose when ta / tb.
void gemm(Context& ctx, const std::string& layer, GemmModes modes, bool ta, bool tb, int64_t m, int64_t n,
          int64_t k, const float* A, int64_t lda, const float* B, int64_t ldb, float* C, int64_t ldc) {
  if (m == 0 || n == 0) return;
  auto& cs = detail::cuda_state(ctx);
  if (k == 0) {  // an empty sum: cuBLAS's k = 0 behaviour with beta = 0 is not something to lean on
    DITTO_CUDA_CHECK(cudaMemsetAsync(C, 0, sizeof(float) * static_cast<size_t>(m * n), cs.stream));
    return;
  }
  detail::CublasModes guard(cs.cublas, modes.atomics == CublasAtomics::On);
  const float alpha = 1.0f, beta = 0.0f;
  cublasComputeType_t compute = modes.math == MathMode::Tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  DITTO_CUBLAS_CHECK(cublasGemmEx(cs.cublas, ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                                  as_int(m, layer, "m"), as_int(n, layer, "n"), as_int(k, layer, "k"), &alpha, A,
                                  CUDA_R_32F, as_int(lda, layer, "lda"), B, CUDA_R_32F, as_int(ldb, layer, "ldb"),
                                  &beta, C, CUDA_R_32F, as_int(ldc, layer, "ldc"), compute, CUBLAS_GEMM_DEFAULT));
}

// A row-major {r, c} matrix is the column-major {c, r} matrix of its transpose (ld = c), so each
// row-major product below is written as the column-major product of transposes.

// y {N,out} = x {N,in} w^T:  y^T (out x N) = w_cm^T (out x in) * x_cm (in x N)
void gemm_fwd(Context& ctx, const std::string& layer, GemmModes md, const float* x, const float* w, float* y,
              int64_t n, int64_t in, int64_t out) {
  gemm(ctx, layer, md, true, false, out, n, in, w, in, x, in, y, out);
}
// dx {N,in} = dy {N,out} w {out,in}:  dx^T (in x N) = w_cm (in x out) * dy_cm (out x N)
void gemm_bwd_x(Context& ctx, const std::string& layer, GemmModes md, const float* dy, const float* w, float* dx,
                int64_t n, int64_t in, int64_t out) {
  gemm(ctx, layer, md, false, false, in, n, out, w, in, dy, out, dx, in);
}
// dw {out,in} = dy^T x:  dw^T (in x out) = x_cm (in x N) * dy_cm^T (N x out)
void gemm_bwd_w(Context& ctx, const std::string& layer, GemmModes md, const float* dy, const float* x, float* dw,
                int64_t n, int64_t in, int64_t out) {
  gemm(ctx, layer, md, false, true, in, out, n, x, in, dy, out, dw, in);
}

void record_manifest(Context& ctx, const std::string& layer, GemmModes md) {
  const Policy& p = ctx.policy();
  const std::string dev = ctx.device().str();
  if (!ctx.is_cuda()) {
    for (const char* knob : {"math", "cublas_atomics"})
      ctx.manifest().record({layer, "linear", knob, "reference", p.requested(layer, knob, op::linear),
                             Determinism::Yes, "", 0, dev, "", guarantee_of(Determinism::Yes, Impl::CpuReference)});
    return;
  }
  // Both math modes are run-to-run deterministic on one GPU (TF32 changes the bits, not their
  // reproducibility); atomics allowed: cuBLAS promises nothing (see linear.h).
  ctx.manifest().record({layer, "linear", "math", name_of(md.math), p.requested(layer, "math", op::linear),
                         Determinism::Yes, name_of(md.math), 0, dev, "", Guarantee::RunToRun});
  ctx.manifest().record({layer, "linear", "cublas_atomics", name_of(md.atomics),
                         p.requested(layer, "cublas_atomics", op::linear),
                         md.atomics == CublasAtomics::Off ? Determinism::Yes : Determinism::Unknown,
                         name_of(md.math), 0, dev, "",
                         md.atomics == CublasAtomics::Off ? Guarantee::RunToRun : Guarantee::NotGuaranteed});
}

}  // namespace

Var linear(Context& ctx, const std::string& layer, const Var& x, const Var& w) {
  const std::string op = fmt::format("linear (layer '{}')", layer);
  check_f32_on(ctx, x.value(), op, "x");
  check_f32_on(ctx, w.value(), op, "w");
  check_ndim(x.value(), 2, op, "x");
  check_ndim(w.value(), 2, op, "w");
  if (x.shape()[1] != w.shape()[1])
    throw ShapeError(fmt::format("{}: x has shape {} and w has shape {}: x's dim 1 (in features) must equal "
                                 "w's dim 1",
                                 op, shape_str(x.shape()), shape_str(w.shape())));
  const int64_t n = x.shape()[0], in = x.shape()[1], out = w.shape()[0];
  const GemmModes md{ctx.policy().variant<MathMode>(layer, op::linear), ctx.policy().variant<CublasAtomics>(layer, op::linear)};
  // NVIDIA_TF32_OVERRIDE=0 turns TF32 off inside NVIDIA's libraries: a pinned tf32 would silently
  // run as fma while the manifest said tf32.
  if (ctx.is_cuda() && md.math == MathMode::Tf32) {
    const char* env = std::getenv("NVIDIA_TF32_OVERRIDE");
    if (env && std::string(env) == "0")
      throw PolicyError(fmt::format("{}: math=tf32 cannot run while NVIDIA_TF32_OVERRIDE=0 disables TF32 in "
                                    "cuBLAS; unset it or use math=fma",
                                    op));
  }
  record_manifest(ctx, layer, md);

  Tensor y = ctx.empty({n, out});
  {
    ProfileScope timed(ctx, ProfileKind::LinearFwd);
    if (ctx.is_cuda())
      gemm_fwd(ctx, layer, md, x.value().f32(), w.value().f32(), y.f32(), n, in, out);
    else
      ref::linear_fwd(x.value().f32(), w.value().f32(), y.f32(), n, in, out);
  }

  bool grad = needs_grad(ctx, {&x, &w});
  Var result(std::move(y), grad);
  if (grad) {
    // dW reads x, dX reads w: each is kept only when that gradient is wanted.
    Tensor saved_x = w.requires_grad() ? x.value() : Tensor();
    Tensor saved_w = x.requires_grad() ? w.value() : Tensor();
    ctx.tape().record("linear", layer, {{"x", x}, {"w", w}}, result,
                      [saved_x, saved_w, xr = x.grad_ref(), wr = w.grad_ref(), outr = result.grad_ref(), layer, md, n,
                       in, o = out](Context& c) {
      if (!outr.grad().defined()) return;
      const float* dy = outr.grad().f32();
      Tensor dx, dw;
      {
        ProfileScope timed(c, ProfileKind::LinearBwd);
        if (xr.requires_grad()) {
          dx = c.empty({n, in});
          if (c.is_cuda())
            gemm_bwd_x(c, layer, md, dy, saved_w.f32(), dx.f32(), n, in, o);
          else
            ref::linear_bwd_x(dy, saved_w.f32(), dx.f32(), n, in, o);
        }
        if (wr.requires_grad()) {
          dw = c.empty({o, in});
          if (c.is_cuda())
            gemm_bwd_w(c, layer, md, dy, saved_x.f32(), dw.f32(), n, in, o);
          else
            ref::linear_bwd_w(dy, saved_x.f32(), dw.f32(), n, in, o);
        }
      }
      accumulate_grad(c, xr, std::move(dx));
      accumulate_grad(c, wr, std::move(dw));
    });
  }
  return result;
}

}  // namespace ditto
