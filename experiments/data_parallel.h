// Data-parallel training: K ranks (one thread, Context, network, optimizer and loader each; K
// GPUs, or K simulated ranks on the CPU) train one model on one global batch per step.
//
// The batch. Every rank's loader draws the same epoch order and augmentation (the same Philox
// keys as the 1-GPU run) and keeps rows [r*R/K, (r+1)*R/K) of each global batch of R rows
// (LoaderOptions::shard), so a K-rank step sees exactly the examples of the 1-GPU step with the
// same global batch.
//
// Example groups. The global batch is cut into G fixed groups (G a multiple of K, default K):
// group g holds rows [g*R/G, (g+1)*R/G), and rank r runs groups [r*G/K, (r+1)*G/K), each as one
// forward and backward pass of its own (a micro-batch) whose loss is weighted by its share of the
// batch (the backward is seeded with rows_g / R, so the summed gradients are those of the batch's
// mean loss). Each group's gradient is the same for every K: the same rows through the same
// kernels at the same shape from the same weights. The groups' gradients are summed in the
// binary-counter tree over the global group index (engine/collective.h): within a rank as they
// arrive, then across the ranks by each bucket's all-reduce.
//
// The all-reduce is a knob per gradient bucket ("bucket0", "bucket1", ...: parameters in reverse
// order, packed up to bucket_bytes, as PyTorch DDP packs them), set by the policy and recorded in
// the manifest like every other kernel choice: fixed-order (ditto's tree: with G/K a power of two
// the bits do not depend on K at all, so K = 1, 2, 4 runs with the same G are bit-identical, and
// with G = 1 the step is bitwise the plain trainer's), ring (ditto's ring order: reproducible,
// K-dependent), nccl-default (what frameworks do) and nccl-ALGO-PROTO with pinned channels.
//
// Batch norm follows each layer's knob batchnorm.stats (kernels/batchnorm.h; ditto-train's
// --batchnorm VALUE is the rule `*.stats=VALUE`): `local` normalizes each group by its own
// statistics (with G = K, each rank's share: what DDP does); the running statistics follow group 0
// alone (as DDP's broadcast_buffers makes them follow rank 0), so they too are the same for every
// K. `sync` normalizes by the statistics of the whole global batch (kernels/sync_batchnorm.h); it
// needs one group per rank (G = K) and its bits follow K. Every rank's context gets the rank group
// that sync layers merge over.
//
// The cost of K-independence: G passes of R/G rows instead of K of R/K per step (with G = K they
// are the same), the groups' gradient flattening, and all-reduces after the backward pass rather
// than overlapped with it.
//
// Rank 0 is the trainer's own (evaluation, checkpoints, hooks and the tracer are there); the other
// ranks run on threads of their own and meet rank 0 in the collectives. Or every rank is a process
// of its own (ProcessRank, engine/collective.h: a Slurm job step's tasks, slurm_task_from_environment
// below): each process runs the trainer with its own rank's parts, the ranks meet in a rendezvous
// folder inside the run folder, and the bits are those of the same K ranks in one process. Under a tracer the ranks
// run their groups one rank after the other (rank 0's first), so the trace holds every group's ops
// in global group order — the same events for any K — followed by one "allreduce" event per bucket
// (inputs: each group's flattened gradient g0..g{G-1}; output: the reduced sum) and rank 0's
// updates: ditto-diverge then names an all-reduce whose output differs while its inputs did not.
#pragma once
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "engine/collective.h"
#include "engine/param.h"
#include "engine/policy.h"
#include "kernels/batchnorm.h"

