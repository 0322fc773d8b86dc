// Shared by tests/cpu_batch_invariance.cpp and tests/gpu_batch_invariance.cpp: evaluates a set of
// examples in batches of several sizes and orders and compares every example's logits bit for
// bit with those of the first evaluation.
#pragma once
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "engine/context.h"
#include "nets/nets.h"
#include "support.h"

namespace ditto::test {

// One way of evaluating the examples: batches of `batch` taken from `order` (a permutation of the
// examples), so example order[i] sits at position i % batch of batch i / batch.
struct EvalPass {
  int64_t batch;
  std::vector<int64_t> order;
  std::string str() const {
    return "batch " + std::to_string(batch) + (order.size() > 1 && order[0] != 0 ? " (permuted)" : "");
  }
};

inline std::vector<int64_t> identity_order(int64_t n) {
  std::vector<int64_t> o(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) o[std::size_t(i)] = i;
  return o;
}
// i -> (a * i + b) mod n with a coprime to n: every example moves, to another position in its batch.
inline std::vector<int64_t> strided_order(int64_t n, int64_t a, int64_t b) {
  std::vector<int64_t> o(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) o[std::size_t(i)] = (a * i + b) % n;
  return o;
}

// Row e of the result: example e's logits, wherever it sat. images: n examples of `example` floats.
inline std::vector<float> eval_logits(Context& ctx, Net& net, const std::vector<float>& images, const Shape& one,
                                      const EvalPass& pass, int classes) {
  const int64_t n = static_cast<int64_t>(pass.order.size()), per = shape_numel(one);
  std::vector<float> out(static_cast<std::size_t>(n * classes));
  NoGradGuard ng(ctx);
  for (int64_t s = 0; s < n; s += pass.batch) {
    const int64_t b = std::min(pass.batch, n - s);
    std::vector<float> x(static_cast<std::size_t>(b * per));
    for (int64_t r = 0; r < b; ++r)
      std::memcpy(x.data() + r * per, images.data() + pass.order[std::size_t(s + r)] * per, sizeof(float) * per);
    Shape xs = one;
    xs.insert(xs.begin(), b);
    const std::vector<float> y = net.forward(ctx, Var(ctx.from_host(x, xs)), false).value().to_host_f32();
    for (int64_t r = 0; r < b; ++r)
      std::memcpy(out.data() + pass.order[std::size_t(s + r)] * classes, y.data() + r * classes,
                  sizeof(float) * classes);
  }
  return out;
}

// How many examples' logits differ bitwise between the first pass and any later one.
struct InvarianceReport {
  int64_t examples = 0, differing = 0;
  std::string first_difference;  // "example 3: batch 7 vs batch 1"
};

inline InvarianceReport compare_passes(Context& ctx, Net& net, const std::vector<float>& images, const Shape& one,
                                       const std::vector<EvalPass>& passes, int classes) {
  InvarianceReport rep;
  const std::vector<float> ref = eval_logits(ctx, net, images, one, passes.at(0), classes);
  rep.examples = static_cast<int64_t>(passes[0].order.size());
  std::vector<bool> differs(static_cast<std::size_t>(rep.examples), false);
  for (std::size_t p = 1; p < passes.size(); ++p) {
    const std::vector<float> got = eval_logits(ctx, net, images, one, passes[p], classes);
    for (int64_t e = 0; e < rep.examples; ++e) {
      if (std::memcmp(got.data() + e * classes, ref.data() + e * classes, sizeof(float) * classes) == 0) continue;
      if (rep.first_difference.empty())
        rep.first_difference = "example " + std::to_string(e) + ": " + passes[p].str() + " vs " + passes[0].str();
      differs[std::size_t(e)] = true;
    }
  }
  for (bool d : differs) rep.differing += d;
  return rep;
}

}  // namespace ditto::test
