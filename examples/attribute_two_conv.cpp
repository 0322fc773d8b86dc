// Which kernel of a two-conv network makes identical runs drift apart? Every candidate (each
// layer's knob that has a nondeterministic variant) runs alone in an otherwise deterministic
// network, 3 replicas each, 30 steps on the built-in synthetic data; the table ranks them.
//   attribute_two_conv [--device auto|cpu|cuda] [--steps N]
#include <CLI/CLI.hpp>
#include <cstdio>

#include "ditto/experiments.h"

int main(int argc, char** argv) {
  CLI::App app{"attribute the run-to-run noise of a two-conv network to its kernels"};
  ditto::TrainConfig cfg;
  cfg.model = "two-conv";
  cfg.dataset = "synthetic";
  cfg.device = "auto";
  cfg.max_steps = 30;
  app.add_option("--device", cfg.device, "auto, cpu or cuda[:N]");
  app.add_option("--steps", cfg.max_steps, "training steps per replica")->check(CLI::Range(1, 100000));
  CLI11_PARSE(app, argc, argv);
  try {
    cfg.device = ditto::resolve_device(cfg.device);
    const bool gpu = cfg.device != "cpu";
    cfg.synthetic_train = gpu ? 4096 : 512;  // the CPU runs the double-checked reference ops
    cfg.synthetic_size = gpu ? 32 : 16;
    cfg.batch_size = gpu ? 128 : 32;
    cfg.lr = 2e-3f;
    cfg.progress = false;

    ditto::AttributeOptions opts;
    opts.replicas = 3;
    opts.l2_steps = {1, 10};
    auto candidates = ditto::model_candidates(cfg.model, 10, 3, cfg.synthetic_size, /*groups=*/false);
    auto result = ditto::attribute(cfg, candidates, opts);
    std::printf("%s", ditto::format_attribution(result).c_str());
    for (const auto& row : result.rows)
      if (row.kind != "baseline" && row.diverged())
        std::printf("noisy: %-28s first differs after step %lld, weight L2 after step 1: %.3g\n", row.name.c_str(),
                    (long long)row.first_divergence_step, row.l2_at.front().second);
    if (!gpu) std::printf("(on the CPU every op has one code path, so nothing diverges: run it on a GPU)\n");
  } catch (const ditto::Error& e) {
    std::fprintf(stderr, "attribute_two_conv: %s\n", e.what());
    return 1;
  }
}
