// Loader: turns a Dataset into batches of float32 images and int32 labels on the context's
// device. The order (epoch_permutation) and augmentation (augment_draw) are pure functions of
// the seeds, the epoch and the example index (see augment.h), and each example is written to a
// fixed place in its batch, so every batch's bytes are the same for any number of worker
// threads and any timing, and on the CPU and the GPU.
//
// On a CUDA context, worker threads fill pinned host buffers (cudaHostAlloc), next() queues
// cudaMemcpyAsync into fresh device tensors on the context's stream and records a cudaEvent per
// buffer; a worker waits for that event before it refills the buffer. Buffers = threads + 1
// (at least 2: double buffering). On a CPU context, plain memory and memcpy.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "datasets/augment.h"
#include "datasets/dataset.h"
#include "engine/tensor.h"

namespace ditto {

class Context;

struct LoaderOptions {
  int64_t batch_size = 128;
  bool shuffle = true;          // false: dataset order every epoch
  bool drop_last = false;       // drop a final partial batch
  uint64_t seed_order = 0;      // epoch_permutation
  uint64_t seed_augment = 0;    // augment_draw
  bool augment = false;         // pad-and-random-crop + horizontal flip
  int pad = 4;                  // crop padding when augment
  bool flip = true;             // horizontal flip when augment
  bool standardize = false;     // per-image standardization (then mean / std must be empty)
  std::vector<float> mean, std; // per channel on the [0, 1] scale; empty: 0 and 1
  int threads = 2;              // background workers; 0 prepares batches inside next()
  // Data parallelism: each batch keeps rows [shard*R/shards, (shard+1)*R/shards) of the global
  // batch of R rows (the order and augmentation stay those of the whole run), so `shards` loaders
  // with shard = 0..shards-1 together yield exactly the unsharded batches.
  int shard = 0, shards = 1;
};

struct Batch {
  Tensor images;                 // (N, C, H, W) f32 on the context's device; for a categorical
                                 // dataset the category ids (N, fields) i32
  Tensor labels;                 // (N) i32 on the context's device
  // The dataset's targets (Dataset::task), undefined for classification: segmentation masks
  // (N, H, W) i32; label sequences (N, target_length) i32 with their lengths (N) i32.
  Tensor targets, target_lengths;
  std::vector<int64_t> indices;  // dataset index of each row
  int64_t global_rows = 0;       // rows of the whole batch this shard belongs to (= rows unsharded)
};

class Loader {
 public:
  // ds must outlive the Loader. Throws Error for inconsistent options: augmentation of a dataset
  // whose targets are pixels or symbols (it would move the pixels but not their labels), and
  // augmentation, standardization or a mean / std for categorical ids.
  Loader(Context& ctx, const Dataset& ds, LoaderOptions opts);
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  int64_t batches_per_epoch() const;
  // Stops any epoch in progress and starts preparing batches of `epoch`.
  void start_epoch(int epoch);
  // The next batch of the epoch; false once the epoch is exhausted.
  bool next(Batch& out);

  const std::vector<int64_t>& order() const;  // this epoch's example order
  const LoaderOptions& options() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ditto
