// Statistics and charts for determinism experiments: quantiles, churn and per-example
// disagreement against hand-worked numbers, bootstrap intervals against the normal
// approximation and for reproducibility, ulp/bit/L2 tensor differences on planted changes,
// and the SVG bar chart's structure and escaping.
#include <catch2/catch.hpp>

#include <cmath>
#include <string>

#include "engine/error.h"
#include "experiments/stats.h"
#include "experiments/svg.h"

using namespace ditto;

namespace {

std::size_t count_occurrences(const std::string& haystack, const std::string& needle) {
  std::size_t count = 0;
  for (std::size_t at = haystack.find(needle); at != std::string::npos; at = haystack.find(needle, at + 1)) ++count;
  return count;
}

// 3 replicas over 4 examples. Per example (labels across replicas -> disagreeing pairs of 3):
//   0: {0,0,0} -> 0/3;  1: {1,1,2} -> 2/3;  2: {2,2,1} -> 2/3;  3: {3,0,1} -> 3/3.
// Per pair: (0,1) differ at 3 -> 1/4; (0,2) at 1,2,3 -> 3/4; (1,2) at 1,2,3 -> 3/4.
// Both ways the mean is 7/12.
const std::vector<std::vector<int32_t>> kThreeReplicas = {{0, 1, 2, 3}, {0, 1, 2, 0}, {0, 2, 1, 1}};

}  // namespace

TEST_CASE("mean and sample stddev", "[stats]") {
  CHECK(mean({}) == 0);
  CHECK(stddev({3.0}) == 0);
  const std::vector<double> v = {2, 4, 4, 4, 5, 5, 7, 9};
  CHECK(mean(v) == Approx(5));
  CHECK(stddev(v) == Approx(std::sqrt(32.0 / 7)));  // squared deviations sum to 32, n-1 = 7
  // Bit-identical replicas have no spread: 0.4324 three times has a mean that is not exactly
  // 0.4324 in double, which must not show up as a std of 7e-17.
  CHECK(stddev({0.4324, 0.4324, 0.4324}) == 0.0);
}

TEST_CASE("percentile interpolates linearly between order statistics", "[stats]") {
  const std::vector<double> v = {4, 1, 3, 2};  // unsorted on purpose
  CHECK(percentile(v, 0) == 1);
  CHECK(percentile(v, 0.25) == Approx(1.75));  // position 0.75 between 1 and 2
  CHECK(percentile(v, 0.5) == Approx(2.5));
  CHECK(percentile(v, 1) == 4);
  CHECK(percentile({7}, 0.3) == 7);
  CHECK_THROWS_AS(percentile({}, 0.5), Error);
  CHECK_THROWS_AS(percentile(v, 1.5), Error);
  CHECK_THROWS_AS(percentile(v, -0.1), Error);
  CHECK_THROWS_AS(percentile(v, std::nan("")), Error);
}

TEST_CASE("churn and mean pairwise churn on hand-made predictions", "[stats]") {
  CHECK(churn({1, 2, 3, 4}, {1, 0, 3, 0}) == Approx(0.5));
  CHECK(churn({}, {}) == 0);
  CHECK_THROWS_AS(churn({1, 2}, {1, 2, 3}), Error);
  CHECK(mean_pairwise_churn(kThreeReplicas) == Approx(7.0 / 12));
  // 4 replicas, 6 pairs, over 2 examples: pair churns (0,1) 1/2, (0,2) 1, (0,3) 1/2, (1,2) 1/2,
  // (1,3) 0, (2,3) 1/2 sum to 3, so the mean is 3/6 (a count of replicas instead of pairs gives 3/4).
  CHECK(mean_pairwise_churn({{0, 0}, {0, 1}, {1, 1}, {0, 1}}) == Approx(0.5));
  CHECK(mean_pairwise_churn({{1, 2, 3}}) == 0);
  CHECK_THROWS_AS(mean_pairwise_churn({{1, 2}, {1, 2}, {1}}), Error);
}

