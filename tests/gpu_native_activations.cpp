// Native activations on the GPU: bf16/f16 (and f32) channels-last tensors read as they are by batch
// norm (ditto's kernels and cuDNN's), activations, add and global average pooling, against the
// CPU's reference (which computes in float or double from the same widened values and rounds once
// to the same dtype), every deterministic variant repeating bit for bit; and a bf16 ResNet-18 whose
// convolutions hand on native results trains twice, eager and graphed, to the same bits.
//
// Tolerances. Elementwise ops that round an exactly computed float (add of two bf16 values, relu)
// must equal the CPU bit for bit. Batch norm and pooling sum in another order than the CPU's, so
// their float results differ by a few fp32 ulps of the sums, and after rounding to the output
// format by at most one unit in its last place at the larger magnitude; batch norm's dx subtracts
// two means from dy (cancellation), so it gets that unit at the scale of its largest value:
// |gpu - cpu| <= ulp(max|cpu|) with ulp = 2^-7 (bf16), 2^-10 (f16), 2^-20 (f32: float sums against
// the CPU's double ones).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include "engine/context.h"
#include "engine/error.h"
#include "engine/tensor_ops.h"
#include "engine/tuning.h"
#include "experiments/run_dir.h"
#include "experiments/train.h"
#include "kernels/activation.h"
#include "kernels/batchnorm.h"
#include "kernels/bias.h"
#include "kernels/concat.h"
#include "kernels/elementwise.h"
#include "kernels/loss.h"
#include "kernels/pool.h"
#include "nets/nets.h"
#include "support.h"
#include "train_support.h"

#include <nlohmann/json.hpp>

using namespace ditto;
using Catch::Matchers::Contains;

namespace {

double unit_of(DType t) { return t == DType::BF16 ? 0x1p-7 : t == DType::F16 ? 0x1p-10 : 0x1p-20; }

// Largest |a - b| over max |b| in units of the format: <= 1 passes.
double scaled_error(const std::vector<float>& a, const std::vector<float>& b, DType t) {
  REQUIRE(a.size() == b.size());
  double worst = 0, scale = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    worst = std::max(worst, std::fabs(double(a[i]) - double(b[i])));
    scale = std::max(scale, std::fabs(double(b[i])));
  }
  return scale == 0 ? worst : worst / (unit_of(t) * scale);
}

struct BnRun {
  Tensor y, dx, dgamma, dbeta, running_mean, running_var;
};

BnRun run_bn(Context& ctx, const Tensor& x, const Tensor& dy) {
  BatchNormState st = batch_norm_state(ctx, x.dim(1));
  Var xv(ctx.to_device(x), true), g(ctx.full({x.dim(1)}, 1.25f), true), b(ctx.full({x.dim(1)}, 0.5f), true);
  Var y = batch_norm(ctx, "bn", xv, g, b, st, true);
  ctx.tape().backward(ctx, y, ctx.to_device(dy));
  return {y.value(), xv.grad(), g.grad(), b.grad(), st.running_mean, st.running_var};
}

}  // namespace

