// Native activations on the CPU: channels-last (Layout::Nhwc) tensors and the ops that read bf16/f16
// and channels-last tensors as they are (conv2d.output=native, batch norm, activations, add, global
// average pooling). Each op must compute in float from the widened values and round once to the
// operand's dtype, in the operand's layout — checked bit for bit against the fp32 op run on the
// widened values and rounded afterwards — and every op that reads only NCHW must refuse them.
#include <catch2/catch.hpp>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "engine/checkpoint.h"
#include "engine/context.h"
#include "engine/detail/half_bits.h"
#include "engine/digest.h"
#include "engine/error.h"
#include "engine/tensor_ops.h"
#include "experiments/train.h"
#include "kernels/activation.h"
#include "kernels/batchnorm.h"
#include "kernels/bias.h"
#include "kernels/concat.h"
#include "kernels/conv2d.h"
#include "kernels/dropout.h"
#include "kernels/elementwise.h"
#include "kernels/linear.h"
#include "kernels/loss.h"
#include "kernels/pool.h"
#include "kernels/upsample.h"
#include "support.h"
#include "train_support.h"

using namespace ditto;
using Catch::Matchers::Contains;

namespace {

const Shape kShape{2, 8, 3, 5};  // C = 8: the 16-byte vectors of the GPU kernels, and H*W odd

Tensor random_tensor(Context& ctx, const Shape& s, uint64_t seed) {
  return ctx.from_host(test::random_vec<float>(static_cast<std::size_t>(shape_numel(s)), seed), s);
}

// t's values widened to f32 NCHW: what the fp32 reference ops read.
Tensor widened(Context& ctx, const Tensor& t) { return to_form(ctx, t, DType::F32, Layout::Nchw); }

}  // namespace

TEST_CASE("channels-last tensors: logical shapes, refused by NCHW-only ops, told apart by fingerprints") {
  Context ctx;
  const Tensor t = random_tensor(ctx, kShape, test::fresh_seed());
  const Tensor nhwc = to_channels_last(ctx, t, DType::F32);
  CHECK(nhwc.shape() == kShape);
  CHECK(nhwc.type_tag() == "f32-nhwc");
  CHECK(to_channels_last(ctx, nhwc, DType::F32).raw() == nhwc.raw());  // already channels-last: no pass
  CHECK_THROWS_WITH(Tensor(detail::storage_of(t), {16, 15}, DType::F32, Layout::Nhwc), Contains("4-D"));
  CHECK_THROWS_WITH(nhwc.reshape({2, 120}), Contains("channels-last"));
  // The same bytes in the other layout are another tensor.
  const Tensor same_bytes(detail::storage_of(nhwc), kShape, DType::F32, Layout::Nchw);
  CHECK(same_bytes.fingerprint() != nhwc.fingerprint());
  CHECK(digest(same_bytes) != digest(nhwc));
  CHECK(digest(nhwc) == digest(ctx.to_device(nhwc)));
  // Ops that read only NCHW say so, by name.
  CHECK_THROWS_WITH(upsample2d(ctx, "up1", Var(nhwc), UpsampleParams{UpsampleMode::Nearest, 6, 10}),
                    Contains("up1") && Contains("channels-last"));
  Tensor dst = ctx.empty(kShape);
  CHECK_THROWS_AS(ctx.copy(dst, nhwc), ShapeError);
  CHECK_THROWS_WITH(save_safetensors(test::scratch("cpu_native_activations", "nhwc.safetensors"), {{"x", nhwc}}),
                    Contains("channels-last"));
}

