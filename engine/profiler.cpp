#include "engine/profiler.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>

#include "engine/detail/cuda_state.h"
#include "engine/error.h"

namespace ditto {

const char* profile_kind_name(ProfileKind k) {
  switch (k) {
    case ProfileKind::ConvFwd: return "conv.fwd";
    case ProfileKind::ConvBwdData: return "conv.bwd_data";
    case ProfileKind::ConvBwdFilter: return "conv.bwd_filter";
    case ProfileKind::LinearFwd: return "linear.fwd";
    case ProfileKind::LinearBwd: return "linear.bwd";
    case ProfileKind::PoolFwd: return "pool.fwd";
    case ProfileKind::PoolBwd: return "pool.bwd";
    case ProfileKind::BatchNormFwd: return "batchnorm.fwd";
    case ProfileKind::BatchNormBwd: return "batchnorm.bwd";
    case ProfileKind::BiasFwd: return "bias.fwd";
    case ProfileKind::BiasBwd: return "bias.bwd";
    case ProfileKind::ActivationFwd: return "activation.fwd";
    case ProfileKind::ActivationBwd: return "activation.bwd";
    case ProfileKind::LossFwd: return "loss.fwd";
    case ProfileKind::LossBwd: return "loss.bwd";
    case ProfileKind::Optimizer: return "optimizer";
    case ProfileKind::Other: return "other";
  }
  return "?";
}

double ProfileReport::kind_ms(ProfileKind k) const {
  double ms = 0;
  for (const auto& e : entries)
    if (e.kind == profile_kind_name(k)) ms += e.ms;
  return ms;
}

namespace {
using Clock = std::chrono::steady_clock;
constexpr int kOtherLabel = 0;  // labels_[0]: time outside every scope
constexpr int kStepEnd = -1;    // the mark that closes a step
}  // namespace

struct Profiler::Impl {
  struct Label {
    ProfileKind kind;
    std::string variant;
  };
  Context* ctx = nullptr;
  std::vector<Label> labels{{ProfileKind::Other, ""}};
  std::vector<double> ms{0.0};
  std::vector<int64_t> calls{0};
  std::vector<int> stack;  // labels of the open scopes, innermost last
  bool open = false;
  std::string failure;     // a mark that could not be recorded (from pop, which cannot throw)
  // Marks not read yet: the label that runs from each mark to the next (kStepEnd: none).
  std::vector<int> mark_label;
  std::vector<cudaEvent_t> events;  // CUDA: a pool, reused once read; the first mark_label.size() hold marks
  std::vector<Clock::time_point> host;  // CPU
  int64_t steps = 0;
  double total_ms = 0;

  ~Impl() {
    for (auto e : events) DITTO_CUDA_CHECK_PRINT(cudaEventDestroy(e));
  }

  int label_of(ProfileKind kind, const char* variant) {
    const char* v = variant ? variant : "";
    for (std::size_t i = 0; i < labels.size(); ++i)
      if (labels[i].kind == kind && labels[i].variant == v) return static_cast<int>(i);
    labels.push_back({kind, v});
    ms.push_back(0.0);
    calls.push_back(0);
    return static_cast<int>(labels.size() - 1);
  }

  void mark(int label) {
    if (ctx->is_cuda()) {
      if (mark_label.size() == events.size()) {
        cudaEvent_t e = nullptr;
        DITTO_CUDA_CHECK(cudaEventCreate(&e));
        events.push_back(e);
      }
      DITTO_CUDA_CHECK(cudaEventRecord(events[mark_label.size()], detail::stream_of(*ctx)));
    } else {
      host.push_back(Clock::now());
    }
    mark_label.push_back(label);
  }

  // Milliseconds from mark `from` to mark `to` (both recorded; the device has passed them).
  double between(std::size_t from, std::size_t to) const {
    if (!ctx->is_cuda()) return std::chrono::duration<double, std::milli>(host[to] - host[from]).count();
    float t = 0;
    DITTO_CUDA_CHECK(cudaEventElapsedTime(&t, events[from], events[to]));
    return t;
  }

