// The collectives of engine/collective.h on simulated CPU ranks (one thread each): the tree's
// order and its subtree property, the exchanges, the all-reduce variants (fixed-order the same
// bits for every rank count, ring following it), the all-reduce knob in the policy and the
// manifest, failure propagation, and synchronized batch norm against batch norm over the whole
// batch, with a central-difference check of its gradient in double. The same collectives between
// ranks that are processes (ProcessRank: the file transport, each rank here a thread with a group
// of its own, as a process would hold) give the same bits, and refuse mismatched calls, a rank
// that never comes and a rank that failed.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <thread>

#include "engine/collective.h"
#include "engine/collective_ref.h"
#include "engine/context.h"
#include "engine/detail/process_link.h"
#include "engine/error.h"
#include "kernels/batchnorm.h"
#include "kernels/batchnorm_ref.h"
#include "kernels/sync_batchnorm.h"
#include "kernels/sync_batchnorm_ref.h"
#include "support.h"
#include "train_support.h"
#include "kernels/conv2d.h"

using namespace ditto;

namespace {

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Runs fn(rank) on `ranks` threads; rethrows the first error (by rank).
void on_ranks(int ranks, const std::function<void(int)>& fn) {
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(ranks));
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r)
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

// Leaves whose sum depends on the order of the additions: magnitudes from 1e-3 to 1e7.
std::vector<std::vector<float>> order_sensitive_leaves(int count, int64_t n, uint64_t seed) {
  std::vector<std::vector<float>> leaves;
  for (int k = 0; k < count; ++k) {
    auto v = test::random_vec(static_cast<std::size_t>(n), seed + k, -1.0, 1.0);
    for (int64_t i = 0; i < n; ++i) v[i] *= std::pow(10.0f, float((k * 7 + i) % 11) - 3.0f);
    leaves.push_back(v);
  }
  return leaves;
}

std::vector<float> tree_of(const std::vector<std::vector<float>>& leaves) {
  std::vector<const float*> ptrs;
  for (const auto& l : leaves) ptrs.push_back(l.data());
  std::vector<float> out(leaves[0].size());
  ref::tree_sum(ptrs.data(), static_cast<int64_t>(ptrs.size()), static_cast<int64_t>(out.size()), out.data());
  return out;
}