TEST_CASE("add and activations on bf16/f16 channels-last tensors: float math, rounded once, layout kept") {
  Context ctx;
  const Tensor fa = random_tensor(ctx, kShape, test::fresh_seed()), fb = random_tensor(ctx, kShape, test::fresh_seed());
  for (DType d : {DType::BF16, DType::F16}) {
    INFO(dtype_name(d));
    const Tensor a = to_channels_last(ctx, fa, d), b = to_channels_last(ctx, fb, d);
    const std::vector<float> va = a.to_host_f32(), vb = b.to_host_f32();  // memory order
    Var sum = add(ctx, Var(a), Var(b));
    REQUIRE(sum.value().type_tag() == a.type_tag());
    const std::vector<float> vs = sum.value().to_host_f32();
    for (std::size_t i = 0; i < va.size(); ++i) REQUIRE(vs[i] == detail::round_through(d, va[i] + vb[i]));
    Tensor acc = ctx.to_device(a);
    add_inplace(ctx, acc, b);
    CHECK(acc.fingerprint() == sum.value().fingerprint());
    CHECK_THROWS_WITH(add(ctx, Var(a), Var(widened(ctx, b))), Contains("one dtype and layout"));

    // relu forward is exact; its backward passes dy where y > 0, in x's form.
    Var x(a, true);
    Var y = relu(ctx, x);
    REQUIRE(y.value().type_tag() == a.type_tag());
    const Tensor dy = to_channels_last(ctx, random_tensor(ctx, kShape, test::fresh_seed()), d);
    ctx.tape().backward(ctx, y, ctx.to_device(dy));
    REQUIRE(x.grad().type_tag() == a.type_tag());
    const std::vector<float> vy = y.value().to_host_f32(), vdy = dy.to_host_f32(), vdx = x.grad().to_host_f32();
    for (std::size_t i = 0; i < va.size(); ++i) {
      REQUIRE(vy[i] == (va[i] > 0.f ? va[i] : 0.f));
      REQUIRE(vdx[i] == (vy[i] > 0.f ? vdy[i] : 0.f));
    }
    // silu: the float formula of the widened value, rounded once (what the fp32 op gives, rounded).
    const Tensor s = silu(ctx, Var(a)).value();
    CHECK(s.fingerprint() == to_channels_last(ctx, silu(ctx, Var(widened(ctx, a))).value(), d).fingerprint());
  }
}

TEST_CASE("batch norm on bf16/f16 channels-last x: float statistics, y and dx rounded once, in x's layout") {
  Context ctx;
  const Tensor fx = random_tensor(ctx, kShape, test::fresh_seed());
  const Tensor fdy = random_tensor(ctx, kShape, test::fresh_seed());
  for (DType d : {DType::BF16, DType::F16}) {
    INFO(dtype_name(d));
    const Tensor x = to_channels_last(ctx, fx, d), dy = to_channels_last(ctx, fdy, d);
    // What it must equal: the fp32 op on the widened values, its y and dx rounded afterwards.
    auto run = [&](const Tensor& input, const Tensor& grad, BatchNormState& st) {
      Var xv(input, true), g(ctx.full({8}, 1.5f), true), b(ctx.full({8}, -0.25f), true);
      Var y = batch_norm(ctx, "bn1", xv, g, b, st, true);
      ctx.tape().backward(ctx, y, ctx.to_device(grad));
      return std::vector<Tensor>{y.value(), xv.grad(), g.grad(), b.grad()};
    };
    BatchNormState sa = batch_norm_state(ctx, 8), sb = batch_norm_state(ctx, 8);
    const auto got = run(x, dy, sa);
    const auto want = run(widened(ctx, x), widened(ctx, dy), sb);
    CHECK(got[0].type_tag() == x.type_tag());
    CHECK(got[1].type_tag() == x.type_tag());
    CHECK(got[0].fingerprint() == to_channels_last(ctx, want[0], d).fingerprint());
    CHECK(got[1].fingerprint() == to_channels_last(ctx, want[1], d).fingerprint());
    CHECK(got[2].fingerprint() == want[2].fingerprint());  // dgamma, dbeta: float
    CHECK(got[3].fingerprint() == want[3].fingerprint());
    CHECK(sa.running_mean.fingerprint() == sb.running_mean.fingerprint());
    CHECK(sa.running_var.fingerprint() == sb.running_var.fingerprint());
  }
}

