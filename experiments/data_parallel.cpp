#include "experiments/data_parallel.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <climits>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

#include "datasets/loader.h"
#include "engine/context.h"
#include "engine/error.h"
#include "engine/optim.h"
#include "engine/philox.h"
#include "engine/tracer.h"
#include "experiments/step.h"
#include "kernels/elementwise.h"
#include "kernels/loss.h"
#include "kernels/metrics.h"
#include "kernels/sync_batchnorm.h"
#include "nets/module.h"

namespace ditto {

int64_t group_start(int64_t rows, int groups, int g) { return groups ? g * rows / groups : 0; }

namespace {
// The integer value of environment variable `name`, at least `low`; `fallback` when it is unset
// and optional.
int slurm_int(const char* name, int low, std::optional<int> fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) {
    if (fallback) return *fallback;
    throw Error(fmt::format("--dp-launch slurm: {} is not set: start every rank as a task of one Slurm job step "
                            "(srun, or sbatch with srun inside), which sets it",
                            name));
  }
  char* end = nullptr;
  errno = 0;
  const long x = std::strtol(v, &end, 10);
  if (errno || end == v || *end || x < low || x > 1000000)
    throw Error(fmt::format("--dp-launch slurm: {}={} is not a whole number of at least {}", name, v, low));
  return static_cast<int>(x);
}
}  // namespace

SlurmTask slurm_task_from_environment() {
  SlurmTask t;
  t.world = slurm_int("SLURM_NTASKS", 1, std::nullopt);
  t.rank = slurm_int("SLURM_PROCID", 0, std::nullopt);
  t.local_id = slurm_int("SLURM_LOCALID", 0, 0);
  if (t.rank >= t.world)
    throw Error(fmt::format("--dp-launch slurm: SLURM_PROCID={} is not below SLURM_NTASKS={}", t.rank, t.world));
  const int job = slurm_int("SLURM_JOB_ID", 0, std::nullopt);
  const char* step = std::getenv("SLURM_STEP_ID");
  const int restart = slurm_int("SLURM_RESTART_COUNT", 0, 0);
  std::string step_name = step && *step ? step : "batch";
  for (char c : step_name)
    if (!std::isalnum(static_cast<unsigned char>(c)))
      throw Error(fmt::format("--dp-launch slurm: SLURM_STEP_ID={} is not a step id", step_name));
  t.step = fmt::format("job{}.{}", job, step_name) + (restart ? fmt::format(".restart{}", restart) : "");
  return t;
}

BnStats batch_norm_stats(const Policy& policy, const std::vector<std::pair<std::string, OpKind>>& layers) {
  for (const auto& [layer, op] : layers)
    if (op == op::batchnorm && policy.variant<BnStats>(layer, op::batchnorm) == BnStats::Sync) return BnStats::Sync;
  return BnStats::Local;
}

void check_data_parallel(const DataParallelOptions& o, BnStats stats, int64_t n, int64_t batch_size,
                         bool drop_last) {
  if (o.ranks < 1 || o.ranks > 64) throw Error(fmt::format("--gpus: must be from 1 to 64, got {}", o.ranks));
  const int groups = o.group_count();
  if (groups < o.ranks || groups % o.ranks != 0)
    throw Error(fmt::format("--dp-groups: {} example groups cannot be shared by {} ranks; give a multiple of {}",
                            groups, o.ranks, o.ranks));
  if (stats == BnStats::Sync && groups != o.ranks)
    throw Error(fmt::format("--batchnorm sync: every rank normalizes its share of the batch in one pass, so it needs "
                            "one example group per rank (--dp-groups {}), not {}",
                            o.ranks, groups));
  if (o.bucket_bytes < 4) throw Error(fmt::format("bucket size {} bytes is below one float", o.bucket_bytes));
  if (batch_size < groups)
    throw Error(fmt::format("--batch-size: {} rows cannot be split into {} example groups", batch_size, groups));
  const int64_t last = n % batch_size;
  if (!drop_last && last != 0 && last < groups)
    throw Error(fmt::format("--batch-size: the last batch of an epoch has {} rows ({} examples, batches of {}), fewer "
                            "than the {} example groups it must be split into; choose a batch size or --train-size "
                            "that leaves at least {} rows (or none) in the last batch",
                            last, n, batch_size, groups, groups));
}

