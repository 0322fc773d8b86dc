// Engine core on the GPU: device tensors, fingerprints and digests equal to the CPU's, bit
// distances, the tape running CUDA closures, relu/add against the CPU path, debug-sync error
// reporting.
#include <catch2/catch.hpp>

#include <chrono>
#include <cstdio>
#include <cuda_runtime.h>
#include <cstdint>
#include <vector>

#include "engine/context.h"
#include "engine/digest.h"
#include "engine/tensor_ops.h"
#include "engine/error.h"
#include "kernels/activation.h"
#include "kernels/elementwise.h"
#include "kernels/loss.h"
#include "nets/nets.h"
#include "support.h"

using namespace ditto;

TEST_CASE("gpu tensor: round trip and fingerprint identical to the CPU's") {
  Context gpu(Device::cuda(0));
  Context cpu;
  auto v = test::random_vec(100003, test::fresh_seed());
  Tensor g = gpu.from_host(v, {100003});
  Tensor c = cpu.from_host(v, {100003});
  CHECK(g.is_cuda());
  CHECK(g.to_host_f32() == v);
  CHECK(g.fingerprint() == c.fingerprint());
  Tensor back = cpu.to_device(g);
  CHECK(back.fingerprint() == c.fingerprint());
  Tensor z = gpu.zeros({7}, DType::I32);
  CHECK(z.to_host_i32() == std::vector<int32_t>(7, 0));
  CHECK(gpu.full({3}, 2.5f).to_host_f32() == std::vector<float>{2.5f, 2.5f, 2.5f});
  auto info = gpu.runtime_info();
  std::printf("GPU %s, driver %s, runtime %s, cuDNN %s (built %s), cuBLAS %s\n", info.gpu_name.c_str(),
              info.driver.c_str(), info.cuda_runtime.c_str(), info.cudnn.c_str(), info.cudnn_build.c_str(),
              info.cublas.c_str());
  CHECK_FALSE(info.gpu_name.empty());
}

TEST_CASE("gpu narrow_int64_words: int32-sized values exactly, others saturated to int32's limits") {
  Context gpu(Device::cuda(0));
  const std::vector<int64_t> v = {0, 1, -1, -100, INT32_MAX, INT32_MIN, (int64_t(1) << 32) + 3, -(int64_t(1) << 33),
                                  INT64_MAX, INT64_MIN, int64_t(INT32_MAX) + 1, int64_t(INT32_MIN) - 1};
  Tensor t = narrow_int64_words(gpu, gpu.from_host(test::int64_words(v), {24}), {3, 4});
  CHECK(t.shape() == Shape{3, 4});
  CHECK(t.to_host_i32() == std::vector<int32_t>{0, 1, -1, -100, INT32_MAX, INT32_MIN, INT32_MAX, INT32_MIN, INT32_MAX,
                                                INT32_MIN, INT32_MAX, INT32_MIN});
}

TEST_CASE("gpu tape: relu + add with fan-out, bit-equal to the CPU path") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  auto v = test::random_vec(4096, seed);
  auto run = [&](Context& ctx) {
    Var x(ctx.from_host(v, {64, 64}), true);
    Var y = add(ctx, relu(ctx, x), add(ctx, x, x));
    ctx.tape().backward(ctx, y);
    return std::make_pair(y.value().fingerprint(), x.grad().fingerprint());
  };
  Context gpu(Device::cuda(0));
  Context cpu;
  // Elementwise float ops are exact-order per element on both sides, so bits must agree.
  CHECK(run(gpu) == run(cpu));
}

TEST_CASE("gpu relu: deterministic, timing line") {
  Context gpu(Device::cuda(0));
  auto v = test::random_vec(1 << 22, test::fresh_seed());
  Var x(gpu.from_host(v, {1 << 22}), false);
  CHECK(test::distinct_results(10, [&] { return relu(gpu, x).value(); }) == 1);
  for (int i = 0; i < 3; ++i) relu(gpu, x);
  gpu.synchronize();
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 20; ++i) relu(gpu, x);
  gpu.synchronize();
  double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / 20;
  std::printf("DETERMINISM | relu | fwd | 1/10 | %.1f us\n", us);
}

TEST_CASE("gpu memory: steady-state ops reuse the arena") {
  Context gpu(Device::cuda(0));
  Var x(gpu.full({1 << 20}, 1.0f), false);
  for (int i = 0; i < 5; ++i) relu(gpu, x);
  gpu.synchronize();
  size_t free0 = 0, total = 0;
  REQUIRE(cudaMemGetInfo(&free0, &total) == cudaSuccess);
  for (int i = 0; i < 200; ++i) relu(gpu, x);
  gpu.synchronize();
  size_t free1 = 0;
  REQUIRE(cudaMemGetInfo(&free1, &total) == cudaSuccess);
  // 200 fresh 4 MB outputs would take 800 MB if nothing were reused.
  CHECK(free0 - std::min(free0, free1) < (64u << 20));
}

