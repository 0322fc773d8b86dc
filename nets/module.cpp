#include "nets/module.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <thread>
#include <vector>

#include "engine/error.h"
#include "engine/philox.h"
#include "kernels/bias.h"
#include "kernels/dropout.h"
#include "kernels/linear.h"

namespace ditto {

const char* init_name(Init i) {
  switch (i) {
    case Init::GlorotUniform: return "glorot_uniform";
    case Init::GlorotNormal: return "glorot_normal";
    case Init::HeUniform: return "he_uniform";
    case Init::HeNormal: return "he_normal";
    case Init::Zeros: return "zeros";
    case Init::Ones: return "ones";
  }
  return "?";
}

void init_tensor(Context& ctx, Tensor& t, Init rule, int64_t fan_in, int64_t fan_out, uint64_t seed,
                 const std::string& name) {
  const int64_t n = t.numel();
  std::vector<float> v(static_cast<std::size_t>(n));
  const uint64_t key = mix_key(seed, hash_name(name));
  // Each Philox block is drawn once and serves the elements it covers; every element depends on
  // its index alone, so the elements are filled by several threads in chunks of whole blocks
  // (large tensors: VGG's 100M weights take seconds on one core) with the same bits.
  auto uniform = [&](float limit, int64_t b0, int64_t b1) {
    // Element i takes word i%4 of block i/4.
    for (int64_t b = b0; b < b1; ++b) {
      const auto blk = philox4x32(static_cast<uint64_t>(b), 0, key);
      for (int64_t i = b * 4; i < std::min(n, b * 4 + 4); ++i)
        v[i] = (2.0f * philox_uniform(blk.v[i % 4]) - 1.0f) * limit;
    }
  };
  auto normal = [&](double stddev, int64_t b0, int64_t b1) {
    // Box–Muller: element i takes the pair (2*(i%2), 2*(i%2)+1) of block i/2.
    for (int64_t b = b0; b < b1; ++b) {
      const auto blk = philox4x32(static_cast<uint64_t>(b), 1, key);
      for (int64_t i = b * 2; i < std::min(n, b * 2 + 2); ++i) {
        const int j = 2 * static_cast<int>(i % 2);
        const double u1 = (static_cast<double>(blk.v[j]) + 1.0) / 4294967296.0;  // (0, 1]
        const double u2 = static_cast<double>(blk.v[j + 1]) / 4294967296.0;
        v[i] = static_cast<float>(stddev * std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2));
      }
    }
  };
  auto in_chunks = [&](int64_t per_block, auto fill) {
    const int64_t blocks = (n + per_block - 1) / per_block;
    const int64_t threads = std::clamp<int64_t>(blocks / (int64_t(1) << 16), 1,
                                                std::max(1u, std::thread::hardware_concurrency()));
    std::vector<std::thread> pool;
    try {
      for (int64_t t = 1; t < threads; ++t)
        pool.emplace_back(fill, blocks * t / threads, blocks * (t + 1) / threads);
    } catch (...) {  // no thread to be had: the rest on this one
      for (auto& th : pool) th.join();
      fill(blocks * int64_t(pool.size() + 1) / threads, blocks);
      pool.clear();
    }
    fill(int64_t(0), blocks / threads);
    for (auto& th : pool) th.join();
  };
  switch (rule) {
    case Init::GlorotUniform: {
      const float limit = static_cast<float>(std::sqrt(6.0 / double(fan_in + fan_out)));
      in_chunks(4, [&](int64_t b0, int64_t b1) { uniform(limit, b0, b1); });
      break;
    }
    case Init::GlorotNormal: {
      const double stddev = std::sqrt(2.0 / double(fan_in + fan_out));
      in_chunks(2, [&](int64_t b0, int64_t b1) { normal(stddev, b0, b1); });
      break;
    }
    case Init::HeUniform: {
      const float limit = static_cast<float>(std::sqrt(6.0 / double(fan_in)));
      in_chunks(4, [&](int64_t b0, int64_t b1) { uniform(limit, b0, b1); });
      break;
    }
    case Init::HeNormal: {
      const double stddev = std::sqrt(2.0 / double(fan_in));
      in_chunks(2, [&](int64_t b0, int64_t b1) { normal(stddev, b0, b1); });
      break;
    }
    case Init::Zeros: std::fill(v.begin(), v.end(), 0.0f); break;
    case Init::Ones: std::fill(v.begin(), v.end(), 1.0f); break;
  }
  Tensor src = Context().from_host(v, t.shape());
  ctx.copy(t, src);
}

