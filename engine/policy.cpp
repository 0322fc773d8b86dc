#include "engine/policy.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>

#include "engine/error.h"

namespace ditto {
namespace {

bool is_mode_word(const std::string& v) {
  SelectMode ignored;
  return parse_mode_word(v, ignored);
}

std::vector<std::string> knob_names_for(OpKind op) {
  std::vector<std::string> out;
  for (const auto& k : knobs())
    if (k.op == op) out.push_back(k.name);
  return out;
}

std::vector<std::string> all_knob_names() {
  std::vector<std::string> out;
  for (const auto& k : knobs())
    if (std::find(out.begin(), out.end(), k.name) == out.end()) out.push_back(k.name);
  return out;
}

bool value_ok(const KnobSpec& spec, const std::string& v) {
  return is_mode_word(v) || spec.index_of(v) != KnobPick::kNone;
}

// "@NxCxHxW" is taken only by knobs their op selects at run time, for a named layer.
bool takes_shape(const std::string& knob) {
  for (const auto& k : knobs())
    if (k.name == knob && k.selected_at_run_time) return true;
  return false;
}

void check_shape_text(const std::string& rule, const std::string& shape) {
  bool ok = !shape.empty() && std::isdigit(static_cast<unsigned char>(shape.front())) &&
            std::isdigit(static_cast<unsigned char>(shape.back()));
  for (char ch : shape) ok = ok && (std::isdigit(static_cast<unsigned char>(ch)) || ch == 'x');
  if (!ok) throw PolicyError(fmt::format("policy rule '{}': a shape is written NxCxHxW, got '{}'", rule, shape));
}

// A rule's value checked against every op kind that has the knob: the error lists the variants
// per op kind, since the layer (and so its op kind) is known only when a network is built.
void check_value(const std::string& rule, const std::string& knob, const std::string& value) {
  if (knob == "*") {
    if (!is_mode_word(value))
      throw PolicyError(fmt::format("policy rule '{}': a rule for all knobs takes a mode, one of {}; "
                                    "to pin a variant name the knob (knobs: {})",
                                    rule, fmt::join(mode_words(), ", "), fmt::join(all_knob_names(), ", ")));
    return;
  }
  bool known = false, valid = false;
  for (const auto& k : knobs()) {
    if (k.name != knob) continue;
    known = true;
    valid = valid || value_ok(k, value);
  }
  if (!known)
    throw PolicyError(fmt::format("policy rule '{}': unknown knob '{}'; knobs are {}", rule, knob,
                                  fmt::join(all_knob_names(), ", ")));
  if (!valid)
    throw PolicyError(fmt::format("policy rule '{}': unknown variant '{}' for knob '{}'; valid: the modes {}, or for {}",
                                  rule, value, knob, fmt::join(mode_words(), ", "), describe_variants(knob)));
}

}  // namespace

Policy Policy::parse(const std::vector<std::string>& rules) {
  Policy p;
  for (const auto& r : rules) p.set(r);
  return p;
}

Policy& Policy::set(const std::string& rule) {
  auto eq = rule.find('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == rule.size())
    throw PolicyError(fmt::format("policy rule '{}': expected LAYER.KNOB=VALUE, LAYER=MODE or *=MODE", rule));
  std::string lhs = rule.substr(0, eq), value = rule.substr(eq + 1);
  std::string shape;
  if (auto at = lhs.find('@'); at != std::string::npos) {
    shape = lhs.substr(at + 1);
    lhs = lhs.substr(0, at);
    check_shape_text(rule, shape);
  }
  std::string layer = lhs, knob = "*";
  if (auto dot = lhs.rfind('.'); dot != std::string::npos) {
    layer = lhs.substr(0, dot);
    knob = lhs.substr(dot + 1);
    if (layer.empty() || knob.empty())
      throw PolicyError(fmt::format("policy rule '{}': empty layer or knob name", rule));
  }
  if (!shape.empty() && (layer == "*" || !takes_shape(knob))) {
    std::vector<std::string> shaped;
    for (const auto& k : knobs())
      if (k.selected_at_run_time) shaped.push_back(fmt::format("{}.{}", k.op.name, k.name));
    throw PolicyError(fmt::format("policy rule '{}': only a named layer's knobs selected per shape take @SHAPE ({})",
                                  rule, fmt::join(shaped, ", ")));
  }
  check_value(rule, knob, value);
  rules_.push_back({layer, knob, value, shape});
  rule_text_.push_back(rule);
  return *this;
}

std::string shape_key(const std::vector<int64_t>& shape) {
  std::string out;
  for (std::size_t i = 0; i < shape.size(); ++i) out += (i ? "x" : "") + std::to_string(shape[i]);
  return out;
}

std::string Policy::lookup(const std::string& layer, const std::string& knob, OpKind op,
                           const std::string& shape) const {
  const KnobSpec* spec = find_knob(op, knob);
  int best_rank = -1;
  std::string best = "heuristic";
  for (const auto& r : rules_) {
    bool layer_specific = r.layer == layer;
    if (!layer_specific && r.layer != "*") continue;
    if (layer_specific && r.knob != "*") {
      const KnobSpec* own = find_knob(op, r.knob);
      if (!own)
        throw PolicyError(fmt::format("layer '{}' ({}) has no knob '{}'; its knobs: {}", layer, op.name, r.knob,
                                      fmt::join(knob_names_for(op), ", ")));
      if (!value_ok(*own, r.value))
        throw PolicyError(fmt::format("layer '{}' ({}): '{}' is not a variant of {}; valid: {}, {}", layer, op.name,
                                      r.value, r.knob, fmt::join(own->variant_names(), ", "),
                                      fmt::join(mode_words(), ", ")));
    }
    if (r.knob != "*" && r.knob != knob) continue;
    if (!r.shape.empty() && r.shape != shape) continue;  // a rule for another input shape
    // A wildcard-layer rule applies only where the value fits this op kind.
    if (!layer_specific && r.knob != "*" && !(spec && value_ok(*spec, r.value))) continue;
    int rank = (layer_specific ? 2 : 0) + (r.knob != "*" ? 1 : 0) + (r.shape.empty() ? 0 : 4);
    if (rank >= best_rank) {
      best_rank = rank;
      best = r.value;
    }
  }
  return best;
}

KnobPick Policy::pick(const std::string& layer, OpKind op, const std::string& knob, const std::string& shape) const {
  const KnobSpec& spec = knob_spec(op, knob);
  const std::string v = lookup(layer, knob, op, shape);
  KnobPick out;
  if (parse_mode_word(v, out.mode)) {
    out.index = spec.mode_pick(out.mode);
  } else {
    out.mode = SelectMode::Pinned;
    out.index = spec.index_of(v);
  }
  return out;
}

std::string Policy::requested(const std::string& layer, const std::string& knob, OpKind op) const {
  auto v = lookup(layer, knob, op);
  return is_mode_word(v) ? v : "pinned";
}

void Policy::check_layers(const std::vector<std::pair<std::string, OpKind>>& layers) const {
  std::vector<std::string> names;
  for (const auto& l : layers) names.push_back(l.first);
  for (const auto& r : rules_) {
    if (r.layer == "*") continue;
    auto it = std::find_if(layers.begin(), layers.end(), [&](const auto& l) { return l.first == r.layer; });
    if (it == layers.end())
      throw PolicyError(fmt::format("policy names unknown layer '{}'; layers are {}", r.layer, fmt::join(names, ", ")));
    const auto own = knob_names_for(it->second);
    if (own.empty()) throw PolicyError(fmt::format("layer '{}' ({}) has no knobs", r.layer, it->second.name));
    lookup(it->first, r.knob == "*" ? own.front() : r.knob, it->second);
  }
}

}  // namespace ditto
