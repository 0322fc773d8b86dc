// Internal (CUDA only): the binary-counter tree of ref::CounterTree (engine/collective_ref.h) for
// one element, over `count` values load(0), ..., load(count-1): the order fixed-order sums in.
// Additions are explicit round-to-nearest adds (no contraction). count <= 64 (stack of 8).
#pragma once

namespace ditto::cuda {

__device__ __forceinline__ float add_rn(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ double add_rn(double a, double b) { return __dadd_rn(a, b); }

template <class T, class Load>
__device__ __forceinline__ T counter_tree(int count, Load load) {
  T sum[8];
  int leaves[8], top = 0;
  for (int k = 0; k < count; ++k) {
    T v = load(k);
    int l = 1;
    while (top > 0 && leaves[top - 1] == l) {
      v = add_rn(sum[top - 1], v);  // older + newer
      l *= 2;
      --top;
    }
    sum[top] = v;
    leaves[top++] = l;
  }
  T acc = sum[--top];
  while (top > 0) acc = add_rn(sum[--top], acc);
  return acc;
}

}  // namespace ditto::cuda
