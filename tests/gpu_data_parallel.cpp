// Data parallelism on the GPU (label gpu), for one GPU:
//   - NCCL with one rank: communicators for nccl-default and a pinned nccl-ring-simple/2ch are
//     made (NCCL_NVLS_ENABLE set to 0), an all-reduce over one rank leaves the bits alone;
//   - the fixed-order and ring sums on the GPU give the CPU reference's bits (gpu_to_gpu);
//   - ditto-train's data-parallel path with one rank and one group is bitwise the plain trainer,
//     for fixed-order, nccl-default and a pinned NCCL all-reduce;
//   - two ranks on the one GPU (two contexts, the in-process exchange with CUDA events): fixed-order
//     with 4 groups gives the bits of one rank with 4 groups, and ring replays;
//   - synchronized batch norm of two ranks on the GPU against batch norm over the whole batch;
//   - with two or more GPUs visible: 2 ranks on 2 GPUs give 1 rank's bits (skipped otherwise);
//   - ranks as processes (ProcessRank, the NCCL transport; each rank a thread with a group of its
//     own, as a process holds): one rank on one GPU, and with two GPUs two ranks whose byte moves
//     and sums give the in-process bits.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <thread>

#include "engine/collective.h"
#include "engine/collective_ref.h"
#include "engine/context.h"
#include "engine/error.h"
#include "kernels/batchnorm.h"
#include "kernels/sync_batchnorm.h"
#include "dp_support.h"
#include "support.h"
#include "train_support.h"

using namespace ditto;

namespace {

std::vector<float> order_sensitive(int64_t n, uint64_t seed, int k) {
  auto v = test::random_vec(static_cast<std::size_t>(n), seed + k, -1.0, 1.0);
  for (int64_t i = 0; i < n; ++i) v[i] *= std::pow(10.0f, float((k * 7 + i) % 11) - 3.0f);
  return v;
}

TrainConfig gpu_config(const std::string& model, int gpus, int groups) {
  TrainConfig c = test::synthetic_config(model, 512, 128, 32, 64, "cuda");
  c.epochs = 1;
  c.max_steps = 6;
  c.deterministic_init = c.deterministic_input = true;
  c.augment = true;
  c.gpus = gpus;
  c.dp_groups = groups;
  return c;
}

}  // namespace

TEST_CASE("gpu nccl: one rank, default and pinned communicators; an all-reduce over one rank keeps the bits") {
  REQUIRE(RankGroup::nccl_available());
  const char* before = std::getenv("NCCL_NVLS_ENABLE");
  RankGroup group({Device::cuda(0)});
  AllReduceConfig def{AllReduceAlgo::NcclDefault, 0}, ring{AllReduceAlgo::NcclRingSimple, 2};
  group.prepare_nccl({def, ring});
  CHECK_FALSE(group.nccl_version().empty());
  INFO("NCCL " << group.nccl_version());
  REQUIRE(std::getenv("NCCL_NVLS_ENABLE"));
  CHECK(std::string(std::getenv("NCCL_NVLS_ENABLE")) == "0");
  if (before) CHECK(std::string(before) == "0");
  CHECK_FALSE(std::getenv("NCCL_ALGO"));  // set only while the pinned communicator was made
  Context ctx(Device::cuda(0));
  const auto v = order_sensitive(100003, test::fresh_seed(), 1);
  for (const auto& c : {def, ring}) {
    Tensor buf = ctx.from_host(v, {100003});
    group.all_reduce(0, ctx, buf, c);
    const auto out = buf.to_host_f32();
    CHECK(std::memcmp(out.data(), v.data(), v.size() * sizeof(float)) == 0);
  }
}

TEST_CASE("gpu collectives: the tree and the ring give the CPU reference's bits") {
  const uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  Context gpu(Device::cuda(0));
  for (int count : {1, 2, 3, 8, 13, 64}) {
    const int64_t n = 70001;
    std::vector<std::vector<float>> leaves;
    std::vector<Tensor> ts;
    std::vector<const Tensor*> ptrs;
    std::vector<const float*> host;
    for (int k = 0; k < count; ++k) leaves.push_back(order_sensitive(n, seed, k));
    for (const auto& l : leaves) ts.push_back(gpu.from_host(l, {n}));
    for (const auto& t : ts) ptrs.push_back(&t);
    for (const auto& l : leaves) host.push_back(l.data());
    std::vector<float> want(static_cast<std::size_t>(n));
    ref::tree_sum(host.data(), count, n, want.data());
    Tensor out = gpu.empty({n});
    fixed_tree_sum(gpu, ptrs, out);
    CHECK(test::same_bits(out.to_host_f32(), want));
    TreeAccumulator acc;
    for (const auto& l : leaves) acc.push(gpu, gpu.from_host(l, {n}));
    CHECK(test::same_bits(acc.result(gpu).to_host_f32(), want));
  }
}

