// Loss-scaling checks that run on any device (tests/cpu_loss_scale.cpp on the CPU,
// tests/gpu_loss_scale.cpp on CUDA), and the small pieces they are built from.
#pragma once
#include <catch2/catch.hpp>

#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "engine/context.h"
#include "engine/loss_scale.h"
#include "engine/optim.h"
#include "experiments/train.h"

namespace ditto::test {

inline constexpr float kInf = std::numeric_limits<float>::infinity();

inline Param make_param(Context& ctx, const std::string& name, std::vector<float> value) {
  const int64_t n = static_cast<int64_t>(value.size());
  return {name, Var(ctx.from_host(value, {n}), true)};
}

inline void set_grad(Context& ctx, const Param& p, std::vector<float> g) {
  p.var.grad() = ctx.from_host(g, {static_cast<int64_t>(g.size())});
}

// One scaler step whose (already scaled) gradient of `p` is g: unscale, then update.
inline bool scaler_step(Context& ctx, LossScaler& s, const Param& p, std::vector<float> g) {
  set_grad(ctx, p, std::move(g));
  s.reserve(ctx, 1);
  s.unscale(ctx, {p});
  const bool overflow = s.found_inf().to_host_i32()[0] != 0;
  s.update(ctx);
  return overflow;
}

inline Fingerprint fingerprint_of(const std::vector<Param>& params, Optimizer& opt) {
  Hasher h;
  h.add(params_fingerprint(params));
  for (const Buffer& b : opt.state()) h.add(b.tensor->fingerprint());
  return h.digest();
}

inline std::unique_ptr<Optimizer> make_opt(Context& ctx, const std::string& which, std::vector<Param> params) {
  if (which == "adam") return std::make_unique<Adam>(ctx, std::move(params), AdamOptions{0.9f, 0.999f, 1e-8f, 1e-3f});
  return std::make_unique<Sgd>(ctx, std::move(params), SgdOptions{0.9f, true, 1e-3f});
}

// The schedule for a given sequence of overflow flags: growth after the interval's good steps,
// backoff on an overflow, a record of the scale each step used; a fixed scale never moves.
inline void check_schedule(Device dev) {
  Context ctx(dev);
  LossScaler s(ctx, parse_loss_scaling("dynamic:1024:2:0.5:3"));
  auto p = make_param(ctx, "w", {0.0f, 0.0f});
  const std::vector<bool> flags = {false, false, false, false, true, false, false, false, true, true};
  // Three good steps grow the scale; an overflow halves it and restarts the count.
  const std::vector<float> used = {1024, 1024, 1024, 2048, 2048, 1024, 1024, 1024, 2048, 1024};
  for (bool f : flags) CHECK(scaler_step(ctx, s, p, {1.0f, f ? kInf : 2.0f}) == f);
  const std::vector<LossScaleStep> record = s.take_record(ctx);
  REQUIRE(record.size() == flags.size());
  for (std::size_t i = 0; i < flags.size(); ++i) {
    INFO("step " << i + 1);
    CHECK(record[i].scale == used[i]);
    CHECK(record[i].overflow == flags[i]);
  }
  CHECK(s.seed().to_host_f32()[0] == 512.0f);
  CHECK(s.take_record(ctx).empty());  // taken once

  // A fixed scale never moves, overflow or not.
  LossScaler fixed(ctx, parse_loss_scaling("8"));
  for (bool f : {true, false, true}) scaler_step(ctx, fixed, p, {f ? kInf : 1.0f, 0.0f});
  const std::vector<LossScaleStep> fixed_record = fixed.take_record(ctx);
  CHECK(fixed_record.size() == 3);
  for (const LossScaleStep& r : fixed_record) CHECK(r.scale == 8.0f);
}

// Overflow detection catches +inf, -inf and nan in any gradient and at any position (the last of a
// tensor that spans many blocks too), never a large finite value; unscaling divides exactly.
inline void check_overflow_detection(Device dev) {
  Context ctx(dev);
  LossScaler s(ctx, parse_loss_scaling("1"));
  auto a = make_param(ctx, "a", {0, 0, 0, 0});
  auto b = make_param(ctx, "b", {0, 0, 0});
  const float nan = std::numeric_limits<float>::quiet_NaN(), big = std::numeric_limits<float>::max();
  auto flagged = [&](std::vector<float> ga, std::vector<float> gb) {
    set_grad(ctx, a, std::move(ga));
    set_grad(ctx, b, std::move(gb));
    s.unscale(ctx, {a, b});
    return s.found_inf().to_host_i32()[0] != 0;
  };
  CHECK_FALSE(flagged({big, -big, 1e30f, 0.0f}, {-1e38f, 3.0f, 0.0f}));
  for (float bad : {kInf, -kInf, nan}) {
    INFO(bad);
    CHECK(flagged({0, 0, 0, bad}, {1, 2, 3}));
    CHECK(flagged({bad, 0, 0, 0}, {1, 2, 3}));
    CHECK(flagged({1, 2, 3, 4}, {0, bad, 0}));
  }
  CHECK_FALSE(flagged({1, 2, 3, 4}, {1, 2, 3}));  // cleared at every step
  std::vector<float> wide(300001, 1.0f);
  CHECK_FALSE(flagged(wide, {1, 2, 3}));
  wide.back() = -kInf;
  CHECK(flagged(wide, {1, 2, 3}));
  // Unscaling divides exactly by the scale (a power of two).
  LossScaler four(ctx, parse_loss_scaling("4"));
  set_grad(ctx, a, {1.0f, -3.0f, 0.75f, 1e-30f});
  four.unscale(ctx, {a});
  const float tiny = 1e-30f;
  CHECK(a.var.grad().to_host_f32() == std::vector<float>{0.25f, -0.75f, 0.1875f, tiny / 4});
}

// A skipped step changes no weight or optimizer state, and skipping a step equals never taking
// it: SGD (momentum, Nesterov, weight decay) and Adam (whose bias corrections then follow the
// updates applied), eager and planned.
inline void check_skip_equals_never_stepping(Device dev) {
  for (const std::string which : {"sgd", "adam"}) {
    for (bool planned : {false, true}) {
      INFO(which << (planned ? " planned" : " eager"));
      const std::vector<std::vector<float>> grads = {{0.5f, -1.0f}, {kInf, 1.0f}, {0.25f, 2.0f}, {-0.5f, 0.125f}};
      const std::vector<float> lrs = {1e-2f, 5e-3f, 2e-3f, 1e-3f};
      // With the scaler: step 2 overflows and is skipped.
      Context ctx(dev);
      auto p = make_param(ctx, "w", {1.0f, -2.0f});
      LossScaler s(ctx, parse_loss_scaling("dynamic:2:2:0.5:2000"));
      auto opt = make_opt(ctx, which, {p});
      opt->set_skip_flag(ctx, s.found_inf());
      if (planned) opt->plan(ctx, lrs);
      Fingerprint before_skip;
      for (std::size_t i = 0; i < grads.size(); ++i) {
        std::vector<float> scaled;
        for (float g : grads[i]) scaled.push_back(g * 2.0f * (i >= 2 ? 0.5f : 1.0f));  // the scale of step i
        set_grad(ctx, p, scaled);
        s.reserve(ctx, 1);
        s.unscale(ctx, {p});
        if (i == 1) before_skip = fingerprint_of({p}, *opt);
        planned ? opt->step_planned(ctx) : opt->step(ctx, lrs[i]);
        if (i == 1) CHECK(fingerprint_of({p}, *opt) == before_skip);
        s.update(ctx);
      }
      CHECK(opt->steps() == 4);  // steps taken, skipped or not
      // Without: the same updates, the skipped step left out (its learning rate too).
      Context ref_ctx(dev);
      auto q = make_param(ref_ctx, "w", {1.0f, -2.0f});
      auto ref_opt = make_opt(ref_ctx, which, {q});
      for (std::size_t i : {0, 2, 3}) {
        set_grad(ref_ctx, q, grads[i]);
        ref_opt->step(ref_ctx, lrs[i]);
      }
      CHECK(p.var.value().fingerprint() == q.var.value().fingerprint());
      const auto st = opt->state(), ref_st = ref_opt->state();
      for (std::size_t k = 0; k < ref_st.size(); ++k) CHECK(st[k].tensor->fingerprint() == ref_st[k].tensor->fingerprint());
      if (which == "adam") CHECK(st.back().tensor->to_host_i32()[0] == 3);  // updates applied
    }
  }
}

}  // namespace ditto::test
