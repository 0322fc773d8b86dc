// Checks shared by the network tests (cpu_nets, cpu_zoo_nets, cpu_zoo_nets2): knob coverage,
// counts per op kind, weight spread for init rules, and the gradients of one backward pass.
#pragma once
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <string>

#include "engine/policy.h"
#include "nets/module.h"

namespace ditto::test {

// The layer a parameter or buffer belongs to: its name less the last ".field".
inline std::string layer_of(const std::string& param) { return param.substr(0, param.rfind('.')); }

// Every parameter belongs to a knob layer, every conv / linear / batch norm knob layer owns
// parameters, buffers belong to batch norms, "loss" is listed once and no layer twice.
inline void check_knobs_cover_params(Net& net) {
  std::map<std::string, OpKind> knobs;
  int losses = 0;
  for (const auto& [name, kind] : net.knob_layers()) {
    CHECK(knobs.count(name) == 0);
    knobs[name] = kind;
    losses += name == "loss";
  }
  CHECK(losses == 1);
  std::set<std::string> owners;
  for (const auto& p : net.params()) {
    INFO(p.name);
    REQUIRE(knobs.count(layer_of(p.name)) == 1);
    owners.insert(layer_of(p.name));
  }
  for (const auto& [name, kind] : knobs) {
    INFO(name);
    if (kind == OpKind::Conv2d || kind == OpKind::Linear || kind == OpKind::BatchNorm) CHECK(owners.count(name) == 1);
  }
  for (const auto& b : net.buffers()) CHECK(knobs.at(layer_of(b.name)) == OpKind::BatchNorm);
}

inline int64_t count_kind(Net& net, OpKind kind) {
  int64_t n = 0;
  for (const auto& kl : net.knob_layers()) n += kl.second == kind;
  return n;
}

// Root mean square (the sample stddev of zero-mean weights) and largest magnitude of a parameter.
struct Spread {
  double stddev = 0, most = 0;
};
inline Spread spread_of(Net& net, const std::string& name) {
  for (const auto& p : net.params()) {
    if (p.name != name) continue;
    auto v = p.var.value().to_host_f32();
    double ss = 0, most = 0;
    for (float w : v) {
      ss += double(w) * w;
      most = std::max(most, double(std::fabs(w)));
    }
    return {std::sqrt(ss / double(v.size())), most};
  }
  FAIL("no parameter " << name);
  return {};
}

// After a backward pass: every parameter has a finite gradient of its shape; the ones
// `needs_nonzero` picks have a nonzero one (a conv bias right before batch norm has a zero
// gradient in exact arithmetic, so callers usually ask it of weights only).
template <class Pick>
void check_param_grads(Net& net, Pick needs_nonzero) {
  for (const auto& p : net.params()) {
    INFO(p.name);
    REQUIRE(p.var.grad().defined());
    CHECK(p.var.grad().shape() == p.var.value().shape());
    auto g = p.var.grad().to_host_f32();
    CHECK(std::all_of(g.begin(), g.end(), [](float v) { return std::isfinite(v); }));
    if (needs_nonzero(p.name)) CHECK(std::any_of(g.begin(), g.end(), [](float v) { return v != 0.0f; }));
  }
}
inline bool is_weight(const std::string& name) {
  return name.size() > 7 && name.compare(name.size() - 7, 7, ".weight") == 0;
}

}  // namespace ditto::test