TEST_CASE("gpu ditto-train: one rank, one group is the plain trainer bitwise, for every all-reduce") {
  for (const char* model : {"smallcnn-bn", "resnet18"}) {
    const auto plain = train(gpu_config(model, 1, 0));
    for (const char* algo : {"fixed-order", "nccl-default", "nccl-ring-simple"}) {
      auto c = gpu_config(model, 1, 1);
      c.pins = {std::string("*.algo=") + algo};
      if (std::string(algo) == "nccl-ring-simple") c.pins.push_back("*.channels=2");
      INFO(model << " " << algo);
      const auto dp = train(c);
      CHECK(dp.weights_fingerprint == plain.weights_fingerprint);
      CHECK(dp.predictions == plain.predictions);
      bool recorded = false;
      for (const auto& e : dp.ops)
        if (e.layer == "bucket0" && e.knob == "algo") recorded = e.variant == algo;
      CHECK(recorded);
    }
    // Four groups on one rank: another order than one pass, and reproducible.
    const auto g4 = train(gpu_config(model, 1, 4));
    CHECK(g4.weights_fingerprint != plain.weights_fingerprint);
    CHECK(train(gpu_config(model, 1, 4)).weights_fingerprint == g4.weights_fingerprint);
  }
}

TEST_CASE("gpu data parallel: two ranks on one GPU give one rank's bits under fixed-order; ring replays") {
  test::Setup s;
  s.device = Device::cuda(0);
  s.model = "smallcnn-bn";
  s.size = 32;
  s.n = 224;
  s.batch = 64;
  s.steps = 5;
  s.dp.groups = 4;
  s.dp.ranks = 1;
  const auto one = test::run(s);
  s.dp.ranks = 2;
  const auto two = test::run(s);
  CHECK(test::same_bits(two.weights, one.weights));
  CHECK(test::same_bits(two.buffers, one.buffers));
  s.dp.ranks = 4;
  CHECK(test::same_bits(test::run(s).weights, one.weights));
  s.policy = {"*=deterministic", "*.algo=ring"};
  const auto ring = test::run(s);
  CHECK(test::same_bits(test::run(s).weights, ring.weights));
  CHECK_FALSE(test::same_bits(ring.weights, one.weights));  // four ranks: the ring's order is not the tree's
}

TEST_CASE("gpu synchronized batch norm: two ranks on one GPU normalize as batch norm over the whole batch") {
  const uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  const int64_t n = 8, c = 16, h = 8, numel = n * c * h * h, half = numel / 2;
  const auto x = test::random_vec(numel, seed, -2, 3), w = test::random_vec(numel, seed + 1);
  const auto gamma = test::random_vec(c, seed + 2, 0.5, 1.5), beta = test::random_vec(c, seed + 3);
  Context whole(Device::cuda(0), Policy::parse({"*=deterministic"}));
  Var xv(whole.from_host(x, {n, c, h, h}), true), gv(whole.from_host(gamma, {c}), true), bv(whole.from_host(beta, {c}), true);
  BatchNormState st = batch_norm_state(whole, c);
  Var y = batch_norm(whole, "bn", xv, gv, bv, st, true);
  whole.tape().backward(whole, y, whole.from_host(w, {n, c, h, h}));
  const auto want_y = y.value().to_host_f32(), want_dx = xv.grad().to_host_f32();

  auto run_sync = [&] {
    auto group = std::make_shared<RankGroup>(std::vector<Device>{Device::cuda(0), Device::cuda(0)});
    std::vector<float> ys(numel), dxs(numel);
    std::vector<std::exception_ptr> err(2);
    std::vector<std::thread> th;
    for (int r = 0; r < 2; ++r)
      th.emplace_back([&, r] {
        try {
          Context ctx(Device::cuda(0), Policy::parse({"*=deterministic", "*.stats=sync"}));
          set_batch_norm_group(ctx, group, r);
          std::vector<float> xs(x.begin() + r * half, x.begin() + (r + 1) * half);
          std::vector<float> ws(w.begin() + r * half, w.begin() + (r + 1) * half);
          Var xr(ctx.from_host(xs, {n / 2, c, h, h}), true);
          Var g(ctx.from_host(gamma, {c}), true), b(ctx.from_host(beta, {c}), true);
          BatchNormState s = batch_norm_state(ctx, c);
          Var yr = batch_norm(ctx, "bn", xr, g, b, s, true);
          ctx.tape().backward(ctx, yr, ctx.from_host(ws, {n / 2, c, h, h}));
          auto yh = yr.value().to_host_f32(), dh = xr.grad().to_host_f32();
          std::copy(yh.begin(), yh.end(), ys.begin() + r * half);
          std::copy(dh.begin(), dh.end(), dxs.begin() + r * half);
          const ManifestEntry* e = ctx.manifest().find("bn", "bwd");
          if (!e || e->variant != "deterministic") throw Error("synchronized batch norm recorded another variant");
        } catch (...) {
          err[r] = std::current_exception();
          group->fail();
        }
      });
    for (auto& t : th) t.join();
    for (auto& e : err)
      if (e) std::rethrow_exception(e);
    return std::make_pair(ys, dxs);
  };
  const auto [ys, dxs] = run_sync();
  // Two float computations of the same statistics (E[x^2] - mean^2 in double vs the centred
  // sums of batch norm's kernels): agreement to a few float ULP of the values' scale.
  for (int64_t i = 0; i < numel; ++i) {
    CHECK(std::fabs(ys[i] - want_y[i]) <= 1e-5 * (1 + std::fabs(want_y[i])));
    CHECK(std::fabs(dxs[i] - want_dx[i]) <= 1e-5 * (1 + std::fabs(want_dx[i])));
  }
  const auto again = run_sync();
  CHECK(test::same_bits(again.first, ys));
  CHECK(test::same_bits(again.second, dxs));
}