TEST_CASE("global average pooling reads bf16 channels-last x as it is; dx comes back in x's form") {
  Context ctx;
  const Tensor fx = random_tensor(ctx, kShape, test::fresh_seed());
  const Tensor g = random_tensor(ctx, {2, 8}, test::fresh_seed());
  const Tensor x = to_channels_last(ctx, fx, DType::BF16);
  // Forward and backward of one input (one tape pass each: backward runs and clears the whole tape).
  auto run = [&](const Tensor& input, const Tensor& grad) {
    Var xv(input, true);
    Var y = global_avg_pool(ctx, xv);
    ctx.tape().backward(ctx, y, ctx.to_device(grad));
    return std::make_pair(y.value(), xv.grad());
  };
  const auto [y, dx] = run(x, g);
  const auto [yw, dxw] = run(widened(ctx, x), g);
  CHECK(y.type_tag() == "f32");
  CHECK(y.fingerprint() == yw.fingerprint());
  CHECK(dx.type_tag() == "bf16-nhwc");
  CHECK(dx.fingerprint() == to_channels_last(ctx, dxw, DType::BF16).fingerprint());
}

TEST_CASE("max pooling and the bias read bf16 channels-last x as it is; y and dx in x's form") {
  Context ctx;
  const Tensor fx = random_tensor(ctx, kShape, test::fresh_seed());
  const Tensor x = to_channels_last(ctx, fx, DType::BF16);
  const PoolParams p{3, 3, 2, 2, 1, 1};  // overlapping windows: a dx may gather several dy
  const Tensor g = random_tensor(ctx, pool_output_shape(kShape, p), test::fresh_seed());
  auto pool = [&](const Tensor& input, const Tensor& grad) {
    Var xv(input, true);
    Var y = max_pool2d(ctx, "pool1", xv, p);
    ctx.tape().backward(ctx, y, grad);
    return std::make_pair(y.value(), xv.grad());
  };
  const auto [y, dx] = pool(x, to_channels_last(ctx, g, DType::BF16));
  const auto [yw, dxw] = pool(widened(ctx, x), to_dtype(ctx, to_dtype(ctx, g, DType::BF16), DType::F32));
  CHECK(y.type_tag() == "bf16-nhwc");
  CHECK(y.fingerprint() == to_channels_last(ctx, yw, DType::BF16).fingerprint());  // exact
  CHECK(dx.fingerprint() == to_channels_last(ctx, dxw, DType::BF16).fingerprint());

  const Tensor b = ctx.from_host(test::random_vec<float>(8, 3), {8});
  const Tensor gz = to_channels_last(ctx, random_tensor(ctx, kShape, test::fresh_seed()), DType::BF16);
  auto bias = [&](const Tensor& input, const Tensor& grad) {
    Var xv(input, true), bv(ctx.to_device(b), true);
    Var z = bias_add(ctx, "conv1", op::conv2d, xv, bv);
    ctx.tape().backward(ctx, z, ctx.to_device(grad));
    return std::make_tuple(z.value(), xv.grad(), bv.grad());
  };
  const auto [z, dzx, db] = bias(x, gz);
  const auto [zw, dzxw, dbw] = bias(widened(ctx, x), widened(ctx, gz));
  CHECK(z.fingerprint() == to_channels_last(ctx, zw, DType::BF16).fingerprint());
  CHECK(db.fingerprint() == dbw.fingerprint());
  CHECK(dzx.fingerprint() == gz.fingerprint());  // dx = dy, in x's form
}

