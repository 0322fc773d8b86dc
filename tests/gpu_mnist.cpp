// mnist-cnn (Keras's mnist_cnn) on the GPU: CONTROL runs end bit-identical, --graph is refused
// because of dropout, and one batch's forward and backward agree with the CPU reference —
// exactly where exactness can be proven, within a derived bound where it cannot.
//
// Why exact. On integer data (binary images, weights and biases in {-1, 0, 1}, an integer
// upstream gradient) every product, partial sum and result of every op of the network is an
// integer. If the sum of |terms| of every dot product (forward, backward-data, backward-filter,
// bias gradient) stays below 2^24, every partial sum in ANY order is an integer below 2^24, which
// float32 holds exactly: cuDNN's and cuBLAS's tilings, split-K and the CPU's double accumulation
// all give the exact result, so the tolerance is zero. The test derives those sums' bounds
// from the weights it drew and REQUIREs each below 2^24, so the premise is checked, not assumed.
// ReLU, max pooling (ties go to the first maximum on both devices; kernels/pool.h), flatten and
// the bias add are exact operations on exact inputs. Convolution algorithms are pinned to the
// direct-class ones (sums of products): FFT and Winograd transform their operands, round
// non-integer intermediates and so are not exact even on integers (their accuracy is
// tests/gpu_conv2d.cpp's subject).
//
// Training mode adds the dropout scales: 1/(1 - 0.25) is not a power of two, so fc1 no longer sums
// integers. There the test checks the masks (dropout1's output is bit-identical on both devices,
// dropout2 drops the same elements) and the logits against a first-principles bound (see the
// test). The backward pass in training mode is not compared: an fc1 output that cancels to about
// zero can land on either side of ReLU's kink on the two devices, and then no elementwise bound
// holds for the gradients below it.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <map>
#include <random>

#include "datasets/dataset.h"
#include "engine/context.h"
#include "engine/error.h"
#include "engine/tracer.h"
#include "experiments/train.h"
#include "kernels/dropout.h"
#include "kernels/dropout_ref.h"
#include "nets/nets.h"
#include "support.h"
#include "train_support.h"

using namespace ditto;
using Catch::Matchers::Contains;

namespace {

// MNIST's shape (1x28x28, 10 classes) from the synthetic generator: no data files needed.
std::shared_ptr<const TrainData> mnist_shaped(int64_t train_n, int64_t test_n) {
  auto d = std::make_shared<TrainData>();
  d->train = make_synthetic(train_n, 10, 1, 28, 28, 1);
  d->test = make_synthetic(test_n, 10, 1, 28, 28, 2);
  return d;
}

TrainConfig control_config() {
  TrainConfig c = test::synthetic_config("mnist-cnn", 2000, 500, 28, 128, "cuda");
  c.deterministic_init = c.deterministic_input = true;  // CONTROL: seeds fixed, kernels deterministic
  c.epochs = 2;
  c.lr = 1e-3f;
  return c;
}

// Values in {-1, 0, 1}: nonzero with probability p_nonzero, either sign alike.
std::vector<float> ternary(std::mt19937_64& g, std::size_t n, double p_nonzero) {
  std::uniform_real_distribution<double> u(0, 1);
  std::vector<float> v(n);
  for (auto& x : v) x = u(g) < p_nonzero ? (u(g) < 0.5 ? -1.0f : 1.0f) : 0.0f;
  return v;
}

// The parameters of one mnist-cnn in host memory, by name.
using Weights = std::map<std::string, std::vector<float>>;

void load(Context& ctx, Net& net, const Weights& w) {
  for (auto& p : net.params()) {
    Tensor src = Context().from_host(w.at(p.name), p.var.value().shape());
    ctx.copy(p.var.value(), src);
  }
}

// Row sums of |m| for a row-major rows x cols matrix, and column sums.
std::vector<double> abs_row_sums(const std::vector<float>& m, int64_t rows, int64_t cols) {
  std::vector<double> s(rows, 0.0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) s[r] += std::fabs(m[r * cols + c]);
  return s;
}
std::vector<double> abs_col_sums(const std::vector<float>& m, int64_t rows, int64_t cols) {
  std::vector<double> s(cols, 0.0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) s[c] += std::fabs(m[r * cols + c]);
  return s;
}
double max_of(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, x);
  return m;
}
double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, double(std::fabs(x)));
  return m;
}

