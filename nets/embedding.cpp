#include "nets/embedding.h"

#include <fmt/format.h>

#include "engine/error.h"

namespace ditto {
namespace {

Var make_table(Context& ctx, const std::string& layer, int64_t num_embeddings, int64_t dim) {
  if (num_embeddings < 1 || dim < 1)
    throw ShapeError(fmt::format("embedding layer '{}': num_embeddings = {} and dim = {} must be positive", layer,
                                 num_embeddings, dim));
  return Var(ctx.empty({num_embeddings, dim}), true);
}

// normal(0, 1): Init::HeNormal draws std sqrt(2 / fan_in), so fan_in 2.
void init_table(Context& ctx, Var& weight, const std::string& layer, uint64_t seed) {
  init_tensor(ctx, weight.value(), Init::HeNormal, 2, 0, seed, layer + ".weight");
}

}  // namespace

Embedding::Embedding(Context& ctx, std::string name, int64_t num_embeddings, int64_t dim)
    : weight(make_table(ctx, name, num_embeddings, dim)), name_(std::move(name)) {}

Var Embedding::operator()(Context& ctx, const Tensor& index, SummaryTrace* trace) const {
  Var y = embedding(ctx, name_, weight, index);
  if (trace) trace->push_back({name_, "embedding", y.shape(), weight.value().numel()});
  return y;
}

void Embedding::collect(std::vector<Param>& params) const { params.push_back({name_ + ".weight", weight}); }

void Embedding::init(Context& ctx, uint64_t seed) { init_table(ctx, weight, name_, seed); }

EmbeddingBag::EmbeddingBag(Context& ctx, std::string name, int64_t num_embeddings, int64_t dim, BagMode mode)
    : weight(make_table(ctx, name, num_embeddings, dim)), name_(std::move(name)), mode_(mode) {}

Var EmbeddingBag::operator()(Context& ctx, const Tensor& index, const Tensor& offsets, SummaryTrace* trace) const {
  Var y = embedding_bag(ctx, name_, weight, index, offsets, mode_);
  if (trace) trace->push_back({name_, "embedding_bag", y.shape(), weight.value().numel()});
  return y;
}

void EmbeddingBag::collect(std::vector<Param>& params) const { params.push_back({name_ + ".weight", weight}); }

void EmbeddingBag::init(Context& ctx, uint64_t seed) { init_table(ctx, weight, name_, seed); }

}  // namespace ditto
