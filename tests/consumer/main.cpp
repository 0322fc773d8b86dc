// Builds against the installed headers only: a policy, a tiny CPU computation with a tape,
// and the manifest. Exits non-zero if anything is off.
#include <engine/context.h>
#include <engine/error.h>
#include <kernels/elementwise.h>

#include <cstdio>

int main() {
  ditto::Policy policy = ditto::Policy::parse({"*=deterministic", "conv1.bwd_filter=algo0"});
  if (policy.conv_bwd_filter("conv1").mode != ditto::SelectMode::Pinned) return 1;
  ditto::Context ctx(ditto::Device::cpu(), policy);
  ditto::Var a(ctx.from_host(std::vector<float>{1, 2, 3}, {3}), true);
  ditto::Var b(ctx.from_host(std::vector<float>{4, 5, 6}, {3}), true);
  ditto::Var y = ditto::add(ctx, a, ditto::add(ctx, a, b));  // a used twice: gradient 2
  ctx.tape().backward(ctx, y);
  auto ga = a.grad().to_host_f32();
  if (ga[0] != 2.0f || ga[2] != 2.0f) return 2;
  try {
    ditto::Policy::parse({"conv1.bwd_filter=algo9"});
    return 3;
  } catch (const ditto::PolicyError&) {
  }
  std::printf("consumer ok: fingerprint %s\n", ditto::hex64(y.value().fingerprint()).c_str());
  return 0;
}