// Keeps host copies of the dropout layers' forward outputs.
struct DropoutCapture : Tracer {
  std::map<std::string, std::vector<float>> out;
  void begin_step(int64_t) override {}
  void event(const std::string& phase, const std::string& layer, const std::string&, const std::vector<TracedTensor>&,
             const std::vector<TracedTensor>& outputs) override {
    if (phase == "fwd" && layer.rfind("dropout", 0) == 0) out[layer] = outputs.at(0).tensor->to_host_f32();
  }
};

constexpr double kU = 0x1p-24;  // unit roundoff of float
double gamma_k(double k) { return k * kU / (1 - k * kU); }

// The integer network of the header comment. Sparse enough that every bound of exact_sums stays
// far under 2^24 (the worst of 300 draws reached 0.27 * 2^24), dense enough that every layer
// has positive and negative values.
Weights integer_weights(std::mt19937_64& g) {
  Weights w;
  w["conv1.weight"] = ternary(g, 32 * 9, 2.0 / 3), w["conv1.bias"] = ternary(g, 32, 2.0 / 3);
  w["conv2.weight"] = ternary(g, 64 * 32 * 9, 1.0 / 32), w["conv2.bias"] = ternary(g, 64, 2.0 / 3);
  w["fc1.weight"] = ternary(g, 128 * 9216, 1.0 / 128), w["fc1.bias"] = ternary(g, 128, 2.0 / 3);
  w["fc2.weight"] = ternary(g, 10 * 128, 1.0 / 4), w["fc2.bias"] = ternary(g, 10, 2.0 / 3);
  return w;
}

// Binary images, about 30% ones.
std::vector<float> binary_images(std::mt19937_64& g, int64_t n) {
  std::uniform_real_distribution<double> u(0, 1);
  std::vector<float> x(n * 28 * 28);
  for (auto& v : x) v = u(g) < 0.3 ? 1.0f : 0.0f;
  return x;
}

// Bounds on the sum of |terms| of every dot product of a forward and backward pass of n binary
// images with an upstream gradient in {-1, 0, 1}, layer by layer (ReLU, pooling and flatten never
// increase a magnitude; the 2x2 stride-2 pool routes each gradient to one input).
std::map<std::string, double> exact_sums(const Weights& w, int64_t n) {
  const auto& w1 = w.at("conv1.weight");
  const auto& w2 = w.at("conv2.weight");
  const auto& f1 = w.at("fc1.weight");
  const auto& f2 = w.at("fc2.weight");
  const double h1 = max_of(abs_row_sums(w1, 32, 9)) * 1.0 + max_abs(w.at("conv1.bias"));  // |x| <= 1
  const double h2 = max_of(abs_row_sums(w2, 64, 288)) * h1 + max_abs(w.at("conv2.bias"));
  const double h3 = max_of(abs_row_sums(f1, 128, 9216)) * h2 + max_abs(w.at("fc1.bias"));
  const double logits = max_of(abs_row_sums(f2, 10, 128)) * h3 + max_abs(w.at("fc2.bias"));
  const double d3 = max_of(abs_col_sums(f2, 10, 128)) * 1.0;  // |dy| <= 1
  const double dpool = max_of(abs_col_sums(f1, 128, 9216)) * d3;
  std::vector<double> conv2_in(32, 0.0);  // per input channel: sum over k, r, s of |w2|
  for (int64_t k = 0; k < 64; ++k)
    for (int64_t c = 0; c < 32; ++c)
      for (int64_t t = 0; t < 9; ++t) conv2_in[c] += std::fabs(w2[(k * 32 + c) * 9 + t]);
  const double d1 = max_of(conv2_in) * dpool;
  return {{"conv1 fwd", h1},
          {"conv2 fwd", h2},
          {"fc1 fwd", h3},
          {"fc2 fwd", logits},
          {"fc2 dx", d3},
          {"fc2 dw", n * h3 * 1.0},
          {"fc2 db", n * 1.0},
          {"fc1 dx", dpool},
          {"fc1 dw", n * d3 * h2},
          {"fc1 db", n * d3},
          {"conv2 dx", d1},
          {"conv2 dw", n * 24 * 24 * dpool * h1},
          {"conv2 db", n * 24 * 24 * dpool},
          {"conv1 dw", n * 26 * 26 * d1 * 1.0},
          {"conv1 db", n * 26 * 26 * d1}};
}