void Net::check_input(const Shape& x) const {
  const InputSpec& in = input_;
  if (in.categorical) {
    if (x.size() == 2 && x[0] >= 1 && x[1] >= 1 && (in.channels <= 0 || x[1] == in.channels)) return;
    throw ShapeError(fmt::format("{}: input has shape {}; the network takes category ids, {} (N >= 1){}", name(),
                                 shape_str(x), in.channels > 0 ? fmt::format("Nx{}", in.channels) : "NxF, F fields >= 1",
                                 in.why.empty() ? "" : " (" + in.why + ")"));
  }
  const bool sides_ok = x.size() == 4 && x[2] >= in.min_side && x[3] >= in.min_side &&
                        (in.max_side <= 0 || (x[2] <= in.max_side && x[3] <= in.max_side));
  if (x.size() == 4 && x[0] >= 1 && x[1] == in.channels && sides_ok) return;
  std::string takes;
  if (in.max_side > 0 && in.max_side == in.min_side)
    takes = fmt::format("Nx{}x{}x{}", in.channels, in.min_side, in.min_side);
  else if (in.max_side > 0)
    takes = fmt::format("Nx{}xHxW with {} <= H, W <= {}", in.channels, in.min_side, in.max_side);
  else
    takes = fmt::format("Nx{}xHxW with H, W >= {}", in.channels, in.min_side);
  throw ShapeError(fmt::format("{}: input has shape {}; the network takes {}, N >= 1{}", name(), shape_str(x), takes,
                               in.why.empty() ? "" : " (" + in.why + ")"));
}

Var Net::forward(Context& ctx, const Var& x, bool training, SummaryTrace* trace) {
  check_input(x.shape());
  return forward_impl(ctx, x, training, trace);
}

int64_t Net::param_count() {
  int64_t n = 0;
  for (const auto& p : params()) n += p.var.value().numel();
  return n;
}

namespace {
void trace_row(SummaryTrace* trace, const std::string& name, const std::string& op, const Var& out, int64_t params) {
  if (trace) trace->push_back({name, op, out.shape(), params});
}
}  // namespace

Conv2d::Conv2d(Context& ctx, std::string name, int in_channels, int out_channels, int kernel, int stride, int padding,
               bool bias, Init init, int groups)
    : Conv2d(ctx, std::move(name), in_channels, out_channels, kernel, kernel, stride, padding, padding, bias, init,
             groups) {}

Conv2d::Conv2d(Context& ctx, std::string name, int in_channels, int out_channels, int kernel_h, int kernel_w,
               int stride, int pad_h, int pad_w, bool bias, Init init, int groups)
    : name_(std::move(name)), init_(init) {
  // Checked here, not only by the op: the weight's shape divides by groups, and a truncated
  // division would make a wrong-shaped weight that fails later under a less helpful message.
  if (groups < 1 || in_channels % groups || out_channels % groups)
    throw ShapeError(fmt::format("conv2d layer '{}': groups = {} must be positive and divide in_channels = {} and "
                                 "out_channels = {}",
                                 name_, groups, in_channels, out_channels));
  p_.stride_h = p_.stride_w = stride;
  p_.pad_h = pad_h;
  p_.pad_w = pad_w;
  p_.groups = groups;
  weight = Var(ctx.empty({out_channels, in_channels / groups, kernel_h, kernel_w}), true);
  if (bias) this->bias = Var(ctx.zeros({out_channels}), true);
}