namespace ditto {

class Context;
class Loader;
class Net;
class Optimizer;
class Tracer;

struct DataParallelOptions {
  int ranks = 1;                            // K
  int groups = 0;                           // G example groups per global batch; 0: K (group_count)
  int64_t bucket_bytes = int64_t(25) << 20; // gradient bucket size (DDP's default, 25 MiB)
  // G: --dp-groups, or one group per rank when it is not given. The one place that default is
  // resolved (the step, its checks, the manifest and the replay line read it).
  int group_count() const { return groups ? groups : ranks; }
};

// Sync when any batch-norm layer among `layers` (a net's knob layers) resolves stats=sync under
// the policy: then every rank must see its whole share in one pass.
BnStats batch_norm_stats(const Policy& policy, const std::vector<std::pair<std::string, OpKind>>& layers);

// The first row of group g (0 <= g <= groups) of a batch of `rows` rows: floor(g * rows / groups).
int64_t group_start(int64_t rows, int groups, int g);

// Checks opts against a run: ranks >= 1, groups a multiple of ranks (one per rank where a batch
// norm is stats=sync), and every batch of an epoch (n examples in batches of batch_size) splits
// into non-empty groups. Error naming the flag (--gpus, --dp-groups, --batchnorm, --batch-size).
void check_data_parallel(const DataParallelOptions& opts, BnStats stats, int64_t n, int64_t batch_size,
                         bool drop_last);

struct GradBucket {
  std::string name;                   // "bucket0"
  std::vector<std::size_t> params;    // indices into the parameter list, in layout order
  std::vector<int64_t> offsets;       // each parameter's first element in the bucket
  int64_t elements = 0;
};
// Parameters in reverse order (the order their gradients are finished), packed greedily into
// buckets of at most bucket_bytes (a larger parameter gets a bucket of its own).
std::vector<GradBucket> make_buckets(const std::vector<Param>& params, int64_t bucket_bytes);
// The buckets as policy layers (op kind allreduce), for Policy::check_layers and the noise lab.
std::vector<std::pair<std::string, OpKind>> bucket_layers(const std::vector<GradBucket>& buckets);

// What one rank trains with; the caller builds and owns them. The loader is sharded
// (LoaderOptions::shard = rank, shards = K); state lists every tensor a checkpoint holds
// (parameters, buffers, optimizer state) in one order for all ranks.
struct RankParts {
  Context* ctx = nullptr;
  Net* net = nullptr;
  Optimizer* opt = nullptr;
  Loader* loader = nullptr;
  std::vector<Tensor*> state;
};

// This process's place in a Slurm job step, from the environment srun gives each task:
// SLURM_PROCID (its rank), SLURM_NTASKS (the world), SLURM_LOCALID (its index on its node: which of
// the GPUs it sees it takes), and SLURM_JOB_ID, SLURM_STEP_ID and SLURM_RESTART_COUNT, which name
// the step's rendezvous (a requeued job meets in a fresh one). Error naming the variable when one
// that is needed is missing or malformed.
struct SlurmTask {
  int rank = 0, world = 1, local_id = 0;
  std::string step;  // "job<JOB>.<STEP>[.restart<N>]": the rendezvous folder's name
};
SlurmTask slurm_task_from_environment();

class DataParallel {
 public:
  // parts[r] is rank r; their contexts' devices form the group (distinct GPUs for NCCL). The
  // buckets' all-reduce choices come from rank 0's policy. stochastic_seed keys dropout as the
  // plain trainer's does (group g > 0 with a key of its own). Error for bad options or a tracer
  // with synchronized batch norm (its collectives would wait for ranks the tracer serializes).
  // With `process`, this process is rank process->rank of opts.ranks processes: parts holds its
  // own rank's parts alone, and every rank constructs its DataParallel (they meet here). No
  // tracer then.
  DataParallel(std::vector<RankParts> parts, const DataParallelOptions& opts, uint64_t stochastic_seed,
               Tracer* tracer = nullptr, const ProcessRank* process = nullptr);
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  // Copies rank 0's state (parameters, buffers, optimizer state) to every other rank: after a
  // fresh initialization or a resume.
  void broadcast_state();
  // Starts the epoch on the other ranks' loaders this process holds (the caller's own belongs to
  // the caller).
  void start_epoch(int epoch);
  // One optimizer step on every rank at lr: the caller's rank (rank 0, or this process's) trains
  // on the rows the caller took from its loader, every other rank this process holds on its
  // loader's next batch. loss_sum and correct are the caller's accumulators (TrainStep::run's);
  // the other ranks keep their own.
  void step(const Tensor& images, const Tensor& labels, int64_t global_rows, float lr, Tensor& loss_sum,
            Tensor& correct);
  // The other ranks' loss sum and correct count since the last call (host values, for the
  // epoch's log), and resets them. loss_sum and correct are the caller's own (step's): across
  // processes every rank sends its own and receives the others' (every rank calls this).
  std::pair<double, int64_t> take_other_sums(const Tensor& loss_sum, const Tensor& correct);
  // Error naming the rank when a rank's parameters differ bitwise from rank 0's (every rank
  // must apply the same update). Across processes every rank calls it.
  void check_replicas() const;
  // Tells the other ranks this one stopped (a rank whose run failed outside a collective: the
  // others then stop at their next meeting instead of waiting out the timeout).
  void fail();

  const std::vector<GradBucket>& buckets() const;
  const std::vector<AllReduceConfig>& configs() const;
  int ranks() const;
  int groups() const;
  // The caller's rank: 0, or this process's rank when the ranks are processes.
  int rank() const;
  // Whether the run's bits are the same for any rank count: every bucket fixed-order, G/K a power
  // of two, local batch norm.
  bool rank_count_independent() const;
  // The manifest's "data_parallel" section: ranks, devices, groups, batch norm, buckets with their
  // parameters, sizes and all-reduce choices, NCCL version and environment, transport.
  nlohmann::json describe() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ditto
