// Networks on the CPU: the input check every net's forward makes (Net::forward before
// forward_impl); mnist-cnn (Keras's mnist_cnn) — its parameter count, layers and knobs, forward
// and backward shapes, flatten's gradient, dropout keyed by (seed, step, layer), and two short
// training runs that end bit-identical.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>

#include "datasets/dataset.h"
#include "engine/context.h"
#include "engine/error.h"
#include "engine/policy.h"
#include "experiments/train.h"
#include "kernels/elementwise.h"
#include "kernels/loss.h"
#include "nets/nets.h"
#include "net_support.h"
#include "support.h"
#include "train_support.h"

using namespace ditto;
using Catch::Matchers::Contains;

namespace {

std::vector<int32_t> labels_of(int64_t n, int classes) {
  std::vector<int32_t> l(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) l[i] = static_cast<int32_t>(i % classes);
  return l;
}

// Logits of one forward pass, with no tape.
Tensor logits_of(Context& ctx, Net& net, const Tensor& x, bool training) {
  NoGradGuard ng(ctx);
  return net.forward(ctx, Var(x), training).value();
}

}  // namespace

TEST_CASE("Net::forward: every net refuses a wrong input shape, naming itself, before any op runs") {
  for (const auto& model : known_models()) {
    INFO(model);
    if (is_task_model(model)) continue;  // cpu_task_nets checks their inputs
    Context ctx;
    const int channels = model == "mnist-cnn" ? 1 : 3;
    auto net = make_net(ctx, {model, 10, channels});
    const InputSpec& in = net->input_spec();
    CHECK(in.channels == channels);
    CHECK(in.min_side >= 1);
    const int64_t side = in.min_side;
    auto refused = [&](const Shape& s) {
      INFO(shape_str(s));
      CHECK_THROWS_AS(net->check_input(s), ShapeError);
      CHECK_THROWS_WITH(net->forward(ctx, Var(ctx.zeros(s)), false), Contains(model + ": input has shape") &&
                                                                          Contains(shape_str(s)));
    };
    refused({1, channels + 1, side, side});    // channels
    refused({0, channels, side, side});        // no batch
    refused({channels, side, side});           // not 4-D
    refused({1, channels, side, side, 1});
    if (in.min_side > 1) {
      refused({1, channels, side - 1, side});  // below the documented minimum, either side
      refused({1, channels, side, side - 1});
    }
    if (in.max_side > 0) refused({1, channels, in.max_side + 1, side});
    CHECK_NOTHROW(net->check_input({1, channels, side, side}));
    CHECK(ctx.manifest().entries().empty());  // no op ran
  }
  // The minimum sides nets.h documents.
  Context ctx;
  const std::pair<const char*, int> minimum[] = {{"smallcnn", 8},    {"mediumcnn-k3", 64}, {"mnist-cnn", 28},
                                                 {"vgg16", 224},     {"densenet121", 29},  {"mobilenet", 32},
                                                 {"inception-v3", 75}, {"xception", 71},   {"resnet50", 1},
                                                 {"resnet34", 1}};
  for (const auto& [model, side] : minimum) {
    INFO(model);
    CHECK(make_net(ctx, {model, 10, std::string(model) == "mnist-cnn" ? 1 : 3})->input_spec().min_side == side);
  }
  CHECK(make_net(ctx, {"vgg19", 10, 3})->input_spec().max_side == 255);
  CHECK(make_net(ctx, {"mnist-cnn", 10, 1})->input_spec().max_side == 28);
  CHECK_THROWS_WITH(make_net(ctx, {"smallcnn", 10, 0}), Contains("input channel"));
}

