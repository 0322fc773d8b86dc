// Collectives of a data-parallel group: K ranks in one process, one thread and one Context each,
// on K CPU "devices" (simulated ranks, for tests) or K CUDA devices; or K processes holding one
// rank each (a Slurm job step's tasks, on one node or many: ProcessRank below). The gradient all-reduce is a
// policy knob per gradient bucket (knob `algo` of op kind allreduce, engine/policy.h):
//
//   fixed-order   ditto's own reduce. Every rank's contribution is itself the tree sum of the
//                 gradients of fixed example groups (experiments/data_parallel.h: group g holds rows
//                 [g*R/G, (g+1)*R/G) of a global batch of R rows, whichever rank runs it), and
//                 the reduce continues the same tree over the ranks: a binary-counter tree over
//                 the global group index (fixed_tree_sum below). With G/K groups per rank a power
//                 of two, rank r's groups form a complete subtree, so the sum's order over the
//                 global batch is the same for K = 1, 2, 4, ...: the bits do not depend on the rank
//                 count (gpu_to_gpu for the reduce itself; the partials are whatever the kernels
//                 that made them promise). Transport: each rank's partial is cut into K shards;
//                 rank q receives shard q of every rank (an all-to-all of device-to-device copies
//                 inside the process), adds them in the tree's order, and every rank gathers the K
//                 summed shards (an all-gather). Traffic per rank 2(K-1)/K of a bucket, as for a
//                 ring all-reduce; the cost of the design is elsewhere: G forward and backward
//                 passes of R/G rows instead of K of R/K (docs/determinism.md).
//   ring          ditto's ring order over the same transport: rank c sums chunk c of the ranks'
//                 buffers starting at rank c+1 and going round to rank c (ref::ring_all_reduce),
//                 as a ring all-reduce does. Reproducible (gpu_to_gpu for a fixed rank count) but
//                 the order follows the rank count: the rank-count noise of NCCL's ring, made
//                 visible and runnable on simulated CPU ranks. With two ranks every all-reduce is
//                 one addition per element, and IEEE addition commutes, so ring (and NCCL) then
//                 equal fixed-order; from three ranks on they differ.
//   nccl-default  ncclAllReduce (sum) with NCCL's own choice of algorithm, protocol and channels:
//                 what PyTorch DDP and Horovod do. The order of the sum follows the rank count, the
//                 ring or tree NCCL picks for the message size, and the topology: a 2-GPU and a
//                 4-GPU run differ. Guarantee unknown (NCCL documents none).
//   nccl-ALGO-PROTO  ncclAllReduce on a communicator created with NCCL_ALGO=ALGO and NCCL_PROTO=PROTO
//                 set in the environment while NCCL builds its tuning model (and unset again), and
//                 with ncclConfig_t minCTAs = maxCTAs = the bucket's `channels` knob (when not
//                 auto). One communicator per distinct (algorithm, protocol, channels), made once
//                 per group; NCCL reports no per-call choice, so the manifest records the pinned
//                 configuration and NCCL's version. run_to_run for a fixed rank count and mapping.
//
// Across processes the same sums run over another transport: the all-to-all and all-gather move
// bytes only, so fixed-order and ring give the bits they give in one process. On GPUs the bytes
// travel by NCCL (ncclSend / ncclRecv and ncclAllGather on a communicator of NCCL's defaults; the
// pinned nccl-* configurations get communicators of their own), on the CPU through files in the
// rendezvous folder (simulated ranks in separate processes: what tests and a CPU cluster run).
// The ranks meet in that folder: rank 0 writes each communicator's ncclUniqueId there (write,
// then rename), the others wait for it, so a multi-node job needs no launcher beyond Slurm's.
//
// NVLink multicast (NVLS) reductions happen in the NVSwitch and are not reproducible: a group with
// NCCL requires NCCL_NVLS_ENABLE unset (ditto sets it to 0 before NCCL starts) or 0, and refuses
// NCCL_ALGO, NCCL_PROTO and NCCL_{MIN,MAX}_{NCHANNELS,CTAS} in the environment (they would
// silently override the policy's per-bucket choice). ditto never calls cuMulticastCreate.
//
// This header is installed: it pulls in no NCCL or CUDA header.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/manifest.h"
#include "engine/policy.h"
#include "engine/tensor.h"

