// ditto-train: trains one of the paper's networks with every source of randomness either fixed
// or recorded. See experiments/train.h for what is written to --out.
#include <cstdio>

#include "ditto/experiments.h"
#include "experiments/cli.h"
#include "experiments/task_scoring.h"

int main(int argc, char** argv) {
  ditto::TrainConfig c;
  ditto::TrainFlags flags;
  CLI::App app{"ditto-train: replayable training runs for determinism studies"};
  app.set_help_all_flag("--help-all");
  ditto::add_train_flags(app, c, flags);
  CLI11_PARSE(app, argc, argv);
  try {
    ditto::apply_train_flags(c, flags, argc, argv);
    auto r = ditto::train(c);
    if (r.rank != 0) {
      // --dp-launch: rank 0 evaluated the weights every rank holds and wrote the run. (This rank's
      // batch-norm running statistics are not rank 0's, which follow group 0 alone: its whole-state
      // fingerprint is not the run's.)
      std::printf("rank %d: trained %lld steps; its parameters equalled rank 0's after every epoch (rank 0 evaluated "
                  "and wrote the run)\n",
                  r.rank, (long long)r.steps);
      return 0;
    }
    const std::string score = r.task == ditto::Task::Classification ? "top-1" : ditto::primary_score(r.task);
    std::printf("final test %s %.4f, weights fingerprint %s, seeds init=%llu order=%llu augment=%llu\n", score.c_str(),
                r.test_top1, r.weights_fingerprint.hex().c_str(), (unsigned long long)r.seed_init,
                (unsigned long long)r.seed_order, (unsigned long long)r.seed_augment);
    return 0;
  } catch (const ditto::Error& e) {
    std::fprintf(stderr, "ditto-train: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ditto-train: unexpected error: %s\n", e.what());
    return 3;
  }
}
