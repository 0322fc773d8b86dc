// Internal to nets/: the networks of the other task kinds — unet-small
// (nets/unet_small.cpp, segmentation), stn (nets/stn.cpp, a spatial transformer classifier),
// ctc-cnn (nets/ctc_cnn.cpp, a CTC recognizer of digit strings), embedding-bag
// (nets/embedding_bag_net.cpp, categorical features) — and what they share. nets.h documents each
// network; make_net (nets/nets.cpp) calls these factories. Not API (callers use make_net); tests
// reach `reshaped` and `time_major_index` here.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "nets/nets.h"
#include "nets/zoo.h"

namespace ditto::tasks {

std::unique_ptr<Net> make_unet_small(Context& ctx, const NetConfig& cfg);
std::unique_ptr<Net> make_stn(Context& ctx, const NetConfig& cfg);
std::unique_ptr<Net> make_ctc_cnn(Context& ctx, const NetConfig& cfg);
std::unique_ptr<Net> make_embedding_bag_net(Context& ctx, const NetConfig& cfg);

// x viewed in another shape of the same element count: the same storage, no kernel (as flatten,
// kernels/elementwise.h); backward hands x the upstream gradient in x's shape. ShapeError naming
// `what` when the counts differ.
Var reshaped(Context& ctx, const Var& x, Shape shape, const std::string& what);

// The gather indices that turn an {N, A, 1, T} tensor, viewed as N*A*T rows of one element, into
// {T, N, A} (time-major, as CTC takes logits): index[t][n][a] = (n * A + a) * T + t. Every row is
// named exactly once (a permutation).
std::vector<int32_t> time_major_index(int64_t n, int64_t a, int64_t t);

// A ZooNet (parameters, buffers and knob layers from one list) that also runs ops ZooNet does not
// create — upsampling, grid sampling, embeddings — listed as extra knob layers, and whose loss
// layers are its task's (task_loss_layers, engine/task_kind.h) instead of softmax cross-entropy.
class TaskNet : public zoo::ZooNet {
 public:
  explicit TaskNet(InputSpec input) : ZooNet(std::move(input)) {}
  // ZooNet's layers in creation order, then the extra ones in the order added, then the loss's.
  std::vector<std::pair<std::string, OpKind>> knob_layers() const override;

 protected:
  void add_knob_layer(std::string name, OpKind kind) { extra_.push_back({std::move(name), kind}); }

 private:
  std::vector<std::pair<std::string, OpKind>> extra_;
};

// PyTorch's default initialization of nn.Conv2d and nn.Linear (kaiming_uniform_ with a = sqrt(5),
// and the bias alike): weight and bias uniform in +-1/sqrt(fan_in), fan_in = in/groups * kernel area.
void init_conv_torch_default(Context& ctx, Conv2d& c, uint64_t seed);
void init_linear_torch_default(Context& ctx, Linear& fc, uint64_t seed);

}  // namespace ditto::tasks
