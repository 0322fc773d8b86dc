// grad_agreement: one training step's gradients in each precision, from the same weights and the
// same batch, written for bench/peers/torch_grad_agreement.py, which runs PyTorch's autocast (and
// an fp64 reference) on the very same weights and batch and says whether ditto's reduced-precision
// gradients are as close to the fp64 truth as PyTorch's own.
//
// Per model: the net is built and initialised from --seed-init (deterministic: the weights are the
// same in every precision), one batch of --batch images (uniform in [-1, 1) from a fixed
// std::mt19937_64 seed, --image-size px, labels i mod --classes) and, per precision, a fresh context
// under the rules `*=deterministic` and `*.precision=VALUE` runs forward (training mode: batch
// statistics), the mean softmax cross-entropy and backward, unscaled (fp16 loss scaling multiplies
// and divides by powers of two, which is exact barring overflow and underflow: the peer compares
// unscaled fp16 too). Nets with stochastic layers (dropout, stochastic depth) are refused: their
// masks cannot be matched with PyTorch's.
//
// Files in --out (written, then renamed, by save_safetensors):
//   <model>-inputs.safetensors           the initial weights (parameter names, fp32), "input.x"
//                                        {N,C,H,W} and "input.labels" (i32); metadata: model,
//                                        classes, seed_init
//   <model>-<precision>-grads.safetensors  each parameter's gradient (fp32, under its own name);
//                                        metadata: loss, precision, device, gpu, cudnn, commit
//   grad_agreement --models smallcnn,resnet18,resnet50 --precisions fp32,bf16,fp16 --out DIR
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <filesystem>
#include <random>

#include "engine/checkpoint.h"
#include "engine/context.h"
#include "engine/error.h"
#include "kernels/loss.h"
#include "kernels/precision.h"
#include "precision_runs.h"
#include "nets/nets.h"

using namespace ditto;
namespace fs = std::filesystem;

namespace {

struct Options {
  std::vector<std::string> models = {"smallcnn", "resnet18", "resnet50"};
  std::vector<std::string> precisions = {"fp32", "bf16", "fp16"};
  int64_t batch = 32;
  int image_size = 32;
  int classes = 10;
  uint64_t seed_init = 1;
  std::string device = "cuda";
  std::string out;
  bool channels_last = false;  // bf16/fp16 convolutions channels-last (bench/precision_runs.h)
  bool native = false;         // ... handing on bf16/f16 channels-last results, as autocast does
};

struct Batch {
  Shape shape;
  std::vector<float> x;
  std::vector<int32_t> labels;
};

Batch make_batch(const Options& o) {
  Batch b;
  b.shape = {o.batch, 3, o.image_size, o.image_size};
  std::mt19937_64 gen(0x6772616473ULL);  // fixed: every model and precision reads the same batch
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  b.x.resize(static_cast<std::size_t>(o.batch * 3 * o.image_size * o.image_size));
  for (float& v : b.x) v = uniform(gen);
  for (int64_t i = 0; i < o.batch; ++i) b.labels.push_back(static_cast<int32_t>(i % o.classes));
  return b;
}

std::unique_ptr<Net> initialised_net(Context& ctx, const Options& o, const std::string& model) {
  auto net = make_net(ctx, NetConfig{model, o.classes, 3, 0});
  if (net->stochastic())
    throw Error(fmt::format("grad_agreement: {} has stochastic layers (dropout or stochastic depth), whose masks "
                            "PyTorch cannot replay; pick a model without them",
                            model));
  net->check_input(Shape{o.batch, 3, o.image_size, o.image_size});
  net->init(ctx, o.seed_init);
  return net;
}

void write_inputs(const Options& o, const std::string& model, const Batch& b) {
  Context ctx(Device::cpu());
  auto net = initialised_net(ctx, o, model);
  std::vector<NamedTensor> tensors;
  for (const auto& p : net->params()) tensors.push_back({p.name, p.var.value()});
  tensors.push_back({"input.x", ctx.from_host(b.x, b.shape)});
  tensors.push_back({"input.labels", ctx.from_host(b.labels, {o.batch})});
  save_safetensors((fs::path(o.out) / (model + "-inputs.safetensors")).string(), tensors,
                   {{"model", model}, {"classes", std::to_string(o.classes)},
                    {"seed_init", std::to_string(o.seed_init)}});
}

// One forward, loss and backward in `precision`; returns the loss.
float write_grads(const Options& o, const std::string& model, const std::string& precision, const Batch& b) {
  Context ctx(Device::parse(o.device),
              Policy::parse(bench::with_precision({"*=deterministic"}, precision, o.channels_last, o.native)));
  auto net = initialised_net(ctx, o, model);
  const Tensor x = ctx.from_host(b.x, b.shape);
  const Tensor labels = ctx.from_host(b.labels, {o.batch});
  Var logits = net->forward(ctx, Var(x), true);
  Var loss = softmax_cross_entropy(ctx, "loss", logits, labels);
  ctx.tape().backward(ctx, loss);
  const float loss_value = loss.value().to_host_f32()[0];
  std::vector<NamedTensor> grads;
  for (const auto& p : net->params()) {
    if (!p.var.grad().defined()) throw Error(fmt::format("grad_agreement: {} got no gradient", p.name));
    grads.push_back({p.name, p.var.grad()});
  }
  const RuntimeInfo info = ctx.runtime_info();
  save_safetensors((fs::path(o.out) / fmt::format("{}-{}-grads.safetensors", model, precision)).string(), grads,
                   {{"model", model}, {"precision", precision}, {"loss", fmt::format("{:.9g}", loss_value)},
                    {"layout", bench::channels_last_for(o.channels_last, precision) ? "nhwc" : "nchw"},
                    {"activations", bench::native_for(o.native, o.channels_last, precision) ? "native" : "fp32"},
                    {"device", info.device}, {"gpu", info.gpu_name}, {"cudnn", info.cudnn},
                    {"commit", info.git_commit}});
  return loss_value;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"One training step's gradients per precision, for bench/peers/torch_grad_agreement.py"};
  app.add_option("--models", o.models, "image classifiers without stochastic layers")->delimiter(',');
  app.add_option("--precisions", o.precisions, "fp32, tf32, bf16, fp16")->delimiter(',');
  app.add_option("--batch", o.batch, "images in the batch")->check(CLI::PositiveNumber);
  app.add_option("--image-size", o.image_size, "height and width of the images")->check(CLI::PositiveNumber);
  app.add_option("--classes", o.classes, "classes of the classifier")->check(CLI::Range(2, 100000));
  app.add_option("--seed-init", o.seed_init, "seed of the initial weights");
  app.add_option("--device", o.device, "cuda, cuda:N or cpu");
  app.add_option("--out", o.out, "folder for the safetensors files")->required();
  app.add_flag("--channels-last", o.channels_last,
               "bf16/fp16 convolutions compute channels-last (the rule *.layout=nhwc)");
  app.add_flag("--native-activations", o.native,
               "with --channels-last, bf16/fp16 convolutions hand on bf16/f16 channels-last results (*.output=native)");
  CLI11_PARSE(app, argc, argv);
  try {
    for (const auto& p : o.precisions) parse_precision(p);
    fs::create_directories(o.out);
    const Batch b = make_batch(o);
    for (const auto& model : o.models) {
      write_inputs(o, model, b);
      for (const auto& p : o.precisions)
        fmt::print("{} {}: loss {:.6f}\n", model, p, write_grads(o, model, p, b));
    }
  } catch (const std::exception& e) {
    fmt::print(stderr, "grad_agreement: {}\n", e.what());
    return 1;
  }
  return 0;
}