TEST_CASE("gpu native activations: batch norm on channels-last x of every float dtype, every variant, against the CPU") {
  const DType d = GENERATE(DType::BF16, DType::F16, DType::F32);
  // C = 64 (vectors), C = 24 (a partial channel tile), and H*W odd; rows enough for several parts.
  const Shape s = GENERATE(Shape{32, 64, 16, 16}, Shape{16, 24, 7, 9});
  const std::string variant = GENERATE(as<std::string>{}, "deterministic", "atomic", "cudnn");
  INFO(dtype_name(d) << " " << shape_str(s) << " bwd=" << variant);
  Context cpu;
  Context gpu(Device::cuda(), Policy::parse({"bn.bwd=" + variant}));
  const Tensor x = to_channels_last(cpu, cpu.from_host(test::random_vec<float>(shape_numel(s), 5), s), d);
  const Tensor dy = to_channels_last(cpu, cpu.from_host(test::random_vec<float>(shape_numel(s), 6), s), d);
  const BnRun want = run_bn(cpu, x, dy);
  const BnRun got = run_bn(gpu, gpu.to_device(x), gpu.to_device(dy));
  REQUIRE(got.y.type_tag() == x.type_tag());
  REQUIRE(got.dx.type_tag() == x.type_tag());
  CHECK(scaled_error(got.y.to_host_f32(), want.y.to_host_f32(), d) <= 1.0);
  CHECK(scaled_error(got.dx.to_host_f32(), want.dx.to_host_f32(), d) <= 1.0);
  CHECK(scaled_error(got.dgamma.to_host_f32(), want.dgamma.to_host_f32(), DType::BF16) <= 1.0);
  CHECK(scaled_error(got.dbeta.to_host_f32(), want.dbeta.to_host_f32(), DType::BF16) <= 1.0);
  CHECK(scaled_error(got.running_mean.to_host_f32(), want.running_mean.to_host_f32(), DType::F32) <= 64.0);
  CHECK(scaled_error(got.running_var.to_host_f32(), want.running_var.to_host_f32(), DType::F32) <= 64.0);
  if (variant == "deterministic") {
    std::set<std::string> prints;
    for (int i = 0; i < 10; ++i) {
      const BnRun r = run_bn(gpu, gpu.to_device(x), gpu.to_device(dy));
      prints.insert(r.y.fingerprint().hex() + r.dx.fingerprint().hex() + r.dgamma.fingerprint().hex() +
                    r.dbeta.fingerprint().hex());
    }
    CHECK(prints.size() == 1);
  }
}

TEST_CASE("gpu native activations: add, relu, silu and global average pooling on bf16 channels-last tensors") {
  Context cpu, gpu(Device::cuda());
  const Shape s{16, 64, 8, 8};
  for (DType d : {DType::BF16, DType::F16}) {
    INFO(dtype_name(d));
    const Tensor a = to_channels_last(cpu, cpu.from_host(test::random_vec<float>(shape_numel(s), 7), s), d);
    const Tensor b = to_channels_last(cpu, cpu.from_host(test::random_vec<float>(shape_numel(s), 8), s), d);
    CHECK(add(gpu, Var(gpu.to_device(a)), Var(gpu.to_device(b))).value().fingerprint() ==
          add(cpu, Var(a), Var(b)).value().fingerprint());
    Var xg(gpu.to_device(a), true), xc(a, true);
    Var yg = relu(gpu, xg), yc = relu(cpu, xc);
    CHECK(yg.value().fingerprint() == yc.value().fingerprint());
    gpu.tape().backward(gpu, yg, gpu.to_device(b));
    cpu.tape().backward(cpu, yc, cpu.to_device(b));
    CHECK(xg.grad().fingerprint() == xc.grad().fingerprint());
    CHECK(scaled_error(silu(gpu, Var(gpu.to_device(a))).value().to_host_f32(),
                       silu(cpu, Var(a)).value().to_host_f32(), d) <= 1.0);
    Var pg(gpu.to_device(a), true), pc(a, true);
    Var qg = global_avg_pool(gpu, pg), qc = global_avg_pool(cpu, pc);
    CHECK(scaled_error(qg.value().to_host_f32(), qc.value().to_host_f32(), DType::F32) <= 64.0);
    const Tensor g = cpu.from_host(test::random_vec<float>(16 * 64, 9), {16, 64});
    gpu.tape().backward(gpu, qg, gpu.to_device(g));
    cpu.tape().backward(cpu, qc, cpu.to_device(g));
    CHECK(pg.grad().fingerprint() == pc.grad().fingerprint());
  }
  // Squeeze-and-excitation: channel_mul with a bf16 excitation, against the CPU.
  {
    const Tensor x = to_channels_last(cpu, cpu.from_host(test::random_vec<float>(shape_numel(s), 31), s), DType::BF16);
    const Tensor e = to_channels_last(cpu, cpu.from_host(test::random_vec<float>(16 * 64, 32), {16, 64, 1, 1}),
                                      DType::BF16);
    const Tensor g = to_channels_last(cpu, cpu.from_host(test::random_vec<float>(shape_numel(s), 33), s), DType::BF16);
    auto se = [&](Context& c) {
      Var xv(c.to_device(x), true), ev(c.to_device(e), true);
      Var y = channel_mul(c, xv, ev);
      c.tape().backward(c, y, c.to_device(g));
      return std::make_tuple(y.value(), xv.grad(), ev.grad());
    };
    const auto [yc, dxc, dec] = se(cpu);
    const auto [yg, dxg, deg] = se(gpu);
    CHECK(yg.fingerprint() == yc.fingerprint());  // one product of two bf16 values, rounded once
    CHECK(dxg.fingerprint() == dxc.fingerprint());
    CHECK(scaled_error(deg.to_host_f32(), dec.to_host_f32(), DType::BF16) <= 1.0);
  }
  // bf16 NCHW has no batch-norm kernel on the GPU: refused by name.
  Var x(to_dtype(gpu, gpu.full(s, 1.f), DType::BF16));
  BatchNormState st = batch_norm_state(gpu, 64);
  CHECK_THROWS_WITH(batch_norm(gpu, "bn3", x, Var(gpu.full({64}, 1.f)), Var(gpu.full({64}, 0.f)), st, true),
                    Contains("bn3") && Contains("channels-last"));
}

