// Test helpers shared by every op test: random inputs, the central-difference gradient check
// in double, the GPU-vs-reference comparison, and the repeat-and-fingerprint determinism probe.
#pragma once
#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "engine/context.h"

namespace ditto::test {

// Fresh random inputs on every run; the seed is printed when a check fails, so a failure can be
// replayed with DITTO_TEST_SEED=<seed>.
// int64 values as the (low, high) i32 words another framework's int64 array holds them in.
inline std::vector<int32_t> int64_words(const std::vector<int64_t>& v) {
  std::vector<int32_t> w;
  for (int64_t x : v) {
    const auto u = static_cast<uint64_t>(x);
    w.push_back(static_cast<int32_t>(static_cast<uint32_t>(u)));
    w.push_back(static_cast<int32_t>(static_cast<uint32_t>(u >> 32)));
  }
  return w;
}

inline uint64_t fresh_seed() {
  if (const char* s = std::getenv("DITTO_TEST_SEED")) return std::strtoull(s, nullptr, 10);
  return std::random_device{}() ^ (uint64_t(std::random_device{}()) << 32);
}

template <class T = float>
std::vector<T> random_vec(std::size_t n, uint64_t seed, double lo = -1.0, double hi = 1.0) {
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<double> d(lo, hi);
  std::vector<T> v(n);
  for (auto& x : v) x = static_cast<T>(d(g));
  return v;
}

template <class T>
std::vector<double> to_double(const std::vector<T>& v) {
  return std::vector<double>(v.begin(), v.end());
}

// Central-difference gradient check in double. `loss` maps the input vector to a scalar;
// `analytic` is the gradient the op's backward computed for the same input. Returns the
// largest |numeric - analytic| / max(1, |numeric|, |analytic|) (relative where large, absolute
// where small). With eps = 1e-6 on smooth functions the difference quotient's truncation error
// is O(eps^2 * f''') ~ 1e-12 and the rounding error O(1e-16 / eps) ~ 1e-10, so 1e-6 is a
// threshold that only a wrong gradient crosses.
inline double gradcheck(const std::function<double(const std::vector<double>&)>& loss, std::vector<double> x,
                        const std::vector<double>& analytic, double eps = 1e-6) {
  REQUIRE(analytic.size() == x.size());
  double worst = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    double keep = x[i];
    x[i] = keep + eps;
    double up = loss(x);
    x[i] = keep - eps;
    double down = loss(x);
    x[i] = keep;
    double numeric = (up - down) / (2 * eps);
    double scale = std::max({1.0, std::fabs(numeric), std::fabs(analytic[i])});
    worst = std::max(worst, std::fabs(numeric - analytic[i]) / scale);
  }
  return worst;
}

// Weights for turning an op's output into a scalar loss L = sum(w * y): dL/dy = w, so the
// backward pass is checked with a non-uniform upstream gradient.
inline std::vector<double> loss_weights(std::size_t n, uint64_t seed) { return random_vec<double>(n, seed ^ 0x5eed); }

inline double weighted_sum(const std::vector<double>& y, const std::vector<double>& w) {
  double s = 0;
  for (std::size_t i = 0; i < y.size(); ++i) s += y[i] * w[i];
  return s;
}

struct CloseReport {
  bool ok = true;
  std::size_t worst_index = 0;
  double worst_excess = 0, got = 0, want = 0;
  std::string str() const {
    return "element " + std::to_string(worst_index) + ": got " + std::to_string(got) + ", reference " +
           std::to_string(want) + " (excess over tolerance " + std::to_string(worst_excess) + ")";
  }
};

// |got - ref| <= atol + rtol * |ref| elementwise; NaN never passes.
template <class A, class B>
CloseReport all_close(const std::vector<A>& got, const std::vector<B>& ref, double atol, double rtol) {
  CloseReport r;
  if (got.size() != ref.size()) {
    r.ok = false;
    return r;
  }
  for (std::size_t i = 0; i < got.size(); ++i) {
    double g = got[i], w = ref[i];
    double excess = std::fabs(g - w) - (atol + rtol * std::fabs(w));
    if (std::isnan(g) || std::isnan(w)) excess = INFINITY;
    if (excess > 0 && (r.ok || excess > r.worst_excess)) {
      r.ok = false;
      r.worst_excess = excess;
      r.worst_index = i;
      r.got = g;
      r.want = w;
    }
  }
  return r;
}

// Runs `fn` (which returns the tensor under test) `runs` times and counts distinct fingerprints.
inline std::size_t distinct_results(int runs, const std::function<Tensor()>& fn) {
  std::set<Fingerprint> prints;
  for (int i = 0; i < runs; ++i) prints.insert(fn().fingerprint());
  return prints.size();
}

// Microseconds per call of fn on ctx: 3 warm-up calls, then the mean of 20, with the stream
// drained before and after (host clock around queued GPU work).
inline double us_per_call(Context& ctx, const std::function<void()>& fn) {
  for (int i = 0; i < 3; ++i) fn();
  ctx.synchronize();
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 20; ++i) fn();
  ctx.synchronize();
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / 20;
}

}  // namespace ditto::test