std::vector<GradBucket> make_buckets(const std::vector<Param>& params, int64_t bucket_bytes) {
  std::vector<GradBucket> out;
  const int64_t cap = std::max<int64_t>(1, bucket_bytes / int64_t(sizeof(float)));
  for (std::size_t k = params.size(); k-- > 0;) {
    const int64_t n = params[k].var.value().numel();
    if (out.empty() || (out.back().elements > 0 && out.back().elements + n > cap))
      out.push_back({fmt::format("bucket{}", out.size()), {}, {}, 0});
    GradBucket& b = out.back();
    b.params.push_back(k);
    b.offsets.push_back(b.elements);
    b.elements += n;
  }
  return out;
}

std::vector<std::pair<std::string, OpKind>> bucket_layers(const std::vector<GradBucket>& buckets) {
  std::vector<std::pair<std::string, OpKind>> out;
  for (const auto& b : buckets) out.push_back({b.name, op::allreduce});
  return out;
}

namespace {

// A thread that runs one job at a time for the caller and reports how it ended.
class Worker {
 public:
  Worker() : thread_([this] { loop(); }) {}
  ~Worker() {
    {
      std::lock_guard<std::mutex> lk(m_);
      quit_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  void post(std::function<void()> job) {
    {
      std::lock_guard<std::mutex> lk(m_);
      job_ = std::move(job);
      pending_ = true;
      error_ = nullptr;
    }
    cv_.notify_all();
  }
  std::exception_ptr wait() {
    std::unique_lock<std::mutex> lk(m_);
    cv_.wait(lk, [&] { return !pending_ && !running_; });
    return error_;
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lk(m_);
    for (;;) {
      cv_.wait(lk, [&] { return quit_ || pending_; });
      if (!pending_) return;
      std::function<void()> job = std::move(job_);
      pending_ = false;
      running_ = true;
      lk.unlock();
      std::exception_ptr err;
      try {
        job();
      } catch (...) {
        err = std::current_exception();
      }
      lk.lock();
      running_ = false;
      error_ = err;
      cv_.notify_all();
    }
  }

  std::mutex m_;
  std::condition_variable cv_;
  std::function<void()> job_;
  bool pending_ = false, running_ = false, quit_ = false;
  std::exception_ptr error_;
  std::thread thread_;  // last: started once the rest exists
};

bool is_secondary(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return std::string(x.what()).rfind("stopped: another rank failed", 0) == 0;
  } catch (...) {
    return false;
  }
}

bool power_of_two(int64_t v) { return v > 0 && (v & (v - 1)) == 0; }

}  // namespace

struct DataParallel::Impl {
  struct Rank {
    RankParts parts;
    std::vector<Param> params;
    std::vector<Buffer> buffers;
    Tensor loss_sum, correct;  // ranks >= 1: their own epoch sums
  };

  DataParallelOptions opts;
  BnStats stats = BnStats::Local;  // sync where any batch norm merges over the ranks
  int k = 1, g = 1, per_rank = 1;
  int base = 0;                    // the first rank this process holds (ranks[0] is rank `base`)
  bool processes = false;          // every rank is a process of its own
  std::vector<std::string> devices, hosts;  // per rank: its device and host, for the manifest
  uint64_t stochastic_seed = 0;
  Tracer* tracer = nullptr;
  std::shared_ptr<RankGroup> group;
  std::vector<Rank> ranks;
  std::vector<GradBucket> buckets;
  std::vector<AllReduceConfig> configs;
  std::vector<std::unique_ptr<Worker>> workers;  // ranks 1..k-1

  // Under a tracer the ranks take turns: rank r runs its groups when turn == r.
  std::mutex turn_m;
  std::condition_variable turn_cv;
  int turn = 0;
  std::vector<std::vector<Tensor>> traced_leaves;  // [bucket][group]

