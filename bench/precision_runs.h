// What bench/step_time and bench/overhead share about the precisions they run each configuration
// under (--precisions) and what a JSON line records about them and about memory.
//
// A precision is one policy rule, `*.precision=VALUE`, added after the mode's rules: conv2d and
// linear layers compute in it (kernels/precision.h says what each reads, accumulates in and
// rounds to), every other op runs as the mode picks. The rule is added for fp32 as well, so a
// line's "precision" always names a rule that ran, never a default assumed.
#pragma once
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <memory>
#include <string>
#include <vector>

#include "engine/loss_scale.h"

namespace ditto::bench {

inline const std::vector<std::string> kPrecisions = {"fp32", "tf32", "bf16", "fp16"};

// Whether bf16/fp16 convolutions run channels-last (--channels-last: the rule *.layout=nhwc), as
// PyTorch's AMP peers do; fp32 and tf32 stay NCHW, as the peers' do.
inline bool channels_last_for(bool channels_last, const std::string& precision) {
  return channels_last && (precision == "bf16" || precision == "fp16");
}

// Whether bf16/fp16 convolutions hand on their results as computed (--native-activations: the rule
// *.output=native), so batch norm, activations and adds read bf16/f16 channels-last tensors as
// PyTorch's autocast peers' do; needs --channels-last. fp32 and tf32 hand on fp32 NCHW.
inline bool native_for(bool native, bool channels_last, const std::string& precision) {
  return native && channels_last_for(channels_last, precision);
}

// The mode's rules, then the precision's (and the layout's, and the activations'), then the
// --rules a run adds to every configuration (e.g. *.bwd_data=engine).
inline std::vector<std::string> with_precision(std::vector<std::string> rules, const std::string& precision,
                                               bool channels_last, bool native = false,
                                               const std::vector<std::string>& extra = {}) {
  rules.push_back("*.precision=" + precision);
  if (channels_last_for(channels_last, precision)) rules.push_back("*.layout=nhwc");
  if (native_for(native, channels_last, precision)) rules.push_back("*.output=native");
  rules.insert(rules.end(), extra.begin(), extra.end());
  return rules;
}

// --rules: policy rules added after every configuration's own (recorded as "rules" on its line).
inline CLI::Option* add_rules_option(CLI::App& app, std::vector<std::string>& rules) {
  return app.add_option("--rules", rules,
                        "comma list of policy rules added after each configuration's mode and precision rules "
                        "(e.g. *.fwd=engine,*.bwd_data=engine)")
      ->delimiter(',');
}

// The loss scaling a step in `precision` runs with: a training run's default (engine/loss_scale.h:
// dynamic for fp16, as PyTorch's GradScaler; none otherwise). Null for none.
inline std::unique_ptr<LossScaler> loss_scaler_for(Context& ctx, const std::string& precision) {
  const LossScaling s = default_loss_scaling(precision);
  return s.enabled() ? std::make_unique<LossScaler>(ctx, s) : nullptr;
}

// The loss scaling an fp16 step runs with, as its lines name it.
inline std::string fp16_loss_scale() { return loss_scaling_name(default_loss_scaling("fp16")); }

// "precision" and "layout" on every line, "loss_scale" on the fp16 ones.
inline void add_precision_fields(nlohmann::json& line, const std::string& precision, bool channels_last,
                                 bool native = false, const std::vector<std::string>& extra = {}) {
  if (!extra.empty()) line["rules"] = extra;
  line["precision"] = precision;
  line["layout"] = channels_last_for(channels_last, precision) ? "nhwc" : "nchw";
  line["activations"] = native_for(native, channels_last, precision) ? "native" : "fp32";
  if (precision == "fp16") line["loss_scale"] = fp16_loss_scale();
}

inline CLI::Option* add_precisions_option(CLI::App& app, std::vector<std::string>& precisions, bool& channels_last,
                                          bool& native) {
  app.add_flag("--channels-last", channels_last,
               "bf16/fp16 configurations compute their convolutions channels-last (the rule *.layout=nhwc)");
  app.add_flag("--native-activations", native,
               "with --channels-last, bf16/fp16 convolutions hand on bf16/f16 channels-last results (the rule "
               "*.output=native) that batch norm, activations and adds read as they are");
  return app
      .add_option("--precisions", precisions,
                  "comma list of fp32 | tf32 | bf16 | fp16: every configuration under each (the rule "
                  "*.precision=VALUE after the mode's)")
      ->delimiter(',')
      ->check(CLI::IsMember(kPrecisions))
      ->capture_default_str();
}

// What "peak_mem_bytes" and "peak_mem_warmup_bytes" measure (Context::memory_peak).
inline std::string pool_mem_source(bool cuda) {
  return cuda ? "context pool high-water mark (tensors and workspaces; not cuDNN/cuBLAS internals): timed steps "
                "after a reset; warmup: context creation through the warm-up steps"
              : "none on the CPU";
}

}  // namespace ditto::bench
