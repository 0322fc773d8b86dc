// Loss scaling for reduced-precision (fp16) training, as torch.cuda.amp.GradScaler does it, with
// every decision made on the device and replayable bit for bit.
//
// The rules, per optimizer step:
//  1. The backward pass is seeded with the current scale S (Tape::backward's seed) instead of 1,
//     so every gradient is S times the unscaled one. Small fp16 gradients stay above underflow.
//  2. After backward, each parameter gradient is divided by S in place, and a flag found_inf is
//     set when any divided element is +inf, -inf or nan. The flag is an integer OR (threads that
//     see a non-finite value OR 1 into it), never a float sum, so it is the same whatever order
//     the threads run in.
//  3. The optimizer reads found_inf on the device (Optimizer::set_skip_flag): set, it changes
//     nothing at all (weights, momentum, Adam's moments and its update count, weight decay);
//     clear, it updates as without scaling.
//  4. The step is recorded (S, found_inf) in a device table, then S and the good-step counter G
//     are updated on the device (ref::update_loss_scale, the one definition of the schedule):
//       overflow:       S *= backoff, G = 0
//       no overflow:    G += 1; when G reaches interval, S *= growth unless that is infinite, G = 0
//     A fixed scale never changes S (steps with an overflow are still skipped).
// Scales, growth and backoff factors must be powers of two, so multiplying by S and dividing by it
// are exact (barring overflow and subnormals): with a fixed power-of-two scale and no overflow, a
// run computes the very bits of an unscaled one. The schedule is a pure function of the steps'
// overflow flags, and the flags of the kernels' bits, so a run replays bit for bit.
//
// Nothing here reads the device from the host during a step, so a captured CUDA graph step
// (engine/graph.h) replays all of it. The host reads the record only in take_record(), once an
// epoch (or at the end of a run). The CPU runs the same rules on the host, over the same tensors.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "engine/param.h"
#include "engine/tensor.h"

namespace ditto {

class Context;

struct LossScaling {
  enum class Mode { Off, Dynamic, Fixed };
  Mode mode = Mode::Off;
  float init_scale = 65536.0f;  // 2^16, GradScaler's default; Fixed: the scale
  float growth_factor = 2.0f;
  float backoff_factor = 0.5f;
  int growth_interval = 2000;   // good steps before a growth
  bool enabled() const { return mode != Mode::Off; }
};

// "off", "dynamic" (GradScaler's defaults) or a power of two ("1024", "65536", "0.5") for a fixed
// scale; anything else is an Error naming --loss-scale and the valid forms.
LossScaling parse_loss_scaling(const std::string& text);
// The form parse_loss_scaling reads back: "off", "dynamic" (defaults) or the fixed scale. A
// dynamic config with other factors is written "dynamic:INIT:GROWTH:BACKOFF:INTERVAL", which
// parse_loss_scaling also reads.
std::string loss_scaling_name(const LossScaling& s);
// Throws Error naming --loss-scale unless every factor is a finite power of two (growth above
// 1, backoff below 1) and the interval is at least 1.
void check_loss_scaling(const LossScaling& s);
// The setting a run takes when --loss-scale was not given: dynamic for fp16 (whose gradients
// underflow without scaling), off otherwise. `precision` is the --precision word.
LossScaling default_loss_scaling(const std::string& precision);

// One recorded step: the scale its backward pass was seeded with, and whether its gradients
// overflowed (then its update was skipped and the scale backed off).
struct LossScaleStep {
  float scale = 0;
  bool overflow = false;
};

class LossScaler {
 public:
  // The scale starts at cfg.init_scale, the counter at 0 (a resumed run restores both from its
  // checkpoint through state()). Throws like check_loss_scaling; cfg must be enabled.
  LossScaler(Context& ctx, LossScaling cfg);

  const LossScaling& config() const { return cfg_; }
  // The seed of the backward pass: the current scale, {1} on the device. Tape::backward copies it.
  const Tensor& seed() const { return scale_; }
  // The flag the optimizer reads (i32 {1} on the device): nonzero when this step overflowed.
  const Tensor& found_inf() const { return found_inf_; }

  // Makes room for `steps` more records at a fixed address (graphs capture it): a captured step
  // writes there, so the room must exist before the capture. Grows by doubling.
  void reserve(Context& ctx, int64_t steps);
  // After backward: clears found_inf, then divides each defined gradient by the scale in place
  // and ORs its "non-finite" into found_inf (rule 2).
  void unscale(Context& ctx, const std::vector<Param>& params);
  // After the optimizer: records (scale, found_inf), then updates scale and counter (rule 4).
  // Throws Error when reserve() left no room for the record.
  void update(Context& ctx);
  // A replay of a captured update(): counts the record the replay wrote.
  void count_replayed_step();

  // The steps recorded since the last call, in order (waits for the device), and an empty
  // record after it. Throws Error when the device's count disagrees with the host's.
  std::vector<LossScaleStep> take_record(Context& ctx);
  // What a checkpoint keeps: "scale" (f32 {1}) and "good_steps" (i32 {1}).
  std::vector<Buffer> state();
  // The record table's address: a graph captured against it is stale once it moves.
  const void* record_address() const { return record_.defined() ? record_.raw() : nullptr; }

 private:
  LossScaling cfg_;
  Tensor scale_, good_steps_, found_inf_;  // the state machine, on the context's device
  Tensor record_, cursor_;                 // (capacity * 2) f32 rows of (scale, flag); i32 next row
  int64_t recorded_ = 0;                   // rows written since the last take_record (host count)
};

}  // namespace ditto
