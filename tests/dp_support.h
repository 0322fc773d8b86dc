// A data-parallel training of a few steps built by hand (K ranks' contexts, nets, optimizers and
// sharded loaders on synthetic data), or the plain TrainStep on the same data: what the CPU and
// GPU data-parallel tests compare bit for bit.
#pragma once
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "datasets/dataset.h"
#include "datasets/loader.h"
#include "engine/context.h"
#include "engine/optim.h"
#include "engine/tracer.h"
#include "experiments/data_parallel.h"
#include "experiments/step.h"
#include "nets/nets.h"

namespace ditto::test {

struct Setup {
  Device device = Device::cpu();  // every rank's
  std::string model = "smallcnn-bn";
  int channels = 3, size = 16;
  int64_t n = 56, batch = 16;  // 3 full batches and one of 8
  int steps = 4;
  std::vector<std::string> policy = {"*=deterministic"};
  DataParallelOptions dp;
  bool plain = false;          // TrainStep instead of DataParallel (one rank)
};

struct Replica {
  std::unique_ptr<Context> ctx;
  std::unique_ptr<Net> net;
  std::unique_ptr<Optimizer> opt;
  std::unique_ptr<Loader> loader;
  std::vector<Param> params;
  std::vector<Buffer> buffers, ostate;
};

struct Outcome {
  std::vector<float> weights, buffers;
  nlohmann::json described;
};

inline std::vector<float> host(const std::vector<Tensor*>& ts) {
  std::vector<float> all;
  for (const Tensor* t : ts) {
    auto v = t->to_host_f32();
    all.insert(all.end(), v.begin(), v.end());
  }
  return all;
}

inline Outcome run(const Setup& s, Tracer* tracer = nullptr) {
  const Dataset ds = make_synthetic(s.n, 10, s.channels, s.size, s.size, 1);
  const int ranks = s.plain ? 1 : s.dp.ranks;
  std::vector<Replica> reps(static_cast<std::size_t>(ranks));
  std::vector<RankParts> parts;
  for (int r = 0; r < ranks; ++r) {
    Replica& rp = reps[r];
    rp.ctx = std::make_unique<Context>(s.device, Policy::parse(s.policy));
    rp.net = make_net(*rp.ctx, NetConfig{s.model, 10, s.channels});
    rp.params = rp.net->params();
    rp.buffers = rp.net->buffers();
    rp.opt = std::make_unique<Adam>(*rp.ctx, rp.params, AdamOptions{});
    rp.ostate = rp.opt->state();
    LoaderOptions lo;
    lo.batch_size = s.batch;
    lo.seed_order = 11;
    lo.seed_augment = 12;
    lo.augment = true;
    lo.threads = r % 3;  // the batches' bits do not depend on it
    lo.shard = r;
    lo.shards = ranks;
    rp.loader = std::make_unique<Loader>(*rp.ctx, ds, lo);
    RankParts p{rp.ctx.get(), rp.net.get(), rp.opt.get(), rp.loader.get(), {}};
    for (auto& q : rp.params) p.state.push_back(&q.var.value());
    for (auto& b : rp.buffers) p.state.push_back(b.tensor);
    for (auto& b : rp.ostate) p.state.push_back(b.tensor);
    parts.push_back(p);
  }
  Replica& r0 = reps[0];
  r0.net->init(*r0.ctx, 7);
  r0.ctx->set_tracer(tracer);
  std::unique_ptr<DataParallel> dp;
  std::unique_ptr<TrainStep> plain;
  if (s.plain) {
    plain = std::make_unique<TrainStep>(*r0.ctx, *r0.net, *r0.opt, false, tracer, 7);
  } else {
    dp = std::make_unique<DataParallel>(parts, s.dp, 7, tracer);
    dp->broadcast_state();
  }
  Tensor loss_sum = r0.ctx->zeros({1}), correct = r0.ctx->zeros({2}, DType::I32);
  int step = 0;
  for (int epoch = 0; step < s.steps; ++epoch) {
    r0.loader->start_epoch(epoch);
    if (dp) dp->start_epoch(epoch);
    Batch b;
    while (step < s.steps && r0.loader->next(b)) {
      if (tracer) tracer->begin_step(++step);
      else ++step;
      const float lr = 1e-3f;
      if (dp)
        dp->step(b.images, b.labels, b.global_rows, lr, loss_sum, correct);
      else
        plain->run(b.images, b.labels, lr, loss_sum, correct);
    }
  }
  r0.ctx->set_tracer(nullptr);
  Outcome o;
  if (dp) {
    dp->check_replicas();
    o.described = dp->describe();
  }
  std::vector<Tensor*> w, buf;
  for (auto& p : r0.params) w.push_back(&p.var.value());
  for (auto& b : r0.buffers) buf.push_back(b.tensor);
  o.weights = host(w);
  o.buffers = host(buf);
  return o;
}

inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}


}  // namespace ditto::test
