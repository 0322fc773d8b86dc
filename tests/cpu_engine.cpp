// Engine core on the CPU: tensors, the tape (fan-out, no-grad), Philox, the
// manifest and atomic writes.
#include <catch2/catch.hpp>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "engine/context.h"
#include "engine/detail/cuda_state.h"
#include "engine/error.h"
#include "engine/philox.h"
#include "kernels/activation.h"
#include "kernels/activation_ref.h"
#include "kernels/batchnorm.h"
#include "kernels/conv2d.h"
#include "kernels/elementwise.h"
#include "support.h"

using namespace ditto;

TEST_CASE("tensor: creation, reshape, host round trip") {
  Context ctx;
  Tensor t = ctx.from_host(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3});
  CHECK(t.shape() == Shape{2, 3});
  CHECK(t.numel() == 6);
  CHECK(t.dim(-1) == 3);
  CHECK_THROWS_AS(t.dim(2), ShapeError);
  CHECK(t.reshape({3, 2}).to_host_f32() == std::vector<float>{1, 2, 3, 4, 5, 6});
  CHECK_THROWS_AS(t.reshape({4, 2}), ShapeError);
  CHECK_THROWS_AS(t.i32(), ShapeError);
  CHECK_THROWS_AS(ctx.from_host(std::vector<float>{1, 2}, {3}), ShapeError);
  Tensor z = ctx.zeros({4}, DType::I32);
  CHECK(z.to_host_i32() == std::vector<int32_t>{0, 0, 0, 0});
  CHECK(ctx.full({2}, 1.5f).to_host_f32() == std::vector<float>{1.5f, 1.5f});
  CHECK(Device::parse("cuda:3").index == 3);
  CHECK_THROWS_AS(Device::parse("gpu"), Error);
}

TEST_CASE("context: a borrowed CUDA stream is refused for a CPU context, by name") {
  ContextOptions o;
  int not_a_stream = 0;
  o.stream = &not_a_stream;
  CHECK_THROWS_WITH(Context(Device::cpu(), Policy{}, o), Catch::Contains("CUDA stream was given for a context on the CPU"));
  CHECK_NOTHROW(Context(Device::cpu(), Policy{}, ContextOptions{}));
}

TEST_CASE("tape: gradients accumulate on fan-out and across backward passes") {
  Context ctx;
  Var x(ctx.from_host(std::vector<float>{-1, 2, 3}, {3}), true);
  // y = relu(x) + x  -> dy/dx = [0+1, 1+1, 1+1]
  Var y = add(ctx, relu(ctx, x), x);
  CHECK(ctx.tape().size() == 2);
  ctx.tape().backward(ctx, y);
  CHECK(ctx.tape().size() == 0);
  CHECK(x.grad().to_host_f32() == std::vector<float>{1, 2, 2});
  // A second pass without zero_grad accumulates.
  Var y2 = add(ctx, relu(ctx, x), x);
  ctx.tape().backward(ctx, y2);
  CHECK(x.grad().to_host_f32() == std::vector<float>{2, 4, 4});
  x.zero_grad();
  CHECK_FALSE(x.grad().defined());
}

TEST_CASE("tape: an entry's closure and what it saved are released once it has run") {
  // Entry A (x -> a) is recorded before entry B (a -> y), so backward runs B, then A. B's closure
  // is the only owner of `saved`; by the time A runs, the tape must have dropped B.
  Context ctx;
  Var x(ctx.from_host(std::vector<float>{1, 2}, {2}), true);
  Var a(ctx.from_host(std::vector<float>{1, 2}, {2}), true);
  Var y(ctx.from_host(std::vector<float>{1, 2}, {2}), true);
  auto saved = std::make_shared<int>(7);
  std::weak_ptr<int> saved_alive = saved;
  bool b_released_before_a = false;
  ctx.tape().record("A", "", {{"x", x}}, a, [x, a, saved_alive, &b_released_before_a](Context& c) {
    b_released_before_a = saved_alive.expired();
    accumulate_grad(c, x, a.grad());
  });
  ctx.tape().record("B", "", {{"a", a}}, y, [a, y, saved](Context& c) { accumulate_grad(c, a, y.grad()); });
  saved.reset();
  CHECK_FALSE(saved_alive.expired());  // B's closure holds it until backward passes B
  ctx.tape().backward(ctx, y);
  CHECK(b_released_before_a);
  CHECK(x.grad().to_host_f32() == std::vector<float>{1, 1});
}