TEST_CASE("per-example disagreement", "[stats]") {
  const auto d = per_example_disagreement(kThreeReplicas);
  REQUIRE(d.size() == 4);
  CHECK(d[0] == 0);
  CHECK(d[1] == Approx(2.0 / 3));
  CHECK(d[2] == Approx(2.0 / 3));
  CHECK(d[3] == Approx(1.0));
  CHECK(mean(d) == Approx(mean_pairwise_churn(kThreeReplicas)));
  // Same 4 replicas: example 0 is {0,0,1,0}, example 1 is {0,1,1,1}; each has 3 of 6 pairs disagreeing.
  CHECK(per_example_disagreement({{0, 0}, {0, 1}, {1, 1}, {0, 1}}) == std::vector<double>{0.5, 0.5});
  CHECK(per_example_disagreement({{5, 6}}) == std::vector<double>{0, 0});
  CHECK_THROWS_AS(per_example_disagreement({{1, 2}, {1}}), Error);
}

TEST_CASE("bootstrap_mean degenerate cases", "[stats]") {
  const Interval equal = bootstrap_mean({0.4, 0.4, 0.4, 0.4}, 500, 1);
  CHECK(equal.value == Approx(0.4));
  CHECK(equal.low == Approx(0.4));
  CHECK(equal.high == Approx(0.4));

  const Interval none = bootstrap_mean({1, 2, 6}, 0, 1);
  CHECK(none.value == Approx(3));
  CHECK(none.low == none.value);
  CHECK(none.high == none.value);

  const Interval single = bootstrap_mean({5}, 100, 1);
  CHECK(single.low == 5);
  CHECK(single.high == 5);

  const Interval tiny = bootstrap_mean({0, 1}, 200, 3);
  CHECK(tiny.value == Approx(0.5));
  CHECK(tiny.low >= 0);
  CHECK(tiny.high <= 1);
  CHECK(tiny.low <= tiny.high);

  CHECK_THROWS_AS(bootstrap_mean({0, 1}, -1, 3), Error);
  CHECK_THROWS_AS(bootstrap_mean({0, 1}, 10, 3, 1.0), Error);
}

TEST_CASE("bootstrap_mean of a proportion matches the normal approximation", "[stats]") {
  const int n = 1000;
  const double p = 0.3;
  std::vector<double> items(n, 0.0);
  for (int i = 0; i < int(p * n); ++i) items[std::size_t(i)] = 1;
  const Interval interval = bootstrap_mean(items, 2000, 42);
  CHECK(interval.value == Approx(p));
  CHECK(interval.low < p);
  CHECK(interval.high > p);
  const double normal_width = 2 * 1.96 * std::sqrt(p * (1 - p) / n);
  CHECK(interval.high - interval.low == Approx(normal_width).epsilon(0.2));

  const Interval again = bootstrap_mean(items, 2000, 42);
  CHECK(again.low == interval.low);
  CHECK(again.high == interval.high);
  const Interval other_seed = bootstrap_mean(items, 2000, 43);
  CHECK((other_seed.low != interval.low || other_seed.high != interval.high));
}

TEST_CASE("bootstrap_stddev: over replicas, by hand", "[stats]") {
  // Three replica accuracies: sample std 0.02; a resample spreads at most like {0.90, 0.90, 0.94}.
  const Interval none = bootstrap_stddev({0.90, 0.92, 0.94}, 0, 1);
  CHECK(none.value == Approx(0.02));
  CHECK(none.low == none.value);
  const Interval i = bootstrap_stddev({0.90, 0.92, 0.94}, 500, 5);
  CHECK(i.value == Approx(0.02));
  CHECK(i.low >= 0.0);
  CHECK(i.high <= std::sqrt(1.6e-3 / 3) + 1e-12);
  CHECK(i.low < i.value);  // 1 resample in 9 draws one value three times: no spread
  const Interval same = bootstrap_stddev({0.7, 0.7, 0.7}, 500, 5);  // bit-identical replicas
  CHECK(same.value == 0.0);
  CHECK(same.high == 0.0);
  CHECK_THROWS_AS(bootstrap_stddev({0, 1}, -1, 3), Error);
}