  void wait_turn(int r) {
    std::unique_lock<std::mutex> lk(turn_m);
    turn_cv.wait(lk, [&] { return turn == r || group->failed(); });
    if (group->failed()) throw Error("stopped: another rank failed");
  }
  void pass_turn(int r) {
    {
      std::lock_guard<std::mutex> lk(turn_m);
      turn = r + 1 == k ? 0 : r + 1;
    }
    turn_cv.notify_all();
  }
  // Inside a handler, the others are told what went wrong here.
  void fail() {
    std::string why;
    if (auto e = std::current_exception()) {
      try {
        std::rethrow_exception(e);
      } catch (const std::exception& x) {
        why = x.what();
      } catch (...) {
      }
    }
    group->fail(why);
    turn_cv.notify_all();
  }
  Rank& local(int r) { return ranks[static_cast<std::size_t>(r - base)]; }

  // Where each rank runs, its device and host in rank order: across processes every rank sends
  // its own ("HOST DEVICE" in a fixed 128 bytes, room for the longest host name Linux allows:
  // what the manifest records of a rank on another node, never cut).
  void gather_places() {
    char host[HOST_NAME_MAX + 1] = {};
    ::gethostname(host, sizeof host - 1);
    if (!processes) {
      for (const auto& r : ranks) {
        devices.push_back(r.parts.ctx->device().str());
        hosts.push_back(host);
      }
      return;
    }
    constexpr int kWords = 32;
    static_assert(HOST_NAME_MAX + 1 + 16 < kWords * 4, "a host name, a space and a device name fit");
    std::string mine = fmt::format("{} {}", host, ranks[0].parts.ctx->device().str());
    if (mine.size() >= kWords * 4)
      throw Error(fmt::format("data parallel: this rank's place \"{}\" is longer than the {} bytes a rank sends",
                              mine, kWords * 4 - 1));
    mine.resize(kWords * 4, '\0');
    std::vector<int32_t> words(kWords);
    std::memcpy(words.data(), mine.data(), kWords * 4);
    Context& ctx = *ranks[0].parts.ctx;
    Tensor send = ctx.from_host(words, {kWords}), all = ctx.empty({kWords * k}, DType::I32);
    try {
      group->all_gather(base, ctx, send, all);
    } catch (...) {
      fail();
      throw;
    }
    const auto got = all.to_host_i32();
    for (int r = 0; r < k; ++r) {
      std::string place(kWords * 4, '\0');
      std::memcpy(place.data(), got.data() + r * kWords, kWords * 4);
      place = place.c_str();
      const auto space = place.rfind(' ');
      hosts.push_back(place.substr(0, space));
      devices.push_back(space == std::string::npos ? "" : place.substr(space + 1));
    }
  }

  // One rank's part of a step: its groups' forward and backward passes, the gradients summed in
  // the tree, the buckets' all-reduces, the update.
  void run_rank(int r, const Tensor& images, const Tensor& labels, int64_t global_rows, float lr, Tensor& loss_sum,
                Tensor& correct) {
    Rank& rk = local(r);
    Context& ctx = *rk.parts.ctx;
    Optimizer& opt = *rk.parts.opt;
    use_device(ctx);
    const int64_t offset = group_start(global_rows, k, r), rows = group_start(global_rows, k, r + 1) - offset;
    if (images.ndim() < 1 || images.dim(0) != rows || labels.numel() != rows)
      throw Error(fmt::format("data parallel: rank {} holds {} rows of a batch of {}, but its share is {} (the loaders "
                              "are not sharded alike)",
                              r, images.ndim() ? images.dim(0) : 0, global_rows, rows));
    RankSums sums{std::vector<TreeAccumulator>(buckets.size()), std::vector<char>(rk.params.size(), 0)};
    if (tracer) wait_turn(r);
    for (int j = 0; j < per_rank; ++j)
      run_group(r, r * per_rank + j, images, labels, global_rows, offset, loss_sum, correct, sums);
    if (tracer) {
      pass_turn(r);
      group->barrier(r);  // every group's leaves exist before rank 0 reports the all-reduces
    }
    for (std::size_t b = 0; b < buckets.size(); ++b) all_reduce_bucket(r, b, sums);
    if (tracer && r == 0)
      traced_update(ctx, opt, rk.params, lr, *tracer);
    else
      opt.step(ctx, lr);
    opt.zero_grad();
  }

