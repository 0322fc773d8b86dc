// Data parallelism on simulated CPU ranks (experiments/data_parallel.h): sharded loaders yield
// the 1-rank batches; fixed-order gives the same bits for 1, 2 and 4 ranks (weights and batch-norm
// running statistics, with dropout too), and with one group is bitwise the plain training step;
// ring follows the rank count; synchronized batch norm keeps the ranks equal and replays; a traced
// run holds the same events for any rank count, and the first divergence between a 1-rank and a
// 4-rank ring run is the all-reduce.
#include <catch2/catch.hpp>

#include <cstring>
#include <memory>

#include "datasets/dataset.h"
#include "datasets/loader.h"
#include "engine/context.h"
#include "engine/error.h"
#include "engine/optim.h"
#include "experiments/data_parallel.h"
#include "experiments/diverge.h"
#include "experiments/step.h"
#include "experiments/trace.h"
#include "nets/nets.h"
#include "dp_support.h"
#include "train_support.h"
#include "kernels/conv2d.h"
#include "kernels/batchnorm.h"

using namespace ditto;

using test::Outcome;
using test::Setup;
using test::run;
using test::same_bits;

TEST_CASE("loader shards: K sharded loaders yield exactly the unsharded batches") {
  const Dataset ds = make_synthetic(37, 10, 3, 8, 8, 3);
  Context ctx;
  LoaderOptions lo;
  lo.batch_size = 10;
  lo.seed_order = 5;
  lo.seed_augment = 6;
  lo.augment = true;
  Loader whole(ctx, ds, lo);
  for (int shards : {1, 2, 3, 4}) {
    std::vector<std::unique_ptr<Loader>> parts;
    for (int s = 0; s < shards; ++s) {
      LoaderOptions o = lo;
      o.shard = s;
      o.shards = shards;
      o.threads = s % 2;
      parts.push_back(std::make_unique<Loader>(ctx, ds, o));
      parts.back()->start_epoch(2);
    }
    whole.start_epoch(2);
    Batch b;
    while (whole.next(b)) {
      std::vector<int64_t> indices;
      std::vector<float> images;
      for (int s = 0; s < shards; ++s) {
        Batch p;
        REQUIRE(parts[s]->next(p));
        CHECK(p.global_rows == b.global_rows);
        CHECK(p.labels.numel() == (s + 1) * b.global_rows / shards - s * b.global_rows / shards);
        indices.insert(indices.end(), p.indices.begin(), p.indices.end());
        auto v = p.images.to_host_f32();
        images.insert(images.end(), v.begin(), v.end());
      }
      CHECK(indices == b.indices);
      CHECK(same_bits(images, b.images.to_host_f32()));
    }
  }
  LoaderOptions bad = lo;
  bad.shard = 2;
  bad.shards = 2;
  CHECK_THROWS_AS(Loader(ctx, ds, bad), Error);
}

