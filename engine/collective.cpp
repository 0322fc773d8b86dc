#include "engine/collective.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <set>

#include "engine/collective_ref.h"
#include "engine/context.h"
#include "engine/detail/collective_cuda.h"
#include "engine/detail/cuda_state.h"
#include "engine/detail/nccl.h"
#include "engine/detail/process_link.h"
#include "engine/error.h"

namespace ditto {

// NCCL documents no reproducibility; with its choice left to it the sum's order follows the rank
// count, the message size and the topology (docs/determinism.md). A pinned algorithm and
// protocol give the same order for a fixed rank count and mapping.
namespace {
VariantSpec nccl_pinned(const char* name, const char* summary) {
  return {name, Guarantee::RunToRun, Impl::Library, summary};
}
}  // namespace

DITTO_KNOB(allreduce_algo_knob,
           {op::allreduce, "algo",
            {{"fixed-order", Guarantee::GpuToGpu, Impl::Ditto, "fixed example groups, the same bits for any rank count",
              true},
             {"ring", Guarantee::GpuToGpu, Impl::Ditto, "ditto's ring order (for a fixed rank count)", true},
             {"nccl-default", Guarantee::Unknown, Impl::Library, "ncclAllReduce, NCCL's own choice"},
             nccl_pinned("nccl-ring-simple", "NCCL ring, Simple protocol"),
             nccl_pinned("nccl-ring-ll", "NCCL ring, LL protocol"),
             nccl_pinned("nccl-ring-ll128", "NCCL ring, LL128 protocol"),
             nccl_pinned("nccl-tree-simple", "NCCL tree, Simple protocol"),
             nccl_pinned("nccl-tree-ll", "NCCL tree, LL protocol"),
             nccl_pinned("nccl-tree-ll128", "NCCL tree, LL128 protocol")},
            "nccl-default", false, "a gradient bucket's all-reduce"})
DITTO_KNOB(allreduce_channels_knob,
           {op::allreduce, "channels",
            {nccl_pinned("auto", "NCCL picks per call"), nccl_pinned("1", "one channel"), nccl_pinned("2", "2 channels"),
             nccl_pinned("4", "4 channels"), nccl_pinned("8", "8 channels"), nccl_pinned("16", "16 channels"),
             nccl_pinned("32", "32 channels")},
            "auto", false, "NCCL's channels for a pinned nccl-ALGO-PROTO"})

const char* name_of(AllReduceAlgo v) { return variant_name(allreduce_algo_knob(), v); }

void use_device(const Context& ctx) {
  if (ctx.is_cuda()) DITTO_CUDA_CHECK(cudaSetDevice(ctx.device().index));
}

void copy_elements(Context& ctx, Tensor& dst, int64_t dst_offset, const Tensor& src, int64_t src_offset, int64_t n) {
  if (!dst.defined() || !src.defined() || dst.dtype() != src.dtype() || n < 0 || dst_offset < 0 || src_offset < 0 ||
      dst_offset + n > dst.numel() || src_offset + n > src.numel())
    throw ShapeError(fmt::format("copy_elements: {} elements from offset {} of a {}-element tensor to offset {} of a "
                                 "{}-element one (or the dtypes differ)",
                                 n, src_offset, src.defined() ? src.numel() : 0, dst_offset,
                                 dst.defined() ? dst.numel() : 0));
  if (dst.device() != ctx.device())
    throw ShapeError(fmt::format("copy_elements: the destination is on {}, the context on {}", dst.device().str(),
                                 ctx.device().str()));
  if (n == 0) return;
  const std::size_t es = dtype_size(dst.dtype());
  uint8_t* d = static_cast<uint8_t*>(dst.raw()) + dst_offset * es;
  const uint8_t* s = static_cast<const uint8_t*>(src.raw()) + src_offset * es;
  if (ctx.is_cuda() || src.is_cuda()) {
    if (!ctx.is_cuda()) throw ShapeError("copy_elements: a CUDA source needs a CUDA context");
    DITTO_CUDA_CHECK(cudaMemcpyAsync(d, s, n * es, cudaMemcpyDefault, detail::stream_of(ctx)));
  } else {
    std::memcpy(d, s, n * es);
  }
}

// ---- configurations ----------------------------------------------------------------------

std::string AllReduceConfig::nccl_algo() const {
  switch (algo) {
    case AllReduceAlgo::NcclRingSimple:
    case AllReduceAlgo::NcclRingLl:
    case AllReduceAlgo::NcclRingLl128: return "Ring";
    case AllReduceAlgo::NcclTreeSimple:
    case AllReduceAlgo::NcclTreeLl:
    case AllReduceAlgo::NcclTreeLl128: return "Tree";
    default: return "";
  }
}

std::string AllReduceConfig::nccl_proto() const {
  switch (algo) {
    case AllReduceAlgo::NcclRingSimple:
    case AllReduceAlgo::NcclTreeSimple: return "Simple";
    case AllReduceAlgo::NcclRingLl:
    case AllReduceAlgo::NcclTreeLl: return "LL";
    case AllReduceAlgo::NcclRingLl128:
    case AllReduceAlgo::NcclTreeLl128: return "LL128";
    default: return "";
  }
}

std::string AllReduceConfig::str() const {
  if (nccl_algo().empty()) return name_of(algo);
  return channels ? fmt::format("{}/{}ch", name_of(algo), channels) : fmt::format("{}/auto", name_of(algo));
}

AllReduceConfig allreduce_config(const Policy& policy, const std::string& bucket) {
  AllReduceConfig c;
  c.algo = policy.variant<AllReduceAlgo>(bucket, op::allreduce);
  const KnobPick ch = policy.pick(bucket, op::allreduce, "channels");
  const int channels = ch.index == 0 ? 0 : std::stoi(allreduce_channels_knob().variants[ch.index].name);
  if (channels && c.nccl_algo().empty()) {
    if (policy.requested(bucket, "channels", op::allreduce) == "pinned")
      throw PolicyError(fmt::format("bucket '{}': channels={} is pinned, but channels apply to a pinned nccl-ALGO-PROTO "
                                    "all-reduce and the bucket runs {}",
                                    bucket, channels, name_of(c.algo)));
  } else {
    c.channels = channels;
  }
  return c;
}

Determinism allreduce_determinism(const AllReduceConfig& c) {
  if (c.algo == AllReduceAlgo::NcclDefault) return Determinism::Unknown;
  return Determinism::Yes;
}

Guarantee allreduce_guarantee(const AllReduceConfig& c) {
  return guarantee_of(allreduce_determinism(c), c.nccl() ? Impl::Library : Impl::Ditto);
}

void record_allreduce(Context& ctx, const std::string& bucket, const AllReduceConfig& c, const Policy& policy) {
  const Determinism d = allreduce_determinism(c);
  const Guarantee g = allreduce_guarantee(c);
  ctx.manifest().record({bucket, "allreduce", "algo", name_of(c.algo), policy.requested(bucket, "algo", op::allreduce),
                         d, "", 0, ctx.device().str(), "", g});
  if (!c.nccl_algo().empty())
    ctx.manifest().record({bucket, "allreduce", "channels", c.channels ? std::to_string(c.channels) : "auto",
                           policy.requested(bucket, "channels", op::allreduce), d, "", 0, ctx.device().str(), "",
                           g});
}

// ---- the tree ----------------------------------------------------------------------------

namespace {
void check_part(const Context& ctx, const Tensor& t, int64_t n, const char* what) {
  if (!t.defined() || t.dtype() != DType::F32 || t.device() != ctx.device() || t.numel() != n)
    throw ShapeError(fmt::format("{}: every part must be f32 with {} elements on {}; got {} {} on {}", what, n,
                                 ctx.device().str(), t.defined() ? dtype_name(t.dtype()) : "undefined",
                                 t.defined() ? shape_str(t.shape()) : "", t.defined() ? t.device().str() : "-"));
}

void tree_sum_raw(Context& ctx, const std::vector<const float*>& parts, int64_t n, float* out) {
  if (ctx.is_cuda()) {
    if (parts.size() > static_cast<std::size_t>(cuda::kTreeSumMaxParts))
      throw Error(fmt::format("fixed_tree_sum: {} parts; at most {} at once", parts.size(), cuda::kTreeSumMaxParts));
    cuda::tree_sum(ctx, parts.data(), static_cast<int>(parts.size()), n, out);
  } else {
    ref::tree_sum(parts.data(), static_cast<int64_t>(parts.size()), n, out);
  }
}

void add_into(Context& ctx, Tensor& a, const Tensor& b) {
  if (ctx.is_cuda()) {
    cuda::add_inplace(ctx, a.f32(), b.f32(), a.numel());
  } else {
    float* pa = a.f32();
    const float* pb = b.f32();
    for (int64_t i = 0; i < a.numel(); ++i) pa[i] = pa[i] + pb[i];
  }
}
}  // namespace

void fixed_tree_sum(Context& ctx, const std::vector<const Tensor*>& parts, Tensor& out) {
  if (parts.empty()) throw Error("fixed_tree_sum: no parts");
  check_part(ctx, out, out.numel(), "fixed_tree_sum (out)");
  std::vector<const float*> ptrs;
  for (const Tensor* p : parts) {
    check_part(ctx, *p, out.numel(), "fixed_tree_sum");
    if (p->raw() == out.raw()) throw Error("fixed_tree_sum: out may not alias a part");
    ptrs.push_back(p->f32());
  }
  tree_sum_raw(ctx, ptrs, out.numel(), out.f32());
}

void fixed_tree_sum_chunks(Context& ctx, const Tensor& chunks, int count, Tensor& out) {
  check_part(ctx, out, out.numel(), "fixed_tree_sum_chunks (out)");
  if (count < 1) throw Error(fmt::format("fixed_tree_sum_chunks: {} chunks", count));
  check_part(ctx, chunks, out.numel() * count, "fixed_tree_sum_chunks");
  std::vector<const float*> ptrs;
  for (int q = 0; q < count; ++q) ptrs.push_back(chunks.f32() + q * out.numel());
  tree_sum_raw(ctx, ptrs, out.numel(), out.f32());
}

void TreeAccumulator::push(Context& ctx, Tensor leaf) {
  if (!stack_.empty()) check_part(ctx, leaf, stack_.front().sum.numel(), "TreeAccumulator::push");
  ++leaves_;
  int64_t covers = 1;
  while (!stack_.empty() && stack_.back().leaves == covers) {
    // older + newer; IEEE addition commutes exactly, so adding into the older sum is the same.
    Tensor older = std::move(stack_.back().sum);
    stack_.pop_back();
    add_into(ctx, older, leaf);
    leaf = std::move(older);
    covers *= 2;
  }
  stack_.push_back({std::move(leaf), covers});
}

Tensor TreeAccumulator::result(Context& ctx) {
  if (stack_.empty()) return Tensor();
  Tensor acc = std::move(stack_.back().sum);
  stack_.pop_back();
  while (!stack_.empty()) {
    Tensor older = std::move(stack_.back().sum);
    stack_.pop_back();
    add_into(ctx, older, acc);
    acc = std::move(older);
  }
  leaves_ = 0;
  return acc;
}

// ---- the group ---------------------------------------------------------------------------

struct RankGroup::Impl {
  std::vector<Device> devices;  // of the ranks this process holds
  bool cuda = false;
  int world = 0;                // ranks in the group
  int first = 0;                // the first rank this process holds (they are consecutive)
  std::unique_ptr<detail::ProcessLink> link;  // ranks spread over processes