namespace ditto {

namespace op { inline constexpr OpKind allreduce{"allreduce"}; }

// Knobs allreduce.algo and allreduce.channels of a data-parallel run's gradient buckets (the
// "layers" bucket0, bucket1, ...), declared in engine/collective.cpp:
//   fixed-order   ditto's reduce over fixed example groups, the same bits for any rank count
//   ring          ditto's own ring order (chunk c summed from rank c+1 round to rank c),
//                 reproducible but following the rank count, as NCCL's ring does
//   nccl-default  ncclAllReduce with NCCL's own algorithm, protocol and channel choice (what
//                 frameworks do)
//   nccl-ALGO-PROTO  ncclAllReduce on a communicator made with that algorithm and protocol
//                 pinned (NCCL_ALGO / NCCL_PROTO at its creation)
// channels: NCCL's channels (CTAs) for a pinned nccl-*: auto (NCCL picks per call) or 1..32.
enum class AllReduceAlgo { FixedOrder, Ring, NcclDefault, NcclRingSimple, NcclRingLl, NcclRingLl128, NcclTreeSimple,
                           NcclTreeLl, NcclTreeLl128 };
const KnobSpec& allreduce_algo_knob();
const KnobSpec& allreduce_channels_knob();
const char* name_of(AllReduceAlgo v);
inline const char* knob_name(AllReduceAlgo) { return "algo"; }

class Context;

// One rank of a group whose ranks are processes, one rank each.
struct ProcessRank {
  int rank = 0;             // this process's rank, 0 .. world-1
  int world = 1;            // ranks in the group
  std::string rendezvous;   // a folder every rank's process reads and writes (a shared filesystem
                            // across nodes); only this group's files go there
  double timeout_s = 600;   // how long a rank waits for the others at any meeting point
};

// Makes ctx's GPU the calling thread's current CUDA device (ops launch on the current device; a
// rank's thread calls this before it works, and after anything that switched devices, such as
// reading another GPU's tensor). No-op on the CPU.
void use_device(const Context& ctx);

// dst[dst_offset + i] = src[src_offset + i] for i < n: both of one dtype, dst on ctx's device, src
// on ctx's device (or anywhere, for CUDA), queued on ctx's stream. How gradients are laid into
// buckets and rows of a batch into its example groups. ShapeError when a range is out of bounds.
void copy_elements(Context& ctx, Tensor& dst, int64_t dst_offset, const Tensor& src, int64_t src_offset, int64_t n);

// One bucket's all-reduce as it runs: the algorithm and, for a pinned nccl-*, its channels
// (0: NCCL's choice).
struct AllReduceConfig {
  AllReduceAlgo algo = AllReduceAlgo::FixedOrder;
  int channels = 0;
  bool nccl() const { return algo != AllReduceAlgo::FixedOrder && algo != AllReduceAlgo::Ring; }
  // NCCL_ALGO / NCCL_PROTO values for a pinned nccl-* ("Ring", "Simple"); "" otherwise.
  std::string nccl_algo() const;
  std::string nccl_proto() const;
  std::string str() const;  // "nccl-ring-simple/4ch", "nccl-default", "fixed-order"
  bool operator<(const AllReduceConfig& o) const {
    return algo != o.algo ? algo < o.algo : channels < o.channels;
  }
  bool operator==(const AllReduceConfig& o) const { return algo == o.algo && channels == o.channels; }
};

// What the policy asks for one bucket.
AllReduceConfig allreduce_config(const Policy& policy, const std::string& bucket);

// The guarantee a configuration gives (engine/manifest.h): fixed-order and ring gpu_to_gpu (ring
// for a fixed rank count), a pinned nccl-* run_to_run (for a fixed rank count and mapping),
// nccl-default unknown.
Determinism allreduce_determinism(const AllReduceConfig& c);
Guarantee allreduce_guarantee(const AllReduceConfig& c);

// Records (bucket, "allreduce", "algo") and, for a pinned nccl-*, (bucket, "allreduce", "channels")
// in ctx's manifest.
void record_allreduce(Context& ctx, const std::string& bucket, const AllReduceConfig& c, const Policy& policy);

// out[i] = the binary-counter tree sum of parts[0][i], ..., parts[count-1][i]: leaves are pushed
// in index order; whenever the two newest partial sums cover equally many leaves they are added
// (older + newer); at the end the remaining sums are folded from the newest down. For a power of
// two this is the balanced pairwise tree, and for count = K * m with m a power of two it is the
// tree over K subtrees of m leaves each — the property fixed-order rests on. All parts are f32
// of out's element count on out's device; parts may alias nothing but themselves.
void fixed_tree_sum(Context& ctx, const std::vector<const Tensor*>& parts, Tensor& out);
// The same over `count` chunks of one tensor (chunk q = elements [q*n, (q+1)*n), n = out.numel()),
// e.g. what all_gather delivered.
void fixed_tree_sum_chunks(Context& ctx, const Tensor& chunks, int count, Tensor& out);

// The same tree, fed one leaf at a time (a rank's groups arrive one backward pass after the
// other), keeping at most log2(count) + 1 partial sums alive.
class TreeAccumulator {
 public:
  void push(Context& ctx, Tensor leaf);  // takes the tensor (it becomes a partial sum)
  // The sum of every leaf pushed (undefined when none was); resets the accumulator.
  Tensor result(Context& ctx);
  int64_t leaves() const { return leaves_; }