TEST_CASE("data parallel: groups, buckets and the checks of a configuration") {
  CHECK(group_start(10, 4, 0) == 0);
  CHECK(group_start(10, 4, 1) == 2);
  CHECK(group_start(10, 4, 2) == 5);
  CHECK(group_start(10, 4, 4) == 10);
  // Rank r's rows are its groups' rows: floor(r*R/K) = floor(r*(G/K)*R/G).
  for (int64_t rows = 1; rows < 40; ++rows)
    for (int k : {1, 2, 4})
      for (int r = 0; r <= k; ++r) CHECK(group_start(rows, k, r) == group_start(rows, 8, r * (8 / k)));

  Context ctx;
  std::vector<Param> params;
  for (int64_t n : {10, 300, 5, 700, 2})
    params.push_back({"p" + std::to_string(params.size()), Var(ctx.zeros({n}), true)});
  auto b = make_buckets(params, 1000 * 4);  // 1000 floats a bucket
  REQUIRE(b.size() == 2);
  CHECK(b[0].name == "bucket0");
  CHECK(b[0].params == std::vector<std::size_t>{4, 3, 2});  // reverse order: 2 + 700 + 5 ...
  CHECK(b[0].offsets == std::vector<int64_t>{0, 2, 702});
  CHECK(b[0].elements == 707);
  CHECK(b[1].params == std::vector<std::size_t>{1, 0});  // ... 707 + 300 > 1000
  CHECK(b[1].offsets == std::vector<int64_t>{0, 300});
  CHECK(b[1].elements == 310);
  auto one = make_buckets(params, 8);  // smaller than any parameter: one bucket each
  CHECK(one.size() == params.size());
  CHECK(bucket_layers(one).front() == std::make_pair(std::string("bucket0"), op::allreduce));

  DataParallelOptions o;
  o.ranks = 2;
  CHECK(o.group_count() == 2);  // --dp-groups not given: one group per rank
  o.groups = 3;
  const BnStats local = BnStats::Local, sync = BnStats::Sync;
  CHECK(test::error_of([&] { check_data_parallel(o, local, 64, 16, false); }).find("--dp-groups") == 0);
  o.groups = 4;
  CHECK_NOTHROW(check_data_parallel(o, local, 64, 16, false));
  CHECK(test::error_of([&] { check_data_parallel(o, local, 66, 16, false); }).find("last batch of an epoch has 2 rows") !=
        std::string::npos);
  CHECK_NOTHROW(check_data_parallel(o, local, 66, 16, true));
  CHECK(test::error_of([&] { check_data_parallel(o, sync, 64, 16, false); }).find("--batchnorm sync") == 0);
  o.groups = 2;
  CHECK_NOTHROW(check_data_parallel(o, sync, 64, 16, false));
  o.ranks = 0;
  CHECK(test::error_of([&] { check_data_parallel(o, local, 64, 16, false); }).find("--gpus") == 0);

  // Whether a run synchronizes is its batch norms' stats knob: one sync layer is enough.
  const std::vector<std::pair<std::string, OpKind>> layers = {{"conv1", op::conv2d}, {"bn1", op::batchnorm},
                                                              {"bn2", op::batchnorm}};
  CHECK(batch_norm_stats(Policy(), layers) == BnStats::Local);
  CHECK(batch_norm_stats(Policy::parse({"*.stats=sync"}), layers) == BnStats::Sync);
  CHECK(batch_norm_stats(Policy::parse({"bn2.stats=sync"}), layers) == BnStats::Sync);
  CHECK(batch_norm_stats(Policy::parse({"*.stats=sync", "bn1.stats=local", "bn2.stats=local"}), layers) ==
        BnStats::Local);
}

TEST_CASE("data parallel fixed-order: 1, 2 and 4 ranks give the same bits; one group is the plain step") {
  Setup s;
  s.dp.groups = 4;
  std::vector<Outcome> runs;
  for (int ranks : {1, 2, 4}) {
    s.dp.ranks = ranks;
    runs.push_back(run(s));
    INFO(ranks << " ranks");
    CHECK(runs.back().described["rank_count_independent"] == true);
    CHECK(same_bits(runs.back().weights, runs.front().weights));
    CHECK(same_bits(runs.back().buffers, runs.front().buffers));  // running statistics: group 0's
  }
  CHECK(runs.back().described["groups"] == 4);
  CHECK(runs.back().described["buckets"][0]["algo"] == "fixed-order");

  // One group, one rank: bitwise the plain TrainStep.
  Setup one = s;
  one.dp.ranks = 1;
  one.dp.groups = 1;
  Setup plain = s;
  plain.plain = true;
  const Outcome a = run(one), b = run(plain);
  CHECK(same_bits(a.weights, b.weights));
  CHECK(same_bits(a.buffers, b.buffers));
  // Four groups are another summation order than one pass over the batch.
  CHECK_FALSE(same_bits(runs.front().weights, b.weights));
  // Several buckets (small ones), each fixed-order: still the same bits.
  Setup small = s;
  small.dp.bucket_bytes = 4096;
  small.dp.ranks = 2;
  const Outcome c = run(small);
  CHECK(c.described["buckets"].size() > 3);
  CHECK(same_bits(c.weights, runs.front().weights));
}

TEST_CASE("data parallel fixed-order with dropout: group keys do not depend on the rank count") {
  Setup s;
  s.model = "mnist-cnn";
  s.channels = 1;
  s.size = 28;
  s.n = 16;
  s.batch = 8;
  s.steps = 2;
  s.dp.groups = 2;
  s.dp.ranks = 1;
  const Outcome one = run(s);
  s.dp.ranks = 2;
  CHECK(same_bits(run(s).weights, one.weights));
}