  std::mutex m;
  std::condition_variable cv;
  int arrived = 0;
  uint64_t generation = 0;
  bool failed = false;

  // What each rank offers in the current exchange.
  std::vector<const uint8_t*> published;
  std::vector<std::size_t> published_bytes;
  std::vector<cudaEvent_t> ready, done;  // per rank: its offer is complete / its reads are queued

  std::vector<bool> pool_shared;         // per rank: the other ranks' devices may read its pool

  std::map<AllReduceConfig, std::vector<void*>> comms;  // per nccl configuration, one per rank
  bool aborted = false;                  // fail() aborted the communicators
  std::string nccl_version;

  int size() const { return world; }

  void barrier() {
    std::unique_lock<std::mutex> lk(m);
    if (failed) throw Error("stopped: another rank failed");
    if (++arrived == size()) {
      arrived = 0;
      ++generation;
      cv.notify_all();
      return;
    }
    const uint64_t g = generation;
    cv.wait(lk, [&] { return generation != g || failed; });
    if (failed) throw Error("stopped: another rank failed");
  }

  // Rank `rank` offers `bytes` at `src`; once every rank has offered, take(q, offer of q) runs
  // for every q in rank order (queued on ctx's stream after q's offer is complete); no rank
  // leaves before every rank's reads are queued, and later work on a rank's stream waits for
  // the others' reads of its offer.
  void exchange(int rank, Context& ctx, const void* src, std::size_t bytes,
                const std::function<void(int, const uint8_t*)>& take) {
    cudaStream_t stream = cuda ? detail::stream_of(ctx) : nullptr;
    if (cuda) {
      DITTO_CUDA_CHECK(cudaSetDevice(devices[rank].index));
      share_pool(rank, ctx);
    }
    published[rank] = static_cast<const uint8_t*>(src);
    published_bytes[rank] = bytes;
    if (cuda) DITTO_CUDA_CHECK(cudaEventRecord(ready[rank], stream));
    barrier();
    for (int q = 0; q < size(); ++q)
      if (published_bytes[q] != bytes)
        throw Error(fmt::format("collective: rank {} offers {} bytes, rank {} {}: the ranks' calls do not match", rank,
                                bytes, q, published_bytes[q]));
    for (int q = 0; q < size(); ++q) {
      if (cuda) DITTO_CUDA_CHECK(cudaStreamWaitEvent(stream, ready[q], 0));
      take(q, published[q]);
    }
    if (cuda) DITTO_CUDA_CHECK(cudaEventRecord(done[rank], stream));
    barrier();
    if (cuda)
      for (int q = 0; q < size(); ++q)
        if (q != rank) DITTO_CUDA_CHECK(cudaStreamWaitEvent(stream, done[q], 0));
  }

