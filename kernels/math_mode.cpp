#include "kernels/math_mode.h"

namespace ditto {

std::vector<VariantSpec> math_mode_variants() {
  return {{"fma", Guarantee::RunToRun, Impl::Library, "fp32 on FMA units"},
          {"tf32", Guarantee::RunToRun, Impl::Library, "inputs rounded to TF32 on tensor cores, fp32 accumulation"}};
}

const char* name_of(MathMode m) { return m == MathMode::Tf32 ? "tf32" : "fma"; }

}  // namespace ditto
