// Is GPU noise additive to algorithmic noise, or do they interact? The paper's four settings
// form a 2 x 2 design: seeds vary or not (ALGO) x the framework-default kernels or deterministic
// ones (IMPL). For a noise measure X of a setting (churn, or the variance of replica accuracy),
//
//   excess      = X(ALGO+IMPL) - X(ALGO)               what GPU noise adds on top of seed noise
//   additive    = X(ALGO) + X(IMPL) - X(CONTROL)       X(ALGO+IMPL) if the two sources added up
//   interaction = X(ALGO+IMPL) - X(ALGO) - X(IMPL) + X(CONTROL)
//
// interaction is the 2 x 2 design's interaction contrast: 0 when the sources add, below 0 when
// they overlap (each alone already moves the examples or the accuracy the other would: the noise
// saturates), above 0 when together they do more than the sum. X(CONTROL) is 0 when CONTROL is
// bit-identical; it stays in the formula so that the contrast is exact either way.
//
// Intervals. Churn: a paired percentile bootstrap over test examples — each resample draws one
// set of example indices and applies it to all four settings, so the terms' shared example
// difficulty cancels in the contrasts; the replicas are held fixed (their draw is not covered).
// Accuracy variance: a percentile bootstrap over replicas, drawn independently per setting
// (replica accuracies are all there is to resample; with 3 replicas the intervals are wide).
// Both use std::mt19937_64(seed) with modulo draws, like bootstrap_mean (experiments/stats.h).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "experiments/stats.h"

namespace ditto {

struct NoiseDecomposition {
  std::string measure;  // "churn" | "accuracy_variance"
  Interval algo_impl, algo, impl, control;
  Interval excess, additive, interaction;
  // "additive" (the interaction's interval covers 0), "sub-additive" (it lies below 0) or
  // "super-additive" (above 0).
  std::string verdict;
};

// The verdict an interaction interval supports (see NoiseDecomposition::verdict).
std::string interaction_verdict(const Interval& interaction);

// Churn (mean pairwise churn per setting, experiments/stats.h) decomposed; each argument holds a
// setting's replicas' top-1 predictions (or any units, experiments/task_scoring.h: with units_per_item > 1
// the paired bootstrap resamples groups of that many, a segmentation's images). Throws Error when
// a setting has fewer than 2 replicas or the settings predict different numbers of examples.
NoiseDecomposition decompose_churn(const std::vector<std::vector<int32_t>>& algo_impl,
                                   const std::vector<std::vector<int32_t>>& algo,
                                   const std::vector<std::vector<int32_t>>& impl,
                                   const std::vector<std::vector<int32_t>>& control, int resamples, uint64_t seed,
                                   double level = 0.95, std::size_t units_per_item = 1);

// The sample variance (divisor n-1) of the replicas' test accuracy decomposed; each argument holds
// a setting's replica accuracies. Throws Error when a setting has fewer than 2 replicas.
NoiseDecomposition decompose_accuracy_variance(const std::vector<double>& algo_impl, const std::vector<double>& algo,
                                               const std::vector<double>& impl, const std::vector<double>& control,
                                               int resamples, uint64_t seed, double level = 0.95);

}  // namespace ditto