  // Memory from a stream-ordered pool is visible to other devices only where the pool says so
  // (peer access does not extend to it): the first exchange of a rank opens its context's pool
  // to the other ranks' devices.
  void share_pool(int rank, Context& ctx) {
    if (pool_shared[rank]) return;
    std::vector<cudaMemAccessDesc> access;
    for (int q = 0; q < size(); ++q) {
      const int mine = devices[rank].index, other = devices[q].index;
      if (other == mine) continue;
      int can = 0;
      DITTO_CUDA_CHECK(cudaDeviceCanAccessPeer(&can, other, mine));
      if (!can)
        throw Error(fmt::format("collective: {} cannot access {}'s memory (no peer access between the two GPUs); "
                                "ditto's in-process exchange needs it",
                                devices[q].str(), devices[rank].str()));
      cudaMemAccessDesc d{};
      d.location.type = cudaMemLocationTypeDevice;
      d.location.id = other;
      d.flags = cudaMemAccessFlagsProtReadWrite;
      access.push_back(d);
    }
    if (!access.empty()) DITTO_CUDA_CHECK(cudaMemPoolSetAccess(detail::cuda_state(ctx).pool, access.data(), access.size()));
    pool_shared[rank] = true;
  }

  void copy(Context& ctx, void* dst, const void* src, std::size_t bytes) {
    if (bytes == 0) return;
    if (cuda)
      DITTO_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, detail::stream_of(ctx)));
    else
      std::memcpy(dst, src, bytes);
  }

  bool holds(int rank) const { return rank >= first && rank < first + static_cast<int>(devices.size()); }

  void check_rank(int rank, const Context& ctx, const char* what) const {
    if (rank < 0 || rank >= size())
      throw Error(fmt::format("{}: rank {} is outside this group of {}", what, rank, size()));
    if (!holds(rank))
      throw Error(fmt::format("{}: rank {} is held by another process (this one holds rank {})", what, rank, first));
    if (ctx.device() != devices[rank - first])
      throw Error(fmt::format("{}: rank {} lives on {}, but its context is on {}", what, rank,
                              devices[rank - first].str(), ctx.device().str()));
  }
};