TEST_CASE("churn_interval is the bootstrap of per-example disagreement", "[stats]") {
  const Interval interval = churn_interval(kThreeReplicas, 300, 7);
  CHECK(interval.value == Approx(7.0 / 12));
  const Interval direct = bootstrap_mean(per_example_disagreement(kThreeReplicas), 300, 7);
  CHECK(interval.low == direct.low);
  CHECK(interval.high == direct.high);
  CHECK(interval.low >= 0);
  CHECK(interval.high <= 1);
}

TEST_CASE("student_t_quantile against tabulated values", "[stats]") {
  // Two-sided 95% points of the t table, and symmetry.
  CHECK(student_t_quantile(1, 0.975) == Approx(12.706205).epsilon(1e-6));
  CHECK(student_t_quantile(2, 0.975) == Approx(4.302653).epsilon(1e-6));
  CHECK(student_t_quantile(4, 0.975) == Approx(2.776445).epsilon(1e-6));
  CHECK(student_t_quantile(9, 0.975) == Approx(2.262157).epsilon(1e-6));
  CHECK(student_t_quantile(30, 0.975) == Approx(2.042272).epsilon(1e-6));
  CHECK(student_t_quantile(4, 0.025) == Approx(-2.776445).epsilon(1e-6));
  CHECK(student_t_quantile(3, 0.5) == Approx(0).margin(1e-9));
  CHECK_THROWS_AS(student_t_quantile(0.5, 0.9), Error);
  CHECK_THROWS_AS(student_t_quantile(3, 1.0), Error);
}

TEST_CASE("churn_replica_interval: the jackknife over replicas, by hand", "[stats]") {
  // Pair churns 0.2 (0,1), 0.4 (0,2), 0.4 (1,2): leaving replica i out leaves one pair,
  // theta = {0.4, 0.4, 0.2}; se^2 = 2/3 * 6/225 = (2/15)^2; t(2, 0.975) = 4.302653.
  const std::vector<int32_t> r0(10, 0);
  std::vector<int32_t> r1 = r0, r2 = r0;
  r1[0] = r1[1] = 1;
  for (int i = 0; i < 4; ++i) r2[i] = 2;
  const Interval c = churn_replica_interval({r0, r1, r2});
  CHECK(c.value == Approx(1.0 / 3));
  CHECK(c.low == 0.0);  // 1/3 - 0.5737 clipped at 0
  CHECK(c.high == Approx(1.0 / 3 + 4.302653 * 2.0 / 15).epsilon(1e-6));
  // With r0 the pairs are closer than among s1..s3: the interval opens; every pair equally apart
  // (s1..s3 alone): the draw of replicas does not move the churn.
  std::vector<int32_t> s1 = r0, s2 = r0, s3 = r0;
  s1[0] = 1;
  s2[1] = 1;
  s3[2] = 1;
  const Interval flat = churn_replica_interval({r0, s1, s2, s3});
  CHECK(flat.value == Approx(0.15));  // pairs with r0: 0.1; among s1..s3: 0.2
  CHECK(flat.high > flat.value);
  const Interval same = churn_replica_interval({s1, s2, s3});
  CHECK(same.value == Approx(0.2));
  CHECK(same.low == Approx(0.2));
  CHECK(same.high == Approx(0.2));
  // Two replicas: one pair, no interval.
  const Interval two = churn_replica_interval({r0, r1});
  CHECK((two.low == two.value && two.high == two.value && two.value == Approx(0.2)));
  CHECK_THROWS_AS(churn_replica_interval({r0, std::vector<int32_t>(9, 0), r1}), Error);
}

TEST_CASE("ulp_distance", "[stats]") {
  CHECK(ulp_distance(1.0f, 1.0f) == 0);
  CHECK(ulp_distance(1.0f, std::nextafter(1.0f, 2.0f)) == 1);
  CHECK(ulp_distance(-0.0f, 0.0f) == 1);
  CHECK(ulp_distance(-0.0f, -0.0f) == 0);
  // 1.0f is 0x3f800000 = 1065353216 above +0.0, and -1.0f as far below -0.0, one below +0.0.
  CHECK(ulp_distance(1.0f, -1.0f) == 2 * uint64_t(1065353216) + 1);
  CHECK(ulp_distance(-1.0f, 1.0f) == ulp_distance(1.0f, -1.0f));
  CHECK(ulp_distance(std::nanf(""), 1.0f) == UINT64_MAX);
  CHECK(ulp_distance(std::nanf(""), std::nanf("")) == 0);  // same bits
}