TEST_CASE("tape: a forward value no backward reads is freed during the forward, not kept to the end") {
  // conv -> batch norm -> relu -> add -> relu, as in a residual block. Batch norm's backward reads
  // its input (the conv output), ReLU's its own output, add nothing: so once the forward has
  // moved past them, batch norm's output and add's output belong to no one and are freed, while
  // what the backward needs stays. PyTorch keeps the same set.
  Context ctx;
  Var x(ctx.from_host(test::random_vec(2 * 3 * 6 * 6, 1), {2, 3, 6, 6}), true);
  Var w(ctx.from_host(test::random_vec(4 * 3 * 3 * 3, 2), {4, 3, 3, 3}), true);
  Var gamma(ctx.full({4}, 1.f), true), beta(ctx.zeros({4}), true);
  BatchNormState st = batch_norm_state(ctx, 4);
  Conv2dParams p;
  p.pad_h = p.pad_w = 1;
  auto alive = [](const Var& v) { return std::weak_ptr<detail::Storage>(detail::storage_of(v.value())); };
  Var c = conv2d(ctx, "conv", x, w, p);
  Var b = batch_norm(ctx, "bn", c, gamma, beta, st, true);
  Var r = relu(ctx, b);
  Var s = add(ctx, r, x.value().shape() == r.shape() ? x : r);
  Var out = relu(ctx, s);
  const auto conv_out = alive(c), bn_out = alive(b), relu_out = alive(r), add_out = alive(s);
  c = b = r = s = Var();
  CHECK_FALSE(conv_out.expired());  // batch norm's backward reads it
  CHECK(bn_out.expired());          // ReLU saves its output, not its input
  CHECK_FALSE(relu_out.expired());  // ReLU's backward reads it
  CHECK(add_out.expired());         // add saves nothing; the last ReLU saves its own output
  ctx.tape().backward(ctx, out, ctx.full(out.shape(), 1.f));
  CHECK(w.grad().defined());
  CHECK(x.grad().defined());
  CHECK(conv_out.expired());  // and everything is released once backward has passed it
  CHECK(relu_out.expired());
}

TEST_CASE("tape: a kernel may add into a gradient in place only where accumulate_grad would add the same") {
  Context ctx;
  Var x(ctx.full({1, 2, 2, 2}, 1.0f), true);
  CHECK(grad_to_add_into(x.grad_ref(), DType::F32, Layout::Nchw) == nullptr);  // none yet: moved in, not added
  accumulate_grad(ctx, x, ctx.full({1, 2, 2, 2}, 0.5f));
  Tensor* g = grad_to_add_into(x.grad_ref(), DType::F32, Layout::Nchw);
  REQUIRE(g == &x.grad());
  // An in-place add through it is the accumulation: the next contribution lands on top of it.
  ctx.copy(*g, ctx.full({1, 2, 2, 2}, 2.0f));
  accumulate_grad(ctx, x, ctx.full({1, 2, 2, 2}, 0.25f));
  CHECK(x.grad().to_host_f32() == std::vector<float>(8, 2.25f));
  CHECK(grad_to_add_into(x.grad_ref(), DType::BF16, Layout::Nchw) == nullptr);  // another rounding
  CHECK(grad_to_add_into(x.grad_ref(), DType::F32, Layout::Nhwc) == nullptr);   // another element order
  Var frozen(ctx.full({2}, 1.0f), false);
  CHECK(grad_to_add_into(frozen.grad_ref(), DType::F32, Layout::Nchw) == nullptr);
  Var b(ctx.zeros({2}, DType::BF16), true);
  accumulate_grad(ctx, b, ctx.zeros({2}, DType::BF16));
  CHECK(grad_to_add_into(b.grad_ref(), DType::F32, Layout::Nchw) == nullptr);  // a bf16 gradient
}