TEST_CASE("mnist-cnn: Keras's parameter count, layer names, knob layers") {
  Context ctx;
  auto net = make_net(ctx, {"mnist-cnn", 10, 1});
  CHECK(net->name() == "mnist-cnn");
  // Keras examples/mnist_cnn.py, model.summary(): conv2d 320 (1*32*9 + 32), conv2d_1 18,496
  // (32*64*9 + 64), dense 1,179,776 (9216*128 + 128), dense_1 1,290 (128*10 + 10); total 1,199,882.
  CHECK(net->param_count() == 1199882);
  std::vector<std::string> names;
  for (const auto& p : net->params()) names.push_back(p.name);
  CHECK(names == std::vector<std::string>{"conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias", "fc1.weight",
                                          "fc1.bias", "fc2.weight", "fc2.bias"});
  CHECK(net->stochastic());
  const auto& known = known_models();
  CHECK(std::find(known.begin(), known.end(), "mnist-cnn") != known.end());

  Policy ok = Policy::parse({"conv2.bwd_filter=algo0", "pool1.bwd=gather", "fc1.bias_bwd=deterministic",
                             "fc2.precision=fp32", "loss.reduce=deterministic"});
  CHECK_NOTHROW(ok.check_layers(net->knob_layers()));
  Policy bad = Policy::parse({"conv3.fwd=implicit_gemm"});
  CHECK_THROWS_WITH(bad.check_layers(net->knob_layers()), Contains("conv2"));

  // The summary walks every layer, dropout and flatten included, with Keras's output shapes.
  SummaryTrace trace;
  net->init(ctx, 0);
  {
    NoGradGuard ng(ctx);
    net->forward(ctx, Var(ctx.zeros({1, 1, 28, 28})), false, &trace);
  }
  std::vector<std::string> rows;
  for (const auto& r : trace) rows.push_back(r.name + " " + shape_str(r.output));
  CHECK(rows == std::vector<std::string>{"conv1 " + shape_str({1, 32, 26, 26}), "relu1 " + shape_str({1, 32, 26, 26}),
                                         "conv2 " + shape_str({1, 64, 24, 24}), "relu2 " + shape_str({1, 64, 24, 24}),
                                         "pool1 " + shape_str({1, 64, 12, 12}), "dropout1 " + shape_str({1, 64, 12, 12}),
                                         "flatten " + shape_str({1, 9216}), "fc1 " + shape_str({1, 128}),
                                         "relu3 " + shape_str({1, 128}), "dropout2 " + shape_str({1, 128}),
                                         "fc2 " + shape_str({1, 10})});
  int64_t summed = 0;
  for (const auto& r : trace) summed += r.params;
  CHECK(summed == 1199882);
}

TEST_CASE("mnist-cnn: Glorot-uniform kernels within their bounds, zero biases") {
  Context ctx;
  auto net = make_net(ctx, {"mnist-cnn", 10, 1});
  net->init(ctx, 5);
  // Keras's glorot_uniform limit sqrt(6 / (fan_in + fan_out)), fans including the kernel area.
  const std::map<std::string, double> limit = {{"conv1.weight", std::sqrt(6.0 / (9 + 32 * 9))},
                                               {"conv2.weight", std::sqrt(6.0 / (32 * 9 + 64 * 9))},
                                               {"fc1.weight", std::sqrt(6.0 / (9216 + 128))},
                                               {"fc2.weight", std::sqrt(6.0 / (128 + 10))}};
  for (const auto& p : net->params()) {
    INFO(p.name);
    auto v = p.var.value().to_host_f32();
    if (p.name.find(".bias") != std::string::npos) {
      CHECK(std::all_of(v.begin(), v.end(), [](float b) { return b == 0.0f; }));
    } else {
      const double lim = limit.at(p.name);
      float most = 0;
      for (float w : v) most = std::max(most, std::fabs(w));
      CHECK(most <= lim);
      CHECK(most > 0.9 * lim);  // uniform over the whole range, not a narrower one
    }
  }
}

TEST_CASE("mnist-cnn: forward gives N x 10 logits; backward reaches every parameter") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  Context ctx;
  auto net = make_net(ctx, {"mnist-cnn", 10, 1});
  net->init(ctx, seed);
  net->begin_step(seed, 1);
  Tensor x = ctx.from_host(test::random_vec(2 * 28 * 28, seed), {2, 1, 28, 28});
  Var logits = net->forward(ctx, Var(x), true);
  CHECK(logits.shape() == Shape{2, 10});
  Var loss = softmax_cross_entropy(ctx, "loss", logits, ctx.from_host(std::vector<int32_t>{3, 7}, {2}));
  ctx.tape().backward(ctx, loss);
  test::check_param_grads(*net, [](const std::string&) { return true; });
  CHECK_THROWS_AS(net->forward(ctx, Var(ctx.zeros({2, 1, 32, 32})), false), ShapeError);
  CHECK_THROWS_WITH(net->forward(ctx, Var(ctx.zeros({2, 3, 28, 28})), false), Contains("Nx1x28x28"));
}

