// Internal: the manifest entry of a knob whose every GPU variant is one of ditto's own kernels
// (the scatter, upsample, pixel_xent and reduction families). On a CUDA context the
// variant that ran is recorded with its label: deterministic variants are fixed-order kernels
// whose grids follow the tensor shape alone (gpu_to_gpu), the others add with atomics
// (not_guaranteed). On a CPU context the double-accumulating reference ran whatever the policy
// asked, and the entry says so: variant "cpu-reference", run_to_run.
#pragma once
#include <cstddef>
#include <string>

#include "engine/context.h"
#include "engine/manifest.h"

namespace ditto::detail {

inline void record_own_knob(Context& ctx, const std::string& layer, const char* op, const char* knob,
                            const char* variant, const std::string& requested, bool deterministic,
                            std::size_t workspace_bytes = 0) {
  if (!ctx.is_cuda()) {
    ctx.manifest().record({layer, op, knob, "cpu-reference", requested, Determinism::Yes, "", 0, ctx.device().str(),
                           "", guarantee_of(Determinism::Yes, Impl::CpuReference)});
    return;
  }
  const Determinism d = deterministic ? Determinism::Yes : Determinism::No;
  ctx.manifest().record({layer, op, knob, variant, requested, d, "", workspace_bytes, ctx.device().str(), "",
                         guarantee_of(d, Impl::Ditto)});
}

}  // namespace ditto::detail