TEST_CASE("tape: variables without requires_grad get no gradient; seeds are checked") {
  Context ctx;
  Var x(ctx.from_host(std::vector<float>{1, -2}, {2}), true);
  Var c(ctx.from_host(std::vector<float>{5, 5}, {2}), false);
  Var y = add(ctx, x, c);
  ctx.tape().backward(ctx, y, ctx.from_host(std::vector<float>{3, 4}, {2}));
  CHECK(x.grad().to_host_f32() == std::vector<float>{3, 4});
  CHECK_FALSE(c.grad().defined());
  Var y2 = add(ctx, x, c);
  CHECK_THROWS_AS(ctx.tape().backward(ctx, y2, ctx.zeros({3})), ShapeError);
  CHECK_THROWS_AS(ctx.tape().backward(ctx, c), Error);
}

TEST_CASE("tape: no-grad scope records nothing") {
  Context ctx;
  Var x(ctx.from_host(std::vector<float>{1, 2}, {2}), true);
  {
    NoGradGuard guard(ctx);
    Var y = relu(ctx, add(ctx, x, x));
    CHECK_FALSE(y.requires_grad());
    CHECK(ctx.tape().size() == 0);
  }
  CHECK(ctx.grad_enabled());
  Var y = relu(ctx, x);
  CHECK(y.requires_grad());
  CHECK(ctx.tape().size() == 1);
}

TEST_CASE("relu: gradient check in double") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  const int n = 64;
  auto x = test::random_vec<double>(n, seed);
  for (auto& v : x)
    if (std::fabs(v) < 1e-3) v = 0.5;  // keep away from the kink, where the derivative is undefined
  auto w = test::loss_weights(n, seed);
  auto loss = [&](const std::vector<double>& in) {
    std::vector<double> y(n);
    ref::relu_fwd(in.data(), y.data(), n);
    return test::weighted_sum(y, w);
  };
  std::vector<double> y(n), dx(n);
  ref::relu_fwd(x.data(), y.data(), n);
  ref::relu_bwd(y.data(), w.data(), dx.data(), n);
  CHECK(test::gradcheck(loss, x, dx) < 1e-6);
}

TEST_CASE("philox: Random123 known-answer vectors") {
  auto a = philox4x32(0, 0, 0);
  CHECK(a.v[0] == 0x6627e8d5u);
  CHECK(a.v[1] == 0xe169c58du);
  CHECK(a.v[2] == 0xbc57ac4cu);
  CHECK(a.v[3] == 0x9b00dbd8u);
  auto b = philox4x32(0x85a308d3243f6a88ull, 0x0370734413198a2eull, 0x299f31d0a4093822ull);
  CHECK(b.v[0] == 0xd16cfe09u);
  CHECK(b.v[1] == 0x94fdccebu);
  CHECK(b.v[2] == 0x5001e420u);
  CHECK(b.v[3] == 0x24126ea1u);
  CHECK(philox_uniform(0xffffffffu) < 1.0f);
}