RankGroup::RankGroup(std::vector<Device> devices) : impl_(std::make_unique<Impl>()) {
  Impl& I = *impl_;
  if (devices.empty() || devices.size() > static_cast<std::size_t>(cuda::kTreeSumMaxParts))
    throw Error(fmt::format("RankGroup: {} ranks; 1 to {} are supported", devices.size(), cuda::kTreeSumMaxParts));
  I.cuda = devices.front().is_cuda();
  for (const auto& d : devices)
    if (d.is_cuda() != I.cuda)
      throw Error(fmt::format("RankGroup: ranks on {} and {}: all ranks are CPU or all are CUDA",
                              devices.front().str(), d.str()));
  I.devices = std::move(devices);
  I.world = static_cast<int>(I.devices.size());
  const int k = I.size();
  I.published.assign(k, nullptr);
  I.published_bytes.assign(k, 0);
  I.pool_shared.assign(k, false);
  if (!I.cuda) return;
  int previous = 0;
  DITTO_CUDA_CHECK(cudaGetDevice(&previous));
  I.ready.assign(k, nullptr);
  I.done.assign(k, nullptr);
  for (int r = 0; r < k; ++r) {
    DITTO_CUDA_CHECK(cudaSetDevice(I.devices[r].index));
    DITTO_CUDA_CHECK(cudaEventCreateWithFlags(&I.ready[r], cudaEventDisableTiming));
    DITTO_CUDA_CHECK(cudaEventCreateWithFlags(&I.done[r], cudaEventDisableTiming));
    // Peer access lets the exchanges copy GPU to GPU directly; without it CUDA stages through
    // the host (same bytes, slower).
    for (int q = 0; q < k; ++q) {
      const int a = I.devices[r].index, b = I.devices[q].index;
      int can = 0;
      if (a == b || cudaDeviceCanAccessPeer(&can, a, b) != cudaSuccess || !can) continue;
      const cudaError_t e = cudaDeviceEnablePeerAccess(b, 0);
      if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled) DITTO_CUDA_CHECK(e);
      (void)cudaGetLastError();  // clear the already-enabled status
    }
  }
  DITTO_CUDA_CHECK(cudaSetDevice(previous));
}