  // What a rank's groups leave for the all-reduces: per bucket the tree of the groups' gradients,
  // and which parameters any group gave a gradient.
  struct RankSums {
    std::vector<TreeAccumulator> acc;
    std::vector<char> had_grad;
  };

  // Example group gi of the batch on rank r (whose share starts at row `offset`): its forward and
  // backward pass, its loss and correct count, its gradients pushed into the buckets' trees.
  void run_group(int r, int gi, const Tensor& images, const Tensor& labels, int64_t global_rows, int64_t offset,
                 Tensor& loss_sum, Tensor& correct, RankSums& sums) {
    Rank& rk = local(r);
    Context& ctx = *rk.parts.ctx;
    Net& net = *rk.parts.net;
    Optimizer& opt = *rk.parts.opt;
    const int64_t rows = group_start(global_rows, k, r + 1) - offset;
    const int64_t per_row = rows ? images.numel() / rows : 0;
    const int64_t first = group_start(global_rows, g, gi), n = group_start(global_rows, g, gi + 1) - first;
    if (n < 1)
      throw Error(fmt::format("data parallel: example group {} of a batch of {} rows is empty", gi, global_rows));
    Tensor x = images, y = labels;
    if (per_rank > 1) {
      Shape xs = images.shape();
      xs[0] = n;
      x = ctx.empty(xs);
      y = ctx.empty({n}, DType::I32);
      copy_elements(ctx, x, 0, images, (first - offset) * per_row, n * per_row);
      copy_elements(ctx, y, 0, labels, first - offset, n);
    }
    // Local batch norm: the running statistics follow group 0 alone, whatever rank runs it.
    std::vector<Tensor> kept;
    if (gi > 0 && stats == BnStats::Local)
      for (const auto& b : rk.buffers) kept.push_back(ctx.to_device(*b.tensor));
    if (tracer) tracer->event("data", "data", "loader", {}, {{"images", &x}, {"labels", &y}});
    net.begin_step(gi == 0 ? stochastic_seed : mix_key(stochastic_seed, uint64_t(gi)), opt.steps() + 1);
    Var logits = net.forward(ctx, Var(x), true);
    Var loss = softmax_cross_entropy(ctx, "loss", logits, y);
    // The group's mean loss weighted by its share of the batch: the summed gradients are those
    // of the batch's mean loss. A whole batch (one group) is seeded with 1, as the plain step.
    Tensor seed;
    if (n != global_rows) seed = ctx.full(loss.shape(), static_cast<float>(double(n) / double(global_rows)));
    ctx.tape().backward(ctx, loss, seed);
    for (std::size_t b = 0; b < kept.size(); ++b) ctx.copy(*rk.buffers[b].tensor, kept[b]);
    axpy_inplace(ctx, loss_sum, static_cast<float>(n), loss.value());
    accumulate_correct(ctx, logits.value(), y, correct);
    for (std::size_t b = 0; b < buckets.size(); ++b) {
      const GradBucket& bk = buckets[b];
      Tensor flat = ctx.zeros({bk.elements});
      for (std::size_t q = 0; q < bk.params.size(); ++q) {
        const Param& p = rk.params[bk.params[q]];
        if (!p.var.grad().defined()) continue;
        sums.had_grad[bk.params[q]] = 1;
        copy_elements(ctx, flat, bk.offsets[q], p.var.grad(), 0, p.var.grad().numel());
      }
      if (tracer) traced_leaves[b][gi] = ctx.to_device(flat);
      sums.acc[b].push(ctx, std::move(flat));
    }
    opt.zero_grad();
  }