TEST_CASE("data parallel ring: reproducible, and the rank count changes its bits") {
  Setup s;
  s.policy = {"*=deterministic", "*.algo=ring"};
  s.dp.groups = 4;
  s.dp.bucket_bytes = int64_t(1) << 30;  // one bucket
  s.dp.ranks = 4;
  const Outcome four = run(s);
  CHECK(four.described["buckets"][0]["algo"] == "ring");
  CHECK(four.described["rank_count_independent"] == false);
  CHECK(same_bits(run(s).weights, four.weights));
  s.dp.ranks = 1;  // one rank: a ring over one is its own tree
  const Outcome one = run(s);
  CHECK_FALSE(same_bits(four.weights, one.weights));
  s.dp.ranks = 2;  // two ranks: one addition per element, which commutes
  CHECK(same_bits(run(s).weights, one.weights));
}

TEST_CASE("data parallel: synchronized batch norm keeps the ranks equal and replays") {
  Setup s;
  s.dp.ranks = 2;
  s.dp.groups = 2;
  s.policy = {"*=deterministic", "*.stats=sync"};
  const Outcome a = run(s), b = run(s);
  CHECK(same_bits(a.weights, b.weights));
  CHECK(same_bits(a.buffers, b.buffers));
  CHECK(a.described["batchnorm"].get<std::string>().rfind("sync", 0) == 0);
  CHECK(a.described["rank_count_independent"] == false);
  // Local batch norm normalizes each rank's half alone: other statistics, other weights.
  s.policy = {"*=deterministic"};
  CHECK_FALSE(same_bits(run(s).weights, a.weights));
  // Tracing would serialize the ranks that synchronized batch norm needs together.
  s.policy = {"*=deterministic", "*.stats=sync"};
  RecordingTracer t;
  CHECK(test::error_of([&] { run(s, &t); }).find("--batchnorm sync") != std::string::npos);
}

TEST_CASE("data parallel: a traced run has the same events for any rank count; ditto-diverge's search names the "
          "all-reduce") {
  auto trace_of = [](Setup s) {
    RecordingTracer t;
    std::vector<TraceEvent> events;
    struct Collect : Tracer {
      RecordingTracer& inner;
      std::vector<TraceEvent>& out;
      Collect(RecordingTracer& i, std::vector<TraceEvent>& o) : inner(i), out(o) {}
      void begin_step(int64_t step) override {
        out.insert(out.end(), inner.step_events().begin(), inner.step_events().end());
        inner.clear_step();
        inner.begin_step(step);
      }
      void event(const std::string& phase, const std::string& layer, const std::string& op,
                 const std::vector<TracedTensor>& in, const std::vector<TracedTensor>& o) override {
        inner.event(phase, layer, op, in, o);
      }
    } collect(t, events);
    run(s, &collect);
    events.insert(events.end(), t.step_events().begin(), t.step_events().end());
    return events;
  };
  Setup s;
  s.steps = 2;
  s.dp.groups = 4;
  s.dp.bucket_bytes = int64_t(1) << 30;
  s.dp.ranks = 1;
  const auto one = trace_of(s);
  s.dp.ranks = 4;
  const auto four = trace_of(s);
  REQUIRE(one.size() == four.size());
  const Divergence same = first_divergence(one, four);
  CHECK_FALSE(same.found);
  CHECK_FALSE(same.structure_mismatch);
  int allreduces = 0;
  for (const auto& e : one)
    if (e.phase == "allreduce") {
      ++allreduces;
      CHECK(e.layer == "bucket0");
      CHECK(e.op == "allreduce/fixed-order");
      CHECK(e.inputs.size() == 4);  // g0..g3
    }
  CHECK(allreduces == 2);

  s.policy = {"*=deterministic", "*.algo=ring"};
  s.dp.ranks = 1;
  const auto ring1 = trace_of(s);
  s.dp.ranks = 4;
  const auto ring4 = trace_of(s);
  const Divergence d = first_divergence(ring1, ring4);
  REQUIRE(d.found);
  CHECK(d.event_a.phase == "allreduce");
  CHECK(d.event_a.layer == "bucket0");
  CHECK(d.event_a.step == 1);
  CHECK(d.inputs_identical);
}