 private:
  struct Node {
    Tensor sum;
    int64_t leaves;
  };
  std::vector<Node> stack_;
  int64_t leaves_ = 0;
};

// K ranks that reduce together. Each rank's thread calls the collective methods with its rank
// and its own context, and every rank makes the same calls in the same order (as for NCCL).
// If a rank fails it calls fail(): every rank waiting in (or later entering) a collective gets
// Error("stopped: another rank failed"), and NCCL communicators are aborted.
class RankGroup {
 public:
  // devices: one per rank, all CPU (simulated ranks) or all CUDA (distinct GPUs when NCCL is used).
  explicit RankGroup(std::vector<Device> devices);
  // This process's rank of a group spread over processes, on `device`: the ranks meet in
  // me.rendezvous (Error when it is not a folder, or the rank is outside the world). On the CPU
  // the first meeting is here; on CUDA in prepare_nccl, which every rank must call.
  RankGroup(Device device, const ProcessRank& me);
  ~RankGroup();
  RankGroup(const RankGroup&) = delete;
  RankGroup& operator=(const RankGroup&) = delete;

  int size() const;
  // The devices of the ranks this process holds: every rank's in one process; this rank's alone
  // when the group spans processes.
  const std::vector<Device>& devices() const;
  // Whether this process holds `rank`, and its device (Error for a rank held elsewhere).
  bool holds(int rank) const;
  const Device& device_of(int rank) const;
  // Whether the ranks are processes (the ProcessRank constructor).
  bool spans_processes() const;

  // Makes one NCCL communicator (K ranks) per distinct nccl configuration among configs, from
  // the calling thread, before the rank threads start. Checks the environment (see above; sets
  // NCCL_NVLS_ENABLE=0 when unset). Error on a CPU group, a build without NCCL, a device used by
  // two ranks, or a refused environment. A CUDA group spread over processes also makes its
  // transport's communicator here (every rank calls it, with the same configs).
  void prepare_nccl(const std::vector<AllReduceConfig>& configs);
  // NCCL's version ("2.28.9", the library loaded at run time), "" before prepare_nccl or without
  // any nccl configuration.
  std::string nccl_version() const;
  // Whether this build of ditto can use NCCL at all.
  static bool nccl_available();

  // ---- collectives (called by every rank) ----
  // Waits for every rank.
  void barrier(int rank);
  // recv (size() * n elements, n = send.numel()) gets every rank's send, in rank order. Same dtype.
  void all_gather(int rank, Context& ctx, const Tensor& send, Tensor& recv);
  // send and recv hold size() chunks of n = numel / size() elements: chunk q of send goes to rank
  // q; chunk q of recv comes from rank q.
  void all_to_all(int rank, Context& ctx, const Tensor& send, Tensor& recv);
  // buf of rank `root` into every rank's buf (the same dtype and size on every rank).
  void broadcast(int rank, Context& ctx, Tensor& buf, int root);
  // In-place sum of buf over the ranks by the configuration: fixed-order (tree over the ranks'
  // buffers, in rank order), ring (ditto's ring order), both bitwise the same on every rank, or
  // an NCCL all-reduce on the communicator prepare_nccl made for it (Error when there is none).
  void all_reduce(int rank, Context& ctx, Tensor& buf, const AllReduceConfig& config);

  // Tells the other ranks this one stopped: in one process every rank waiting in (or later
  // entering) a collective gets Error("stopped: another rank failed"); across processes the
  // others get it at their next wait on the CPU transport (on NCCL a rank blocked in a
  // collective waits until its launcher ends it: Slurm's srun --kill-on-bad-exit=1). `why` is
  // what the others are told.
  void fail(const std::string& why = "");
  bool failed() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ditto