TEST_CASE("squeeze-and-excitation on bf16 channels-last x: 1x1 adaptive pooling and channel_mul read it as it is") {
  Context ctx;
  const Tensor x = to_channels_last(ctx, random_tensor(ctx, kShape, test::fresh_seed()), DType::BF16);
  // The excitation comes back from a native 1x1 convolution: bf16, channels-last, one value per plane.
  const Tensor s = to_channels_last(ctx, random_tensor(ctx, {2, 8, 1, 1}, test::fresh_seed()), DType::BF16);
  const Tensor g = to_channels_last(ctx, random_tensor(ctx, kShape, test::fresh_seed()), DType::BF16);
  auto se = [&](const Tensor& xin, const Tensor& sin, const Tensor& grad) {
    Var xv(xin, true), sv(sin, true);
    Var pooled = adaptive_avg_pool2d(ctx, xv, 1, 1);
    Var y = channel_mul(ctx, xv, sv);
    ctx.tape().backward(ctx, y, ctx.to_device(grad));
    return std::make_tuple(pooled.value(), y.value(), xv.grad(), sv.grad());
  };
  const auto [p, y, dx, ds] = se(x, s, g);
  const auto [pw, yw, dxw, dsw] = se(widened(ctx, x), widened(ctx, s), widened(ctx, g));
  CHECK(p.type_tag() == "f32");
  CHECK(p.fingerprint() == pw.fingerprint());
  CHECK(y.type_tag() == "bf16-nhwc");
  CHECK(y.fingerprint() == to_channels_last(ctx, yw, DType::BF16).fingerprint());
  CHECK(dx.fingerprint() == to_channels_last(ctx, dxw, DType::BF16).fingerprint());
  CHECK(ds.type_tag() == "bf16-nhwc");
  CHECK(ds.fingerprint() == to_channels_last(ctx, dsw, DType::BF16).fingerprint());
}

TEST_CASE("concat, average pooling, flatten and the loss take bf16 channels-last tensors; gradients in their forms") {
  Context ctx;
  const Tensor a = to_channels_last(ctx, random_tensor(ctx, kShape, test::fresh_seed()), DType::BF16);
  const Tensor b = to_channels_last(ctx, random_tensor(ctx, {2, 6, 3, 5}, test::fresh_seed()), DType::BF16);
  // concat then average pooling then flatten into the loss: the DenseNet / Inception / VGG tail.
  auto run = [&](const Tensor& ta, const Tensor& tb) {
    Var va(ta, true), vb(tb, true);
    Var cat = concat_channels(ctx, {va, vb});
    Var pooled = avg_pool2d(ctx, cat, PoolParams{2, 2, 1, 1, 0, 0});
    Var flat = flatten(ctx, pooled);
    const int64_t classes = flat.shape()[1];
    Var loss = softmax_cross_entropy(ctx, "loss", flat, ctx.from_host(std::vector<int32_t>{1, int32_t(classes - 1)}, {2}));
    ctx.tape().backward(ctx, loss);
    return std::make_tuple(cat.value(), pooled.value(), flat.value(), loss.value(), va.grad(), vb.grad());
  };
  const auto [cat, pooled, flat, loss, da, db] = run(a, b);
  const auto [catw, pooledw, flatw, lossw, daw, dbw] = run(widened(ctx, a), widened(ctx, b));
  CHECK(cat.type_tag() == "bf16-nhwc");
  CHECK(cat.fingerprint() == to_channels_last(ctx, catw, DType::BF16).fingerprint());  // a copy: exact
  CHECK(pooled.type_tag() == "bf16-nhwc");
  CHECK(pooled.fingerprint() == to_channels_last(ctx, pooledw, DType::BF16).fingerprint());
  CHECK(flat.type_tag() == "bf16");  // channels-first order, as flatten promises
  CHECK(flat.fingerprint() == to_dtype(ctx, flatw, DType::BF16).fingerprint());
  CHECK(da.type_tag() == "bf16-nhwc");
  CHECK(db.type_tag() == "bf16-nhwc");
  // Each step rounds once more to bf16 than the fp32 run, so the values differ by bf16 roundings only.
  const std::vector<float> g = da.to_host_f32(), gw = to_channels_last(ctx, daw, DType::F32).to_host_f32();
  for (std::size_t i = 0; i < g.size(); ++i) REQUIRE(std::fabs(g[i] - gw[i]) <= 0x1p-6 * std::fabs(gw[i]) + 1e-6);
  CHECK(std::fabs(loss.to_host_f32()[0] - lossw.to_host_f32()[0]) <= 1e-2);
  // Odd channel counts cannot move as bf16 pairs: said, not copied wrongly.
  const Tensor odd = to_channels_last(ctx, random_tensor(ctx, {2, 3, 3, 5}, 3), DType::BF16);
  CHECK_THROWS_WITH(concat_channels(ctx, {Var(a), Var(odd)}), Contains("even channel count"));
  CHECK_THROWS_WITH(concat_channels(ctx, {Var(a), Var(widened(ctx, b))}), Contains("one dtype and layout"));
}