Var Conv2d::operator()(Context& ctx, const Var& x, SummaryTrace* trace) const {
  Var y = conv2d(ctx, name_, x, weight, p_);
  if (bias.defined()) y = bias_add(ctx, name_, op::conv2d, y, bias);
  trace_row(trace, name_, "conv2d", y, weight.value().numel() + (bias.defined() ? bias.value().numel() : 0));
  return y;
}

void Conv2d::collect(std::vector<Param>& params) const {
  params.push_back({name_ + ".weight", weight});
  if (bias.defined()) params.push_back({name_ + ".bias", bias});
}

Linear::Linear(Context& ctx, std::string name, int in_features, int out_features, bool bias, Init init)
    : name_(std::move(name)), init_(init) {
  weight = Var(ctx.empty({out_features, in_features}), true);
  if (bias) this->bias = Var(ctx.zeros({out_features}), true);
}

Var Linear::operator()(Context& ctx, const Var& x, SummaryTrace* trace) const {
  Var y = linear(ctx, name_, x, weight);
  if (bias.defined()) y = bias_add(ctx, name_, op::linear, y, bias);
  trace_row(trace, name_, "linear", y, weight.value().numel() + (bias.defined() ? bias.value().numel() : 0));
  return y;
}

void Linear::collect(std::vector<Param>& params) const {
  params.push_back({name_ + ".weight", weight});
  if (bias.defined()) params.push_back({name_ + ".bias", bias});
}

BatchNorm2d::BatchNorm2d(Context& ctx, std::string name, int channels, float momentum, float eps)
    : name_(std::move(name)), momentum_(momentum), eps_(eps) {
  gamma = Var(ctx.full({channels}, 1.0f), true);
  beta = Var(ctx.zeros({channels}), true);
  state.running_mean = ctx.zeros({channels});
  state.running_var = ctx.full({channels}, 1.0f);
}

Var BatchNorm2d::operator()(Context& ctx, const Var& x, bool training, SummaryTrace* trace) {
  Var y = batch_norm(ctx, name_, x, gamma, beta, state, training, momentum_, eps_);
  trace_row(trace, name_, "batchnorm", y, gamma.value().numel() * 2);
  return y;
}

void BatchNorm2d::collect(std::vector<Param>& params) const {
  params.push_back({name_ + ".weight", gamma});
  params.push_back({name_ + ".bias", beta});
}

void BatchNorm2d::collect(std::vector<Buffer>& buffers) {
  buffers.push_back({name_ + ".running_mean", &state.running_mean});
  buffers.push_back({name_ + ".running_var", &state.running_var});
}

MaxPool2d::MaxPool2d(std::string name, int kernel, int stride, int padding) : name_(std::move(name)) {
  p_.kernel_h = p_.kernel_w = kernel;
  p_.stride_h = p_.stride_w = stride;
  p_.pad_h = p_.pad_w = padding;
}

Var MaxPool2d::operator()(Context& ctx, const Var& x, SummaryTrace* trace) const {
  Var y = max_pool2d(ctx, name_, x, p_);
  trace_row(trace, name_, "maxpool2d", y, 0);
  return y;
}

Dropout::Dropout(std::string name, float p) : name_(std::move(name)), p_(p) {
  if (!(p >= 0.0f && p < 1.0f)) throw Error(fmt::format("dropout layer '{}': p = {} is outside [0, 1)", name_, p));
}

Var Dropout::operator()(Context& ctx, const Var& x, bool training, uint64_t seed, int64_t step,
                        SummaryTrace* trace) const {
  Var y = dropout(ctx, name_, x, p_, seed, static_cast<uint64_t>(step), training);
  trace_row(trace, name_, "dropout", y, 0);
  return y;
}

std::string format_summary(const SummaryTrace& rows, int64_t total_params) {
  std::string out = fmt::format("{:<28} {:<12} {:<20} {:>12}\n", "layer", "op", "output", "params");
  for (const auto& r : rows) out += fmt::format("{:<28} {:<12} {:<20} {:>12}\n", r.name, r.op, shape_str(r.output), r.params);
  out += fmt::format("total parameters: {}\n", total_params);
  return out;
}

}  // namespace ditto