TEST_CASE("flatten: a view of x's storage; backward hands x exactly dy in x's shape") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  Context ctx;
  const Shape xs{3, 4, 5, 2};
  auto xv = test::random_vec(3 * 40, seed), dyv = test::random_vec(3 * 40, seed + 1);
  Var x(ctx.from_host(xv, xs), true);
  Var y = flatten(ctx, x);
  CHECK(y.shape() == Shape{3, 40});
  CHECK(y.value().raw() == x.value().raw());  // no copy, no kernel: row-major NCHW is already flat
  CHECK(y.value().to_host_f32() == xv);
  CHECK(ctx.tape().op_names() == std::vector<std::string>{":flatten"});
  // Flatten is the identity on the values, so its Jacobian is the identity and the gradient is
  // dy reshaped, bit for bit (a finite-difference check would only approximate this exact claim).
  Tensor dy = ctx.from_host(dyv, {3, 40});
  ctx.tape().backward(ctx, y, dy);
  CHECK(x.grad().shape() == xs);
  CHECK(x.grad().to_host_f32() == dyv);
  // The upstream gradient is handed on, not copied (engine/tape.h, pass_grad): y, an
  // intermediate, keeps none after backward; the caller's dy is never aliased, so later
  // accumulation into x's gradient cannot reach it.
  CHECK_FALSE(y.grad().defined());
  CHECK(x.grad().raw() != dy.raw());
  // Gradients accumulate through flatten like through any op (fan-out: x feeds two flattens).
  x.zero_grad();
  Var a = flatten(ctx, x), b = flatten(ctx, x);
  ctx.tape().backward(ctx, add(ctx, a, b), dy);
  auto g = x.grad().to_host_f32();
  for (std::size_t i = 0; i < g.size(); ++i) CHECK(g[i] == dyv[i] + dyv[i]);
  // 1-D: {N} becomes {N, 1}; without grad nothing is recorded.
  {
    NoGradGuard ng(ctx);
    CHECK(flatten(ctx, Var(ctx.zeros({7}), true)).shape() == Shape{7, 1});
  }
  CHECK(ctx.tape().size() == 0);
  CHECK_THROWS_AS(flatten(ctx, Var(ctx.zeros({2, 2}, DType::I32))), ShapeError);
}

TEST_CASE("mnist-cnn: dropout masks are keyed by (seed, step); evaluation ignores them") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  Context ctx;
  auto net = make_net(ctx, {"mnist-cnn", 10, 1});
  net->init(ctx, 3);
  Tensor x = ctx.from_host(test::random_vec(2 * 28 * 28, seed, 0.0, 1.0), {2, 1, 28, 28});

  net->begin_step(seed, 3);
  const Fingerprint train_a = logits_of(ctx, *net, x, true).fingerprint();
  CHECK(logits_of(ctx, *net, x, true).fingerprint() == train_a);  // same (seed, step): same masks
  net->begin_step(seed, 4);
  const Fingerprint next_step = logits_of(ctx, *net, x, true).fingerprint();
  CHECK(next_step != train_a);
  net->begin_step(seed + 1, 3);
  CHECK(logits_of(ctx, *net, x, true).fingerprint() != train_a);
  net->begin_step(seed, 3);
  CHECK(logits_of(ctx, *net, x, true).fingerprint() == train_a);  // back to step 3: replays

  // Evaluation: no dropout, so neither the step nor the seed matter, and it differs from training.
  const Fingerprint eval = logits_of(ctx, *net, x, false).fingerprint();
  net->begin_step(seed + 7, 99);
  CHECK(logits_of(ctx, *net, x, false).fingerprint() == eval);
  CHECK(eval != train_a);
  CHECK(ctx.tape().size() == 0);
}

TEST_CASE("train: two CPU runs of mnist-cnn on 1x28x28 synthetic data are bit-identical") {
  // The built-in synthetic dataset of TrainConfig has 3 channels; make_synthetic makes MNIST's
  // shape (1x28x28, 10 classes), handed to train() as its data.
  auto data = std::make_shared<TrainData>();
  // Small: the CPU reference spends about 1.5 s on one step of 32 examples.
  data->train = make_synthetic(64, 10, 1, 28, 28, 1);
  data->test = make_synthetic(16, 10, 1, 28, 28, 2);
  TrainConfig c = test::synthetic_config("mnist-cnn", 64, 16, 28, 32);
  c.epochs = 2;
  c.lr = 1e-3f;
  c.deterministic_init = c.deterministic_input = true;
  auto a = train(c, {}, data);
  auto b = train(c, {}, data);
  REQUIRE(a.log.size() == 2);
  CHECK(a.steps == 4);
  CHECK(a.weights_fingerprint == b.weights_fingerprint);
  CHECK(a.predictions == b.predictions);
  CHECK(a.log[1].loss == b.log[1].loss);
  CHECK(std::isfinite(a.log[1].loss));
  CHECK(a.predictions.size() == 16);
}

TEST_CASE("manifest: every knob a CPU training step uses is recorded with the CPU reference's guarantee") {
  Context ctx(Device::cpu());
  auto net = make_net(ctx, {"smallcnn-bn", 10, 3});
  Tensor x = ctx.from_host(test::random_vec(2 * 3 * 8 * 8, 7), {2, 3, 8, 8});
  Tensor y = ctx.from_host(std::vector<int32_t>{1, 2}, {2});
  Var loss = softmax_cross_entropy(ctx, "loss", net->forward(ctx, Var(x), true), y);
  ctx.tape().backward(ctx, loss);
  const auto entries = ctx.manifest().entries();
  REQUIRE(entries.size() >= 10);
  for (const auto& e : entries) {
    INFO(e.layer << "." << e.knob);
    CHECK(e.guarantee == Guarantee::RunToRun);
  }
}
