// Policy: which kernel variant each layer uses for every choice that can change bits.
//
// A policy is a list of rules "LAYER.KNOB=VALUE". LAYER is a layer name or '*'; KNOB is a knob
// name or '*' (written "LAYER=VALUE" or "*=VALUE"); VALUE is a variant of that knob or one of
// the five mode words every knob understands (heuristic, deterministic, nondeterministic, pytorch,
// fastest). The knobs, their variants and what each mode picks are declared by the op families
// that own them, in the knob registry (engine/knob.h); the policy knows no family by name.
// A knob the op selects at run time (a convolution algorithm) may also be qualified by the
// layer's input shape, "LAYER.KNOB@NxCxHxW=VALUE" (e.g. conv1.bwd_filter@80x3x32x32=algo1):
// cuDNN's choices depend on the shape, so a final partial batch may run another algorithm than
// the full ones, and an exact replay pins each.
// The most specific rule wins (LAYER.KNOB@SHAPE > LAYER.KNOB > LAYER=* > *.KNOB > *=*); among
// equals the last. A wildcard-layer rule that names a variant applies only to the op kinds that
// have that variant (`*.bwd=gather` is meant for pools, not batch norm).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "engine/knob.h"

namespace ditto {

// "NxCxHxW": how shapes are written in @SHAPE rules and manifest entries.
std::string shape_key(const std::vector<int64_t>& shape);

// One knob of one layer, resolved: how it was chosen, and the variant's index in the knob's
// declaration (none for a knob the op selects at run time under a mode).
struct KnobPick {
  static constexpr std::size_t kNone = static_cast<std::size_t>(-1);
  SelectMode mode = SelectMode::Heuristic;
  std::size_t index = kNone;
  // What manifests record as the policy's ask: the mode word, or "pinned".
  std::string requested() const { return select_mode_name(mode); }
};

class Policy {
 public:
  Policy() = default;
  // Parses rules; throws PolicyError naming the bad rule and listing valid knobs/variants.
  static Policy parse(const std::vector<std::string>& rules);
  Policy& set(const std::string& rule);  // "conv2.bwd_filter=algo0", "*=deterministic", ...

  // Pins one of a family's enum values: the family declares, beside the enum, name_of(value)
  // (its variant name) and knob_name(value) (the knob it is a variant of).
  template <class E>
  Policy& pin(const std::string& layer, E value) {
    return set(layer + "." + knob_name(value) + "=" + name_of(value));
  }

  // Resolves one knob of one layer of op kind `op` (the knob must be registered for it). Throws
  // PolicyError if a rule naming this layer uses a knob its op kind lacks or a variant the knob
  // lacks. shape: the layer's input shape as shape_key() writes it ("" matches no @SHAPE rule).
  KnobPick pick(const std::string& layer, OpKind op, const std::string& knob, const std::string& shape = "") const;

  // The variant of a family's enum E for one layer: the family declares knob_name(E) beside E,
  // and E's values in the order of the knob's registered variants.
  template <class E>
  E variant(const std::string& layer, OpKind op) const {
    return static_cast<E>(pick(layer, op, knob_name(E{})).index);
  }

  // What the policy asked for one knob of one layer, as manifests record it: the mode word that
  // resolved it or "pinned" where the winning rule names a variant.
  std::string requested(const std::string& layer, const std::string& knob, OpKind op) const;

  // Checks every layer-specific rule against the layers a network actually has: an unknown
  // layer, or a knob its op kind lacks, throws PolicyError listing the valid ones.
  void check_layers(const std::vector<std::pair<std::string, OpKind>>& layers) const;

  const std::vector<std::string>& rules() const { return rule_text_; }

 private:
  struct Rule { std::string layer, knob, value, shape; };
  std::string lookup(const std::string& layer, const std::string& knob, OpKind op, const std::string& shape = "") const;
  std::vector<Rule> rules_;
  std::vector<std::string> rule_text_;
};

}  // namespace ditto
