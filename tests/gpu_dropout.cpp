// Dropout on the GPU: the mask and outputs bit-equal to the CPU's, forward and backward, 10-run
// bit-equality, the mask changing with the step, and the DETERMINISM line.
#include <catch2/catch.hpp>

#include <chrono>
#include <cstdio>

#include "engine/context.h"
#include "kernels/dropout.h"
#include "support.h"

using namespace ditto;

TEST_CASE("gpu dropout: forward and backward bit-equal to the CPU") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  Context cpu;
  Context gpu(Device::cuda(0));
  const int64_t n = 1000003;  // not a multiple of 4
  auto xv = test::random_vec(n, seed), dyv = test::random_vec(n, seed + 1);
  for (float p : {0.1f, 0.5f, 0.77f}) {
    INFO("p " << p);
    Var xc(cpu.from_host(xv, {n}), true), xg(gpu.from_host(xv, {n}), true);
    Var yc = dropout(cpu, "drop1", xc, p, seed, 9, true);
    Var yg = dropout(gpu, "drop1", xg, p, seed, 9, true);
    // Same Philox words, same float comparison, same single multiply: the same bits (so also the
    // same mask: zeros in the same places).
    CHECK(yg.value().fingerprint() == yc.value().fingerprint());
    cpu.tape().backward(cpu, yc, cpu.from_host(dyv, {n}));
    gpu.tape().backward(gpu, yg, gpu.from_host(dyv, {n}));
    CHECK(xg.grad().fingerprint() == xc.grad().fingerprint());
  }
  // On ones the output is the mask itself (0 or 1/(1-p)): compare element by element for a
  // readable failure.
  Var ones_c(cpu.full({4099}, 1.0f)), ones_g(gpu.full({4099}, 1.0f));
  CHECK(dropout(gpu, "d", ones_g, 0.3f, seed, 1, true).value().to_host_f32() ==
        dropout(cpu, "d", ones_c, 0.3f, seed, 1, true).value().to_host_f32());
}

TEST_CASE("gpu dropout: bit-equal over 10 runs, changes with the step") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  Context ctx(Device::cuda(0));
  const int64_t n = 1 << 22;
  Var x(ctx.from_host(test::random_vec(n, seed), {n}), true);
  Tensor dy = ctx.from_host(test::random_vec(n, seed + 1), {n});
  auto step = [&] {
    x.zero_grad();
    Var y = dropout(ctx, "drop", x, 0.5f, seed, 3, true);
    ctx.tape().backward(ctx, y, dy);
    return x.grad();
  };
  std::size_t distinct = test::distinct_results(10, step);
  ctx.synchronize();
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 20; ++i) step();
  ctx.synchronize();
  double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / 20;
  std::printf("DETERMINISM | dropout | mask=philox | %zu/10 | %.1f us\n", distinct, us);
  CHECK(distinct == 1);
  CHECK(dropout(ctx, "drop", x, 0.5f, seed, 4, true).value().fingerprint() !=
        dropout(ctx, "drop", x, 0.5f, seed, 3, true).value().fingerprint());
}
