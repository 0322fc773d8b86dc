// Epoch order, augmentation and the batch Loader (see loader.h and augment.h).
#include "datasets/loader.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <mutex>
#include <numeric>
#include <optional>
#include <thread>

#include "datasets/stream.h"
#include "engine/context.h"
#include "engine/detail/capture_gate.h"
#include "engine/detail/cuda_state.h"
#include "engine/error.h"
#include "engine/philox.h"

namespace ditto {

namespace {
// Each purpose draws from a Philox stream of its own, so e.g. changing seed_order never moves
// the augmentation of an example.
constexpr uint64_t kOrderStream = 0x6f72646572ull;     // "order"
constexpr uint64_t kAugmentStream = 0x6175676d656eull; // "augmen"

// Unbiased enough integer in [0, range) from a 32-bit word: (w * range) >> 32 (bias < range / 2^32).
inline int below(uint32_t w, int range) { return static_cast<int>((uint64_t(w) * uint64_t(range)) >> 32); }
}  // namespace

std::vector<int64_t> epoch_permutation(int64_t n, uint64_t seed_order, int epoch) {
  if (n < 0) throw Error(fmt::format("epoch_permutation: n = {} < 0", n));
  std::vector<int64_t> p(static_cast<std::size_t>(n));
  std::iota(p.begin(), p.end(), int64_t{0});
  const uint64_t key = mix_key(seed_order, kOrderStream);
  for (int64_t i = n - 1; i > 0; --i) {
    const Philox4x32 r = philox4x32(uint64_t(i), uint64_t(uint32_t(epoch)), key);
    const uint64_t word = (uint64_t(r.v[0]) << 32) | r.v[1];
    const int64_t j = static_cast<int64_t>(word % uint64_t(i + 1));
    std::swap(p[i], p[j]);
  }
  return p;
}

AugmentDraw augment_draw(uint64_t seed_augment, int epoch, int64_t index, int pad, bool flip) {
  const Philox4x32 r = philox4x32(uint64_t(index), uint64_t(uint32_t(epoch)), mix_key(seed_augment, kAugmentStream));
  AugmentDraw d;
  d.dx = below(r.v[0], 2 * pad + 1);
  d.dy = below(r.v[1], 2 * pad + 1);
  d.flip = flip && (r.v[2] >> 31) != 0;
  return d;
}

void augment_image(const uint8_t* src, int c, int h, int w, int pad, const AugmentDraw& d, uint8_t* dst) {
  for (int ch = 0; ch < c; ++ch) {
    const uint8_t* s = src + static_cast<std::size_t>(ch) * h * w;
    uint8_t* o = dst + static_cast<std::size_t>(ch) * h * w;
    for (int y = 0; y < h; ++y) {
      const int sy = y + d.dy - pad;
      for (int x = 0; x < w; ++x) {
        const int sx = (d.flip ? w - 1 - x : x) + d.dx - pad;
        o[y * w + x] = (sy >= 0 && sy < h && sx >= 0 && sx < w) ? s[sy * w + sx] : 0;
      }
    }
  }
}

void standardize_image(const uint8_t* src, int64_t numel, float* dst) {
  if (numel <= 0) return;
  // x - mean = (v * numel - sum) / (255 * numel): the numerator is an exact integer, so a
  // constant image gives exactly 0 and the result does not depend on summation order.
  int64_t sum = 0;
  for (int64_t k = 0; k < numel; ++k) sum += src[k];
  const double scale = 255.0 * double(numel);
  double sq = 0;
  for (int64_t k = 0; k < numel; ++k) {
    const double d = double(int64_t(src[k]) * numel - sum) / scale;
    sq += d * d;
  }
  const double adjusted = std::max(std::sqrt(sq / double(numel)), 1.0 / std::sqrt(double(numel)));
  for (int64_t k = 0; k < numel; ++k)
    dst[k] = static_cast<float>(double(int64_t(src[k]) * numel - sum) / scale / adjusted);
}

void normalize_example(const uint8_t* src, int c, int64_t plane, const LoaderOptions& opts, float* dst) {
  if (opts.standardize) {
    standardize_image(src, int64_t(c) * plane, dst);
    return;
  }
  for (int ch = 0; ch < c; ++ch) {
    const double m = opts.mean.empty() ? 0.0 : opts.mean[ch];
    const double s = opts.std.empty() ? 1.0 : opts.std[ch];
    for (int64_t k = 0; k < plane; ++k)
      dst[ch * plane + k] = static_cast<float>((src[ch * plane + k] / 255.0 - m) / s);
  }
}

void prepare_example(const Dataset& ds, int64_t index, int epoch, const LoaderOptions& opts, float* dst) {
  if (ds.source) {
    ds.source->prepare(index, epoch, opts, dst);
    return;
  }
  const int64_t numel = ds.image_numel();
  const uint8_t* src = ds.image(index);
  std::vector<uint8_t> scratch;
  if (opts.augment) {
    scratch.resize(static_cast<std::size_t>(numel));
    augment_image(src, ds.channels, ds.height, ds.width, opts.pad,
                  augment_draw(opts.seed_augment, epoch, index, opts.pad, opts.flip), scratch.data());
    src = scratch.data();
  }
  normalize_example(src, ds.channels, int64_t(ds.height) * ds.width, opts, dst);
}

// ---- Loader ------------------------------------------------------------------------------

namespace {
struct Slot {
  float* images = nullptr;   // batch_size * image_numel, pinned on CUDA (int32 ids when categorical)
  int32_t* labels = nullptr; // batch_size
  int32_t* targets = nullptr;  // batch_size * target_length (tasks other than classification)
  int32_t* lengths = nullptr;  // batch_size (sequence targets)
  std::vector<int64_t> indices;
  int64_t rows = 0;
  int64_t global_rows = 0;   // the unsharded batch's rows
  int64_t free_for = 0;      // the batch allowed to fill this slot next
  int64_t ready = -1;        // the batch this slot holds, ready to copy
  cudaEvent_t copied = nullptr;  // recorded after the copies out of this slot
  bool copy_pending = false;
};
}  // namespace

struct Loader::Impl {
  Context& ctx;
  const Dataset& ds;
  LoaderOptions opts;
  bool cuda = false;
  int64_t per = 0;  // floats per image
  std::vector<Slot> slots;
  std::vector<int64_t> order;
  int epoch = 0;
  int64_t next_batch = 0;
  bool started = false;