TEST_CASE("diff_f32 and l2_distance on planted differences", "[stats]") {
  const float a[] = {1.0f, 2.0f, -3.0f, 0.5f, 7.0f};
  const float b[] = {1.0f, std::nextafter(2.0f, 3.0f), -3.0f, 0.5f, 7.5f};
  const TensorDiff diff = diff_f32(a, b, 5);
  CHECK(diff.numel == 5);
  CHECK(diff.differing == 2);
  // In [4, 8) one ulp is 2^-21, so 7 -> 7.5 is 0.5 / 2^-21 = 2^20 ulps; in [2, 4) one ulp is 2^-22.
  CHECK(diff.max_ulp == (uint64_t(1) << 20));
  CHECK(diff.max_abs == 0.5);
  CHECK(diff.l2 == Approx(std::sqrt(0.25 + std::ldexp(1.0, -44))));
  CHECK(diff_f32(a, a, 5).differing == 0);

  CHECK(l2_distance({0, 0}, {3, 4}) == Approx(5));
  CHECK_THROWS_AS(l2_distance({0}, {3, 4}), Error);
}

TEST_CASE("svg_bar_chart structure and escaping", "[svg]") {
  std::vector<BarRow> rows(4);
  rows[0].label = "a<b & c";
  rows[0].value = 0.05;
  rows[0].low = 0.03;
  rows[0].high = 0.07;
  rows[0].has_interval = true;
  rows[1].label = "layer2.0.conv1.bwd_filter=algo0";
  rows[1].value = 0.12;
  rows[2].label = "layer3.fc.bias_grad=atomic";
  rows[2].note = "no divergence";
  rows[3].label = "plain_zero";
  const std::string svg = svg_bar_chart("Churn <per> kernel", "churn (%)", rows, 100);

  CHECK(svg.rfind("<svg", 0) == 0);
  CHECK(svg.find("a&lt;b &amp; c") != std::string::npos);
  CHECK(svg.find("a<b") == std::string::npos);
  CHECK(svg.find("Churn &lt;per&gt; kernel") != std::string::npos);
  for (const char* label : {"layer2.0.conv1.bwd_filter=algo0", "layer3.fc.bias_grad=atomic", "plain_zero"})
    CHECK(svg.find(label) != std::string::npos);
  CHECK(svg.find("no divergence") != std::string::npos);
  CHECK(svg.find(">12<") != std::string::npos);  // value printed scaled to percent
  CHECK(count_occurrences(svg, "<rect") == 2);     // only the two non-zero rows get bars
  CHECK(count_occurrences(svg, "<text") == count_occurrences(svg, "</text>"));
  CHECK(svg.find("</svg>") != std::string::npos);

  rows[1].value = -1;
  CHECK_THROWS_AS(svg_bar_chart("t", "x", rows), Error);
  CHECK(svg_bar_chart("empty", "x", {}).rfind("<svg", 0) == 0);
}

TEST_CASE("svg_log_bar_chart: decades on the axis, zero rows show their note") {
  std::vector<ditto::BarRow> rows = {{"loud", 3e-8}, {"soft", 2e-10}, {"quiet", 0, 0, 0, false, "no divergence"}};
  std::string svg = ditto::svg_log_bar_chart("t", "x", rows);
  for (const char* tick : {">1e-10<", ">1e-9<", ">1e-8<", ">1e-7<"}) CHECK(svg.find(tick) != std::string::npos);
  CHECK(svg.find(">1e-11<") == std::string::npos);  // the lowest decade holds the smallest value
  std::size_t rects = 0;
  for (std::size_t at = svg.find("<rect"); at != std::string::npos; at = svg.find("<rect", at + 1)) ++rects;
  CHECK(rects == 2);
  CHECK(svg.find("no divergence") != std::string::npos);
  CHECK_THROWS_AS(ditto::svg_log_bar_chart("t", "x", {{"bad", -1}}), ditto::Error);
}