TEST_CASE("gpu native activations: max pooling and the bias on bf16 channels-last tensors, every variant, against the CPU") {
  const std::string pool = GENERATE(as<std::string>{}, "gather", "cudnn-deterministic", "atomic-scatter", "cudnn");
  const std::string bias = GENERATE(as<std::string>{}, "deterministic", "atomic", "cudnn");
  INFO("maxpool bwd=" << pool << ", bias_bwd=" << bias);
  Context cpu;
  Context gpu(Device::cuda(), Policy::parse({"pool1.bwd=" + pool, "conv1.bias_bwd=" + bias}));
  const Shape s{16, 64, 15, 15};
  const Tensor x = to_channels_last(cpu, cpu.from_host(test::random_vec<float>(shape_numel(s), 21), s), DType::BF16);
  const PoolParams p{3, 3, 2, 2, 1, 1};
  Var xc(x, true), xg(gpu.to_device(x), true);
  Var yc = max_pool2d(cpu, "pool1", xc, p), yg = max_pool2d(gpu, "pool1", xg, p);
  CHECK(yg.value().fingerprint() == yc.value().fingerprint());  // the max is exact
  const Tensor g =
      to_channels_last(cpu, cpu.from_host(test::random_vec<float>(shape_numel(yc.shape()), 22), yc.shape()), DType::BF16);
  cpu.tape().backward(cpu, yc, cpu.to_device(g));
  gpu.tape().backward(gpu, yg, gpu.to_device(g));
  REQUIRE(xg.grad().type_tag() == "bf16-nhwc");
  if (pool == "gather")  // the same float sums in the same order, rounded once
    CHECK(xg.grad().fingerprint() == xc.grad().fingerprint());
  else
    CHECK(scaled_error(xg.grad().to_host_f32(), xc.grad().to_host_f32(), DType::BF16) <= 1.0);

  const Tensor b = cpu.from_host(test::random_vec<float>(64, 23), {64});
  if (bias == "cudnn") {  // cuDNN refuses bf16 channels-last bias gradients: a pinned cudnn says so at the forward
    CHECK_THROWS_WITH(bias_add(gpu, "conv1", op::conv2d, Var(gpu.to_device(x)), Var(gpu.to_device(b), true)),
                      Contains("conv1") && Contains("cudnn") && Contains("deterministic"));
    return;
  }
  Var bc(b, true), bg(gpu.to_device(b), true);
  Var zc = bias_add(cpu, "conv1", op::conv2d, Var(x), bc), zg = bias_add(gpu, "conv1", op::conv2d, Var(gpu.to_device(x)), bg);
  CHECK(zg.value().fingerprint() == zc.value().fingerprint());
  cpu.tape().backward(cpu, zc, cpu.to_device(x));
  gpu.tape().backward(gpu, zg, gpu.to_device(x));
  CHECK(scaled_error(bg.grad().to_host_f32(), bc.grad().to_host_f32(), DType::BF16) <= 1.0);
  if (bias == "deterministic") {
    std::set<std::string> prints;
    for (int i = 0; i < 10; ++i) {
      Var bi(gpu.to_device(b), true);
      Var z = bias_add(gpu, "conv1", op::conv2d, Var(gpu.to_device(x)), bi);
      gpu.tape().backward(gpu, z, gpu.to_device(x));
      prints.insert(bi.grad().fingerprint().hex());
    }
    CHECK(prints.size() == 1);
  }
}