void require_exact(const Weights& w, int64_t n) {
  for (const auto& [what, bound] : exact_sums(w, n)) {
    INFO(what << ": sum of |terms| <= " << bound);
    REQUIRE(bound < 0x1p24);
  }
}

// Direct-class convolution algorithms (sums of products; see the header comment).
Policy exact_policy() {
  return Policy::parse({"*=deterministic", "*.fwd=implicit_gemm", "*.bwd_data=algo1", "*.bwd_filter=algo1"});
}

}  // namespace

TEST_CASE("gpu mnist-cnn: three CONTROL runs end bit-identical") {
  auto data = mnist_shaped(2000, 500);
  TrainConfig c = control_config();
  std::vector<TrainResult> runs;
  for (int r = 0; r < 3; ++r) runs.push_back(train(c, {}, data));
  const TrainResult& a = runs[0];
  std::printf("MNIST-CNN CONTROL x3: fingerprint %s, top-1 %.4f, loss %.4f -> %.4f, %.3f s for %lld steps\n",
              a.weights_fingerprint.hex().c_str(), a.test_top1, a.log[0].loss, a.log[1].loss, a.train_seconds,
              (long long)a.steps);
  REQUIRE(a.log.size() == 2);
  CHECK(a.steps == 2 * 16);  // 2000 / 128: 15 full batches and one of 80, per epoch
  CHECK(a.log[1].loss < a.log[0].loss);
  for (int r = 1; r < 3; ++r) {
    INFO("run " << r);
    CHECK(runs[r].weights_fingerprint == a.weights_fingerprint);
    CHECK(runs[r].predictions == a.predictions);
    for (std::size_t e = 0; e < a.log.size(); ++e) CHECK(runs[r].log[e].loss == a.log[e].loss);
  }
}

TEST_CASE("gpu mnist-cnn: --graph is refused, naming dropout") {
  TrainConfig c = control_config();
  c.graph = true;
  c.max_steps = 1;
  CHECK_THROWS_WITH(train(c, {}, mnist_shaped(256, 64)), Contains("dropout") && Contains("mnist-cnn"));
}

TEST_CASE("gpu mnist-cnn: one batch's forward and backward equal the CPU's exactly on integer data") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 g(seed);
  const int64_t n = 4;
  Context cpu;
  Context gpu(Device::cuda(0), exact_policy());
  auto net_c = make_net(cpu, {"mnist-cnn", 10, 1});
  auto net_g = make_net(gpu, {"mnist-cnn", 10, 1});
  const Weights w = integer_weights(g);
  require_exact(w, n);
  load(cpu, *net_c, w);
  load(gpu, *net_g, w);
  const std::vector<float> xv = binary_images(g, n), dyv = ternary(g, n * 10, 2.0 / 3);

  Var lc = net_c->forward(cpu, Var(cpu.from_host(xv, {n, 1, 28, 28})), false);
  Var lg = net_g->forward(gpu, Var(gpu.from_host(xv, {n, 1, 28, 28})), false);
  auto lcv = lc.value().to_host_f32();
  CHECK(lg.value().to_host_f32() == lcv);
  CHECK(max_abs(lcv) > 0);  // the data reach the logits
  cpu.tape().backward(cpu, lc, cpu.from_host(dyv, {n, 10}));
  gpu.tape().backward(gpu, lg, gpu.from_host(dyv, {n, 10}));
  auto pc = net_c->params(), pg = net_g->params();
  for (std::size_t i = 0; i < pc.size(); ++i) {
    INFO(pc[i].name);
    REQUIRE(pg[i].var.grad().defined());
    auto gc = pc[i].var.grad().to_host_f32();
    CHECK(pg[i].var.grad().to_host_f32() == gc);
    CHECK(max_abs(gc) > 0);
  }
}