  // Folds the closed steps' marks into the totals. Each interval is taken as the difference of
  // two times measured from the step's first mark, so the intervals of a step add up to its
  // total exactly (no rounding error accumulates over a thousand ops).
  void fold() {
    if (mark_label.empty()) return;
    if (ctx->is_cuda()) DITTO_CUDA_CHECK(cudaEventSynchronize(events[mark_label.size() - 1]));
    std::size_t begin = 0;
    while (begin < mark_label.size()) {
      std::size_t end = begin;
      while (mark_label[end] != kStepEnd) ++end;  // end_step always closes a step
      double prev = 0;
      for (std::size_t i = begin; i < end; ++i) {
        const double t = between(begin, i + 1);
        ms[static_cast<std::size_t>(mark_label[i])] += t - prev;
        prev = t;
      }
      total_ms += prev;
      ++steps;
      begin = end + 1;
    }
    mark_label.clear();
    host.clear();
  }
};

Profiler::Profiler(Context& ctx) : impl_(std::make_unique<Impl>()) { impl_->ctx = &ctx; }

Profiler::~Profiler() {
  if (impl_->ctx->profiler() == this) impl_->ctx->set_profiler(nullptr);
}

Context& Profiler::context() const { return *impl_->ctx; }

void Profiler::begin_step() {
  Impl& m = *impl_;
  if (m.open) throw Error("Profiler::begin_step: a step is already open (end_step it first)");
  if (m.ctx->is_cuda()) {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    DITTO_CUDA_CHECK(cudaStreamIsCapturing(detail::stream_of(*m.ctx), &status));
    if (status != cudaStreamCaptureStatusNone)
      throw Error("Profiler::begin_step: the context's stream is being captured into a CUDA graph; a profiler's "
                  "events would time the graph's replay, not its ops: profile an eager step");
  }
  m.stack.clear();
  m.mark(kOtherLabel);
  m.open = true;
}

void Profiler::end_step() {
  Impl& m = *impl_;
  if (!m.open) throw Error("Profiler::end_step: no step is open (begin_step first)");
  if (!m.stack.empty())
    throw Error(fmt::format("Profiler::end_step: {} scope(s) still open, innermost '{}'", m.stack.size(),
                            profile_kind_name(m.labels[static_cast<std::size_t>(m.stack.back())].kind)));
  m.mark(kStepEnd);
  m.open = false;
}

bool Profiler::push(ProfileKind kind, const char* variant) {
  Impl& m = *impl_;
  if (!m.open) return false;
  const int label = m.label_of(kind, variant);
  m.mark(label);
  m.stack.push_back(label);
  ++m.calls[static_cast<std::size_t>(label)];
  return true;
}

void Profiler::pop() noexcept {
  Impl& m = *impl_;
  if (m.stack.empty()) return;
  m.stack.pop_back();
  try {
    m.mark(m.stack.empty() ? kOtherLabel : m.stack.back());
  } catch (const std::exception& e) {
    if (m.failure.empty()) m.failure = e.what();
  }
}

ProfileReport Profiler::report() {
  Impl& m = *impl_;
  if (m.open) throw Error("Profiler::report: a step is open (end_step it first)");
  if (!m.failure.empty()) throw Error(fmt::format("Profiler::report: a mark could not be recorded: {}", m.failure));
  m.fold();
  std::vector<std::size_t> order(m.labels.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    if (m.labels[a].kind != m.labels[b].kind) return m.labels[a].kind < m.labels[b].kind;
    return m.labels[a].variant < m.labels[b].variant;
  });
  ProfileReport r;
  r.steps = m.steps;
  r.total_ms = m.total_ms;
  for (std::size_t i : order)
    r.entries.push_back({profile_kind_name(m.labels[i].kind), m.labels[i].variant, m.ms[i], m.calls[i]});
  return r;
}

void Profiler::clear() {
  Context* ctx = impl_->ctx;
  auto fresh = std::make_unique<Impl>();
  fresh->ctx = ctx;
  fresh->events.swap(impl_->events);  // recorded events are kept for reuse
  impl_ = std::move(fresh);
}

}  // namespace ditto