TEST_CASE("gpu native activations: channels-last pooling over few and many channels against the CPU") {
  // The channels-last kernels give each pixel a group of lanes sized to its channels (1 to 32, a
  // warp holding several pixels below 32 channels): channel counts on both sides of each group
  // size, overlapping padded windows and plain 2x2 ones, every float dtype.
  const int64_t channels = GENERATE(as<int64_t>{}, 1, 3, 5, 16, 20, 33, 64);
  const DType dtype = GENERATE(DType::BF16, DType::F16, DType::F32);
  const PoolParams p = GENERATE(PoolParams{3, 3, 2, 2, 1, 1}, PoolParams{2, 2, 2, 2, 0, 0}, PoolParams{3, 3, 1, 1, 1, 1});
  INFO("C=" << channels << " " << dtype_name(dtype) << " kernel " << p.kernel_h << " stride " << p.stride_h);
  Context cpu;
  Context gpu(Device::cuda(), Policy::parse({"pool1.bwd=gather"}));
  const Shape s{3, channels, 13, 11};
  const Tensor x = to_channels_last(cpu, cpu.from_host(test::random_vec<float>(shape_numel(s), 31), s), dtype);
  const Shape ys = pool_output_shape(s, p);
  const Tensor g = to_channels_last(cpu, cpu.from_host(test::random_vec<float>(shape_numel(ys), 32), ys), dtype);
  for (const bool max : {true, false}) {
    INFO((max ? "max" : "avg"));
    Var xc(x, true), xg(gpu.to_device(x), true);
    Var yc = max ? max_pool2d(cpu, "pool1", xc, p) : avg_pool2d(cpu, xc, p);
    Var yg = max ? max_pool2d(gpu, "pool1", xg, p) : avg_pool2d(gpu, xg, p);
    cpu.tape().backward(cpu, yc, g);
    gpu.tape().backward(gpu, yg, gpu.to_device(g));
    if (max) {  // the max is exact, and dx the same float sums in the same order, rounded once
      CHECK(yg.value().fingerprint() == yc.value().fingerprint());
      CHECK(xg.grad().fingerprint() == xc.grad().fingerprint());
    } else {  // the reference sums in double: the float sums agree to a unit of the format
      CHECK(scaled_error(yg.value().to_host_f32(), yc.value().to_host_f32(), dtype) <= 1.0);
      CHECK(scaled_error(xg.grad().to_host_f32(), xc.grad().to_host_f32(), dtype) <= 1.0);
    }
  }
}