TEST_CASE("gpu mnist-cnn: training-mode forward: same dropout masks, logits within the derived bound") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 g(seed);
  const int64_t n = 4, step = 5;
  Context cpu;
  Context gpu(Device::cuda(0), exact_policy());
  auto net_c = make_net(cpu, {"mnist-cnn", 10, 1});
  auto net_g = make_net(gpu, {"mnist-cnn", 10, 1});
  const Weights w = integer_weights(g);  // exact up to dropout1 (header comment)
  require_exact(w, n);
  load(cpu, *net_c, w);
  load(gpu, *net_g, w);
  const std::vector<float> xv = binary_images(g, n);

  DropoutCapture cap_c, cap_g;
  cpu.set_tracer(&cap_c);
  gpu.set_tracer(&cap_g);
  net_c->begin_step(seed, step);
  net_g->begin_step(seed, step);
  auto lc = net_c->forward(cpu, Var(cpu.from_host(xv, {n, 1, 28, 28})), true).value().to_host_f32();
  auto lg = net_g->forward(gpu, Var(gpu.from_host(xv, {n, 1, 28, 28})), true).value().to_host_f32();
  cpu.set_tracer(nullptr);
  gpu.set_tracer(nullptr);
  cpu.tape().clear();
  gpu.tape().clear();
  REQUIRE(cap_c.out.size() == 2);
  REQUIRE(cap_g.out.size() == 2);

  // dropout1's input is exact (integers below 2^24, header comment), the mask is a function of (seed, step,
  // layer, index) and the scaling one correctly rounded multiply: the same bits on both devices.
  const auto& t = cap_c.out["dropout1"];
  CHECK(cap_g.out["dropout1"] == t);
  const uint64_t key1 = dropout_key(seed, step, "dropout1");
  int64_t dropped1 = 0;
  for (std::size_t i = 0; i < t.size(); ++i) {
    const bool dropped = ref::dropout_dropped(key1, int64_t(i), 0.25f);
    dropped1 += dropped;
    if (dropped) CHECK(t[i] == 0.0f);
  }
  CHECK(dropped1 > 0);

  // fc1 sums 9216 float products of the identical dropout1 output t. For the exact value s* of
  // row (e, i) plus bias, both devices are within E3 = gamma_{9218} (A + |b|), A = sum |W1||t|
  // (Higham's dot-product bound for any summation order, one more rounding for the bias add; the
  // CPU's double sum rounded once is inside it too).
  const auto& f1 = w.at("fc1.weight");
  const auto& f2 = w.at("fc2.weight");
  std::vector<double> e3(n * 128);
  for (int64_t e = 0; e < n; ++e)
    for (int64_t i = 0; i < 128; ++i) {
      double a = std::fabs(w.at("fc1.bias")[i]);
      for (int64_t j = 0; j < 9216; ++j) a += std::fabs(f1[i * 9216 + j]) * std::fabs(t[e * 9216 + j]);
      e3[e * 128 + i] = gamma_k(9218) * a;
    }
  // ReLU is 1-Lipschitz and dropout2's scale is exactly 2 (p = 0.5): a kept element is within 2 E3
  // of its exact value on each device, a dropped one is 0 on both.
  const auto& d2c = cap_c.out["dropout2"];
  const auto& d2g = cap_g.out["dropout2"];
  const uint64_t key2 = dropout_key(seed, step, "dropout2");
  int64_t dropped2 = 0;
  for (int64_t i = 0; i < n * 128; ++i) {
    INFO("dropout2 element " << i);
    if (ref::dropout_dropped(key2, i, 0.5f)) {
      ++dropped2;
      CHECK(d2g[i] == 0.0f);
      CHECK(d2c[i] == 0.0f);
    } else {
      CHECK(std::fabs(double(d2g[i]) - d2c[i]) <= 4 * e3[i]);
    }
  }
  CHECK(dropped2 > 0);
  CHECK(dropped2 < n * 128);
  // fc2: each device's logit is within E4 = sum |W2| 2 E3 (propagated) + gamma_{130} (sum |W2|
  // |d2| + |b|) (its own rounding; |d2| <= |d2_cpu| + 4 E3) of the exact one: the two within 2 E4.
  for (int64_t e = 0; e < n; ++e)
    for (int64_t o = 0; o < 10; ++o) {
      double prop = 0, a = std::fabs(w.at("fc2.bias")[o]);
      for (int64_t j = 0; j < 128; ++j) {
        const double wj = std::fabs(f2[o * 128 + j]), ej = e3[e * 128 + j];
        prop += wj * 2 * ej;
        a += wj * (std::fabs(d2c[e * 128 + j]) + 4 * ej);
      }
      const double e4 = prop + gamma_k(130) * a;
      INFO("logit " << e << "," << o << ": gpu " << lg[e * 10 + o] << " cpu " << lc[e * 10 + o] << " bound " << 2 * e4);
      CHECK(std::fabs(double(lg[e * 10 + o]) - lc[e * 10 + o]) <= 2 * e4);
    }
}