TEST_CASE("a linear layer reading flattened bf16 activations hands back a bf16 dx: the product it rounded") {
  // The VGG / MNIST-CNN head: flattened native activations into a classifier. dx belongs to a bf16
  // variable, so it comes in bf16; in bf16 precision it is the product cuBLAS (or the reference)
  // rounded, bit for bit the f32 run's dx rounded again.
  for (const char* precision : {"bf16", "fp32"}) {
    INFO(precision);
    Context ctx(Device::cpu(), Policy::parse({std::string("*.precision=") + precision}));
    const Tensor x = to_channels_last(ctx, random_tensor(ctx, {2, 4, 3, 5}, 11), DType::BF16);
    const Tensor w = random_tensor(ctx, {3, 60}, 12);
    auto run = [&](const Tensor& tx) {
      Var vx(tx, true), vw(w, true);
      Var flat = flatten(ctx, vx);
      Var logits = linear(ctx, "fc", flat, vw);
      Var loss = softmax_cross_entropy(ctx, "loss", logits, ctx.from_host(std::vector<int32_t>{0, 2}, {2}));
      ctx.tape().backward(ctx, loss);
      return std::make_tuple(vx.grad(), vw.grad(), loss.value());
    };
    const auto [dx, dw, loss] = run(x);
    const auto [dxw, dww, lossw] = run(widened(ctx, x));
    CHECK(dx.type_tag() == "bf16-nhwc");
    CHECK(dw.type_tag() == "f32");
    CHECK(loss.fingerprint() == lossw.fingerprint());
    CHECK(dw.fingerprint() == dww.fingerprint());
    CHECK(dx.fingerprint() == to_channels_last(ctx, dxw, DType::BF16).fingerprint());
  }
}

TEST_CASE("dropout on a bf16 channels-last tensor: the f32 op's mask and products, rounded once, in x's form") {
  Context ctx;
  const Tensor x = to_channels_last(ctx, random_tensor(ctx, kShape, test::fresh_seed()), DType::BF16);
  const Tensor g = to_channels_last(ctx, random_tensor(ctx, kShape, test::fresh_seed()), DType::BF16);
  auto drop = [&](const Tensor& xin, const Tensor& grad) {
    Var xv(xin, true);
    Var y = dropout(ctx, "drop1", xv, 0.3f, 11, 2, true);
    ctx.tape().backward(ctx, y, ctx.to_device(grad));
    return std::make_pair(y.value(), xv.grad());
  };
  const auto [y, dx] = drop(x, g);
  const auto [yw, dxw] = drop(widened(ctx, x), widened(ctx, g));
  CHECK(y.type_tag() == "bf16-nhwc");
  CHECK(y.fingerprint() == to_channels_last(ctx, yw, DType::BF16).fingerprint());
  CHECK(dx.type_tag() == "bf16-nhwc");
  CHECK(dx.fingerprint() == to_channels_last(ctx, dxw, DType::BF16).fingerprint());
}

TEST_CASE("a gradient must come in its variable's dtype and layout; backward's default seed does") {
  Context ctx;
  const Tensor x = to_channels_last(ctx, random_tensor(ctx, kShape, test::fresh_seed()), DType::BF16);
  Var v(x, true);
  CHECK_THROWS_WITH(accumulate_grad(ctx, v, ctx.zeros(kShape)), Contains("bf16-nhwc") && Contains("f32"));
  CHECK_THROWS_WITH(accumulate_grad(ctx, v, to_dtype(ctx, ctx.zeros(kShape), DType::BF16)), Contains("bf16-nhwc"));
  Var y = relu(ctx, v);
  CHECK_THROWS_AS(ctx.tape().backward(ctx, y, ctx.zeros(kShape)), ShapeError);
  Var y2 = relu(ctx, v);
  ctx.tape().backward(ctx, y2);
  CHECK(v.grad().type_tag() == "bf16-nhwc");
}