namespace {
// Two epochs of `model` on synthetic CIFAR-shaped data, deterministic, bf16 channels-last, native.
TrainConfig native_config(const std::string& model) {
  TrainConfig c = test::synthetic_config(model, 512, 128, 32, 64, "cuda");
  c.deterministic_init = c.deterministic_input = true;
  c.kernels = "deterministic";
  c.precision = "bf16";
  c.channels_last = true;
  c.native_activations = true;
  c.epochs = 2;
  return c;
}

// Trains c twice eagerly and once graphed: the three end in the same weights (and the graphed run
// predicts the same); the first run's result.
TrainResult repeats_graphed_as_eager(TrainConfig c) {
  const TrainResult a = train(c), b = train(c);
  CHECK(a.weights_fingerprint == b.weights_fingerprint);
  CHECK(std::isfinite(a.log.back().loss));
  c.graph = true;
  const TrainResult graphed = train(c);
  CHECK(graphed.weights_fingerprint == a.weights_fingerprint);
  CHECK(graphed.predictions == a.predictions);
  return a;
}
}  // namespace

TEST_CASE("gpu native activations: bf16 SmallCNN with native channels-last activations repeats, graphed as eager") {
  repeats_graphed_as_eager(native_config("smallcnn"));
}

TEST_CASE("gpu native activations: bf16 ResNet-18 with native channels-last activations repeats, graphed as eager") {
  TrainConfig c = native_config("resnet18");
  const TrainResult a = repeats_graphed_as_eager(c);
  c.native_activations = false;
  const TrainResult widened = train(c);
  CHECK(widened.weights_fingerprint != a.weights_fingerprint);
  std::printf("NATIVE resnet18 bf16 channels-last: native %s (loss %.4f, top1 %.4f), widened %s (loss %.4f, top1 %.4f)\n",
              a.weights_fingerprint.hex().c_str(), a.log.back().loss, a.log.back().test_top1,
              widened.weights_fingerprint.hex().c_str(), widened.log.back().loss, widened.log.back().test_top1);
}

TEST_CASE("gpu native activations: every zoo network trains a bf16 step with native activations, twice to the same bits") {
  struct Probe {
    const char* model;
    int channels, side, batch;
  };
  // The sizes of tests/gpu_zoo_nets.cpp: each net's smallest documented side.
  const Probe probe = GENERATE(values<Probe>({{"smallcnn", 3, 16, 2}, {"two-conv", 3, 16, 2}, {"resnet18-imagenet", 3, 32, 2},
                                              {"mnist-cnn", 1, 28, 2}, {"vgg16-bn", 3, 224, 1}, {"resnet50", 3, 32, 2},
                                              {"mediumcnn-k3", 3, 64, 2}, {"densenet121", 3, 32, 2}, {"mobilenet", 3, 32, 2},
                                              {"mobilenet-v2", 3, 32, 2}, {"efficientnet-b0", 3, 32, 2},
                                              {"inception-v3", 3, 75, 2}, {"xception", 3, 71, 2}}));
  INFO(probe.model);
  auto step = [&] {
    Context ctx(Device::cuda(0),
                Policy::parse({"*=deterministic", "*.precision=bf16", "*.layout=nhwc", "*.output=native"}));
    auto net = make_net(ctx, {probe.model, 10, probe.channels});
    net->init(ctx, 7);
    net->begin_step(7, 1);
    const Shape xs{probe.batch, probe.channels, probe.side, probe.side};
    Tensor x = ctx.from_host(test::random_vec(std::size_t(shape_numel(xs)), 7), xs);
    std::vector<int32_t> labels(std::size_t(probe.batch));
    for (int i = 0; i < probe.batch; ++i) labels[std::size_t(i)] = i % 10;
    Var logits = net->forward(ctx, Var(x), true);
    Var loss = softmax_cross_entropy(ctx, "loss", logits, ctx.from_host(labels, {probe.batch}));
    ctx.tape().backward(ctx, loss);
    const std::vector<float> lv = loss.value().to_host_f32();
    CHECK(std::isfinite(lv[0]));
    std::string prints = loss.value().fingerprint().hex();
    for (const auto& prm : net->params()) {
      INFO(prm.name);
      REQUIRE(prm.var.grad().defined());
      prints += prm.var.grad().fingerprint().hex();
    }
    return prints;
  };
  CHECK(step() == step());
}

