// Embedding layers (kernels/scatter.h) in the style of nets/module.h: a named weight
// "<name>.weight" {num_embeddings, dim}, a forward that takes i32 indices, and the op kind whose
// knob (`scatter`: atomic | sorted, the backward scatter-add of the weight gradient) the layer
// owns, for Net::knob_layers().
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "engine/param.h"
#include "kernels/scatter.h"
#include "nets/module.h"

namespace ditto {

// PyTorch's nn.Embedding (no padding_idx, max_norm or sparse gradients): y = weight[index], index
// of any shape, y of index's shape plus {dim}.
class Embedding {
 public:
  Embedding(Context& ctx, std::string name, int64_t num_embeddings, int64_t dim);
  Var operator()(Context& ctx, const Tensor& index, SummaryTrace* trace = nullptr) const;
  void collect(std::vector<Param>& params) const;
  // PyTorch's init: normal(0, 1), from the Philox stream keyed by (seed, "<name>.weight").
  void init(Context& ctx, uint64_t seed);
  const std::string& name() const { return name_; }
  static constexpr OpKind kind = op::embedding;
  Var weight;

 private:
  std::string name_;
};

// PyTorch's nn.EmbeddingBag (mode sum or mean, include_last_offset=False, no per-sample weights):
// y {bags, dim}; index {M} with offsets {bags}, or index {bags, L} with offsets undefined.
class EmbeddingBag {
 public:
  EmbeddingBag(Context& ctx, std::string name, int64_t num_embeddings, int64_t dim, BagMode mode);
  Var operator()(Context& ctx, const Tensor& index, const Tensor& offsets = Tensor(),
                 SummaryTrace* trace = nullptr) const;
  void collect(std::vector<Param>& params) const;
  void init(Context& ctx, uint64_t seed);  // normal(0, 1), as nn.EmbeddingBag
  const std::string& name() const { return name_; }
  BagMode mode() const { return mode_; }
  static constexpr OpKind kind = op::embedding;
  Var weight;

 private:
  std::string name_;
  BagMode mode_;
};

}  // namespace ditto
