// Internal: CUDA launchers of engine/collective.cu.
#pragma once
#include <cstdint>

namespace ditto { class Context; }

namespace ditto::cuda {

// The most parts fixed_tree_sum adds in one launch (their pointers travel as a kernel argument).
constexpr int kTreeSumMaxParts = 64;

// out[i] = binary-counter tree sum over k of parts[k][i] (ref::tree_sum's order). count in
// [1, kTreeSumMaxParts]; out may alias no part.
void tree_sum(Context& ctx, const float* const* parts, int count, int64_t n, float* out);
// out[i] = ((parts[0][i] + parts[1][i]) + ...) + parts[count-1][i], a left fold in the given order.
void fold_sum(Context& ctx, const float* const* parts, int count, int64_t n, float* out);
// a[i] += b[i].
void add_inplace(Context& ctx, float* a, const float* b, int64_t n);

}  // namespace ditto::cuda
