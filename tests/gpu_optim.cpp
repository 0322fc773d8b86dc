// The optimizers' CUDA updates against the CPU reference, bit for bit: SGD (momentum, Nesterov,
// weight decay) and Adam, by value, from a plan's table (CUDA graphs) and under a loss scaler's skip
// flag, over more parameters than one launch takes (the updates go out in groups), with sizes from one
// element to past one launch's blocks per parameter, and a parameter without a gradient left alone.
#include <catch2/catch.hpp>

#include <memory>

#include "engine/context.h"
#include "engine/optim.h"
#include "support.h"

using namespace ditto;

namespace {

// 21 parameters (more than one launch's 16); the last is past 8192 blocks of 256 elements, so its
// threads stride; parameter 5 has no gradient.
const std::vector<int64_t> kSizes = {1, 3, 255, 256, 257, 100, 4096, 17, 1, 999, 65537, 2, 31, 8, 7, 6, 5, 300, 1024,
                                     12345, 2300000};

struct Run {
  Context ctx;
  std::vector<Param> params;
  std::unique_ptr<Optimizer> opt;
  Tensor skip;

  Run(Device d, const std::string& which, uint64_t seed) : ctx(d) {
    for (std::size_t i = 0; i < kSizes.size(); ++i) {
      const int64_t n = kSizes[i];
      Var v(ctx.from_host(test::random_vec(std::size_t(n), seed + i), {n}), true);
      params.push_back({"p" + std::to_string(i), v});
    }
    if (which == "sgd")
      opt = std::make_unique<Sgd>(ctx, params, SgdOptions{0.9f, true, 1e-4f});
    else if (which == "sgd-plain")
      opt = std::make_unique<Sgd>(ctx, params, SgdOptions{0.0f, false, 0.0f});
    else
      opt = std::make_unique<Adam>(ctx, params, AdamOptions{0.9f, 0.999f, 1e-8f, 1e-4f});
  }
  void grads(uint64_t seed) {
    for (std::size_t i = 0; i < params.size(); ++i) {
      if (i == 5) {
        params[i].var.zero_grad();
        continue;
      }
      params[i].var.grad() = ctx.from_host(test::random_vec(std::size_t(kSizes[i]), seed * 131 + i), {kSizes[i]});
    }
  }
  std::vector<std::vector<float>> weights() const {
    std::vector<std::vector<float>> w;
    for (const Param& p : params) w.push_back(p.var.value().to_host_f32());
    return w;
  }
};

// Three steps by value, three planned, and (Adam, SGD) three under a skip flag that skips the middle one.
std::vector<std::vector<float>> train(Device d, const std::string& which, uint64_t seed) {
  Run r(d, which, seed);
  const std::vector<float> lrs = {1e-2f, 7e-3f, 3e-3f};
  for (int s = 0; s < 3; ++s) {
    r.grads(seed + 10 + s);
    r.opt->step(r.ctx, lrs[std::size_t(s)]);
  }
  r.opt->plan(r.ctx, lrs);
  for (int s = 0; s < 3; ++s) {
    r.grads(seed + 20 + s);
    r.opt->step_planned(r.ctx);
  }
  Tensor flag = r.ctx.zeros({1}, DType::I32);
  r.opt->set_skip_flag(r.ctx, flag);
  for (int s = 0; s < 3; ++s) {
    r.grads(seed + 30 + s);
    r.ctx.copy(flag, r.ctx.from_host(std::vector<int32_t>{s == 1 ? 1 : 0}, {1}));
    r.opt->step(r.ctx, lrs[std::size_t(s)]);
  }
  return r.weights();
}

}  // namespace

TEST_CASE("gpu optimizers: every parameter's update is the CPU reference's, bit for bit, in grouped launches") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  for (const char* which : {"adam", "sgd", "sgd-plain"}) {
    INFO(which);
    const auto cpu = train(Device::cpu(), which, seed);
    const auto gpu = train(Device::cuda(0), which, seed);
    REQUIRE(cpu.size() == gpu.size());
    for (std::size_t i = 0; i < cpu.size(); ++i) {
      INFO("parameter " << i << " of " << kSizes[i] << " elements");
      CHECK(gpu[i] == cpu[i]);
    }
    // The parameter without a gradient never moved.
    Run fresh(Device::cpu(), which, seed);
    CHECK(cpu[5] == fresh.weights()[5]);
  }
}