  // Bucket b on rank r: the tree's sum all-reduced across the ranks, then handed back to the
  // parameters as their gradients; under a tracer rank 0 records the all-reduce with its leaves.
  void all_reduce_bucket(int r, std::size_t b, RankSums& sums) {
    Rank& rk = local(r);
    Context& ctx = *rk.parts.ctx;
    const GradBucket& bk = buckets[b];
    Tensor sum = sums.acc[b].result(ctx);
    group->all_reduce(r, ctx, sum, configs[b]);
    record_allreduce(ctx, bk.name, configs[b], ctx.policy());
    for (std::size_t q = 0; q < bk.params.size(); ++q) {
      const Param& p = rk.params[bk.params[q]];
      if (!sums.had_grad[bk.params[q]]) continue;  // a parameter no group reached keeps no gradient
      Tensor grad = ctx.empty(p.var.value().shape());
      copy_elements(ctx, grad, 0, sum, bk.offsets[q], grad.numel());
      p.var.grad() = std::move(grad);
    }
    if (tracer && r == 0) {
      std::vector<TracedTensor> inputs;
      std::vector<std::string> names;
      for (int gi = 0; gi < g; ++gi) names.push_back(fmt::format("g{}", gi));
      for (int gi = 0; gi < g; ++gi) inputs.push_back({names[gi], &traced_leaves[b][gi]});
      tracer->event("allreduce", bk.name, std::string("allreduce/") + name_of(configs[b].algo), inputs,
                    {{"sum", &sum}});
      use_device(ctx);  // reading the other ranks' leaves switched devices
    }
  }
};

DataParallel::DataParallel(std::vector<RankParts> parts, const DataParallelOptions& opts, uint64_t stochastic_seed,
                           Tracer* tracer, const ProcessRank* process)
    : impl_(std::make_unique<Impl>()) {
  Impl& I = *impl_;
  I.opts = opts;
  I.processes = process != nullptr;
  I.k = I.processes ? process->world : static_cast<int>(parts.size());
  I.base = I.processes ? process->rank : 0;
  if (I.processes && parts.size() != 1)
    throw Error(fmt::format("DataParallel: a process of a group spread over processes holds one rank, not {}",
                            parts.size()));
  if (I.k != opts.ranks)
    throw Error(fmt::format("DataParallel: {} ranks' parts for {} ranks", I.k, opts.ranks));
  if (I.processes && tracer)
    throw Error("tracing a data-parallel run whose ranks are processes: the tracer runs every group in one process, "
                "one after the other; trace the same run with its ranks in one process (--gpus K)");
  I.g = opts.group_count();
  if (!parts.front().ctx || !parts.front().net) throw Error("DataParallel: a rank's parts are missing");
  I.stats = batch_norm_stats(parts.front().ctx->policy(), parts.front().net->knob_layers());
  if (I.g % I.k != 0 || (I.stats == BnStats::Sync && I.g != I.k))
    throw Error(fmt::format("DataParallel: {} groups over {} ranks with batch norm stats={} (check_data_parallel says "
                            "why)",
                            I.g, I.k, name_of(I.stats)));
  if (tracer && I.stats == BnStats::Sync && I.k > 1)
    throw Error("tracing a data-parallel run with --batchnorm sync: the tracer runs the ranks one after the other, and "
                "synchronized batch norm needs them all inside each layer at once; trace with --batchnorm local");
  I.per_rank = I.g / I.k;
  I.stochastic_seed = stochastic_seed;
  I.tracer = tracer;
  std::vector<Device> devices;
  for (const auto& p : parts) {
    if (!p.ctx || !p.net || !p.opt || !p.loader) throw Error("DataParallel: a rank's parts are missing");
    devices.push_back(p.ctx->device());
  }
  I.group = I.processes ? std::make_shared<RankGroup>(devices.front(), *process) : std::make_shared<RankGroup>(devices);
  for (auto& p : parts) {
    Impl::Rank rk;
    rk.params = p.net->params();
    rk.buffers = p.net->buffers();
    rk.parts = std::move(p);
    I.ranks.push_back(std::move(rk));
  }
  for (std::size_t r = 1; r < I.ranks.size(); ++r) {
    Context& ctx = *I.ranks[r].parts.ctx;
    I.ranks[r].loss_sum = ctx.zeros({1});
    I.ranks[r].correct = ctx.zeros({2}, DType::I32);
    if (tracer) ctx.set_tracer(tracer);
  }
  if (I.ranks[0].parts.state.size() != I.ranks.back().parts.state.size())
    throw Error("DataParallel: the ranks' state lists differ in length");
  I.buckets = make_buckets(I.ranks[0].params, opts.bucket_bytes);
  const Policy& policy = I.ranks[0].parts.ctx->policy();
  for (const auto& b : I.buckets) I.configs.push_back(allreduce_config(policy, b.name));
  I.group->prepare_nccl(I.configs);
  // The group stats=sync layers merge over; the layers' knob decides whether they do.
  for (std::size_t r = 0; r < I.ranks.size(); ++r)
    set_batch_norm_group(*I.ranks[r].parts.ctx, I.group, I.base + static_cast<int>(r));
  I.traced_leaves.assign(I.buckets.size(), std::vector<Tensor>(static_cast<std::size_t>(I.g)));
  for (std::size_t r = 1; r < I.ranks.size(); ++r) I.workers.push_back(std::make_unique<Worker>());
  use_device(*I.ranks[0].parts.ctx);  // making the other ranks' contexts switched this thread's device
  I.gather_places();
}

DataParallel::~DataParallel() {
  Impl& I = *impl_;
  I.workers.clear();  // joins the rank threads
  for (std::size_t r = 0; r < I.ranks.size(); ++r) {
    set_batch_norm_group(*I.ranks[r].parts.ctx, nullptr, I.base + static_cast<int>(r));
    if (r > 0 && I.tracer) I.ranks[r].parts.ctx->set_tracer(nullptr);
  }
}

void DataParallel::broadcast_state() {
  Impl& I = *impl_;
  if (I.processes) {
    // Every state tensor from rank 0, and its optimizer's step count (two 32-bit halves).
    Impl::Rank& rk = I.ranks[0];
    Context& ctx = *rk.parts.ctx;
    try {
      for (Tensor* t : rk.parts.state) I.group->broadcast(I.base, ctx, *t, 0);
      const auto steps = static_cast<uint64_t>(rk.parts.opt->steps());
      Tensor count = ctx.from_host(std::vector<int32_t>{static_cast<int32_t>(steps & 0xffffffffu),
                                                        static_cast<int32_t>(steps >> 32)},
                                   {2});
      I.group->broadcast(I.base, ctx, count, 0);
      const auto got = count.to_host_i32();
      rk.parts.opt->set_steps(static_cast<int64_t>(static_cast<uint32_t>(got[0]) |
                                                   (static_cast<uint64_t>(static_cast<uint32_t>(got[1])) << 32)));
      ctx.synchronize();
    } catch (...) {
      I.fail();
      throw;
    }
    return;
  }
  const auto& from = I.ranks[0].parts.state;
  for (int r = 1; r < I.k; ++r) {
    Context& ctx = *I.ranks[r].parts.ctx;
    use_device(ctx);
    auto& to = I.ranks[r].parts.state;
    // Through the host: the ranks' pools are opened to each other only by their first exchange.
    for (std::size_t i = 0; i < from.size(); ++i) ctx.copy(*to[i], Context().to_device(*from[i]));
    I.ranks[r].parts.opt->set_steps(I.ranks[0].parts.opt->steps());
    ctx.synchronize();
  }
  use_device(*I.ranks[0].parts.ctx);
}

void DataParallel::start_epoch(int epoch) {
  Impl& I = *impl_;
  for (std::size_t r = 1; r < I.ranks.size(); ++r) {
    use_device(*I.ranks[r].parts.ctx);
    I.ranks[r].parts.loader->start_epoch(epoch);
  }
  use_device(*I.ranks[0].parts.ctx);
}

void DataParallel::step(const Tensor& images, const Tensor& labels, int64_t global_rows, float lr, Tensor& loss_sum,
                        Tensor& correct) {
  Impl& I = *impl_;
  if (I.group->failed()) throw Error("data parallel: an earlier step failed on some rank");
  if (I.processes) {
    try {
      I.run_rank(I.base, images, labels, global_rows, lr, loss_sum, correct);
    } catch (...) {
      I.fail();
      throw;
    }
    return;
  }
  for (int r = 1; r < I.k; ++r)
    I.workers[r - 1]->post([&I, r, global_rows, lr] {
      try {
        Impl::Rank& rk = I.ranks[r];
        use_device(*rk.parts.ctx);
        Batch batch;
        if (!rk.parts.loader->next(batch))
          throw Error(fmt::format("data parallel: rank {}'s loader ran out of batches before rank 0's", r));
        if (batch.global_rows != global_rows)
          throw Error(fmt::format("data parallel: rank {} is at a batch of {} rows, rank 0 at one of {}", r,
                                  batch.global_rows, global_rows));
        I.run_rank(r, batch.images, batch.labels, global_rows, lr, rk.loss_sum, rk.correct);
      } catch (...) {
        I.fail();
        throw;
      }
    });
  std::exception_ptr first;
  try {
    I.run_rank(0, images, labels, global_rows, lr, loss_sum, correct);
  } catch (...) {
    I.fail();
    first = std::current_exception();
  }
  std::vector<std::exception_ptr> errors;
  if (first) errors.push_back(first);
  for (auto& w : I.workers)
    if (auto e = w->wait()) errors.push_back(e);
  use_device(*I.ranks[0].parts.ctx);
  for (const auto& e : errors)
    if (!is_secondary(e)) std::rethrow_exception(e);
  if (!errors.empty()) std::rethrow_exception(errors.front());
}

std::pair<double, int64_t> DataParallel::take_other_sums(const Tensor& own_loss, const Tensor& own_correct) {
  Impl& I = *impl_;
  double loss = 0;
  int64_t correct = 0;
  if (I.processes) {
    Context& ctx = *I.ranks[0].parts.ctx;
    Tensor losses = ctx.empty({I.k}), corrects = ctx.empty({2 * I.k}, DType::I32);
    try {
      I.group->all_gather(I.base, ctx, own_loss, losses);
      I.group->all_gather(I.base, ctx, own_correct, corrects);
    } catch (...) {
      I.fail();
      throw;
    }
    const auto l = losses.to_host_f32();
    const auto c = corrects.to_host_i32();
    for (int r = 0; r < I.k; ++r)
      if (r != I.base) {
        loss += l[static_cast<std::size_t>(r)];
        correct += c[static_cast<std::size_t>(2 * r)];
      }
    return {loss, correct};
  }
  for (int r = 1; r < I.k; ++r) {
    Impl::Rank& rk = I.ranks[r];
    loss += rk.loss_sum.to_host_f32()[0];
    correct += rk.correct.to_host_i32()[0];
    Context& ctx = *rk.parts.ctx;
    use_device(ctx);
    rk.loss_sum = ctx.zeros({1});
    rk.correct = ctx.zeros({2}, DType::I32);
  }
  use_device(*I.ranks[0].parts.ctx);
  return {loss, correct};
}

void DataParallel::check_replicas() const {
  const Impl& I = *impl_;
  std::vector<Fingerprint> ref;
  for (const auto& p : I.ranks[0].params) ref.push_back(p.var.value().fingerprint());
  if (I.processes) {
    // Every rank's parameter fingerprints (four 32-bit words each) to every rank.
    std::vector<int32_t> words;
    for (const Fingerprint& f : ref)
      for (uint64_t v : {f.high, f.low}) {
        words.push_back(static_cast<int32_t>(static_cast<uint32_t>(v >> 32)));
        words.push_back(static_cast<int32_t>(static_cast<uint32_t>(v & 0xffffffffu)));
      }
    Context& ctx = *I.ranks[0].parts.ctx;
    const int64_t n = static_cast<int64_t>(words.size());
    Tensor mine = ctx.from_host(words, {n}), all = ctx.empty({n * I.k}, DType::I32);
    try {
      I.group->all_gather(I.base, ctx, mine, all);
    } catch (const std::exception& e) {
      I.group->fail(e.what());
      throw;
    }
    const auto got = all.to_host_i32();
    for (int r = 0; r < I.k; ++r)
      for (int64_t i = 0; i < n; ++i)
        if (got[static_cast<std::size_t>(r * n + i)] != got[static_cast<std::size_t>(i)])
          throw Error(fmt::format("data parallel: rank {}'s {} differs from rank 0's: the ranks applied different "
                                  "updates (an all-reduce gave them different sums)",
                                  r, I.ranks[0].params[static_cast<std::size_t>(i / 4)].name));
    return;
  }
  for (int r = 1; r < I.k; ++r)
    for (std::size_t i = 0; i < ref.size(); ++i)
      if (I.ranks[r].params[i].var.value().fingerprint() != ref[i])
        throw Error(fmt::format("data parallel: rank {}'s {} differs from rank 0's: the ranks applied different "
                                "updates (an all-reduce gave them different sums)",
                                r, I.ranks[r].params[i].name));
  use_device(*I.ranks[0].parts.ctx);
}

const std::vector<GradBucket>& DataParallel::buckets() const { return impl_->buckets; }
const std::vector<AllReduceConfig>& DataParallel::configs() const { return impl_->configs; }
int DataParallel::ranks() const { return impl_->k; }
int DataParallel::groups() const { return impl_->g; }
int DataParallel::rank() const { return impl_->base; }
void DataParallel::fail() { impl_->fail(); }

bool DataParallel::rank_count_independent() const {
  const Impl& I = *impl_;
  for (const auto& c : I.configs)
    if (c.algo != AllReduceAlgo::FixedOrder) return false;
  return power_of_two(I.per_rank) && I.stats == BnStats::Local;
}

nlohmann::json DataParallel::describe() const {
  using json = nlohmann::json;
  const Impl& I = *impl_;
  json devices = I.devices;
  json buckets = json::array();
  for (std::size_t b = 0; b < I.buckets.size(); ++b) {
    const GradBucket& bk = I.buckets[b];
    json names = json::array();
    for (std::size_t q : bk.params) names.push_back(I.ranks[0].params[q].name);
    json entry{{"name", bk.name},
               {"elements", bk.elements},
               {"bytes", bk.elements * int64_t(sizeof(float))},
               {"parameters", names},
               {"algo", name_of(I.configs[b].algo)},
               {"guarantee", guarantee_name(allreduce_guarantee(I.configs[b]))}};
    if (!I.configs[b].nccl_algo().empty())
      entry["nccl"] = {{"NCCL_ALGO", I.configs[b].nccl_algo()},
                       {"NCCL_PROTO", I.configs[b].nccl_proto()},
                       {"channels", I.configs[b].channels ? json(I.configs[b].channels) : json("auto")}};
    buckets.push_back(entry);
  }
  json d{{"ranks", I.k},
         {"devices", devices},
         {"groups", I.g},
         {"groups_per_rank", I.per_rank},
         {"group_rows", "group g of a batch of R rows holds rows [g*R/G, (g+1)*R/G)"},
         {"batchnorm", I.stats == BnStats::Local ? "local: each group's own statistics; running statistics from "
                                                     "group 0"
                                                   : "sync: statistics of the whole global batch"},
         {"bucket_bytes", I.opts.bucket_bytes},
         {"buckets", buckets},
         {"rank_count_independent", rank_count_independent()},
         {"hosts", I.hosts},
         {"transport", I.processes ? I.ranks[0].parts.ctx->is_cuda()
                                         ? "one process per rank; fixed-order and ring: the same sums over NCCL's "
                                           "byte moves (ncclSend/ncclRecv, ncclAllGather); nccl-*: ncclAllReduce"
                                         : "one process per rank (simulated CPU ranks); fixed-order and ring: the "
                                           "same sums over files in the rendezvous folder"
                                   : "fixed-order and ring: in-process device-to-device copies (all-to-all, "
                                     "all-gather); nccl-*: ncclAllReduce"}};
  if (I.processes) d["processes"] = {{"launch", "one process per rank, meeting in the run folder's rendezvous"},
                                     {"world", I.k}};
  const std::string version = I.group->nccl_version();
  if (!version.empty()) {
    const char* nvls = std::getenv("NCCL_NVLS_ENABLE");
    d["nccl"] = {{"version", version}, {"NCCL_NVLS_ENABLE", nvls ? nvls : ""}};
  }
  return d;
}

}  // namespace ditto
