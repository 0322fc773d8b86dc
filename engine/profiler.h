// Profiler: where a training step's time goes, per op kind and per algorithm — the cost of
// determinism broken down by the op that pays it.
//
// The caller owns a Profiler, made for one context and attached with ctx.set_profiler(&p). Op
// launchers (kernels/*.cpp, the optimizers) open a ProfileScope around the device work of each
// call; with no profiler attached a scope is one null-pointer test, so an unprofiled run does
// exactly what it did before. Inside begin_step() .. end_step() every scope boundary records a
// mark: on a CUDA context a CUDA event on the context's stream (no host synchronization during
// the step; report() reads the events afterwards), on the CPU the host's steady clock (CPU ops
// run synchronously, so host time is op time). The time between two consecutive marks belongs
// to the innermost open scope, or to "other" when none is open (element-wise adds of gradient
// accumulation, zeroing, dropout, concatenation, metrics, and any time the device waits for the
// host). So the kinds of a step sum to the step's time from its first mark to its last, and a
// nested scope's time is not counted twice.
//
// Events between ops cost a little device time and keep the host from running ahead freely:
// time steps without a profiler and profile others. Graph capture with a profiler attached is
// refused (engine/graph.h): events captured into a graph would time the replay, not the ops.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/context.h"

namespace ditto {

// The op kinds a step's time is split into. Names ("conv.fwd", ...) are what reports use.
enum class ProfileKind {
  ConvFwd, ConvBwdData, ConvBwdFilter,
  LinearFwd, LinearBwd,
  PoolFwd, PoolBwd,
  BatchNormFwd, BatchNormBwd,
  BiasFwd, BiasBwd,
  ActivationFwd, ActivationBwd,
  LossFwd, LossBwd,
  Optimizer,
  Other,
};
const char* profile_kind_name(ProfileKind k);

struct ProfileEntry {
  std::string kind;     // profile_kind_name()
  std::string variant;  // the algorithm or variant that ran ("algo1", "gather"); "" where none
  double ms = 0;        // summed over the profiled steps
  int64_t calls = 0;    // scopes opened (for "other": 0)
  std::string label() const { return variant.empty() ? kind : kind + " " + variant; }
};

struct ProfileReport {
  int64_t steps = 0;                  // profiled steps folded in
  double total_ms = 0;                // their time, first mark to last mark of each step
  std::vector<ProfileEntry> entries;  // by kind (enum order), then variant; entries sum to total_ms
  double kind_ms(ProfileKind k) const;  // summed over the kind's variants
};

class Profiler {
 public:
  explicit Profiler(Context& ctx);
  ~Profiler();  // detaches itself from its context; it must not outlive the context
  Profiler(const Profiler&) = delete;
  Profiler& operator=(const Profiler&) = delete;

  // Brackets one step. begin_step throws Error when a step is open or the context's stream is
  // being captured; end_step when no step is open or a scope is still open. Scopes outside a
  // step record nothing.
  void begin_step();
  void end_step();
  // Every closed step so far (waits for the device); Error while a step is open or after a
  // mark failed to record.
  ProfileReport report();
  void clear();

  Context& context() const;

  // For ProfileScope: push returns false (and records nothing) outside a step. pop never throws
  // (it runs in destructors); a failure is reported by report().
  bool push(ProfileKind kind, const char* variant);
  void pop() noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Times the device work queued while it lives as `kind` (variant: a static name such as an
// algorithm's, or nullptr), when the context has a profiler inside a step.
class ProfileScope {
 public:
  ProfileScope(Context& ctx, ProfileKind kind, const char* variant = nullptr) : p_(ctx.profiler()) {
    if (p_ && !p_->push(kind, variant)) p_ = nullptr;
  }
  ~ProfileScope() { end(); }
  // Ends the timed part before the scope's end (e.g. before a gradient accumulation).
  void end() noexcept {
    if (p_) p_->pop();
    p_ = nullptr;
  }
  ProfileScope(const ProfileScope&) = delete;
  ProfileScope& operator=(const ProfileScope&) = delete;

 private:
  Profiler* p_;
};

}  // namespace ditto
