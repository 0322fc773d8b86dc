// ditto-train: trains one of the paper's networks with every source of randomness either fixed
// or recorded. See engine/train.h for what is written to --out.
#include <CLI/CLI.hpp>
#include <cstdio>

#include "engine/error.h"
#include "engine/train.h"
#include "nets/nets.h"

int main(int argc, char** argv) {
  ditto::TrainConfig c;
  CLI::App app{"ditto-train: replayable training runs for determinism studies"};
  app.set_help_all_flag("--help-all");
  app.add_option("--model", c.model, "smallcnn | smallcnn-bn | resnet18 | resnet18-imagenet")
      ->check(CLI::IsMember(ditto::known_models()));
  app.add_option("--dataset", c.dataset, "synthetic | cifar10 | cifar100 | imagefolder | celeba | mnist")
      ->check(CLI::IsMember({"synthetic", "cifar10", "cifar100", "imagefolder", "celeba", "mnist"}));
  app.add_option("--data", c.data, "dataset folder");
  app.add_option("--epochs", c.epochs)->check(CLI::PositiveNumber);
  app.add_option("--batch-size", c.batch_size)->check(CLI::PositiveNumber);
  app.add_option("--lr", c.lr)->check(CLI::PositiveNumber);
  app.add_option("--optimizer", c.optimizer)->check(CLI::IsMember({"adam", "sgd"}));
  app.add_option("--momentum", c.momentum)->check(CLI::Range(0.0, 1.0));
  app.add_flag("--nesterov", c.nesterov);
  app.add_option("--weight-decay", c.weight_decay)->check(CLI::NonNegativeNumber);
  app.add_option("--lr-schedule", c.lr_schedule)->check(CLI::IsMember({"constant", "step", "cosine"}));
  app.add_option("--milestones", c.milestones, "epochs where the step schedule divides the lr by 10");
  app.add_flag("--augment", c.augment, "pad-4 random crop + horizontal flip");
  app.add_flag("--standardize", c.standardize, "per-image standardization instead of channel mean/std");
  app.add_option("--device", c.device, "cpu | cuda | cuda:N");
  uint64_t si = 0, so = 0, sa = 0;
  auto* o_si = app.add_option("--seed-init", si);
  auto* o_so = app.add_option("--seed-order", so);
  auto* o_sa = app.add_option("--seed-augment", sa);
  app.add_flag("--deterministic-init", c.deterministic_init, "fix the init seed (0 unless --seed-init)");
  app.add_flag("--deterministic-input", c.deterministic_input, "fix order and augmentation seeds (0 unless given)");
  bool det_kernels = false;
  auto* o_dk = app.add_flag("--deterministic-kernels", det_kernels, "same as --kernels deterministic");
  auto* o_k = app.add_option("--kernels", c.kernels)
                  ->check(CLI::IsMember({"heuristic", "deterministic", "nondeterministic", "fastest"}));
  o_dk->excludes(o_k);
  app.add_option("--pin", c.pins, "LAYER.KNOB=VARIANT (repeatable), e.g. conv2.bwd_filter=algo0");
  std::string pins_from;
  app.add_option("--pins-from", pins_from, "pin every kernel a run's manifest.json recorded (exact replay)")
      ->check(CLI::ExistingFile);
  app.add_option("--train-size", c.train_size, "use only the first N training examples")->check(CLI::NonNegativeNumber);
  app.add_option("--test-size", c.test_size, "use only the first N test examples")->check(CLI::NonNegativeNumber);
  app.add_option("--resume", c.resume, "run folder to continue from")->check(CLI::ExistingDirectory);
  app.add_option("--out", c.out, "run folder to write");
  app.add_flag("--summary", c.summary, "print layer name, op, output shape, parameters");
  app.add_option("--loader-threads", c.loader_threads)->check(CLI::NonNegativeNumber);
  app.add_option("--label-attr", c.celeba_label, "celeba: the attribute to predict");
  app.add_option("--subgroup-attrs", c.celeba_subgroups, "celeba: attributes forming subgroups");
  bool quiet = false;
  app.add_flag("--quiet", quiet, "no progress line");
  CLI11_PARSE(app, argc, argv);

  if (*o_si) c.seed_init = si;
  if (*o_so) c.seed_order = so;
  if (*o_sa) c.seed_augment = sa;
  if (det_kernels) c.kernels = "deterministic";
  c.progress = !quiet;
  for (int i = 0; i < argc; ++i) c.command_line += (i ? " " : "") + std::string(argv[i]);
  try {
    if (!pins_from.empty()) {
      // Recorded pins first, so explicit --pin flags still override them.
      auto recorded = ditto::pins_from_manifest(pins_from);
      recorded.insert(recorded.end(), c.pins.begin(), c.pins.end());
      c.pins = recorded;
    }
    auto r = ditto::train(c);
    std::printf("final test top-1 %.4f, weights fingerprint %s, seeds init=%llu order=%llu augment=%llu\n",
                r.test_top1, ditto::hex64(r.weights_fingerprint).c_str(), (unsigned long long)r.seed_init,
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
