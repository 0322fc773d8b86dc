// Statistics for determinism experiments: how far apart replicas of one training run end up,
// both in their predictions (churn, with bootstrap intervals so that a difference between two
// kernel policies can be told from resampling noise) and in their raw float32 tensors (bit,
// ulp and L2 differences). Everything here is a pure function of its inputs and seeds.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace ditto {

// Arithmetic mean; 0 for an empty vector.
double mean(const std::vector<double>& v);

// Sample standard deviation (divisor n-1); 0 for fewer than two values.
double stddev(const std::vector<double>& v);

// q-quantile, q in [0,1], linear interpolation between order statistics (numpy's default
// "linear" method: position q*(n-1)). Throws Error for empty v or q outside [0,1].
double percentile(std::vector<double> v, double q);

// A point estimate with a confidence interval around it.
struct Interval { double value = 0, low = 0, high = 0; };

// Fraction of positions where a and b differ (throws on size mismatch; 0 for empty).
double churn(const std::vector<int32_t>& a, const std::vector<int32_t>& b);

// Mean over all replica pairs (a<b) of churn(a,b). 0 with fewer than 2 replicas. Throws Error
// when replicas predict different numbers of examples.
double mean_pairwise_churn(const std::vector<std::vector<int32_t>>& predictions);

// Per example i: the fraction of replica pairs that disagree at i (mean of these = mean pairwise
// churn). All zeros with fewer than 2 replicas. Throws Error on replicas of unequal size.
std::vector<double> per_example_disagreement(const std::vector<std::vector<int32_t>>& predictions);

// Percentile bootstrap of the mean of per-item values: `resamples` resamples of the items with
// replacement drawn from std::mt19937_64(seed) (so the interval is reproducible), the mean of each;
// low/high are the (1-level)/2 and (1+level)/2 percentiles of those means; value is the plain mean.
// With resamples == 0 or fewer than 2 items, low == high == value. Throws Error for negative
// resamples or level outside (0,1).
Interval bootstrap_mean(const std::vector<double>& per_item, int resamples, uint64_t seed, double level = 0.95);

// Percentile bootstrap of the sample standard deviation (divisor n-1) of a few values (replica
// accuracies): resamples of the values with replacement, drawn as bootstrap_mean draws; value is
// stddev(values). With few values the interval is wide (and the resampled stddev biased low by
// about sqrt((n-1)/n)): it says how little 3 replicas pin a spread down. Throws as bootstrap_mean.
Interval bootstrap_stddev(const std::vector<double>& values, int resamples, uint64_t seed, double level = 0.95);

// The means of consecutive groups of `group` values (an image's pixels): what a bootstrap resamples
// when units come in clusters, so that an interval does not pretend a picture's pixels vary
// independently. group 1 returns v itself. Throws Error unless group divides v's size.
std::vector<double> group_means(const std::vector<double>& v, std::size_t group);

// bootstrap_mean over per_example_disagreement(predictions): mean pairwise churn with its interval.
// units_per_item > 1: predictions are units in consecutive groups of that many (a segmentation's
// pixels, image by image); the groups' means are resampled (the value is the same mean).
Interval churn_interval(const std::vector<std::vector<int32_t>>& predictions, int resamples, uint64_t seed,
                        double level = 0.95, std::size_t units_per_item = 1);

// The q-quantile of Student's t distribution with `dof` degrees of freedom (dof >= 1, q in (0,1)):
// the CDF integrated numerically from the density and inverted by bisection, to about 1e-9.
double student_t_quantile(double dof, double q);

// Churn over the replicas drawn: mean pairwise churn (the value) with an interval for another
// draw of as many replicas on the same test set, where churn_interval's is for another test set
// with these replicas. The jackknife over replicas (leave replica i out: the mean churn of the
// pairs left, theta_i; se^2 = (R-1)/R * sum (theta_i - mean theta)^2, the jackknife's variance of
// a U-statistic) with a t interval of R-1 degrees of freedom, clipped to [0, 1]. With few replicas
// it is wide, which is the point: two invocations of 3 replicas each can land far apart. Fewer
// than 3 replicas: low == high == value (one pair says nothing about the draw).
Interval churn_replica_interval(const std::vector<std::vector<int32_t>>& predictions, double level = 0.95);

// sqrt(sum (a-b)^2), accumulated in double. Throws Error on size mismatch.
double l2_distance(const std::vector<float>& a, const std::vector<float>& b);

// Distance in units in the last place between two float32 values: map each bit pattern to an
// integer that increases monotonically with the float value (negative floats mirrored so that
// -0.0 and +0.0 are 1 apart), return |ia - ib|. Identical bits -> 0. If either is NaN and the bits
// differ, return UINT64_MAX.
uint64_t ulp_distance(float a, float b);

// How two float32 tensors of equal length differ.
struct TensorDiff {
  int64_t numel = 0;
  int64_t differing = 0;   // elements whose bits differ
  uint64_t max_ulp = 0;    // largest ulp_distance over elements
  double l2 = 0;           // sqrt(sum (a-b)^2), NaN-free inputs assumed
  double max_abs = 0;      // largest |a-b|
};

// Compares a[0..n) with b[0..n) element by element (bits, ulps, L2, max abs difference).
TensorDiff diff_f32(const float* a, const float* b, std::size_t n);

}  // namespace ditto