TEST_CASE("manifest: entries are per (layer, knob), JSON holds every field") {
  Manifest m;
  m.record({"conv1", "conv2d", "bwd_filter", "algo0", "pinned", Determinism::No, "fma", 1024, "cuda:0"});
  m.record({"conv1", "conv2d", "fwd", "implicit_gemm", "heuristic", Determinism::Yes, "fma", 0, "cuda:0"});
  m.record({"conv1", "conv2d", "bwd_filter", "algo1", "deterministic", Determinism::Yes, "fma", 2048, "cuda:0"});
  // conv choices depend on the input shape: one entry per shape
  m.record({"conv1", "conv2d", "bwd_filter", "algo0", "pinned", Determinism::No, "fma", 0, "cuda:0", "80x3x32x32"});
  CHECK(m.find("conv1", "bwd_filter", "80x3x32x32")->variant == "algo0");
  CHECK(m.find("conv1", "bwd_filter")->variant == "algo0");  // the latest of any shape
  CHECK(nlohmann::json::parse(m.to_json())["ops"][2]["shape"] == "80x3x32x32");
  m.record({"conv1", "conv2d", "bwd_filter", "algo1", "pinned", Determinism::Yes, "fma", 0, "cuda:0", "80x3x32x32"});
  CHECK(m.find("conv1", "bwd_filter", "80x3x32x32")->variant == "algo1");
  REQUIRE(m.entries().size() == 3);
  CHECK(m.find("conv1", "bwd_filter")->variant == "algo1");
  auto j = nlohmann::json::parse(m.to_json());
  REQUIRE(j["ops"].size() == 3);
  CHECK(j["ops"][0]["knob"] == "bwd_filter");
  CHECK(j["ops"][0]["variant"] == "algo1");
  CHECK(j["ops"][0]["deterministic"] == "yes");
  CHECK(j["ops"][0]["guarantee"] == "unknown");  // not given above
  CHECK(j["ops"][0]["workspace_bytes"] == 2048);
  CHECK(j["ops"][1]["requested"] == "heuristic");
}

TEST_CASE("manifest: each variant's guarantee in CCCL's words, and every CPU op's entry carries one") {
  CHECK(guarantee_of(Determinism::No, Impl::Ditto) == Guarantee::NotGuaranteed);
  CHECK(guarantee_of(Determinism::No, Impl::Library) == Guarantee::NotGuaranteed);
  CHECK(guarantee_of(Determinism::Yes, Impl::Ditto) == Guarantee::GpuToGpu);
  CHECK(guarantee_of(Determinism::Yes, Impl::Library) == Guarantee::RunToRun);
  CHECK(guarantee_of(Determinism::Yes, Impl::CpuReference) == Guarantee::RunToRun);
  CHECK(guarantee_of(Determinism::Unknown, Impl::Library) == Guarantee::Unknown);
  CHECK(std::string(guarantee_name(Guarantee::NotGuaranteed)) == "not_guaranteed");
  CHECK(std::string(guarantee_name(Guarantee::GpuToGpu)) == "gpu_to_gpu");
  Manifest m;
  m.record({"l", "linear", "precision", "fp32", "pinned", Determinism::Yes, "fp32", 0, "cuda:0", "", Guarantee::RunToRun});
  CHECK(nlohmann::json::parse(m.to_json())["ops"][0]["guarantee"] == "run_to_run");

}

TEST_CASE("write_file_atomic: replaces whole files, leaves no temporary, names the path on failure") {
  std::string path = "atomic_test.txt";
  write_file_atomic(path, "first");
  write_file_atomic(path, "second version");
  std::ifstream in(path);
  std::string s((std::istreambuf_iterator<char>(in)), {});
  CHECK(s == "second version");
  std::remove(path.c_str());
  CHECK_THROWS_WITH(write_file_atomic("/nonexistent-dir/x.json", "x"), Catch::Matchers::Contains("/nonexistent-dir/x.json"));
}

TEST_CASE("context: a CUDA context on a machine without a GPU is a typed error, not a crash") {
  int has_gpu = 0;
  try {
    Context probe(Device::cuda(0));
    has_gpu = 1;
  } catch (const CudaError& e) {
    CHECK_THAT(e.what(), Catch::Matchers::Contains("cuda:0"));
  }
  SUCCEED("cuda present: " << has_gpu);
}
