// Synchronized batch normalization for data-parallel runs: in training mode the mean and
// variance are those of every rank's examples together (PyTorch's SyncBatchNorm), not of the
// rank's own. A layer runs it where the policy's knob batchnorm.stats says sync
// (kernels/batchnorm.h); the ranks it merges over are the group set_batch_norm_group gives the
// context (a data-parallel run does). Inference mode is unchanged: the running statistics, which
// are the same on every rank, normalize.
//
// Forward: each rank's per-channel sum and sum of squares in double (a fixed-order walk and a CUB
// block reduction on the GPU, one block per channel; plain loops on the CPU), the ranks' records
// all-gathered and merged by the binary-counter tree over the rank index, identically on every
// rank; mean, biased variance (E[x^2] - mean^2 in double) and invstd follow, the running
// statistics move towards the mean and the unbiased variance of all M = sum N_r*H*W values.
// Backward: each rank's sum dy and sum dy*xhat by batch norm's own reductions (knob `bwd`:
// deterministic, or atomic where the policy asks for it; cuDNN cannot take merged statistics, so
// a PINNED cudnn is a PolicyError naming the layer and a mode word that resolved to cudnn runs
// deterministic and records it), all-gathered and merged by the same tree in float; dx uses the
// merged sums. The parameter gradients each rank keeps are its own sums (the data-parallel
// gradient all-reduce adds them up).
//
// Determinism: the merge is fixed, so with deterministic reductions a run is bit-reproducible for
// a fixed rank count (run_to_run with the cuDNN-free kernels on one GPU model); the bits depend on
// the rank count (each rank sums its own share first), unlike ditto's fixed-order gradient
// reduce. The manifest entries are batch norm's (layer, "batchnorm", "bwd") and ("stats", "sync").
#pragma once
#include <memory>
#include <string>

#include "kernels/batchnorm.h"

namespace ditto {

class RankGroup;

// The rank group whose examples stats=sync layers of ctx (rank `rank` of group) merge over; a
// null group takes it away. Every rank of the group must make the same batch-norm calls in the
// same order.
void set_batch_norm_group(Context& ctx, std::shared_ptr<RankGroup> group, int rank);
bool has_batch_norm_group(Context& ctx);

// What batch_norm runs in training mode for a stats=sync layer (same arguments; Error naming the
// layer when ctx has no rank group).
Var sync_batch_norm(Context& ctx, const std::string& layer, const Var& x, const Var& gamma, const Var& beta,
                    BatchNormState& state, float momentum, float eps);

}  // namespace ditto
