#include "experiments/stats.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <utility>

#include "engine/digest_ref.h"
#include "engine/error.h"

namespace ditto {

namespace {

// Every replica must predict the same examples, otherwise pairwise churn compares unrelated
// positions; returns the common number of examples.
std::size_t common_size(const std::vector<std::vector<int32_t>>& predictions, const char* caller) {
  if (predictions.empty()) return 0;
  const std::size_t n = predictions[0].size();
  for (std::size_t r = 1; r < predictions.size(); ++r)
    if (predictions[r].size() != n)
      throw Error(fmt::format("{}: replica {} has {} predictions, replica 0 has {}", caller, r,
                              predictions[r].size(), n));
  return n;
}

uint32_t float_bits(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  return bits;
}

// Float bits on a line of integers ordered like the floats (-0.0 one step below +0.0): the
// mapping the device-side bit distances use (engine/digest_ref.h).
int64_t ordered_bits(float x) { return ref::ordered_bits(float_bits(x), 0x80000000u); }

}  // namespace

double mean(const std::vector<double>& v) {
  if (v.empty()) return 0;
  double sum = 0;
  for (double x : v) sum += x;
  return sum / double(v.size());
}

double stddev(const std::vector<double>& v) {
  if (v.size() < 2) return 0;
  // Identical values have no spread; the mean of several equal doubles need not equal them
  // exactly, which would report a spread of 1e-17 for bit-identical replicas.
  if (std::all_of(v.begin(), v.end(), [&](double x) { return x == v[0]; })) return 0;
  const double m = mean(v);
  double sum_sq = 0;
  for (double x : v) sum_sq += (x - m) * (x - m);
  return std::sqrt(sum_sq / double(v.size() - 1));
}

double percentile(std::vector<double> v, double q) {
  if (v.empty()) throw Error("percentile: empty input has no quantile");
  if (!(q >= 0 && q <= 1)) throw Error(fmt::format("percentile: q = {} is outside [0, 1]", q));
  std::sort(v.begin(), v.end());
  const double position = q * double(v.size() - 1);
  const std::size_t below = std::size_t(std::floor(position));
  const std::size_t above = std::min(below + 1, v.size() - 1);
  return v[below] + (position - double(below)) * (v[above] - v[below]);
}

double churn(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  if (a.size() != b.size())
    throw Error(fmt::format("churn: prediction vectors differ in size ({} vs {})", a.size(), b.size()));
  if (a.empty()) return 0;
  std::size_t differing = 0;
  for (std::size_t i = 0; i < a.size(); ++i) differing += a[i] != b[i];
  return double(differing) / double(a.size());
}

double mean_pairwise_churn(const std::vector<std::vector<int32_t>>& predictions) {
  common_size(predictions, "mean_pairwise_churn");
  const std::size_t replicas = predictions.size();
  if (replicas < 2) return 0;
  double sum = 0;
  for (std::size_t a = 0; a < replicas; ++a)
    for (std::size_t b = a + 1; b < replicas; ++b) sum += churn(predictions[a], predictions[b]);
  return sum / (double(replicas) * double(replicas - 1) / 2);
}

std::vector<double> per_example_disagreement(const std::vector<std::vector<int32_t>>& predictions) {
  const std::size_t n = common_size(predictions, "per_example_disagreement");
  const std::size_t replicas = predictions.size();
  std::vector<double> disagreement(n, 0.0);
  if (replicas < 2) return disagreement;
  const double pairs = double(replicas) * double(replicas - 1) / 2;
  for (std::size_t i = 0; i < n; ++i) {
    std::size_t differing_pairs = 0;
    for (std::size_t a = 0; a < replicas; ++a)
      for (std::size_t b = a + 1; b < replicas; ++b) differing_pairs += predictions[a][i] != predictions[b][i];
    disagreement[i] = double(differing_pairs) / pairs;
  }
  return disagreement;
}

namespace {

// Percentile bootstrap of statistic(items): `resamples` resamples of the items with replacement
// from std::mt19937_64(seed). Modulo instead of std::uniform_int_distribution: the latter's
// algorithm differs between standard libraries, which would make the interval depend on the
// compiler. The bias is n / 2^64, far below the bootstrap's own noise.
Interval bootstrap_statistic(const char* caller, const std::vector<double>& items, int resamples, uint64_t seed,
                             double level, double (*statistic)(const std::vector<double>&)) {
  if (resamples < 0) throw Error(fmt::format("{}: resamples = {} is negative", caller, resamples));
  if (!(level > 0 && level < 1)) throw Error(fmt::format("{}: level = {} is outside (0, 1)", caller, level));
  Interval interval;
  interval.value = interval.low = interval.high = statistic(items);
  const std::size_t n = items.size();
  if (resamples == 0 || n < 2) return interval;
  std::mt19937_64 generator(seed);
  std::vector<double> resampled(static_cast<std::size_t>(resamples)), draw(n);
  for (double& value : resampled) {
    for (double& x : draw) x = items[std::size_t(generator() % n)];
    value = statistic(draw);
  }
  interval.low = percentile(resampled, (1 - level) / 2);
  interval.high = percentile(std::move(resampled), (1 + level) / 2);
  return interval;
}

}  // namespace

Interval bootstrap_mean(const std::vector<double>& per_item, int resamples, uint64_t seed, double level) {
  return bootstrap_statistic("bootstrap_mean", per_item, resamples, seed, level, mean);
}

Interval bootstrap_stddev(const std::vector<double>& values, int resamples, uint64_t seed, double level) {
  return bootstrap_statistic("bootstrap_stddev", values, resamples, seed, level, stddev);
}

std::vector<double> group_means(const std::vector<double>& v, std::size_t group) {
  if (group == 1) return v;
  if (group == 0 || v.size() % group != 0)
    throw Error(fmt::format("group_means: {} values do not split into groups of {}", v.size(), group));
  std::vector<double> out(v.size() / group, 0.0);
  for (std::size_t g = 0; g < out.size(); ++g) {
    double sum = 0;
    for (std::size_t k = 0; k < group; ++k) sum += v[g * group + k];
    out[g] = sum / double(group);
  }
  return out;
}

Interval churn_interval(const std::vector<std::vector<int32_t>>& predictions, int resamples, uint64_t seed,
                        double level, std::size_t units_per_item) {
  return bootstrap_mean(group_means(per_example_disagreement(predictions), units_per_item), resamples, seed, level);
}

double student_t_quantile(double dof, double q) {
  if (!(dof >= 1) || !(q > 0 && q < 1))
    throw Error(fmt::format("student_t_quantile: {} degrees of freedom, q = {}", dof, q));
  if (q < 0.5) return -student_t_quantile(dof, 1 - q);
  // P(0 < T < t) by Simpson's rule over the density, whose normalizer comes from lgamma.
  const double norm = std::exp(std::lgamma((dof + 1) / 2) - std::lgamma(dof / 2)) / std::sqrt(dof * M_PI);
  auto density = [&](double x) { return norm * std::pow(1 + x * x / dof, -(dof + 1) / 2); };
  auto half_mass = [&](double t) {
    constexpr int kSteps = 4096;  // even
    const double h = t / kSteps;
    double sum = density(0) + density(t);
    for (int k = 1; k < kSteps; ++k) sum += (k % 2 ? 4 : 2) * density(k * h);
    return sum * h / 3;
  };
  const double want = q - 0.5;
  double lo = 0, hi = 1;
  while (half_mass(hi) < want) hi *= 2;  // heavy tails (few dof): widen until the mass is there
  for (int i = 0; i < 100 && hi - lo > 1e-10 * std::max(1.0, hi); ++i) {
    const double mid = (lo + hi) / 2;
    (half_mass(mid) < want ? lo : hi) = mid;
  }
  return (lo + hi) / 2;
}

Interval churn_replica_interval(const std::vector<std::vector<int32_t>>& predictions, double level) {
  if (!(level > 0 && level < 1)) throw Error(fmt::format("churn_replica_interval: level {} outside (0,1)", level));
  common_size(predictions, "churn_replica_interval");
  const std::size_t r = predictions.size();
  Interval out;
  out.value = out.low = out.high = mean_pairwise_churn(predictions);
  if (r < 3) return out;
  std::vector<std::vector<double>> pair(r, std::vector<double>(r, 0.0));
  for (std::size_t a = 0; a < r; ++a)
    for (std::size_t b = a + 1; b < r; ++b) pair[a][b] = pair[b][a] = churn(predictions[a], predictions[b]);
  std::vector<double> left_out(r, 0.0);  // theta_i: the mean over the pairs without replica i
  for (std::size_t i = 0; i < r; ++i) {
    double sum = 0;
    for (std::size_t a = 0; a < r; ++a)
      for (std::size_t b = a + 1; b < r; ++b)
        if (a != i && b != i) sum += pair[a][b];
    left_out[i] = sum / double((r - 1) * (r - 2) / 2);
  }
  const double centre = mean(left_out);
  double ss = 0;
  for (double t : left_out) ss += (t - centre) * (t - centre);
  const double se = std::sqrt(double(r - 1) / double(r) * ss);
  const double half = student_t_quantile(double(r - 1), (1 + level) / 2) * se;
  out.low = std::max(0.0, out.value - half);
  out.high = std::min(1.0, out.value + half);
  return out;
}

double l2_distance(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size())
    throw Error(fmt::format("l2_distance: vectors differ in size ({} vs {})", a.size(), b.size()));
  return diff_f32(a.data(), b.data(), a.size()).l2;
}

uint64_t ulp_distance(float a, float b) {
  if (float_bits(a) == float_bits(b)) return 0;
  if (std::isnan(a) || std::isnan(b)) return UINT64_MAX;
  const int64_t ia = ordered_bits(a), ib = ordered_bits(b);
  return uint64_t(ia > ib ? ia - ib : ib - ia);
}

TensorDiff diff_f32(const float* a, const float* b, std::size_t n) {
  TensorDiff diff;
  diff.numel = int64_t(n);
  double sum_sq = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (float_bits(a[i]) == float_bits(b[i])) continue;
    ++diff.differing;
    diff.max_ulp = std::max(diff.max_ulp, ulp_distance(a[i], b[i]));
    const double delta = double(a[i]) - double(b[i]);
    sum_sq += delta * delta;
    diff.max_abs = std::max(diff.max_abs, std::abs(delta));
  }
  diff.l2 = std::sqrt(sum_sq);
  return diff;
}

}  // namespace ditto
