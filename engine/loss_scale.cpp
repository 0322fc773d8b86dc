#include "engine/loss_scale.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "engine/context.h"
#include "engine/detail/loss_scale_cuda.h"
#include "engine/error.h"
#include "engine/loss_scale_ref.h"

namespace ditto {
namespace {

constexpr const char* kForms =
    "valid: off, dynamic, dynamic:INIT:GROWTH:BACKOFF:INTERVAL, or a power of two such as 1024 (a fixed scale)";

bool power_of_two(double x) {
  int e = 0;
  return std::isfinite(x) && x > 0 && std::frexp(x, &e) == 0.5;
}

// A number that a float holds exactly as a power of two, else nullopt.
std::optional<float> parse_power_of_two(const std::string& text) {
  std::size_t used = 0;
  double x = 0;
  try {
    x = std::stod(text, &used);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  if (used != text.size() || !power_of_two(x) || !power_of_two(static_cast<float>(x)) ||
      double(static_cast<float>(x)) != x)
    return std::nullopt;
  return static_cast<float>(x);
}

[[noreturn]] void bad_form(const std::string& text) {
  throw Error(fmt::format("--loss-scale: '{}' is not a loss-scaling setting; {}", text, kForms));
}

// "dynamic:INIT:GROWTH:BACKOFF:INTERVAL"
LossScaling parse_dynamic_fields(const std::string& text) {
  std::vector<std::string> f;
  for (std::size_t from = 0;;) {
    const std::size_t colon = text.find(':', from);
    f.push_back(text.substr(from, colon == std::string::npos ? std::string::npos : colon - from));
    if (colon == std::string::npos) break;
    from = colon + 1;
  }
  if (f.size() != 5 || f[0] != "dynamic") bad_form(text);
  LossScaling s;
  s.mode = LossScaling::Mode::Dynamic;
  auto number = [&](const std::string& v) {
    auto x = parse_power_of_two(v);
    if (!x) throw Error(fmt::format("--loss-scale: '{}' in '{}' is not a power of two that a float holds", v, text));
    return *x;
  };
  s.init_scale = number(f[1]);
  s.growth_factor = number(f[2]);
  s.backoff_factor = number(f[3]);
  const bool digits = !f[4].empty() && f[4].size() < 10 && f[4].find_first_not_of("0123456789") == std::string::npos;
  if (!digits) throw Error(fmt::format("--loss-scale: interval '{}' in '{}' is not a whole number", f[4], text));
  s.growth_interval = std::stoi(f[4]);
  return s;
}

}  // namespace

LossScaling parse_loss_scaling(const std::string& text) {
  LossScaling s;
  if (text == "off") return s;
  if (text == "dynamic") {
    s.mode = LossScaling::Mode::Dynamic;
    return s;
  }
  if (text.rfind("dynamic:", 0) == 0) s = parse_dynamic_fields(text);
  else if (auto x = parse_power_of_two(text)) s = {LossScaling::Mode::Fixed, *x};
  else bad_form(text);
  check_loss_scaling(s);
  return s;
}

std::string loss_scaling_name(const LossScaling& s) {
  switch (s.mode) {
    case LossScaling::Mode::Off: return "off";
    // As doubles: the shortest decimal of a double reads back to it exactly, and a float's power of
    // two is one (the float's own shortest decimal, "1.7014118e+38", is not 2^127 as a double).
    case LossScaling::Mode::Fixed: return fmt::format("{}", double(s.init_scale));
    case LossScaling::Mode::Dynamic: break;
  }
  const LossScaling d{LossScaling::Mode::Dynamic};
  if (s.init_scale == d.init_scale && s.growth_factor == d.growth_factor && s.backoff_factor == d.backoff_factor &&
      s.growth_interval == d.growth_interval)
    return "dynamic";
  return fmt::format("dynamic:{}:{}:{}:{}", double(s.init_scale), double(s.growth_factor), double(s.backoff_factor),
                     s.growth_interval);
}

void check_loss_scaling(const LossScaling& s) {
  if (!s.enabled()) return;
  if (!power_of_two(s.init_scale))
    throw Error(fmt::format("--loss-scale: the scale {} is not a power of two, so unscaling would round", s.init_scale));
  if (s.mode == LossScaling::Mode::Fixed) return;
  if (!power_of_two(s.growth_factor) || !(s.growth_factor > 1))
    throw Error(fmt::format("--loss-scale: the growth factor {} is not a power of two above 1", s.growth_factor));
  if (!power_of_two(s.backoff_factor) || !(s.backoff_factor < 1))
    throw Error(fmt::format("--loss-scale: the backoff factor {} is not a power of two below 1", s.backoff_factor));
  if (s.growth_interval < 1)
    throw Error(fmt::format("--loss-scale: the growth interval {} is not at least 1", s.growth_interval));
}

LossScaling default_loss_scaling(const std::string& precision) {
  return precision == "fp16" ? LossScaling{LossScaling::Mode::Dynamic} : LossScaling{};
}

LossScaler::LossScaler(Context& ctx, LossScaling cfg) : cfg_(cfg) {
  check_loss_scaling(cfg_);
  if (!cfg_.enabled()) throw Error("LossScaler: loss scaling is off; make no scaler");
  scale_ = ctx.full({1}, cfg_.init_scale);
  good_steps_ = ctx.zeros({1}, DType::I32);
  found_inf_ = ctx.zeros({1}, DType::I32);
  cursor_ = ctx.zeros({1}, DType::I32);
}

void LossScaler::reserve(Context& ctx, int64_t steps) {
  const int64_t capacity = record_.defined() ? record_.numel() / 2 : 0, need = recorded_ + steps;
  if (need <= capacity) return;
  // Doubling: a graph captured against the record is recaptured only log2(steps) times.
  const int64_t grown = std::max<int64_t>({need, 2 * capacity, 64});
  Tensor bigger = ctx.zeros({grown * 2});
  if (recorded_ > 0 && ctx.is_cuda())
    cuda::copy_floats(ctx, bigger.f32(), record_.f32(), recorded_ * 2);
  else if (recorded_ > 0)
    std::copy(record_.f32(), record_.f32() + recorded_ * 2, bigger.f32());
  record_ = std::move(bigger);
}

void LossScaler::unscale(Context& ctx, const std::vector<Param>& params) {
  bool found = false;  // the CPU's OR, stored into found_inf_ at the end
  if (ctx.is_cuda()) cuda::clear_flag(ctx, found_inf_.i32());
  for (const auto& p : params) {
    Tensor& g = p.var.grad();
    if (!g.defined()) continue;
    if (ctx.is_cuda())
      cuda::unscale_and_check(ctx, g.f32(), g.numel(), scale_.f32(), found_inf_.i32());
    else
      found |= ref::unscale_and_check(g.f32(), g.numel(), *scale_.f32());
  }
  if (!ctx.is_cuda()) *found_inf_.i32() = found ? 1 : 0;
}

void LossScaler::update(Context& ctx) {
  const int64_t capacity = record_.defined() ? record_.numel() / 2 : 0;
  if (recorded_ >= capacity)
    throw Error(fmt::format("LossScaler: no room to record step {} since the last take_record ({} reserved)",
                            recorded_ + 1, capacity));
  const bool dynamic = cfg_.mode == LossScaling::Mode::Dynamic;
  if (ctx.is_cuda()) {
    cuda::update_loss_scale(ctx, scale_.f32(), good_steps_.i32(), found_inf_.i32(), record_.f32(), cursor_.i32(),
                            capacity, dynamic, cfg_.growth_factor, cfg_.backoff_factor, cfg_.growth_interval);
  } else {
    const bool overflow = *found_inf_.i32() != 0;
    record_.f32()[2 * recorded_] = *scale_.f32();
    record_.f32()[2 * recorded_ + 1] = overflow ? 1.0f : 0.0f;
    *cursor_.i32() = static_cast<int32_t>(recorded_ + 1);
    if (dynamic)
      ref::update_loss_scale(*scale_.f32(), *good_steps_.i32(), overflow, cfg_.growth_factor, cfg_.backoff_factor,
                             cfg_.growth_interval);
  }
  ++recorded_;
}

void LossScaler::count_replayed_step() {
  const int64_t capacity = record_.defined() ? record_.numel() / 2 : 0;
  if (recorded_ >= capacity)
    throw Error(fmt::format("LossScaler: a replayed step {} has no reserved record row ({} reserved)", recorded_ + 1,
                            capacity));
  ++recorded_;
}

std::vector<LossScaleStep> LossScaler::take_record(Context& ctx) {
  if (recorded_ == 0) return {};
  const int32_t written = cursor_.to_host_i32()[0];  // waits for the device
  if (written != recorded_)
    throw Error(fmt::format("LossScaler: the device recorded {} steps, the host counted {}", written, recorded_));
  const std::vector<float> rows = record_.to_host_f32();
  std::vector<LossScaleStep> out;
  for (int64_t i = 0; i < recorded_; ++i) out.push_back({rows[2 * i], rows[2 * i + 1] != 0.0f});
  if (ctx.is_cuda()) cuda::clear_flag(ctx, cursor_.i32());
  else *cursor_.i32() = 0;
  recorded_ = 0;
  return out;
}

std::vector<Buffer> LossScaler::state() { return {{"scale", &scale_}, {"good_steps", &good_steps_}}; }

}  // namespace ditto