  std::mutex m;
  std::condition_variable cv;
  bool stop = false;
  std::exception_ptr error;
  std::vector<std::thread> workers;

  Impl(Context& c, const Dataset& d, LoaderOptions o) : ctx(c), ds(d), opts(std::move(o)) {}

  int64_t batches() const {
    const int64_t bs = opts.batch_size;
    return opts.drop_last ? ds.n / bs : (ds.n + bs - 1) / bs;
  }

  // Waits until the copies queued out of `s` have finished, so it may be overwritten.
  void wait_copied(Slot& s) {
    if (cuda && s.copy_pending) DITTO_CUDA_CHECK(cudaEventSynchronize(s.copied));
    s.copy_pending = false;
  }

  // Writes batch b into slot s. Row r depends only on (order, epoch, opts, b, r).
  void fill(Slot& s, int64_t b) {
    const int64_t bs = opts.batch_size;
    s.global_rows = std::min(bs, ds.n - b * bs);
    const int64_t lo = opts.shard * s.global_rows / opts.shards, hi = (opts.shard + 1) * s.global_rows / opts.shards;
    const int64_t first = b * bs + lo;
    s.rows = hi - lo;
    s.indices.resize(static_cast<std::size_t>(s.rows));
    for (int64_t r = 0; r < s.rows; ++r) {
      const int64_t idx = order[first + r];
      s.indices[r] = idx;
      s.labels[r] = ds.labels[idx];
      if (ds.categories > 0) {
        int32_t* ids = reinterpret_cast<int32_t*>(s.images) + r * per;
        const uint8_t* src = ds.image(idx);
        for (int64_t k = 0; k < per; ++k) ids[k] = src[k];
      } else {
        prepare_example(ds, idx, epoch, opts, s.images + r * per);
      }
      if (ds.target_length > 0) {
        std::memcpy(s.targets + r * ds.target_length, ds.target(idx), sizeof(int32_t) * ds.target_length);
        if (ds.task == Task::Sequence) s.lengths[r] = ds.sequence_length(idx);
      }
    }
  }

  void worker(int k, int threads) {
    try {
      if (cuda) DITTO_CUDA_CHECK(cudaSetDevice(ctx.device().index));
      const int64_t nb = batches(), ns = static_cast<int64_t>(slots.size());
      for (int64_t b = k; b < nb; b += threads) {
        Slot& s = slots[b % ns];
        {
          std::unique_lock<std::mutex> lk(m);
          cv.wait(lk, [&] { return stop || s.free_for == b; });
          if (stop) return;
        }
        wait_copied(s);
        fill(s, b);
        {
          std::lock_guard<std::mutex> lk(m);
          s.ready = b;
        }
        cv.notify_all();
      }
    } catch (...) {
      {
        std::lock_guard<std::mutex> lk(m);
        if (!error) error = std::current_exception();
      }
      cv.notify_all();
    }
  }