TEST_CASE("gpu data parallel on two GPUs: 2 ranks give 1 rank's bits (fixed-order), NCCL runs") {
  if (cuda_device_count() < 2) {
    WARN("one GPU visible: the two-GPU case is left to bench/gpu_pipeline.sh dp-* on a multi-GPU machine");
    return;
  }
  const auto one = train(gpu_config("resnet18", 1, 2));
  const auto two = train(gpu_config("resnet18", 2, 2));
  CHECK(two.weights_fingerprint == one.weights_fingerprint);
  auto nccl = gpu_config("resnet18", 2, 2);
  nccl.pins = {"*.algo=nccl-default"};
  // Two ranks: one addition per element, which commutes: NCCL's sum equals the tree's too.
  CHECK(train(nccl).weights_fingerprint == one.weights_fingerprint);
}

namespace {
std::string fresh_rendezvous(const std::string& name) {
  const std::string dir = test::scratch("gpu_dp", name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}
}  // namespace

TEST_CASE("gpu data parallel, ranks as processes: the NCCL transport of one rank, and of two on two GPUs") {
  REQUIRE(RankGroup::nccl_available());
  const uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  const int64_t n = 1001;
  AllReduceConfig fixed{}, def{AllReduceAlgo::NcclDefault, 0};
  {
    // One rank: its communicators are made through the rendezvous folder and leave the bits alone.
    RankGroup one(Device::cuda(0), ProcessRank{0, 1, fresh_rendezvous("one"), 60});
    one.prepare_nccl({fixed, def});
    CHECK_FALSE(one.nccl_version().empty());
    Context ctx(Device::cuda(0));
    const auto v = order_sensitive(n, seed, 0);
    Tensor a = ctx.from_host(v, {n}), b = ctx.from_host(v, {n}), c = ctx.from_host(v, {n});
    one.all_reduce(0, ctx, a, fixed);
    one.all_reduce(0, ctx, b, def);
    one.broadcast(0, ctx, c, 0);
    one.barrier(0);
    CHECK(test::same_bits(a.to_host_f32(), v));
    CHECK(test::same_bits(b.to_host_f32(), v));
    CHECK(test::same_bits(c.to_host_f32(), v));
  }
  if (cuda_device_count() < 2) {
    WARN("one GPU visible: two ranks as processes need two GPUs (NCCL takes one rank per GPU)");
    return;
  }
  const std::string dir = fresh_rendezvous("two");
  const std::vector<std::vector<float>> leaves = {order_sensitive(n, seed, 1), order_sensitive(n, seed, 2)};
  std::vector<const float*> ptrs = {leaves[0].data(), leaves[1].data()};
  std::vector<float> want(static_cast<std::size_t>(n));
  ref::tree_sum(ptrs.data(), 2, n, want.data());
  std::vector<std::vector<float>> fixed_sum(2), nccl_sum(2), gathered(2), broadcast(2);
  std::vector<std::exception_ptr> errors(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      try {
        RankGroup group(Device::cuda(r), ProcessRank{r, 2, dir, 120});
        group.prepare_nccl({fixed, def});
        Context ctx(Device::cuda(r));
        Tensor a = ctx.from_host(leaves[r], {n}), b = ctx.from_host(leaves[r], {n});
        Tensor all = ctx.empty({2 * n}), c = ctx.from_host(leaves[r], {n});
        group.all_reduce(r, ctx, a, fixed);
        group.all_reduce(r, ctx, b, def);
        group.all_gather(r, ctx, ctx.from_host(leaves[r], {n}), all);
        group.broadcast(r, ctx, c, 1);
        group.barrier(r);
        fixed_sum[r] = a.to_host_f32();
        nccl_sum[r] = b.to_host_f32();
        gathered[r] = all.to_host_f32();
        broadcast[r] = c.to_host_f32();
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  std::vector<float> both(leaves[0]);
  both.insert(both.end(), leaves[1].begin(), leaves[1].end());
  for (int r = 0; r < 2; ++r) {
    CHECK(test::same_bits(fixed_sum[r], want));  // the tree's bits, as in one process
    CHECK(test::same_bits(nccl_sum[r], want));   // two ranks: one addition per element, which commutes
    CHECK(test::same_bits(gathered[r], both));
    CHECK(test::same_bits(broadcast[r], leaves[1]));
  }
}