TEST_CASE("gpu manifest: a deterministic step's every knob promises run_to_run or gpu_to_gpu; atomics say not_guaranteed") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  for (const char* mode : {"deterministic", "nondeterministic"}) {
    Context ctx(Device::cuda(0), Policy::parse({std::string("*=") + mode}));
    auto net = make_net(ctx, {"smallcnn-bn", 10, 3});
    Tensor x = ctx.from_host(test::random_vec(16 * 3 * 16 * 16, seed), {16, 3, 16, 16});
    std::vector<int32_t> labels(16);
    for (int i = 0; i < 16; ++i) labels[i] = i % 10;
    Var loss = softmax_cross_entropy(ctx, "loss", net->forward(ctx, Var(x), true), ctx.from_host(labels, {16}));
    ctx.tape().backward(ctx, loss);
    ctx.synchronize();
    int own = 0, not_guaranteed = 0;
    for (const auto& e : ctx.manifest().entries()) {
      INFO(mode << ": " << e.layer << "." << e.knob << "=" << e.variant << " " << guarantee_name(e.guarantee));
      if (std::string(mode) == "deterministic")
        CHECK((e.guarantee == Guarantee::RunToRun || e.guarantee == Guarantee::GpuToGpu));
      // The guarantee follows the Determinism label: yes -> run_to_run or gpu_to_gpu, no ->
      // not_guaranteed (cuBLAS with atomics allowed is "unknown" by label, not_guaranteed by promise).
      if (e.deterministic == Determinism::Yes)
        CHECK((e.guarantee == Guarantee::RunToRun || e.guarantee == Guarantee::GpuToGpu));
      if (e.deterministic == Determinism::No) CHECK(e.guarantee == Guarantee::NotGuaranteed);
      own += e.guarantee == Guarantee::GpuToGpu;
      not_guaranteed += e.guarantee == Guarantee::NotGuaranteed;
    }
    if (std::string(mode) == "deterministic") CHECK(own >= 4);  // bias, bn, pool gather, loss: ditto's own
    else CHECK(not_guaranteed >= 4);
  }
}

TEST_CASE("gpu digest: equal to the CPU's for every size and dtype, identical over 20 calls, queued on two streams") {
  Context gpu(Device::cuda(0)), gpu2(Device::cuda(0));
  Context cpu;
  // Sizes around the kernel's 4-word groups and 1024-block grid (5M floats: the grid-stride loop
  // goes round several times), in f32 and in bf16/f16 with odd counts (a zero-padded last word).
  for (int64_t n : {int64_t(1), int64_t(3), int64_t(4), int64_t(5), int64_t(17), int64_t(1023), int64_t(262147),
                    int64_t(5000011)}) {
    const auto v = test::random_vec(static_cast<std::size_t>(n), test::fresh_seed());
    for (DType dtype : {DType::F32, DType::BF16, DType::F16}) {
      const Tensor c = to_dtype(cpu, cpu.from_host(v, {n}), dtype);
      const Tensor g = gpu.to_device(c);
      INFO(n << " " << dtype_name(dtype));
      CHECK(digest(g) == digest(c));
    }
  }
  const auto v = test::random_vec(300001, test::fresh_seed());
  const Tensor a = gpu.from_host(v, {300001}), b = gpu2.from_host(v, {300001});
  const Fingerprint want = digest(cpu.from_host(v, {300001}));
  DigestQueue q;
  for (int k = 0; k < 20; ++k) {
    q.add(a);
    q.add(b);
  }
  for (const auto& d : q.take()) CHECK(d == want);
  // A later take reuses the slots, zeroed.
  q.add(b);
  CHECK(q.take().front() == want);
  std::printf("DIGEST 300001 floats on two streams x20: all equal to the CPU digest\n");
}

TEST_CASE("gpu bit distance: counts and ULPs equal to the CPU's, sums within rounding, repeatable") {
  Context gpu(Device::cuda(0)), cpu;
  const int64_t n = 1000003;
  auto va = test::random_vec(static_cast<std::size_t>(n), test::fresh_seed());
  auto vb = va;
  for (int64_t i = 0; i < n; i += 97) vb[i] = std::nextafter(vb[i], 10.0f);
  vb[5] = -vb[5];
  for (DType dtype : {DType::F32, DType::BF16}) {
    const Tensor ca = to_dtype(cpu, cpu.from_host(va, {n}), dtype), cb = to_dtype(cpu, cpu.from_host(vb, {n}), dtype);
    const Tensor ga = gpu.to_device(ca), gb = gpu.to_device(cb);
    const BitDistance c = bit_distance(ca, cb), g = bit_distance(ga, gb);
    INFO(dtype_name(dtype));
    CHECK(g.numel == c.numel);
    CHECK(g.differing == c.differing);
    CHECK(g.differing > 0);
    CHECK(g.max_ulp == c.max_ulp);
    CHECK(g.max_abs == c.max_abs);
    // Per-block partial sums against the CPU's one running sum: equal to double rounding.
    CHECK(g.l2 == Approx(c.l2).epsilon(1e-12));
    CHECK(g.norm == Approx(c.norm).epsilon(1e-12));
    const BitDistance again = bit_distance(ga, gb);
    CHECK(again.l2 == g.l2);
    CHECK(again.norm == g.norm);
  }
  Tensor s = snapshot(gpu.from_host(va, {n}));
  CHECK(digest(s) == digest(cpu.from_host(va, {n})));
}