  void stop_workers() {
    {
      std::lock_guard<std::mutex> lk(m);
      stop = true;
    }
    cv.notify_all();
    for (auto& t : workers) t.join();
    workers.clear();
    stop = false;
    error = nullptr;
  }
};

Loader::Loader(Context& ctx, const Dataset& ds, LoaderOptions opts) : impl_(std::make_unique<Impl>(ctx, ds, std::move(opts))) {
  Impl& I = *impl_;
  const LoaderOptions& o = I.opts;
  if (o.batch_size < 1) throw Error(fmt::format("Loader: batch_size {} must be >= 1", o.batch_size));
  if (o.threads < 0 || o.threads > 64) throw Error(fmt::format("Loader: threads {} must be in [0, 64]", o.threads));
  if (o.shards < 1 || o.shard < 0 || o.shard >= o.shards)
    throw Error(fmt::format("Loader: shard {} of {} is not a shard (0 <= shard < shards)", o.shard, o.shards));
  if (o.augment && (o.pad < 0 || o.pad > std::min(ds.height, ds.width)))
    throw Error(fmt::format("Loader: pad {} must be in [0, {}]", o.pad, std::min(ds.height, ds.width)));
  if (o.mean.size() != o.std.size())
    throw Error(fmt::format("Loader: {} means but {} stds given", o.mean.size(), o.std.size()));
  if (!o.mean.empty() && static_cast<int>(o.mean.size()) != ds.channels)
    throw Error(fmt::format("Loader: {} means/stds given for '{}', which has {} channels", o.mean.size(), ds.name,
                            ds.channels));
  if (o.standardize && !o.mean.empty())
    throw Error("Loader: per-image standardization and per-channel mean/std are exclusive; give one");
  if (o.augment && ds.task != Task::Classification)
    throw Error(fmt::format("Loader: '{}' has {} targets; augmentation would move its pixels but not their labels",
                            ds.name, task_name(ds.task)));
  if (ds.categories > 0 && (o.augment || o.standardize || !o.mean.empty()))
    throw Error(fmt::format("Loader: '{}' holds category ids, not pixels: no augmentation, standardization or "
                            "mean / std applies",
                            ds.name));
  for (float s : o.std)
    if (!(s > 0)) throw Error(fmt::format("Loader: std {} must be > 0", s));
  ds.validate();
  I.cuda = ctx.is_cuda();
  I.per = ds.image_numel();
  I.slots.resize(static_cast<std::size_t>(std::max(2, o.threads + 1)));
  const std::size_t img_bytes = static_cast<std::size_t>(o.batch_size * I.per) * sizeof(float);
  const std::size_t lab_bytes = static_cast<std::size_t>(o.batch_size) * sizeof(int32_t);
  const std::size_t tgt_bytes = lab_bytes * static_cast<std::size_t>(ds.target_length);
  static_assert(sizeof(float) == sizeof(int32_t), "categorical ids share the image buffers");
  if (I.cuda) DITTO_CUDA_CHECK(cudaSetDevice(ctx.device().index));
  // Pinning host memory may synchronize the device: not during another replica's capture.
  std::optional<detail::DeviceSyncScope> sync;
  if (I.cuda) sync.emplace(ctx.device().index);
  for (auto& s : I.slots) {
    if (I.cuda) {
      void* p = nullptr;
      DITTO_CUDA_CHECK(cudaHostAlloc(&p, img_bytes, cudaHostAllocPortable));
      s.images = static_cast<float*>(p);
      DITTO_CUDA_CHECK(cudaHostAlloc(&p, lab_bytes, cudaHostAllocPortable));
      s.labels = static_cast<int32_t*>(p);
      if (tgt_bytes) {
        DITTO_CUDA_CHECK(cudaHostAlloc(&p, tgt_bytes, cudaHostAllocPortable));
        s.targets = static_cast<int32_t*>(p);
        DITTO_CUDA_CHECK(cudaHostAlloc(&p, lab_bytes, cudaHostAllocPortable));
        s.lengths = static_cast<int32_t*>(p);
      }
      DITTO_CUDA_CHECK(cudaEventCreateWithFlags(&s.copied, cudaEventDisableTiming));
    } else {
      s.images = static_cast<float*>(std::malloc(std::max<std::size_t>(img_bytes, 1)));
      s.labels = static_cast<int32_t*>(std::malloc(std::max<std::size_t>(lab_bytes, 1)));
      if (tgt_bytes) {
        s.targets = static_cast<int32_t*>(std::malloc(tgt_bytes));
        s.lengths = static_cast<int32_t*>(std::malloc(lab_bytes));
      }
      if (!s.images || !s.labels || (tgt_bytes && (!s.targets || !s.lengths)))
        throw Error(fmt::format("Loader: out of host memory for {} bytes", img_bytes + tgt_bytes));
    }
  }
}

Loader::~Loader() {
  Impl& I = *impl_;
  I.stop_workers();
  // cudaFreeHost synchronizes the device: not during another replica's capture.
  std::optional<detail::DeviceSyncScope> sync;
  if (I.cuda) sync.emplace(I.ctx.device().index);
  for (auto& s : I.slots) {
    if (I.cuda) {
      if (s.copied) {
        DITTO_CUDA_CHECK_PRINT(cudaEventSynchronize(s.copied));
        DITTO_CUDA_CHECK_PRINT(cudaEventDestroy(s.copied));
      }
      for (void* p : {static_cast<void*>(s.images), static_cast<void*>(s.labels), static_cast<void*>(s.targets),
                      static_cast<void*>(s.lengths)})
        if (p) DITTO_CUDA_CHECK_PRINT(cudaFreeHost(p));
    } else {
      std::free(s.images);
      std::free(s.labels);
      std::free(s.targets);
      std::free(s.lengths);
    }
  }
}

int64_t Loader::batches_per_epoch() const { return impl_->batches(); }
const std::vector<int64_t>& Loader::order() const { return impl_->order; }
const LoaderOptions& Loader::options() const { return impl_->opts; }

void Loader::start_epoch(int epoch) {
  Impl& I = *impl_;
  I.stop_workers();
  I.epoch = epoch;
  if (I.opts.shuffle) {
    I.order = epoch_permutation(I.ds.n, I.opts.seed_order, epoch);
  } else {
    I.order.resize(static_cast<std::size_t>(I.ds.n));
    std::iota(I.order.begin(), I.order.end(), int64_t{0});
  }
  const int64_t ns = static_cast<int64_t>(I.slots.size());
  for (int64_t s = 0; s < ns; ++s) {
    I.slots[s].free_for = s;
    I.slots[s].ready = -1;
  }
  I.next_batch = 0;
  I.started = true;
  for (int k = 0; k < I.opts.threads; ++k) I.workers.emplace_back([&I, k] { I.worker(k, I.opts.threads); });
}

bool Loader::next(Batch& out) {
  Impl& I = *impl_;
  if (!I.started) throw Error("Loader::next called before start_epoch");
  const int64_t b = I.next_batch;
  if (b >= I.batches()) return false;
  const int64_t ns = static_cast<int64_t>(I.slots.size());
  Slot& s = I.slots[b % ns];
  if (I.opts.threads == 0) {
    I.wait_copied(s);
    I.fill(s, b);
  } else {
    std::unique_lock<std::mutex> lk(I.m);
    I.cv.wait(lk, [&] { return s.ready == b || I.error; });
    if (s.ready != b) std::rethrow_exception(I.error);
  }
  const int64_t rows = s.rows;
  Batch batch;
  const Dataset& ds = I.ds;
  batch.images = ds.categories > 0 ? I.ctx.empty({rows, ds.width}, DType::I32)
                                   : I.ctx.empty({rows, ds.channels, ds.height, ds.width}, DType::F32);
  batch.labels = I.ctx.empty({rows}, DType::I32);
  if (ds.task == Task::Segmentation) batch.targets = I.ctx.empty({rows, ds.height, ds.width}, DType::I32);
  if (ds.task == Task::Sequence) {
    batch.targets = I.ctx.empty({rows, ds.target_length}, DType::I32);
    batch.target_lengths = I.ctx.empty({rows}, DType::I32);
  }
  batch.indices = s.indices;
  // (destination, source) of every copy out of the slot.
  std::vector<std::pair<Tensor*, const void*>> copies = {{&batch.images, s.images}, {&batch.labels, s.labels}};
  if (batch.targets.defined()) copies.push_back({&batch.targets, s.targets});
  if (batch.target_lengths.defined()) copies.push_back({&batch.target_lengths, s.lengths});
  batch.global_rows = s.global_rows;
  if (I.cuda) {
    cudaStream_t stream = detail::stream_of(I.ctx);
    DITTO_CUDA_CHECK(cudaSetDevice(I.ctx.device().index));
    for (const auto& [dst, src] : copies)
      DITTO_CUDA_CHECK(cudaMemcpyAsync(dst->raw(), src, dst->nbytes(), cudaMemcpyHostToDevice, stream));
    DITTO_CUDA_CHECK(cudaEventRecord(s.copied, stream));
  } else if (rows > 0) {
    for (const auto& [dst, src] : copies) std::memcpy(dst->raw(), src, dst->nbytes());
  }
  {
    std::lock_guard<std::mutex> lk(I.m);
    s.copy_pending = I.cuda;
    s.ready = -1;
    s.free_for = b + ns;
  }
  I.cv.notify_all();
  I.next_batch = b + 1;
  out = std::move(batch);
  return true;
}

}  // namespace ditto
