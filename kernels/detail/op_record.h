// Internal: what the sampler, ROI, CTC and sparse op families (grid_sample, affine_grid, roi_align, ctc_loss, spmm)
// share: the "op (layer 'name')" prefix of their messages, the manifest entry of one knob, and the
// error for a workspace that cannot be allocated.
#pragma once
#include <fmt/format.h>

#include <cstddef>
#include <string>

#include "engine/context.h"
#include "engine/detail/cuda_state.h"
#include "engine/error.h"
#include "engine/manifest.h"

namespace ditto::detail {

inline std::string op_where(const char* op, const std::string& layer) {
  return layer.empty() ? std::string(op) : fmt::format("{} (layer '{}')", op, layer);
}

// On a CUDA context: the variant that ran, with its label and who implements it. On the CPU the
// double-accumulating reference runs whatever the policy asked, recorded as "cpu-reference".
inline void record_knob(Context& ctx, const std::string& layer, const char* op, const char* knob,
                        const char* variant, const std::string& requested, Determinism d, Impl impl,
                        std::size_t workspace_bytes = 0) {
  if (ctx.is_cuda())
    ctx.manifest().record({layer, op, knob, variant, requested, d, "", workspace_bytes, ctx.device().str(), "",
                           guarantee_of(d, impl)});
  else
    ctx.manifest().record({layer, op, knob, "cpu-reference", requested, Determinism::Yes, "", 0,
                           ctx.device().str(), "", guarantee_of(Determinism::Yes, Impl::CpuReference)});
}

// A variant's workspace that the pool cannot give is a PolicyError naming the op, the variant,
// the size and what else would run.
inline void require_workspace(const Workspace& ws, const std::string& where, const std::string& knob_variant,
                              const std::string& alternatives) {
  if (!ws.ok())
    throw PolicyError(fmt::format("{}: {} needs a workspace of {} bytes, which could not be allocated; {}", where,
                                  knob_variant, ws.bytes(), alternatives));
}

// A cuDNN call of a pinned variant that cuDNN refuses for this shape (NOT_SUPPORTED or BAD_PARAM)
// is a PolicyError naming the op, what was asked and the variants that do run; other failures stay
// CudnnErrors.
inline void cudnn_variant_check(cudnnStatus_t s, const char* expr, const std::string& where, const std::string& what,
                                const std::string& alternatives, const char* file, int line) {
  if (s == CUDNN_STATUS_SUCCESS) return;
  const int category = int(s) / 1000 * 1000;
  if (category == CUDNN_STATUS_NOT_SUPPORTED || category == CUDNN_STATUS_BAD_PARAM)
    throw PolicyError(fmt::format("{}: {} is not supported by cuDNN here ({}: {}); supported variants: {}", where,
                                  what, expr, cudnnGetErrorString(s), alternatives));
  throw_cudnn(s, expr, file, line);
}

}  // namespace ditto::detail

#define DITTO_CUDNN_VARIANT(expr, where, what, alternatives) \
  ::ditto::detail::cudnn_variant_check((expr), #expr, (where), (what), (alternatives), __FILE__, __LINE__)
