// Evaluation helpers: top-k predictions and correct-prediction counts, computed on the
// tensor's device. Counting sums hits per block (cub::BlockReduce) and adds the block counts with
// integer atomics, which are exact and order-independent, so the counts are deterministic.
#pragma once
#include "engine/context.h"

namespace ditto {

// Indices of the k largest logits per row, largest first; ties go to the lower class index.
// logits [N, C] of any float dtype (widened exactly) → [N, k] i32 on the same device.
Tensor topk(Context& ctx, const Tensor& logits, int k);

// counts (i32 [2], on ctx's device) += (#rows whose label is the top-1 prediction,
// #rows whose label is among the top-5 predictions). labels: [N] i32.
void accumulate_correct(Context& ctx, const Tensor& logits, const Tensor& labels, Tensor& counts);

}  // namespace ditto