// A fresh rendezvous folder for a group whose ranks are processes.
std::string rendezvous(const std::string& name) {
  const std::string dir = test::scratch("collective", name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// Each of `ranks` ranks sums its share of the leaves in a TreeAccumulator, then all-reduces: in
// one group, or (with a rendezvous folder) each rank in a group of its own, as processes are.
std::vector<std::vector<float>> reduce_on_ranks(const std::vector<std::vector<float>>& leaves, int ranks,
                                                AllReduceAlgo algo, const std::string& rendezvous_dir = "") {
  RankGroup shared(std::vector<Device>(static_cast<std::size_t>(ranks), Device::cpu()));
  const int per = static_cast<int>(leaves.size()) / ranks;
  std::vector<std::vector<float>> out(static_cast<std::size_t>(ranks));
  AllReduceConfig config;
  config.algo = algo;
  on_ranks(ranks, [&](int r) {
    std::unique_ptr<RankGroup> own;
    if (!rendezvous_dir.empty())
      own = std::make_unique<RankGroup>(Device::cpu(), ProcessRank{r, ranks, rendezvous_dir, 30});
    RankGroup& group = own ? *own : shared;
    Context ctx;
    TreeAccumulator acc;
    for (int j = 0; j < per; ++j) {
      const auto& l = leaves[r * per + j];
      acc.push(ctx, ctx.from_host(l, {static_cast<int64_t>(l.size())}));
    }
    Tensor sum = acc.result(ctx);
    group.all_reduce(r, ctx, sum, config);
    out[r] = sum.to_host_f32();
  });
  return out;
}

// Rank r of `ranks` all-gathers and all-to-alls 2 * ranks floats (100 r + q) and checks what came.
void check_chunks_move(RankGroup& group, Context& ctx, int r, int ranks) {
  std::vector<float> mine(static_cast<std::size_t>(ranks) * 2);
  for (int q = 0; q < ranks * 2; ++q) mine[q] = float(100 * r + q);
  Tensor send = ctx.from_host(mine, {ranks * 2});
  Tensor gathered = ctx.empty({ranks * ranks * 2}), swapped = ctx.empty({ranks * 2});
  group.all_gather(r, ctx, send, gathered);
  group.all_to_all(r, ctx, send, swapped);
  const auto g = gathered.to_host_f32(), s = swapped.to_host_f32();
  for (int q = 0; q < ranks; ++q)
    for (int i = 0; i < ranks * 2; ++i) CHECK(g[q * ranks * 2 + i] == float(100 * q + i));
  // Chunk q of swapped is chunk r of rank q's send.
  for (int q = 0; q < ranks; ++q)
    for (int i = 0; i < 2; ++i) CHECK(s[q * 2 + i] == float(100 * q + r * 2 + i));
}

}  // namespace

TEST_CASE("tree sum: the binary-counter order, by hand") {
  // Floats where a + b + c differs by association: 1e8, 1, -1e8, 1.
  const std::vector<float> v = {1e8f, 1.f, -1e8f, 1.f, 3.f};
  auto tree = [&](int count) {
    std::vector<const float*> ptrs;
    for (int k = 0; k < count; ++k) ptrs.push_back(&v[k]);
    float out = 0;
    ref::tree_sum(ptrs.data(), count, 1, &out);
    return out;
  };
  CHECK(tree(1) == 1e8f);
  CHECK(tree(2) == 1e8f + 1.f);
  CHECK(tree(3) == (1e8f + 1.f) + -1e8f);                     // the odd leaf joins at the end
  CHECK(tree(4) == (1e8f + 1.f) + (-1e8f + 1.f));             // pairs, then the pair of pairs
  CHECK(tree(5) == ((1e8f + 1.f) + (-1e8f + 1.f)) + 3.f);
  // Not a left fold: ((1e8 + 1) - 1e8) + 1 = 1 in float, the tree gives 0.
  CHECK(tree(4) == 0.f);
  CHECK(((1e8f + 1.f) + -1e8f) + 1.f == 1.f);
}

TEST_CASE("tree sum: K subtrees of a power-of-two size are the tree over all leaves") {
  const uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  for (int groups : {1, 2, 4, 8, 12, 16}) {
    const auto leaves = order_sensitive_leaves(groups, 257, seed + groups);
    const auto whole = tree_of(leaves);
    for (int ranks = 1; ranks <= groups; ++ranks) {
      if (groups % ranks) continue;
      const int per = groups / ranks;
      if (ranks > 1 && (per & (per - 1))) continue;  // the property needs a power of two per rank
      std::vector<std::vector<float>> partials;
      for (int r = 0; r < ranks; ++r)
        partials.push_back(tree_of({leaves.begin() + r * per, leaves.begin() + (r + 1) * per}));
      INFO(groups << " groups over " << ranks << " ranks");
      CHECK(same_bits(tree_of(partials), whole));
    }
  }
  // A left fold is another order: for order-sensitive data it differs somewhere.
  const auto leaves = order_sensitive_leaves(8, 257, seed);
  std::vector<float> fold = leaves[0];
  for (int k = 1; k < 8; ++k)
    for (std::size_t i = 0; i < fold.size(); ++i) fold[i] += leaves[k][i];
  CHECK_FALSE(same_bits(fold, tree_of(leaves)));
}

TEST_CASE("TreeAccumulator and fixed_tree_sum give ref::tree_sum's bits") {
  const uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  Context ctx;
  for (int count : {1, 2, 3, 5, 8, 13}) {
    const auto leaves = order_sensitive_leaves(count, 100, seed);
    std::vector<Tensor> ts;
    std::vector<const Tensor*> ptrs;
    for (const auto& l : leaves) ts.push_back(ctx.from_host(l, {100}));
    for (const auto& t : ts) ptrs.push_back(&t);
    Tensor out = ctx.empty({100});
    fixed_tree_sum(ctx, ptrs, out);
    CHECK(same_bits(out.to_host_f32(), tree_of(leaves)));
    TreeAccumulator acc;
    for (const auto& l : leaves) acc.push(ctx, ctx.from_host(l, {100}));
    CHECK(acc.leaves() == count);
    CHECK(same_bits(acc.result(ctx).to_host_f32(), tree_of(leaves)));
    CHECK(acc.leaves() == 0);
  }
  TreeAccumulator empty;
  CHECK_FALSE(empty.result(ctx).defined());
  Tensor out = ctx.empty({4});
  CHECK_THROWS_AS(fixed_tree_sum(ctx, {}, out), Error);
  Tensor wrong = ctx.empty({3});
  CHECK_THROWS_AS(fixed_tree_sum(ctx, {&wrong}, out), ShapeError);
  CHECK_THROWS_AS(fixed_tree_sum(ctx, {&out}, out), Error);  // aliasing
}

TEST_CASE("rank group: all_gather and all_to_all move the right chunks") {
  for (int ranks : {1, 2, 3, 4}) {
    RankGroup group(std::vector<Device>(ranks, Device::cpu()));
    CHECK(group.size() == ranks);
    on_ranks(ranks, [&](int r) {
      Context ctx;
      check_chunks_move(group, ctx, r, ranks);
    });
  }
}

TEST_CASE("all-reduce fixed-order: the same bits for 1, 2, 4 and 8 ranks, and on every rank") {
  const uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  for (int64_t n : {1, 7, 1000, 4099}) {
    const auto leaves = order_sensitive_leaves(8, n, seed + n);
    const auto want = tree_of(leaves);
    for (int ranks : {1, 2, 4, 8}) {
      INFO(n << " elements, " << ranks << " ranks");
      const auto got = reduce_on_ranks(leaves, ranks, AllReduceAlgo::FixedOrder);
      for (const auto& g : got) CHECK(same_bits(g, want));
    }
  }
}

TEST_CASE("all-reduce ring: the ring's order, the same on every rank, and rank-count dependent") {
  const uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  const int64_t n = 999;
  const auto leaves = order_sensitive_leaves(4, n, seed);
  // Four ranks with one leaf each: ring reference.
  const auto ring4 = reduce_on_ranks(leaves, 4, AllReduceAlgo::Ring);
  for (const auto& g : ring4) CHECK(same_bits(g, ref::ring_all_reduce(leaves)));
  // Two ranks: one addition per element, which commutes: ring equals the tree.
  const auto ring2 = reduce_on_ranks(leaves, 2, AllReduceAlgo::Ring);
  for (const auto& g : ring2) CHECK(same_bits(g, tree_of(leaves)));
  // From three ranks on the order differs from the tree's somewhere.
  CHECK_FALSE(same_bits(ring4[0], tree_of(leaves)));
}

TEST_CASE("all-reduce: NCCL variants need CUDA ranks; a failing rank stops the others") {
  RankGroup cpu(std::vector<Device>(2, Device::cpu()));
  AllReduceConfig nccl;
  nccl.algo = AllReduceAlgo::NcclDefault;
  const std::string msg = test::error_of([&] { cpu.prepare_nccl({nccl}); });
  CHECK(msg.find("NCCL needs CUDA devices") != std::string::npos);
  CHECK_NOTHROW(cpu.prepare_nccl({AllReduceConfig{}}));  // fixed-order needs no NCCL
  Context ctx;
  Tensor buf = ctx.zeros({4});
  CHECK(test::error_of([&] { cpu.all_reduce(0, ctx, buf, nccl); }).find("no NCCL communicator") != std::string::npos);
  CHECK_THROWS_AS(RankGroup({Device::cpu(), Device::cuda(0)}), Error);
  CHECK_THROWS_AS(RankGroup({}), Error);

  // Rank 1 fails before the collective: rank 0, waiting in it, is released with an error.
  RankGroup group(std::vector<Device>(2, Device::cpu()));
  std::string rank0;
  on_ranks(2, [&](int r) {
    Context c;
    Tensor t = c.zeros({8});
    if (r == 1) {
      group.fail();
      return;
    }
    rank0 = test::error_of([&] { group.all_reduce(0, c, t, AllReduceConfig{}); });
  });
  CHECK(rank0.find("stopped: another rank failed") == 0);
  CHECK(group.failed());
}

TEST_CASE("all-reduce knob: policy, mode words, channels, manifest and guarantees") {
  Policy p = Policy::parse({"*=deterministic"});
  CHECK(p.variant<AllReduceAlgo>("bucket0", op::allreduce) == AllReduceAlgo::FixedOrder);
  p = Policy::parse({"*=heuristic"});
  CHECK(p.variant<AllReduceAlgo>("bucket0", op::allreduce) == AllReduceAlgo::NcclDefault);
  p = Policy::parse({"*=nondeterministic"});
  CHECK(p.variant<AllReduceAlgo>("bucket0", op::allreduce) == AllReduceAlgo::NcclDefault);
  p = Policy::parse({"*=deterministic", "bucket1.algo=nccl-tree-ll128", "bucket1.channels=4", "bucket2.algo=ring"});
  CHECK(p.variant<AllReduceAlgo>("bucket0", op::allreduce) == AllReduceAlgo::FixedOrder);
  CHECK(p.variant<AllReduceAlgo>("bucket2", op::allreduce) == AllReduceAlgo::Ring);
  const AllReduceConfig c1 = allreduce_config(p, "bucket1");
  CHECK(c1.algo == AllReduceAlgo::NcclTreeLl128);
  CHECK(c1.channels == 4);
  CHECK(c1.nccl_algo() == "Tree");
  CHECK(c1.nccl_proto() == "LL128");
  CHECK(c1.str() == "nccl-tree-ll128/4ch");
  CHECK(allreduce_config(p, "bucket0").str() == "fixed-order");
  CHECK_THROWS_AS(Policy::parse({"bucket0.algo=nccl-nvls"}), PolicyError);
  CHECK_THROWS_AS(Policy::parse({"bucket0.channels=3"}), PolicyError);
  // Channels belong to a pinned nccl-* only.
  Policy bad = Policy::parse({"*=deterministic", "bucket0.channels=8"});
  CHECK(test::error_of([&] { allreduce_config(bad, "bucket0"); }).find("channels=8 is pinned") != std::string::npos);
  // The bucket is a layer the policy checks like any other.
  CHECK_NOTHROW(p.check_layers({{"bucket0", op::allreduce}, {"bucket1", op::allreduce}, {"bucket2", op::allreduce}}));
  CHECK_THROWS_AS(Policy::parse({"bucket0.algo=ring"}).check_layers({{"bucket0", op::conv2d}}), PolicyError);

  CHECK(allreduce_guarantee({AllReduceAlgo::FixedOrder, 0}) == Guarantee::GpuToGpu);
  CHECK(allreduce_guarantee({AllReduceAlgo::Ring, 0}) == Guarantee::GpuToGpu);
  CHECK(allreduce_guarantee({AllReduceAlgo::NcclRingSimple, 2}) == Guarantee::RunToRun);
  CHECK(allreduce_guarantee({AllReduceAlgo::NcclDefault, 0}) == Guarantee::Unknown);
  Context ctx;
  record_allreduce(ctx, "bucket1", c1, p);
  record_allreduce(ctx, "bucket0", allreduce_config(p, "bucket0"), p);
  const ManifestEntry* e = ctx.manifest().find("bucket1", "algo");
  REQUIRE(e);
  CHECK(e->op == "allreduce");
  CHECK(e->variant == "nccl-tree-ll128");
  CHECK(e->requested == "pinned");
  CHECK(e->guarantee == Guarantee::RunToRun);
  const ManifestEntry* ch = ctx.manifest().find("bucket1", "channels");
  REQUIRE(ch);
  CHECK(ch->variant == "4");
  CHECK(ctx.manifest().find("bucket0", "algo")->requested == "deterministic");
  CHECK_FALSE(ctx.manifest().find("bucket0", "channels"));
  // The knob's nondeterministic variant is the noise lab's candidate.
  for (const auto& k : knobs())
    if (k.op == op::allreduce && k.name == "algo") CHECK(k.nondeterministic() == std::vector<std::string>{"nccl-default"});
}

TEST_CASE("copy_elements: ranges, bounds") {
  Context ctx;
  Tensor a = ctx.from_host(std::vector<float>{1, 2, 3, 4, 5}, {5}), b = ctx.zeros({4});
  copy_elements(ctx, b, 1, a, 2, 3);
  CHECK(b.to_host_f32() == std::vector<float>{0, 3, 4, 5});
  CHECK_THROWS_AS(copy_elements(ctx, b, 2, a, 0, 3), ShapeError);
  CHECK_THROWS_AS(copy_elements(ctx, b, 0, a, 3, 3), ShapeError);
  Tensor i = ctx.zeros({4}, DType::I32);
  CHECK_THROWS_AS(copy_elements(ctx, i, 0, a, 0, 1), ShapeError);
}

namespace {
// Synchronized batch norm over `ranks` CPU ranks, each with its rows of x (N x C x H x W): y and dx
// for the upstream gradient w, stitched back in row order, and the ranks' dgamma / dbeta summed.
struct SyncResult {
  std::vector<float> y, dx, dgamma, dbeta, running_mean, running_var;
};
SyncResult sync_bn(int ranks, const std::vector<float>& x, const std::vector<float>& w, int64_t n, int64_t c,
                   int64_t h, const std::vector<float>& gamma, const std::vector<float>& beta) {
  auto group = std::make_shared<RankGroup>(std::vector<Device>(ranks, Device::cpu()));
  const int64_t per_row = c * h * h;
  SyncResult out;
  out.y.resize(x.size());
  out.dx.resize(x.size());
  std::vector<std::vector<float>> dg(ranks), db(ranks), rm(ranks), rv(ranks);
  on_ranks(ranks, [&](int r) {
    Context ctx(Device::cpu(), Policy::parse({"*.stats=sync"}));
    set_batch_norm_group(ctx, group, r);
    const int64_t lo = r * n / ranks, hi = (r + 1) * n / ranks;
    std::vector<float> xs(x.begin() + lo * per_row, x.begin() + hi * per_row);
    std::vector<float> ws(w.begin() + lo * per_row, w.begin() + hi * per_row);
    Var xv(ctx.from_host(xs, {hi - lo, c, h, h}), true);
    Var gv(ctx.from_host(gamma, {c}), true), bv(ctx.from_host(beta, {c}), true);
    BatchNormState st = batch_norm_state(ctx, c);
    Var y = batch_norm(ctx, "bn", xv, gv, bv, st, true);
    ctx.tape().backward(ctx, y, ctx.from_host(ws, {hi - lo, c, h, h}));
    auto yh = y.value().to_host_f32(), dxh = xv.grad().to_host_f32();
    std::copy(yh.begin(), yh.end(), out.y.begin() + lo * per_row);
    std::copy(dxh.begin(), dxh.end(), out.dx.begin() + lo * per_row);
    dg[r] = gv.grad().to_host_f32();
    db[r] = bv.grad().to_host_f32();
    rm[r] = st.running_mean.to_host_f32();
    rv[r] = st.running_var.to_host_f32();
    const ManifestEntry* e = ctx.manifest().find("bn", "bwd");
    REQUIRE(e);
    CHECK(e->variant == "cpu-reference");
  });
  out.dgamma.assign(c, 0.f);
  out.dbeta.assign(c, 0.f);
  for (int r = 0; r < ranks; ++r)
    for (int64_t k = 0; k < c; ++k) {
      out.dgamma[k] += dg[r][k];
      out.dbeta[k] += db[r][k];
      CHECK(rm[r] == rm[0]);  // every rank keeps the same running statistics
      CHECK(rv[r] == rv[0]);
    }
  out.running_mean = rm[0];
  out.running_var = rv[0];
  return out;
}
}  // namespace

TEST_CASE("synchronized batch norm: K ranks normalize as batch norm over the whole batch") {
  const uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  const int64_t n = 6, c = 3, h = 3, numel = n * c * h * h;
  const auto x = test::random_vec(numel, seed, -2, 3), w = test::random_vec(numel, seed + 1);
  const auto gamma = test::random_vec(c, seed + 2, 0.5, 1.5), beta = test::random_vec(c, seed + 3);
  // The reference: batch_norm on one context over all rows.
  Context ctx;
  Var xv(ctx.from_host(x, {n, c, h, h}), true), gv(ctx.from_host(gamma, {c}), true), bv(ctx.from_host(beta, {c}), true);
  BatchNormState st = batch_norm_state(ctx, c);
  Var y = batch_norm(ctx, "bn", xv, gv, bv, st, true);
  ctx.tape().backward(ctx, y, ctx.from_host(w, {n, c, h, h}));
  const auto want_y = y.value().to_host_f32(), want_dx = xv.grad().to_host_f32();
  const auto want_dg = gv.grad().to_host_f32(), want_db = bv.grad().to_host_f32();
  const auto want_rm = st.running_mean.to_host_f32(), want_rv = st.running_var.to_host_f32();
  // float results of two double computations (E[x^2] - mean^2 vs the centred sum): a few ULP.
  auto close = [](const std::vector<float>& a, const std::vector<float>& b, double tol) {
    REQUIRE(a.size() == b.size());
    for (std::size_t i = 0; i < a.size(); ++i) CHECK(std::fabs(a[i] - b[i]) <= tol * (1 + std::fabs(b[i])));
  };
  for (int ranks : {1, 2, 3}) {
    INFO(ranks << " ranks");
    const SyncResult s = sync_bn(ranks, x, w, n, c, h, gamma, beta);
    close(s.y, want_y, 1e-5);
    close(s.dx, want_dx, 1e-5);
    close(s.dgamma, want_dg, 1e-5);
    close(s.dbeta, want_db, 1e-5);
    close(s.running_mean, want_rm, 1e-6);
    close(s.running_var, want_rv, 1e-5);
    // Reproducible for a rank count.
    const SyncResult again = sync_bn(ranks, x, w, n, c, h, gamma, beta);
    CHECK(same_bits(again.y, s.y));
    CHECK(same_bits(again.dx, s.dx));
  }
  // Inference mode is batch norm's own (the running statistics), synchronized or not.
  auto group = std::make_shared<RankGroup>(std::vector<Device>(1, Device::cpu()));
  Context one(Device::cpu(), Policy::parse({"*.stats=sync"}));
  set_batch_norm_group(one, group, 0);
  CHECK(has_batch_norm_group(one));
  BatchNormState s2 = batch_norm_state(one, c);
  Var yi = batch_norm(one, "bn", Var(one.from_host(x, {n, c, h, h})), Var(one.from_host(gamma, {c})),
                      Var(one.from_host(beta, {c})), s2, false);
  Context plain;
  BatchNormState s3 = batch_norm_state(plain, c);
  Var yp = batch_norm(plain, "bn", Var(plain.from_host(x, {n, c, h, h})), Var(plain.from_host(gamma, {c})),
                      Var(plain.from_host(beta, {c})), s3, false);
  CHECK(same_bits(yi.value().to_host_f32(), yp.value().to_host_f32()));
  // The knob decides; the group only says whom to merge with. stats=sync without one is an error
  // naming the layer; a group with stats=local changes nothing.
  set_batch_norm_group(one, nullptr, 0);
  CHECK_FALSE(has_batch_norm_group(one));
  BatchNormState s4 = batch_norm_state(one, c);
  CHECK_THROWS_WITH(batch_norm(one, "bn", Var(one.from_host(x, {n, c, h, h})), Var(one.from_host(gamma, {c})),
                               Var(one.from_host(beta, {c})), s4, true),
                    Catch::Matchers::Contains("layer 'bn'") && Catch::Matchers::Contains("stats=sync"));
  Context local;
  set_batch_norm_group(local, group, 0);
  BatchNormState s5 = batch_norm_state(local, c), s6 = batch_norm_state(plain, c);
  Var yl = batch_norm(local, "bn", Var(local.from_host(x, {n, c, h, h})), Var(local.from_host(gamma, {c})),
                      Var(local.from_host(beta, {c})), s5, true);
  Var yq = batch_norm(plain, "bn", Var(plain.from_host(x, {n, c, h, h})), Var(plain.from_host(gamma, {c})),
                      Var(plain.from_host(beta, {c})), s6, true);
  CHECK(same_bits(yl.value().to_host_f32(), yq.value().to_host_f32()));
  CHECK(local.manifest().find("bn", "stats")->variant == std::string("local"));
  CHECK_THROWS_AS(set_batch_norm_group(one, group, 1), Error);
}

TEST_CASE("synchronized batch norm: central-difference gradient check in double over two ranks") {
  const uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  const int64_t c = 2, hw = 3, n0 = 2, n1 = 3, n = n0 + n1;
  const auto x0 = test::to_double(test::random_vec<double>(n * c * hw, seed, -1, 2));
  const auto gamma = test::random_vec<double>(c, seed + 1, 0.5, 1.5), beta = test::random_vec<double>(c, seed + 2);
  const auto w = test::loss_weights(n * c * hw, seed);
  const double eps = 1e-5;
  // The two ranks' forward, composed from the reference pieces as sync_batch_norm runs them.
  auto forward = [&](const std::vector<double>& x, std::vector<double>& y, std::vector<double>& mean,
                     std::vector<double>& invstd) {
    std::vector<double> records(2 * (2 * c + 1)), merged(2 * c + 1);
    ref::sbn_local_sums(x.data(), n0, c, hw, records.data());
    ref::sbn_local_sums(x.data() + n0 * c * hw, n1, c, hw, records.data() + 2 * c + 1);
    ref::sbn_merge(records.data(), 2, 2 * c + 1, merged.data());
    mean.assign(c, 0);
    invstd.assign(c, 0);
    ref::sbn_stats<double>(merged.data(), c, 0.1, eps, mean.data(), invstd.data(), nullptr, nullptr);
    y.assign(x.size(), 0);
    ref::bn_apply(x.data(), mean.data(), invstd.data(), gamma.data(), beta.data(), y.data(), n, c, hw);
  };
  auto loss = [&](const std::vector<double>& x) {
    std::vector<double> y, m, s;
    forward(x, y, m, s);
    return test::weighted_sum(y, w);
  };
  std::vector<double> y, mean, invstd;
  forward(x0, y, mean, invstd);
  // Backward: each rank's sums, merged, then dx with the global count.
  std::vector<double> sums0(2 * c), sums1(2 * c), packs(4 * c), merged(2 * c), dx(x0.size());
  std::vector<double> unused_dx;
  ref::bn_bwd(x0.data(), w.data(), mean.data(), invstd.data(), gamma.data(), true, static_cast<double*>(nullptr),
              sums0.data() + c, sums0.data(), n0, c, hw);
  ref::bn_bwd(x0.data() + n0 * c * hw, w.data() + n0 * c * hw, mean.data(), invstd.data(), gamma.data(), true,
              static_cast<double*>(nullptr), sums1.data() + c, sums1.data(), n1, c, hw);
  std::copy(sums0.begin(), sums0.end(), packs.begin());
  std::copy(sums1.begin(), sums1.end(), packs.begin() + 2 * c);
  ref::sbn_merge(packs.data(), 2, 2 * c, merged.data());
  ref::sbn_bwd_dx(x0.data(), w.data(), mean.data(), invstd.data(), gamma.data(), merged.data(), merged.data() + c,
                  double(n * hw), dx.data(), n0, c, hw);
  ref::sbn_bwd_dx(x0.data() + n0 * c * hw, w.data() + n0 * c * hw, mean.data(), invstd.data(), gamma.data(),
                  merged.data(), merged.data() + c, double(n * hw), dx.data() + n0 * c * hw, n1, c, hw);
  CHECK(test::gradcheck(loss, x0, dx) < 1e-6);
}

TEST_CASE("ranks as processes: the file transport moves the same chunks and gives the same all-reduce bits") {
  for (int ranks : {1, 2, 3, 4}) {
    INFO(ranks << " ranks");
    const std::string dir = rendezvous("moves" + std::to_string(ranks));
    on_ranks(ranks, [&](int r) {
      RankGroup group(Device::cpu(), ProcessRank{r, ranks, dir, 30});
      CHECK(group.size() == ranks);
      CHECK(group.spans_processes());
      CHECK(group.holds(r));
      if (ranks > 1) CHECK_FALSE(group.holds((r + 1) % ranks));
      Context ctx;
      check_chunks_move(group, ctx, r, ranks);
      Tensor b = ctx.from_host(std::vector<float>{float(r), float(r)}, {2});
      group.broadcast(r, ctx, b, ranks - 1);
      group.barrier(r);
      CHECK(b.to_host_f32() == std::vector<float>{float(ranks - 1), float(ranks - 1)});
      if (ranks > 1)
        CHECK(test::error_of([&] { group.barrier((r + 1) % ranks); }).find("held by another process") !=
              std::string::npos);
    });
    // At most the last meeting's files and each rank's leaving mark stay behind.
    int files = 0;
    for (const auto& e : std::filesystem::directory_iterator(dir)) files += e.is_regular_file() ? 1 : 0;
    CHECK(files <= 2 * ranks);
  }
  const uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  const auto leaves = order_sensitive_leaves(8, 1001, seed);
  for (int ranks : {2, 4, 8})
    for (AllReduceAlgo algo : {AllReduceAlgo::FixedOrder, AllReduceAlgo::Ring}) {
      INFO(ranks << " ranks, " << name_of(algo));
      const auto threads = reduce_on_ranks(leaves, ranks, algo);
      const auto processes = reduce_on_ranks(leaves, ranks, algo, rendezvous("reduce"));
      for (int r = 0; r < ranks; ++r) CHECK(same_bits(processes[r], threads[r]));
      if (algo == AllReduceAlgo::FixedOrder) CHECK(same_bits(processes[0], tree_of(leaves)));
    }
}

TEST_CASE("ranks as processes: mismatched calls, a missing rank and a failed rank are errors that say so") {
  // Rank 1 offers fewer bytes than rank 0: both refuse, naming the sizes (however the two
  // interleave: the rank that reads the other's part second must not see only the failure).
  for (int attempt = 0; attempt < 40; ++attempt) {
    INFO("attempt " << attempt);
    const std::string dir = rendezvous("mismatch");
    std::vector<std::string> errors(2);
    on_ranks(2, [&](int r) {
      RankGroup group(Device::cpu(), ProcessRank{r, 2, dir, 30});
      Context ctx;
      Tensor send = ctx.zeros({r == 0 ? 4 : 2}), recv = ctx.empty({r == 0 ? 8 : 4});
      errors[r] = test::error_of([&] { group.all_gather(r, ctx, send, recv); });
      group.fail(errors[r]);
    });
    CHECK(errors[0].find("rank 1 offered 8 bytes") != std::string::npos);
    CHECK(errors[1].find("rank 0 offered 16 bytes") != std::string::npos);
  }
  // A part written before its writer failed is still read (the writer's failure came from what it
  // read after offering it, and the reader must reach the same verdict); an absent one is a stop.
  {
    const std::string dir = rendezvous("written-then-failed");
    detail::write_rendezvous_file(dir, "x1.r0", "part");
    detail::write_rendezvous_file(dir, "failed.r0", "sizes differ");
    CHECK(detail::wait_rendezvous_file(dir, "x1.r0", 5, "rank 0's part") == "part");
    CHECK(test::error_of([&] { detail::wait_rendezvous_file(dir, "x2.r0", 5, "rank 0's part"); })
              .find("stopped: rank 0 failed: sizes differ") == 0);
  }
  // Rank 1 never comes: rank 0 gives up after the timeout, naming the file and the rank.
  {
    const std::string dir = rendezvous("missing");
    const std::string msg = test::error_of([&] { RankGroup group(Device::cpu(), ProcessRank{0, 2, dir, 0.3}); });
    CHECK(msg.find("rank 1's part of exchange 0") != std::string::npos);
    CHECK(msg.find("x0.r1") != std::string::npos);
  }
  // Rank 1 fails after the first meeting: rank 0, waiting at the next, stops with its reason.
  {
    const std::string dir = rendezvous("failed");
    std::string rank0;
    on_ranks(2, [&](int r) {
      RankGroup group(Device::cpu(), ProcessRank{r, 2, dir, 30});
      if (r == 1) {
        group.fail("rank 1's loader ran out of batches");
        return;
      }
      Context ctx;
      Tensor t = ctx.zeros({8});
      rank0 = test::error_of([&] { group.all_reduce(0, ctx, t, AllReduceConfig{}); });
      group.fail(rank0);
    });
    CHECK(rank0.find("stopped: rank 1 failed: rank 1's loader ran out of batches") == 0);
  }
  // The folder must exist, the rank must be in the world; CPU ranks have no NCCL.
  CHECK_THROWS_AS(RankGroup(Device::cpu(), ProcessRank{0, 2, test::scratch("collective", "absent"), 1}), Error);
  CHECK_THROWS_AS(RankGroup(Device::cpu(), ProcessRank{2, 2, rendezvous("bad-rank"), 1}), Error);
  RankGroup one(Device::cpu(), ProcessRank{0, 1, rendezvous("nccl"), 1});
  AllReduceConfig nccl;
  nccl.algo = AllReduceAlgo::NcclDefault;
  CHECK(test::error_of([&] { one.prepare_nccl({nccl}); }).find("NCCL needs CUDA devices") != std::string::npos);
}