RankGroup::RankGroup(Device device, const ProcessRank& me) : impl_(std::make_unique<Impl>()) {
  Impl& I = *impl_;
  if (me.world < 1 || me.world > cuda::kTreeSumMaxParts)
    throw Error(fmt::format("RankGroup: {} ranks; 1 to {} are supported", me.world, cuda::kTreeSumMaxParts));
  if (me.rank < 0 || me.rank >= me.world)
    throw Error(fmt::format("RankGroup: rank {} is outside a group of {}", me.rank, me.world));
  std::error_code ec;
  if (!std::filesystem::is_directory(me.rendezvous, ec))
    throw Error(fmt::format("RankGroup: the rendezvous folder '{}' does not exist", me.rendezvous));
  if (!(me.timeout_s > 0)) throw Error(fmt::format("RankGroup: a wait of {} s", me.timeout_s));
  I.cuda = device.is_cuda();
  I.devices = {device};
  I.world = me.world;
  I.first = me.rank;
  if (I.cuda) {
    I.link = detail::make_nccl_link(me, device.index);
  } else {
    I.link = detail::make_file_link(me);
    I.link->barrier();  // every rank is there
  }
}

RankGroup::~RankGroup() {
  Impl& I = *impl_;
  if (I.link) {
    if (!I.failed) I.link->leave();
    I.link.reset();
  }
  if (!I.aborted)
    for (auto& [config, comms] : I.comms)
      for (void* c : comms) detail::nccl_destroy(c);
  for (std::size_t r = 0; r < I.ready.size(); ++r) {
    DITTO_CUDA_CHECK_PRINT(cudaSetDevice(I.devices[r].index));
    if (I.ready[r]) DITTO_CUDA_CHECK_PRINT(cudaEventDestroy(I.ready[r]));
    if (I.done[r]) DITTO_CUDA_CHECK_PRINT(cudaEventDestroy(I.done[r]));
  }
}

int RankGroup::size() const { return impl_->size(); }
const std::vector<Device>& RankGroup::devices() const { return impl_->devices; }
bool RankGroup::holds(int rank) const { return impl_->holds(rank); }
const Device& RankGroup::device_of(int rank) const {
  if (!impl_->holds(rank))
    throw Error(fmt::format("RankGroup: rank {} is not held by this process", rank));
  return impl_->devices[rank - impl_->first];
}
bool RankGroup::spans_processes() const { return impl_->link != nullptr; }
bool RankGroup::nccl_available() { return detail::nccl_built(); }
std::string RankGroup::nccl_version() const {
  return impl_->link ? impl_->link->nccl_version() : impl_->nccl_version;
}

