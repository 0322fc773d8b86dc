// eval_invariance: what batch-invariant evaluation costs, and what it buys. Per model and batch
// size, --examples synthetic images (--image-size px, fixed seed) are evaluated (forward, no tape,
// running batch-norm statistics, freshly initialized weights) in consecutive batches under three
// kernel choices:
//   fastest          cuDNN's Find among every algorithm, cuBLAS's pick for linear layers: the fastest
//                    evaluation ditto offers;
//   heuristic        the framework default (cuDNN's and cuBLAS's own per-size picks);
//   batch-invariant  experiments/train.h batch_invariant_rules (ditto-direct convolutions, gemm=ditto
//                    linear layers, ditto's batch norm and pooling).
// Each is timed over --repeats full passes after one warm-up pass (which also selects the
// algorithms), between two synchronizations. Then every example's logits are compared bit for bit
// with those of the first batch size under the same kernels: `differing` counts the examples whose
// logits changed with the batch they were computed in.
//
// One JSON line per (model, kernels, batch) to --out (and stdout): model, image, examples, kernels,
// batch, ms_per_pass, images_per_s, differing (vs the first --batches value), gpu, cudnn, commit.
//   eval_invariance --models smallcnn,resnet18,resnet50 --image-size 32 --batches 1000,128,7,1 \
//     --examples 1000 --out eval_invariance.jsonl
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "engine/collective.h"
#include "engine/context.h"
#include "engine/error.h"
#include "experiments/train.h"
#include "nets/nets.h"

using namespace ditto;
using Clock = std::chrono::steady_clock;

namespace {

struct Options {
  std::vector<std::string> models = {"smallcnn", "resnet18", "resnet50"};
  std::vector<int64_t> batches = {1000, 128, 7, 1};
  std::vector<std::string> kernels = {"fastest", "heuristic", "batch-invariant"};
  int image_size = 32, repeats = 3;
  int64_t examples = 1000;
  std::string device = "cuda", out;
};

Policy policy_of(const std::string& kernels) {
  if (kernels == "batch-invariant") {
    Policy p = Policy::parse({"*=heuristic"});
    for (const std::string& r : batch_invariant_rules()) p.set(r);
    return p;
  }
  return Policy::parse({"*=" + kernels});
}

// One pass over the examples in consecutive batches; the logits on the host.
std::vector<float> pass(Context& ctx, Net& net, const Tensor& images, int64_t batch, int64_t classes) {
  const int64_t n = images.shape()[0];
  std::vector<float> out;
  out.reserve(std::size_t(n * classes));
  NoGradGuard ng(ctx);
  for (int64_t s = 0; s < n; s += batch) {
    const int64_t b = std::min(batch, n - s), per = shape_numel(images.shape()) / n;
    Shape xs = images.shape();
    xs[0] = b;
    Tensor x = ctx.empty(xs);
    copy_elements(ctx, x, 0, images, s * per, b * per);
    const std::vector<float> y = net.forward(ctx, Var(x), false).value().to_host_f32();
    out.insert(out.end(), y.begin(), y.end());
  }
  return out;
}

void measure(const Options& o, const std::string& model, std::ofstream* out) {
  const int64_t classes = 10;
  const Shape xs{o.examples, 3, o.image_size, o.image_size};
  std::vector<float> host(std::size_t(shape_numel(xs)));
  std::mt19937 gen(7);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (float& v : host) v = u(gen);
  for (const std::string& k : o.kernels) {
    Context ctx(Device::parse(o.device), policy_of(k));
    auto net = make_net(ctx, {model, int(classes), 3});
    net->init(ctx, 5);
    const Tensor images = ctx.from_host(host, xs);
    std::vector<float> first;
    for (int64_t b : o.batches) {
      const std::vector<float> logits = pass(ctx, *net, images, b, classes);  // warm-up: selects the algorithms
      ctx.synchronize();
      const auto t0 = Clock::now();
      for (int r = 0; r < o.repeats; ++r) pass(ctx, *net, images, b, classes);
      ctx.synchronize();
      const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count() / o.repeats;
      if (first.empty()) first = logits;
      int64_t differing = 0;
      for (int64_t e = 0; e < o.examples; ++e)
        differing += std::memcmp(first.data() + e * classes, logits.data() + e * classes, sizeof(float) * classes) != 0;
      const RuntimeInfo info = ctx.runtime_info();
      const nlohmann::json line = {{"model", model},           {"image", o.image_size}, {"examples", o.examples},
                                   {"kernels", k},             {"batch", b},            {"ms_per_pass", ms},
                                   {"images_per_s", o.examples / (ms / 1000.0)},     {"differing", differing},
                                   {"differing_vs_batch", o.batches.front()},        {"gpu", info.gpu_name},
                                   {"cudnn", info.cudnn},      {"commit", info.git_commit}};
      std::printf("%s\n", line.dump().c_str());
      std::fflush(stdout);
      if (out) *out << line.dump() << "\n" << std::flush;
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"eval_invariance: the cost of batch-invariant evaluation against the fastest and the default kernels"};
  app.add_option("--models", o.models, "networks (nets/nets.h names)")->delimiter(',')->capture_default_str();
  app.add_option("--batches", o.batches, "evaluation batch sizes; the first is what the others are compared with")
      ->delimiter(',')
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--kernels", o.kernels, "fastest | heuristic | batch-invariant")
      ->delimiter(',')
      ->check(CLI::IsMember({"fastest", "heuristic", "batch-invariant"}))
      ->capture_default_str();
  app.add_option("--image-size", o.image_size, "image side in pixels")->check(CLI::Range(8, 1024))->capture_default_str();
  app.add_option("--examples", o.examples, "images evaluated per pass")->check(CLI::Range(1, 1000000))->capture_default_str();
  app.add_option("--repeats", o.repeats, "timed passes after the warm-up pass")->check(CLI::Range(1, 1000))->capture_default_str();
  app.add_option("--device", o.device, "cuda | cuda:N | cpu")->capture_default_str();
  app.add_option("--out", o.out, "JSON lines file to append to");
  CLI11_PARSE(app, argc, argv);
  try {
    std::ofstream out;
    if (!o.out.empty()) {
      out.open(o.out, std::ios::app);
      if (!out) throw IoError(fmt::format("--out: cannot open '{}' for appending", o.out));
    }
    for (const std::string& m : o.models) measure(o, m, o.out.empty() ? nullptr : &out);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "eval_invariance: %s\n", e.what());
    return 1;
  }
  return 0;
}
