// Fully connected layer without bias: y = x w^T (bias is kernels/bias.h, bias_add).
//
// x is {N, in}, w is {out, in} (row-major, as stored by every ditto tensor), y is {N, out}.
// Backward: dx = dy w ({N, in}), dw = dy^T x ({out, in}); each only when its input requires grad.
//
// On CUDA all three products run on the context's stream through cuBLAS, with three knobs
// resolved per layer through the Policy and written to the Manifest:
//   precision fp32 -> float operands, CUBLAS_COMPUTE_32F with the handle's math mode set to
//                     CUBLAS_DEFAULT_MATH: IEEE fp32 multiply-adds, no TF32 down-conversion.
//                     (Not CUBLAS_COMPUTE_32F_PEDANTIC: pedantic mode is meant for numerical
//                     debugging and may force slower kernels; DEFAULT_MATH with COMPUTE_32F
//                     already excludes TF32, and the mode is set explicitly on every call so
//                     another user of the shared handle cannot leave TF32 switched on.)
//             tf32 -> CUBLAS_COMPUTE_32F_FAST_TF32: inputs rounded to TF32 (10-bit mantissa)
//                     on tensor cores, fp32 accumulation. Deterministic run to run, but its
//                     bits differ from fp32. With NVIDIA_TF32_OVERRIDE=0 in the environment
//                     (which turns TF32 off inside cuBLAS) a tf32 layer throws PolicyError
//                     rather than run fp32 under a tf32 label.
//        bf16/fp16 -> operands rounded to bf16/f16 (x and w once per forward, dy once per
//                     backward), CUBLAS_COMPUTE_32F: tensor-core products accumulated in fp32,
//                     the result rounded to bf16/f16 by cuBLAS and handed on widened to fp32
//                     (kernels/precision.h's rules).
//   cublas_atomics  off  -> CUBLAS_ATOMICS_NOT_ALLOWED (the context default). cuBLAS documents that
//                           with atomics disallowed every routine gives the same bits from run to
//                           run for identical parameters on the same hardware: Determinism yes.
//                   on   -> CUBLAS_ATOMICS_ALLOWED for this layer's calls. cuBLAS documents atomics
//                           alternatives only for some routines (symv/hemv are named; GEMM is not),
//                           and promises no bitwise reproducibility when they are allowed, so the
//                           manifest says Determinism unknown.
//   gemm      cublas    -> cublasGemmEx (the default): cuBLAS picks the algorithm per call, split-K
//                           included, and the manifest cannot say which ran.
//             cublaslt  -> cuBLASLt, with one algorithm per layer, product (y, dx, dw) and shape,
//                           fixed on first use: the heuristic's best among those that do not split
//                           K or that add the split parts' fp32 sums in a separate pass (reduction
//                           scheme compute_type; in-place and output-type reductions, which add in
//                           the output's type, are excluded and an algorithm using them is refused),
//                           at most 32 MiB of workspace. Every output element is then summed in the
//                           order the recorded algorithm fixes, and the manifest's entry for the
//                           layer and x shape names each product's algorithm (id, tile, stages,
//                           split-K, reduction). No algorithm for a shape is a PolicyError naming
//                           the layer; cublas_atomics=on pinned beside it is a contradiction
//                           (PolicyError), a mode's "on" yields.
//             ditto     -> ditto's fixed-order GEMM (kernels/detail/fixed_gemm.cuh), no library: every
//                           output is one thread's fmaf chain over k in ascending order, so a row's
//                           result does not depend on how many rows the batch has or where the row
//                           sits in it (batch-invariant), and is the same on any GPU (gpu_to_gpu).
//                           fp32 only (another precision pinned beside it is a PolicyError); slower
//                           than cuBLAS, so no mode picks it: a rule names it (batch-invariant
//                           evaluation, experiments/train.h).
// Both cuBLAS modes are set on ctx's cuBLAS handle for this layer's calls only and restored afterwards.
// Every GEMM of one layer runs on the context's single stream (cuBLAS's multi-stream workspace
// caveat does not apply).
//
// On the CPU the products are the double-accumulating reference (kernels/linear_ref.h), rounding
// its operands and results where bf16/fp16 say (every output summed in one order whatever the
// batch: batch-invariant too); cublas_atomics, gemm and tf32 do not apply there,
// and the manifest records variant "reference" for them.
#pragma once
#include <string>

#include "engine/context.h"
#include "engine/tape.h"
#include "engine/knob.h"
#include "kernels/precision.h"

namespace ditto {

namespace op { inline constexpr OpKind linear{"linear"}; }

// Knob linear.cublas_atomics (kernels/linear.cpp): whether cuBLAS may use atomics (split-K).
enum class CublasAtomics { Off, On };
const KnobSpec& linear_cublas_atomics_knob();
const char* name_of(CublasAtomics c);
inline const char* knob_name(CublasAtomics) { return "cublas_atomics"; }

// Knob linear.gemm (kernels/linear.cpp): which cuBLAS interface runs the GEMMs, and who picks
// their algorithm, or ditto's own fixed-order GEMM.
enum class LinearGemm { Cublas, Cublaslt, Ditto };
const KnobSpec& linear_gemm_knob();
const char* name_of(LinearGemm g);
inline const char* knob_name(LinearGemm) { return "gemm"; }

Var linear(Context& ctx, const std::string& layer, const Var& x, const Var& w);

}  // namespace ditto
