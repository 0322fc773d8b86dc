#include "kernels/precision.h"

#include <fmt/format.h>

#include "engine/error.h"
#include "engine/tensor_ops.h"

namespace ditto {

std::vector<VariantSpec> precision_variants() {
  // bf16/fp16 run on the CPU too: its reference rounds where the GPU rounds.
  return {{"fp32", Guarantee::RunToRun, Impl::Library, "fp32 on FMA units"},
          {"tf32", Guarantee::RunToRun, Impl::Library, "inputs rounded to TF32 on tensor cores, fp32 accumulation"},
          {"bf16", Guarantee::RunToRun, Impl::Library,
           "inputs and output rounded to bf16, tensor cores, fp32 accumulation", true},
          {"fp16", Guarantee::RunToRun, Impl::Library,
           "inputs and output rounded to fp16, tensor cores, fp32 accumulation", true}};
}

const char* name_of(Precision p) {
  switch (p) {
    case Precision::Fp32: return "fp32";
    case Precision::Tf32: return "tf32";
    case Precision::Bf16: return "bf16";
    case Precision::Fp16: return "fp16";
  }
  return "?";
}

DType precision_dtype(Precision p) {
  return p == Precision::Bf16 ? DType::BF16 : p == Precision::Fp16 ? DType::F16 : DType::F32;
}

bool is_reduced(Precision p) { return p == Precision::Bf16 || p == Precision::Fp16; }

Precision parse_precision(const std::string& name) {
  for (Precision p : {Precision::Fp32, Precision::Tf32, Precision::Bf16, Precision::Fp16})
    if (name == name_of(p)) return p;
  throw PolicyError(fmt::format("unknown precision '{}'; precisions are fp32, tf32, bf16, fp16", name));
}

Tensor rounded_reference(Context& ctx, DType dtype, const Shape& shape, const std::function<void(float*)>& reference) {
  Tensor out = ctx.empty(shape);
  reference(out.f32());
  return to_dtype(ctx, out, dtype);
}

}  // namespace ditto