void RankGroup::prepare_nccl(const std::vector<AllReduceConfig>& configs) {
  Impl& I = *impl_;
  if (I.link) {
    I.link->prepare(configs);
    return;
  }
  std::set<AllReduceConfig> wanted;
  for (const auto& c : configs)
    if (c.nccl()) wanted.insert(c);
  if (wanted.empty()) return;
  std::vector<std::string> names;
  for (const auto& c : wanted) names.push_back(c.str());
  if (!I.cuda)
    throw Error(fmt::format("all-reduce {}: NCCL needs CUDA devices; ranks on the CPU are simulated and run the "
                            "fixed-order all-reduce only: pick it with the rule *.algo=fixed-order, or run every "
                            "kernel deterministic",
                            fmt::join(names, ", ")));
  std::vector<int> indices;
  for (const auto& d : I.devices) {
    if (std::find(indices.begin(), indices.end(), d.index) != indices.end())
      throw Error(fmt::format("all-reduce {}: two ranks on {}; NCCL takes one rank per GPU", fmt::join(names, ", "),
                              d.str()));
    indices.push_back(d.index);
  }
  detail::nccl_check_environment();
  I.nccl_version = detail::nccl_runtime_version();
  for (const auto& c : wanted)
    if (!I.comms.count(c)) I.comms[c] = detail::nccl_make_comms(indices, c.nccl_algo(), c.nccl_proto(), c.channels);
}

void RankGroup::barrier(int rank) {
  if (rank < 0 || rank >= size()) throw Error(fmt::format("barrier: rank {} is outside this group of {}", rank, size()));
  if (impl_->link) {
    if (!impl_->holds(rank)) throw Error(fmt::format("barrier: rank {} is held by another process", rank));
    impl_->link->barrier();
    return;
  }
  impl_->barrier();
}

void RankGroup::all_gather(int rank, Context& ctx, const Tensor& send, Tensor& recv) {
  Impl& I = *impl_;
  I.check_rank(rank, ctx, "all_gather");
  if (recv.dtype() != send.dtype() || recv.numel() != send.numel() * size())
    throw ShapeError(fmt::format("all_gather: recv must hold {} x {} {} elements, has {} {}", size(), send.numel(),
                                 dtype_name(send.dtype()), recv.numel(), dtype_name(recv.dtype())));
  const std::size_t bytes = send.nbytes();
  uint8_t* dst = bytes ? static_cast<uint8_t*>(recv.raw()) : nullptr;
  if (I.link) {
    I.link->all_gather(ctx, bytes ? send.raw() : nullptr, bytes, dst);
    return;
  }
  I.exchange(rank, ctx, bytes ? send.raw() : nullptr, bytes,
             [&](int q, const uint8_t* src) { I.copy(ctx, dst + q * bytes, src, bytes); });
}

void RankGroup::all_to_all(int rank, Context& ctx, const Tensor& send, Tensor& recv) {
  Impl& I = *impl_;
  I.check_rank(rank, ctx, "all_to_all");
  if (recv.dtype() != send.dtype() || recv.numel() != send.numel() || send.numel() % size() != 0)
    throw ShapeError(fmt::format("all_to_all: send and recv must hold {} equal chunks of one dtype; got {} {} and {} {}",
                                 size(), send.numel(), dtype_name(send.dtype()), recv.numel(), dtype_name(recv.dtype())));
  const std::size_t chunk = send.nbytes() / static_cast<std::size_t>(size());
  uint8_t* dst = send.nbytes() ? static_cast<uint8_t*>(recv.raw()) : nullptr;
  if (I.link) {
    I.link->all_to_all(ctx, send.nbytes() ? send.raw() : nullptr, chunk, dst);
    return;
  }
  I.exchange(rank, ctx, send.nbytes() ? send.raw() : nullptr, send.nbytes(),
             [&](int q, const uint8_t* src) { I.copy(ctx, dst + q * chunk, src + rank * chunk, chunk); });
}

