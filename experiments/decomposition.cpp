#include "experiments/decomposition.h"

#include <fmt/format.h>

#include <array>
#include <functional>
#include <random>

#include "engine/error.h"

namespace ditto {
namespace {

// The four settings' values of a measure, in the order ALGO+IMPL, ALGO, IMPL, CONTROL.
using Terms = std::array<double, 4>;

double excess_of(const Terms& t) { return t[0] - t[1]; }
double additive_of(const Terms& t) { return t[1] + t[2] - t[3]; }
double interaction_of(const Terms& t) { return t[0] - t[1] - t[2] + t[3]; }

// Point values from `point`, intervals from the percentiles of every statistic over the
// resampled terms (each resample's terms come from one draw, so the contrasts are paired).
NoiseDecomposition assemble(const std::string& measure, const Terms& point, const std::vector<Terms>& resampled,
                            double level) {
  auto interval = [&](const std::function<double(const Terms&)>& statistic) {
    Interval i;
    i.value = i.low = i.high = statistic(point);
    if (resampled.empty()) return i;
    std::vector<double> values;
    values.reserve(resampled.size());
    for (const Terms& t : resampled) values.push_back(statistic(t));
    i.low = percentile(values, (1 - level) / 2);
    i.high = percentile(std::move(values), (1 + level) / 2);
    return i;
  };
  NoiseDecomposition d;
  d.measure = measure;
  d.algo_impl = interval([](const Terms& t) { return t[0]; });
  d.algo = interval([](const Terms& t) { return t[1]; });
  d.impl = interval([](const Terms& t) { return t[2]; });
  d.control = interval([](const Terms& t) { return t[3]; });
  d.excess = interval(excess_of);
  d.additive = interval(additive_of);
  d.interaction = interval(interaction_of);
  d.verdict = interaction_verdict(d.interaction);
  return d;
}

void check_resampling(int resamples, double level, const char* what) {
  if (resamples < 0) throw Error(fmt::format("{}: resamples = {} is negative", what, resamples));
  if (!(level > 0 && level < 1)) throw Error(fmt::format("{}: level = {} is outside (0, 1)", what, level));
}

double variance(const std::vector<double>& v) {
  const double s = stddev(v);
  return s * s;
}

}  // namespace

std::string interaction_verdict(const Interval& interaction) {
  if (interaction.low > 0) return "super-additive";
  if (interaction.high < 0) return "sub-additive";
  return "additive";
}

NoiseDecomposition decompose_churn(const std::vector<std::vector<int32_t>>& algo_impl,
                                   const std::vector<std::vector<int32_t>>& algo,
                                   const std::vector<std::vector<int32_t>>& impl,
                                   const std::vector<std::vector<int32_t>>& control, int resamples, uint64_t seed,
                                   double level, std::size_t units_per_item) {
  check_resampling(resamples, level, "decompose_churn");
  const char* names[4] = {"ALGO+IMPL", "ALGO", "IMPL", "CONTROL"};
  const std::vector<std::vector<int32_t>>* settings[4] = {&algo_impl, &algo, &impl, &control};
  std::array<std::vector<double>, 4> per_example;
  for (int s = 0; s < 4; ++s) {
    if (settings[s]->size() < 2)
      throw Error(fmt::format("decompose_churn: {} has {} replica(s); churn needs at least 2", names[s],
                              settings[s]->size()));
    per_example[s] = group_means(per_example_disagreement(*settings[s]), units_per_item);
    if (per_example[s].size() != per_example[0].size())
      throw Error(fmt::format("decompose_churn: {} predicts {} examples, ALGO+IMPL {}", names[s],
                              per_example[s].size(), per_example[0].size()));
  }
  const std::size_t n = per_example[0].size();
  Terms point;
  for (int s = 0; s < 4; ++s) point[s] = mean(per_example[s]);
  std::vector<Terms> resampled;
  if (n >= 2) {
    std::mt19937_64 generator(seed);
    resampled.resize(static_cast<std::size_t>(resamples));
    for (Terms& t : resampled) {
      Terms sum{0, 0, 0, 0};
      for (std::size_t k = 0; k < n; ++k) {
        const std::size_t i = std::size_t(generator() % n);  // one draw for all four: paired
        for (int s = 0; s < 4; ++s) sum[s] += per_example[s][i];
      }
      for (int s = 0; s < 4; ++s) t[s] = sum[s] / double(n);
    }
  }
  return assemble("churn", point, resampled, level);
}

NoiseDecomposition decompose_accuracy_variance(const std::vector<double>& algo_impl, const std::vector<double>& algo,
                                               const std::vector<double>& impl, const std::vector<double>& control,
                                               int resamples, uint64_t seed, double level) {
  check_resampling(resamples, level, "decompose_accuracy_variance");
  const char* names[4] = {"ALGO+IMPL", "ALGO", "IMPL", "CONTROL"};
  const std::vector<double>* settings[4] = {&algo_impl, &algo, &impl, &control};
  Terms point;
  for (int s = 0; s < 4; ++s) {
    if (settings[s]->size() < 2)
      throw Error(fmt::format("decompose_accuracy_variance: {} has {} replica(s); a variance needs at least 2",
                              names[s], settings[s]->size()));
    point[s] = variance(*settings[s]);
  }
  std::mt19937_64 generator(seed);
  std::vector<Terms> resampled(static_cast<std::size_t>(resamples));
  std::vector<double> draw;
  for (Terms& t : resampled)
    for (int s = 0; s < 4; ++s) {
      const std::vector<double>& v = *settings[s];
      draw.assign(v.size(), 0.0);
      for (double& x : draw) x = v[std::size_t(generator() % v.size())];
      t[s] = variance(draw);
    }
  return assemble("accuracy_variance", point, resampled, level);
}

}  // namespace ditto
