// Evaluation counts on the GPU (kernels/metrics.cu: per-block cub::BlockReduce hit counts, then
// one integer atomicAdd per block): equal to the same counts computed on the CPU context, for
// batch sizes that are and are not multiples of the 128-row block, with ties, and accumulated
// over several calls; and top-k equal to the CPU's.
#include <catch2/catch.hpp>

#include "engine/context.h"
#include "kernels/metrics.h"
#include "support.h"

using namespace ditto;

namespace {

std::vector<int32_t> counts_on(Context& ctx, const std::vector<float>& logits, const std::vector<int32_t>& labels,
                               int64_t n, int64_t c, int calls) {
  Tensor x = ctx.from_host(logits, {n, c});
  Tensor y = ctx.from_host(labels, {n});
  Tensor counts = ctx.zeros({2}, DType::I32);
  for (int i = 0; i < calls; ++i) accumulate_correct(ctx, x, y, counts);
  return counts.to_host_i32();
}

}  // namespace

TEST_CASE("gpu metrics: correct counts and top-k equal the CPU's") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  Context cpu(Device::cpu()), gpu(Device::cuda(0));
  for (auto [n, c] : {std::pair<int64_t, int64_t>{1, 10}, {127, 10}, {128, 3}, {1000, 10}, {4097, 100}}) {
    INFO("N " << n << " C " << c);
    auto logits = test::random_vec(std::size_t(n * c), seed);
    // Ties: in every third row the first two classes share the largest value.
    for (int64_t r = 0; r < n; r += 3) logits[std::size_t(r * c)] = logits[std::size_t(r * c + 1)] = 2.f;
    std::mt19937_64 g(seed + 1);
    std::vector<int32_t> labels(static_cast<std::size_t>(n));
    for (auto& l : labels) l = static_cast<int32_t>(g() % c);
    const auto want = counts_on(cpu, logits, labels, n, c, 3);
    const auto got = counts_on(gpu, logits, labels, n, c, 3);
    CHECK(got == want);
    CHECK(want[1] >= want[0]);
    const int k = c < 5 ? int(c) : 5;
    CHECK(topk(gpu, gpu.from_host(logits, {n, c}), k).to_host_i32() ==
          topk(cpu, cpu.from_host(logits, {n, c}), k).to_host_i32());
  }
}