void RankGroup::broadcast(int rank, Context& ctx, Tensor& buf, int root) {
  Impl& I = *impl_;
  I.check_rank(rank, ctx, "broadcast");
  if (root < 0 || root >= size()) throw Error(fmt::format("broadcast: root {} is outside this group of {}", root, size()));
  const std::size_t bytes = buf.nbytes();
  if (I.link) {
    I.link->broadcast(ctx, bytes ? buf.raw() : nullptr, bytes, root);
    return;
  }
  uint8_t* dst = bytes ? static_cast<uint8_t*>(buf.raw()) : nullptr;
  I.exchange(rank, ctx, dst, bytes, [&](int q, const uint8_t* src) {
    if (q == root && rank != root) I.copy(ctx, dst, src, bytes);
  });
}

void RankGroup::all_reduce(int rank, Context& ctx, Tensor& buf, const AllReduceConfig& config) {
  Impl& I = *impl_;
  I.check_rank(rank, ctx, "all_reduce");
  if (buf.dtype() != DType::F32) throw ShapeError("all_reduce: the buffer must be f32");
  if (config.nccl()) {
    {
      std::lock_guard<std::mutex> lk(I.m);
      if (I.failed) throw Error("stopped: another rank failed");
    }
    if (I.link) {  // the link holds the communicators of a group spread over processes
      I.link->all_reduce_nccl(ctx, buf.f32(), buf.numel(), config);
      return;
    }
    auto it = I.comms.find(config);
    if (it == I.comms.end())
      throw Error(fmt::format("all_reduce {}: no NCCL communicator was prepared for it (RankGroup::prepare_nccl)",
                              config.str()));
    DITTO_CUDA_CHECK(cudaSetDevice(I.devices[rank].index));
    detail::nccl_all_reduce_sum(it->second[rank], buf.f32(), buf.numel(), detail::stream_of(ctx));
    return;
  }
  const int k = size();
  if (k == 1) return;  // a tree or a ring over one rank is that rank's sum
  // Shards of L elements (the last ones padded with zeros, which no sum reads back). Rank q
  // receives shard q of every rank, adds them, and every rank gathers the summed shards.
  const int64_t n = buf.numel(), shard = (n + k - 1) / k, padded = shard * k;
  Tensor send = ctx.zeros({padded}), recv = ctx.empty({padded}), mine = ctx.empty({shard}), all = ctx.empty({padded});
  I.copy(ctx, send.raw(), buf.raw(), buf.nbytes());
  all_to_all(rank, ctx, send, recv);
  if (config.algo == AllReduceAlgo::Ring) {
    // Shard `rank` goes round the ring from rank+1 to rank itself.
    std::vector<const float*> parts;
    for (int s = 1; s <= k; ++s) parts.push_back(recv.f32() + ((rank + s) % k) * shard);
    if (ctx.is_cuda()) {
      cuda::fold_sum(ctx, parts.data(), k, shard, mine.f32());
    } else {
      float* out = mine.f32();
      for (int64_t i = 0; i < shard; ++i) {
        float acc = parts[0][i];
        for (int s = 1; s < k; ++s) acc += parts[s][i];
        out[i] = acc;
      }
    }
  } else {
    fixed_tree_sum_chunks(ctx, recv, k, mine);
  }
  all_gather(rank, ctx, mine, all);
  I.copy(ctx, buf.raw(), all.raw(), buf.nbytes());
}

void RankGroup::fail(const std::string& why) {
  Impl& I = *impl_;
  {
    std::lock_guard<std::mutex> lk(I.m);
    if (I.failed) return;
    I.failed = true;
    I.aborted = !I.comms.empty();
  }
  if (I.link) I.link->fail(why.empty() ? fmt::format("rank {} stopped", I.first) : why);
  I.cv.notify_all();
  // A rank blocked inside NCCL waits for peers that will not come: abort the communicators
  // (the map is not changed after prepare_nccl, so reading it here races with nothing).
  for (auto& [config, comms] : I.comms)
    for (void* c : comms) detail::nccl_abort(c);
}

bool RankGroup::failed() const {
  std::lock_guard<std::mutex> lk(impl_->m);
  return impl_->failed;
}

}  // namespace ditto
