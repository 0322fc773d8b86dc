// Checks shared by the network tests (cpu_nets, cpu_zoo_nets, cpu_zoo_nets2, cpu_zoo_nets3): knob
// coverage, counts per op kind, names and shapes of a full-size model, weight spread for init
// rules, and one traced forward and backward pass with its gradients.
#pragma once
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <string>

#include "engine/policy.h"
#include "kernels/loss.h"
#include "nets/module.h"
#include "nets/nets.h"
#include "support.h"
#include "kernels/linear.h"

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
    if (kind == op::conv2d || kind == op::linear || kind == op::batchnorm) CHECK(owners.count(name) == 1);
  }
  for (const auto& b : net.buffers()) CHECK(knobs.at(layer_of(b.name)) == op::batchnorm);
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

// One training-mode forward (traced) and backward at batch 2 of a fresh net initialised from
// `seed`, labels 0 and classes - 1: logits [2, classes], finite; every parameter a finite
// gradient of its shape, those needs_nonzero picks a nonzero one. Returns each traced layer's
// output shape.
template <class Pick>
std::map<std::string, Shape> forward_backward_shapes(const std::string& model, int side, int classes, int channels,
                                                     uint64_t seed, Pick needs_nonzero) {
  INFO(model << " seed " << seed);
  Context ctx;
  auto net = make_net(ctx, {model, classes, channels});
  net->init(ctx, seed);
  net->begin_step(seed, 1);
  const int batch = 2;
  Tensor x = ctx.from_host(random_vec(std::size_t(batch) * channels * side * side, seed), {batch, channels, side, side});
  SummaryTrace trace;
  Var logits = net->forward(ctx, Var(x), true, &trace);
  REQUIRE(logits.shape() == Shape{batch, classes});
  auto l = logits.value().to_host_f32();
  CHECK(std::all_of(l.begin(), l.end(), [](float v) { return std::isfinite(v); }));
  Var loss = softmax_cross_entropy(ctx, "loss", logits, ctx.from_host(std::vector<int32_t>{0, classes - 1}, {batch}));
  ctx.tape().backward(ctx, loss);
  check_param_grads(*net, needs_nonzero);
  std::map<std::string, Shape> out;
  for (const auto& r : trace) out[r.name] = r.output;
  return out;
}

inline int64_t buffer_count(Net& net) {
  int64_t n = 0;
  for (const auto& b : net.buffers()) n += b.tensor->numel();
  return n;
}

inline std::vector<std::string> param_names(Net& net) {
  std::vector<std::string> v;
  for (const auto& p : net.params()) v.push_back(p.name);
  return v;
}

inline Shape param_shape(Net& net, const std::string& name) {
  for (const auto& p : net.params())
    if (p.name == name) return p.var.value().shape();
  FAIL("no parameter " << name);
  return {};
}

inline bool has_param(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

// The shared count checks of one full-size model at 1000 classes and 3 channels.
struct Expect {
  int64_t params, convs, bns, linears, max_pools;
  bool stochastic;
  std::string first, last;
};
inline void check_full_size(const std::string& model, const Expect& e) {
  INFO(model);
  Context ctx;
  auto net = make_net(ctx, {model, 1000, 3});
  CHECK(net->name() == model);
  CHECK(net->param_count() == e.params);
  CHECK(net->stochastic() == e.stochastic);
  CHECK(count_kind(*net, op::conv2d) == e.convs);
  CHECK(count_kind(*net, op::batchnorm) == e.bns);
  CHECK(count_kind(*net, op::linear) == e.linears);
  CHECK(count_kind(*net, op::maxpool2d) == e.max_pools);
  CHECK(net->buffers().size() == std::size_t(2 * e.bns));
  check_knobs_cover_params(*net);
  auto names = param_names(*net);
  CHECK(names.front() == e.first);
  CHECK(names.back() == e.last);
  CHECK(std::set<std::string>(names.begin(), names.end()).size() == names.size());
}

}  // namespace ditto::test
