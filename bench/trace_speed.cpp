// trace_speed: what tracing a training run costs. Per model, one training (synthetic images of
// --image-size px, --batch, deterministic kernels, --steps steps in one epoch) three times on one
// context: untraced and eager, untraced and graphed, and traced as `ditto-diverge record` traces it
// (every tensor every op reads or writes digested on its stream, engine/digest.h; the step's 16-byte
// digests taken at its end; the trace written to a file). Milliseconds per step are measured over
// the steps after --warmup, between two synchronizations (nothing is left out: the tracer's and the
// writer's host time count). The traced run must end with the untraced run's weights (tracing only
// reads), else the bench fails.
//
// One JSON line per model to --out (and stdout): model, batch, image, steps, timed_steps,
// untraced_ms (eager), untraced_graphed_ms, traced_ms, traced_over_untraced (traced ÷ eager
// untraced: a traced run is eager), events_per_step, tensors_per_step, trace_bytes_per_step,
// precision, gpu, cudnn, commit.
//   trace_speed --models resnet18,resnet50 --batch 128 --image-size 32 --steps 40 --out trace_speed.jsonl
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "engine/context.h"
#include "engine/error.h"
#include "experiments/diverge.h"
#include "experiments/trace.h"
#include "experiments/train.h"

using namespace ditto;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

struct Options {
  std::vector<std::string> models = {"resnet18", "resnet50"};
  int batch = 128, image_size = 32, steps = 40, warmup = 5;
  std::string precision = "fp32", device = "cuda", out, scratch = fs::temp_directory_path().string();
};

// Wall time from the end of step `warmup` to the end of the last step, both after a
// synchronization, per step.
struct StepClock {
  int warmup, steps;
  Clock::time_point t0, t1;
  void after(const StepView& v) {
    if (v.step != warmup && v.step != steps) return;
    v.ctx.synchronize();
    (v.step == warmup ? t0 : t1) = Clock::now();
  }
  double ms() const { return std::chrono::duration<double, std::milli>(t1 - t0).count() / (steps - warmup); }
};

TrainConfig config_of(const Options& o, const std::string& model) {
  TrainConfig c;
  c.model = model;
  c.dataset = "synthetic";
  c.synthetic_train = o.batch * o.steps;  // one epoch: no evaluation inside the timed steps
  c.synthetic_test = o.batch;
  c.synthetic_size = o.image_size;
  c.batch_size = o.batch;
  c.epochs = 1;
  c.max_steps = o.steps;
  c.lr = 1e-3f;
  c.optimizer = "adam";
  c.device = o.device;
  c.kernels = "deterministic";
  c.precision = o.precision;
  c.deterministic_init = c.deterministic_input = true;
  c.progress = false;
  c.loader_threads = 4;
  return c;
}

nlohmann::json measure(const Options& o, const std::string& model) {
  const TrainConfig cfg = config_of(o, model);
  auto timed = [&](const TrainConfig& c, RecordingTracer* recorder) {
    StepClock clock{o.warmup, o.steps, {}, {}};
    TrainHooks hooks;
    hooks.tracer = recorder;
    hooks.after_step = [&](const StepView& v) {
      if (recorder) recorder->clear_step();
      clock.after(v);
    };
    TrainResult r = train(c, hooks);
    return std::make_pair(r, clock.ms());
  };
  const auto [plain, untraced_ms] = timed(cfg, nullptr);
  nlohmann::json graphed_ms;  // null on the CPU, which has no graphs
  if (Device::parse(o.device).is_cuda()) {
    TrainConfig graphed = cfg;
    graphed.graph = true;
    graphed_ms = timed(graphed, nullptr).second;
  }

  const std::string path = (fs::path(o.scratch) / fmt::format("trace_speed-{}.trace", model)).string();
  TraceWriter writer(path, {{"model", model}, {"bench", "trace_speed"}});
  RecordingTracer recorder(&writer);
  const auto [traced, traced_ms] = timed(cfg, &recorder);
  recorder.clear_step();
  writer.close();
  const auto bytes = fs::file_size(path);
  const Trace trace = read_trace(path);
  fs::remove(path);
  if (traced.weights_fingerprint != plain.weights_fingerprint)
    throw Error(fmt::format("{}: the traced run ended with weights {} where the untraced one ended with {}; tracing "
                            "changed the bits",
                            model, traced.weights_fingerprint.hex(), plain.weights_fingerprint.hex()));
  int64_t events = 0, tensors = 0;
  for (const auto& e : trace.events)
    if (e.step == 1) ++events, tensors += static_cast<int64_t>(e.inputs.size() + e.outputs.size());
  const RuntimeInfo info = Context(Device::parse(o.device)).runtime_info();
  return {{"model", model},
          {"batch", o.batch},
          {"image", o.image_size},
          {"steps", o.steps},
          {"timed_steps", o.steps - o.warmup},
          {"untraced_ms", untraced_ms},
          {"untraced_graphed_ms", graphed_ms},
          {"traced_ms", traced_ms},
          {"traced_over_untraced", traced_ms / untraced_ms},
          {"events_per_step", events},
          {"tensors_per_step", tensors},
          {"trace_bytes_per_step", double(bytes) / o.steps},
          {"precision", o.precision},
          {"gpu", info.gpu_name},
          {"cudnn", info.cudnn},
          {"commit", info.git_commit}};
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"What tracing costs: ms per step untraced (eager, graphed) and traced, per model"};
  app.add_option("--models", o.models, "zoo models")->delimiter(',');
  app.add_option("--batch", o.batch, "batch size")->check(CLI::PositiveNumber);
  app.add_option("--image-size", o.image_size, "synthetic image side in px")->check(CLI::PositiveNumber);
  app.add_option("--steps", o.steps, "steps per run")->check(CLI::Range(2, 100000));
  app.add_option("--warmup", o.warmup, "steps before timing starts")->check(CLI::PositiveNumber);
  app.add_option("--precision", o.precision, "fp32, tf32, bf16 or fp16");
  app.add_option("--device", o.device, "cuda, cuda:N or cpu");
  app.add_option("--scratch", o.scratch, "folder for the temporary trace files");
  app.add_option("--out", o.out, "JSON-lines file to append to")->required();
  CLI11_PARSE(app, argc, argv);
  if (o.warmup >= o.steps) {
    std::fprintf(stderr, "trace_speed: --warmup %d must be below --steps %d\n", o.warmup, o.steps);
    return 2;
  }
  try {
    for (const auto& model : o.models) {
      const std::string line = measure(o, model).dump();
      std::printf("%s\n", line.c_str());
      std::fflush(stdout);
      std::ofstream(o.out, std::ios::app) << line << "\n";
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "trace_speed: %s\n", e.what());
    return 1;
  }
  return 0;
}
