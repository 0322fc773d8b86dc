// The Loader on cuda:0: batches (copied from pinned buffers with cudaMemcpyAsync on the
// context's stream) are bit-identical to the CPU context's batches for the same options, for
// several thread counts, over epochs and a mid-epoch restart.
#include <catch2/catch.hpp>

#include <chrono>
#include <cstdio>

#include "datasets/dataset.h"
#include "datasets/loader.h"
#include "engine/context.h"

using namespace ditto;

namespace {
std::vector<Fingerprint> prints(Context& ctx, const Dataset& ds, const LoaderOptions& o, std::vector<int> epochs,
                             Device want) {
  Loader loader(ctx, ds, o);
  std::vector<Fingerprint> out;
  for (int e : epochs) {
    loader.start_epoch(e);
    Batch b;
    while (loader.next(b)) {
      CHECK(b.images.device() == want);
      CHECK(b.labels.device() == want);
      out.push_back(b.images.fingerprint());
      out.push_back(b.labels.fingerprint());
    }
  }
  return out;
}
}  // namespace

TEST_CASE("gpu Loader: batches on cuda:0 are bit-identical to the CPU's") {
  Context cpu;
  Context gpu(Device::cuda(0));
  Dataset ds = make_synthetic(1000, 10, 3, 32, 32, 21);
  for (bool standardize : {false, true}) {
    LoaderOptions o;
    o.batch_size = 128;
    o.seed_order = 5;
    o.seed_augment = 6;
    o.augment = true;
    o.standardize = standardize;
    if (!standardize) {
      ChannelStats st = ds.channel_stats();
      o.mean = st.mean;
      o.std = st.std;
    }
    o.threads = 2;
    const auto want = prints(cpu, ds, o, {0, 1}, Device::cpu());
    REQUIRE(want.size() == 2 * 2 * 8);
    for (int threads : {0, 1, 2, 5}) {
      INFO("threads " << threads << " standardize " << standardize);
      o.threads = threads;
      CHECK(prints(gpu, ds, o, {0, 1}, Device::cuda(0)) == want);
    }
  }
}

TEST_CASE("gpu Loader: holding many batches while the loader refills its buffers") {
  // The trainer may keep a batch while asking for the next: the pinned buffer behind a copy
  // must not be refilled before that copy finished (cudaEvent guard). Hold every batch of an
  // epoch, then compare them all with the CPU's.
  Context cpu;
  Context gpu(Device::cuda(0));
  Dataset ds = make_synthetic(2048, 10, 3, 32, 32, 3);
  LoaderOptions o;
  o.batch_size = 256;
  o.augment = true;
  o.threads = 3;
  Loader gl(gpu, ds, o), cl(cpu, ds, o);
  gl.start_epoch(4);
  cl.start_epoch(4);
  std::vector<Batch> held;
  Batch b;
  const auto t0 = std::chrono::steady_clock::now();
  while (gl.next(b)) held.push_back(b);
  gpu.synchronize();
  const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  std::printf("LOADER | synthetic 3x32x32 | batch=256 threads=3 augment | %zu batches | %.1f us per batch\n",
              held.size(), us / held.size());
  for (const Batch& g : held) {
    REQUIRE(cl.next(b));
    CHECK(g.images.fingerprint() == b.images.fingerprint());
    CHECK(g.indices == b.indices);
  }
}