TEST_CASE("gpu native activations: bf16 ResNet-18 on cuDNN's backend engines repeats, graphed as eager") {
  // Every convolution direction pinned to the engine variant (heuristic mode A's first
  // reproducible configuration, kernels/conv2d.h): the path whose plans are captured into the
  // step's CUDA graph like the legacy calls.
  TrainConfig c = native_config("resnet18");
  c.pins = {"*.fwd=engine", "*.bwd_data=engine", "*.bwd_filter=engine"};
  const TrainResult a = repeats_graphed_as_eager(c);
  std::printf("NATIVE resnet18 bf16 channels-last on engines: %s (loss %.4f, top1 %.4f)\n",
              a.weights_fingerprint.hex().c_str(), a.log.back().loss, a.log.back().test_top1);
}

TEST_CASE("gpu native activations: bf16 and fp16 ResNet-18 with a tuning file: two reading runs and a graphed one agree") {
  // Tuning times the engine beside cuDNN's Find and ditto's variants; the runs that read the file
  // take exactly its entries, so they repeat bit for bit, graphed as eager.
  for (const char* precision : {"bf16", "fp16"}) {
    INFO(precision);
    TrainConfig c = native_config("resnet18");
    c.precision = precision;
    c.epochs = 1;
    c.tuning = test::scratch("gpu_native_activations", std::string("resnet18-") + precision + ".json");
    std::filesystem::remove(c.tuning);
    train(c);  // tunes
    const TuningTable t = TuningTable::load(c.tuning);
    int engines = 0;
    for (const auto& e : t.entries()) engines += e.algo == "engine";
    std::printf("TUNED resnet18 %s native: %zu entries, %d of them the engine\n", precision, t.entries().size(), engines);
    CHECK(t.entries().size() > 0);
    const TrainResult a = repeats_graphed_as_eager(c);
    for (const auto& op : a.ops)
      if (op.op == "conv2d" && (op.knob == "fwd" || op.knob == "bwd_data" || op.knob == "bwd_filter"))
        CHECK(op.deterministic == Determinism::Yes);
  }
}

TEST_CASE("gpu native activations: --pins-from replays cuDNN's engines, and a replay that ran other ones is refused") {
  // The engine variant is cuDNN's heuristic pick for the problem, GPU model and cuDNN version: a pin
  // alone replays it only where those match, so the trainer compares configurations after the first
  // step. Here the recorded configuration of one layer is rewritten, as another GPU would have chosen.
  TrainConfig c = native_config("smallcnn");
  c.epochs = 1;
  c.overwrite = true;
  c.out = test::scratch("gpu_native_activations", "replay-source");
  const TrainResult source = train(c);
  const std::string manifest = c.out + "/manifest.json";

  TrainConfig replay = c;
  replay.out = test::scratch("gpu_native_activations", "replay");
  replay.pins = pins_from_manifest(manifest);
  replay.pins_from = manifest;
  CHECK(train(replay).weights_fingerprint == source.weights_fingerprint);

  nlohmann::json m;
  std::ifstream(manifest) >> m;
  std::string layer;
  for (auto& op : m["ops"])
    if (op.value("variant", "") == "engine" && !op.value("algorithm", "").empty()) {
      layer = op["layer"].get<std::string>() + "." + op["knob"].get<std::string>();
      op["algorithm"] = "eng9999[] TENSOR_CORE";
      break;
    }
  REQUIRE_FALSE(layer.empty());
  const std::string other = test::scratch("gpu_native_activations", "other-gpu-manifest.json");
  std::ofstream(other) << m.dump(1);
  replay.pins = pins_from_manifest(other);
  replay.pins_from = other;
  CHECK_THROWS_WITH(train(replay), Contains("--pins-from") && Contains(layer) && Contains("recorded eng9999[]"));
}
