// Builds against the installed package only, through <ditto/experiments.h>: one short CPU
// training run on the synthetic dataset, run twice with fixed seeds, must end bit-identical
// (zero churn, equal weight fingerprints). Exits non-zero if anything is off.
#include <ditto/experiments.h>

#include <cstdio>

int main() {
  ditto::TrainConfig cfg;
  cfg.model = "two-conv";
  cfg.dataset = "synthetic";
  cfg.synthetic_train = 64;
  cfg.synthetic_test = 32;
  cfg.synthetic_size = 8;
  cfg.epochs = 1;
  cfg.batch_size = 16;
  cfg.device = "cpu";
  cfg.deterministic_init = cfg.deterministic_input = true;
  cfg.kernels = "deterministic";
  cfg.progress = false;
  cfg.loader_threads = 1;
  ditto::TrainResult a = ditto::train(cfg), b = ditto::train(cfg);
  if (a.predictions.size() != 32) return 1;
  if (ditto::churn(a.predictions, b.predictions) != 0.0) return 2;
  if (a.weights_fingerprint != b.weights_fingerprint) return 3;
  std::printf("consumer_experiments ok: weights %s\n", a.weights_fingerprint.hex().c_str());
  return 0;
}
