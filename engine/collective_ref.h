// CPU references of the collectives' arithmetic (engine/collective.h).
//
// tree_sum is the fixed-order reduce's sum itself: float additions in the binary-counter tree
// order, exactly as the CUDA kernel does them (IEEE addition is commutative, and no FMA is
// involved), so CPU and GPU give the same bits. The tree is written once, over an abstract add,
// and used for floats here and for tensors by TreeAccumulator.
//
// ring_all_reduce is the reference of the `ring` variant: the order in which a ring all-reduce
// adds the ranks' contributions — the buffer cut into K shards of ceil(n/K) elements, shard c
// summed along the ring starting at rank c+1 and ending at rank c. It shows why such a sum
// depends on the rank count. NCCL's real schedule (channels, slices, protocols, trees) is its
// own; only the GPU runs measure NCCL itself.
#pragma once
#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

namespace ditto::ref {

// Binary-counter tree over leaves pushed in order. Node holds a partial sum and how many leaves
// it covers; add(older, newer) must return older + newer.
template <class T, class Add>
class CounterTree {
 public:
  explicit CounterTree(Add add) : add_(std::move(add)) {}
  void push(T leaf) {
    int64_t leaves = 1;
    while (!stack_.empty() && stack_.back().second == leaves) {
      leaf = add_(std::move(stack_.back().first), std::move(leaf));
      leaves *= 2;
      stack_.pop_back();
    }
    stack_.emplace_back(std::move(leaf), leaves);
  }
  bool empty() const { return stack_.empty(); }
  // Folds the remaining partial sums, newest first: older + (the sum of everything newer).
  T result() {
    T acc = std::move(stack_.back().first);
    stack_.pop_back();
    while (!stack_.empty()) {
      acc = add_(std::move(stack_.back().first), std::move(acc));
      stack_.pop_back();
    }
    return acc;
  }

 private:
  Add add_;
  std::vector<std::pair<T, int64_t>> stack_;
};

// out[i] = tree sum over k of parts[k][i] (float arithmetic). count >= 1.
inline void tree_sum(const float* const* parts, int64_t count, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) {
    auto add = [](float a, float b) { return a + b; };
    CounterTree<float, decltype(add)> t(add);
    for (int64_t k = 0; k < count; ++k) t.push(parts[k][i]);
    out[i] = t.result();
  }
}

// The ring model described above, in float: every rank's buffer (ranks.size() of n elements)
// ends holding the same sums.
inline std::vector<float> ring_all_reduce(const std::vector<std::vector<float>>& ranks) {
  const int64_t k = static_cast<int64_t>(ranks.size());
  const int64_t n = k ? static_cast<int64_t>(ranks[0].size()) : 0;
  std::vector<float> out(static_cast<std::size_t>(n));
  const int64_t shard = k ? (n + k - 1) / k : 0;
  for (int64_t c = 0; c < k; ++c) {
    const int64_t lo = std::min(n, c * shard), hi = std::min(n, (c + 1) * shard);
    for (int64_t i = lo; i < hi; ++i) {
      float acc = ranks[(c + 1) % k][i];
      for (int64_t s = 2; s <= k; ++s) acc += ranks[(c + s) % k][i];
      out[i] = acc;
    }
  }
  return out;
}

}  // namespace ditto::ref