TEST_CASE("conv2d.output=native hands on the rounded result as it is; fp32 widens the same values") {
  auto conv = [](const std::vector<std::string>& rules, DType x_dtype) {
    Context ctx(Device::cpu(), Policy::parse(rules));
    Var x(to_dtype(ctx, random_tensor(ctx, {2, 3, 6, 6}, 11), x_dtype), true);
    Var w(random_tensor(ctx, {4, 3, 3, 3}, 12), true);
    Var y = conv2d(ctx, "conv1", x, w, Conv2dParams{1, 1, 1, 1});
    ctx.tape().backward(ctx, y);  // ones in y's dtype and layout
    bool recorded = false;
    for (const auto& e : ctx.manifest().entries())
      if (e.layer == "conv1" && e.knob == "output") recorded = e.variant == "native";
    return std::make_tuple(y.value(), x.grad(), w.grad(), recorded);
  };
  Context cpu;
  const auto [y32, dx32, dw32, rec32] = conv({"*.precision=bf16"}, DType::F32);
  const auto [yn, dxn, dwn, recn] = conv({"*.precision=bf16", "*.output=native"}, DType::F32);
  CHECK(y32.dtype() == DType::F32);
  CHECK(yn.dtype() == DType::BF16);  // NCHW on the CPU: the layout knob is the GPU's
  CHECK(to_dtype(cpu, yn, DType::F32).fingerprint() == y32.fingerprint());
  CHECK(dxn.dtype() == DType::F32);  // each gradient in its variable's form
  CHECK(dxn.fingerprint() == dx32.fingerprint());
  CHECK(dwn.fingerprint() == dw32.fingerprint());
  CHECK(recn);
  CHECK_FALSE(rec32);
  // A native input (the layer before's result) is read as it is, and its gradient comes back in bf16.
  const auto [yb, dxb, dwb, recb] = conv({"*.precision=bf16", "*.output=native"}, DType::BF16);
  CHECK(yb.fingerprint() == yn.fingerprint());
  CHECK(dxb.dtype() == DType::BF16);
  CHECK(dxb.fingerprint() == to_dtype(cpu, dxn, DType::BF16).fingerprint());
}

TEST_CASE("bf16 ResNet-18 and SmallCNNs with native activations train on the CPU and replay bit for bit") {
  using test::scratch;
  auto config = [](const std::string& name, bool native) {
    TrainConfig c = test::synthetic_config("resnet18", 16, 8, 8, 8);
    c.deterministic_init = c.deterministic_input = true;
    c.precision = "bf16";
    c.native_activations = native;
    c.out = scratch("cpu_native_activations", name);
    return c;
  };
  const TrainResult a = train(config("native_a", true));
  const TrainResult b = train(config("native_b", true));
  const TrainResult w = train(config("widened", false));
  CHECK(std::isfinite(a.log.back().loss));
  CHECK(a.weights_fingerprint == b.weights_fingerprint);
  CHECK(a.weights_fingerprint != w.weights_fingerprint);
  std::ifstream in(scratch("cpu_native_activations", "native_a") + "/manifest.json");
  const nlohmann::json m = nlohmann::json::parse(in);
  CHECK(m["replay"].get<std::string>().find("--native-activations") != std::string::npos);
  CHECK(m["config"]["native_activations"] == true);
  // SmallCNN's convolutions add a bias and max-pool: both read native tensors too.
  for (const char* model : {"smallcnn", "smallcnn-bn"}) {
    INFO(model);
    auto small = [&](const std::string& name) {
      TrainConfig s = test::synthetic_config(model, 16, 8, 8, 8);
      s.deterministic_init = s.deterministic_input = true;
      s.precision = "bf16";
      s.native_activations = true;
      s.out = scratch("cpu_native_activations", std::string(model) + name);
      return train(s);
    };
    CHECK(small("_a").weights_fingerprint == small("_b").weights_fingerprint);
  }
}
