#include "engine/knob.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <deque>
#include <limits>

#include "engine/error.h"

namespace ditto {
namespace {

constexpr std::size_t npos = std::numeric_limits<std::size_t>::max();

// Stable addresses: register_knob hands out references that families keep.
struct Registry {
  std::deque<KnobSpec> specs;
  std::vector<KnobSpec> view;  // copies in registration order, for iteration
};

Registry& registry() {
  static Registry r;
  return r;
}

int strength(Guarantee g) {
  switch (g) {
    case Guarantee::GpuToGpu: return 2;
    case Guarantee::RunToRun: return 1;
    case Guarantee::NotGuaranteed:
    case Guarantee::Unknown: return 0;
  }
  return 0;
}

bool guaranteed(Guarantee g) { return strength(g) > 0; }

void validate(const KnobSpec& s) {
  const std::string who = fmt::format("knob {}.{}", s.op.name, s.name);
  if (s.name.empty() || !*s.op.name) throw Error(fmt::format("{}: a knob needs an op and a name", who));
  if (s.variants.empty()) throw Error(fmt::format("{}: declares no variant", who));
  for (std::size_t i = 0; i < s.variants.size(); ++i) {
    const std::string v = s.variants[i].name;
    if (v.empty()) throw Error(fmt::format("{}: a variant needs a name", who));
    if (s.index_of(v) != i) throw Error(fmt::format("{}: variant '{}' declared twice", who, v));
  }
  if (s.selected_at_run_time != s.framework_default.empty())
    throw Error(fmt::format("{}: a framework default is declared exactly when the op does not select at run time", who));
  if (!s.selected_at_run_time && s.index_of(s.framework_default) == npos)
    throw Error(fmt::format("{}: framework default '{}' is not one of its variants", who, s.framework_default));
  if (std::none_of(s.variants.begin(), s.variants.end(),
                   [](const VariantSpec& v) { return guaranteed(v.guarantee) && !v.by_name_only; }))
    throw Error(fmt::format("{}: no variant a mode may pick is guaranteed, so the deterministic mode has nothing to pick",
                            who));
  if (!s.pytorch_default.empty() && (s.selected_at_run_time || s.index_of(s.pytorch_default) == npos ||
                                     s.variants[s.index_of(s.pytorch_default)].by_name_only))
    throw Error(fmt::format("{}: PyTorch's default '{}' is not a variant a mode may pick", who, s.pytorch_default));
  if (!s.selected_at_run_time && s.variants[s.index_of(s.framework_default)].by_name_only)
    throw Error(fmt::format("{}: framework default '{}' is declared by_name_only", who, s.framework_default));
  // A rule's value is read as a mode word first, so a variant named like a mode ("deterministic")
  // is reachable only as that mode's pick: the declaration must make it so.
  for (std::size_t i = 0; i < s.variants.size(); ++i) {
    SelectMode m;
    if (parse_mode_word(s.variants[i].name, m) && s.mode_pick(m) != i)
      throw Error(fmt::format("{}: variant '{}' is named like a mode, but that mode picks '{}'", who,
                              s.variants[i].name, s.selected_at_run_time ? "per shape" : s.variants[s.mode_pick(m)].name));
  }
}

std::string guarantee_words(Guarantee g) {
  switch (g) {
    case Guarantee::GpuToGpu: return "gpu-to-gpu";
    case Guarantee::RunToRun: return "run-to-run";
    case Guarantee::NotGuaranteed: return "**not guaranteed**";
    case Guarantee::Unknown: return "**unknown**";
  }
  return "?";
}

}  // namespace

const char* select_mode_name(SelectMode m) {
  switch (m) {
    case SelectMode::Pinned: return "pinned";
    case SelectMode::Heuristic: return "heuristic";
    case SelectMode::Deterministic: return "deterministic";
    case SelectMode::Nondeterministic: return "nondeterministic";
    case SelectMode::Fastest: return "fastest";
    case SelectMode::Pytorch: return "pytorch";
  }
  return "?";
}

const std::vector<std::string>& mode_words() {
  static const std::vector<std::string> words = {"heuristic", "deterministic", "nondeterministic", "fastest",
                                                 "pytorch"};
  return words;
}

bool parse_mode_word(const std::string& word, SelectMode& out) {
  static const SelectMode modes[] = {SelectMode::Heuristic, SelectMode::Deterministic, SelectMode::Nondeterministic,
                                     SelectMode::Fastest, SelectMode::Pytorch};
  for (std::size_t i = 0; i < mode_words().size(); ++i)
    if (word == mode_words()[i]) {
      out = modes[i];
      return true;
    }
  return false;
}

std::vector<std::string> KnobSpec::variant_names() const {
  std::vector<std::string> out;
  for (const auto& v : variants) out.push_back(v.name);
  return out;
}

std::size_t KnobSpec::index_of(const std::string& variant) const {
  for (std::size_t i = 0; i < variants.size(); ++i)
    if (variant == variants[i].name) return i;
  return npos;
}

std::size_t KnobSpec::mode_pick(SelectMode mode) const {
  if (selected_at_run_time) return npos;
  switch (mode) {
    case SelectMode::Pinned:
      throw Error(fmt::format("knob {}.{}: a pinned rule names its variant; no mode picks it", op.name, name));
    case SelectMode::Heuristic:
    case SelectMode::Fastest:
      return index_of(framework_default);
    case SelectMode::Pytorch:
      return index_of(pytorch_default.empty() ? framework_default : pytorch_default);
    case SelectMode::Deterministic: {
      std::size_t best = npos;
      for (std::size_t i = 0; i < variants.size(); ++i)
        if (!variants[i].by_name_only &&
            (best == npos || strength(variants[i].guarantee) > strength(variants[best].guarantee)))
          best = i;
      return best;
    }
    case SelectMode::Nondeterministic: {
      for (std::size_t i = 0; i < variants.size(); ++i)
        if (variants[i].guarantee == Guarantee::NotGuaranteed && variants[i].impl == Impl::Ditto) return i;
      for (std::size_t i = 0; i < variants.size(); ++i)
        if (!guaranteed(variants[i].guarantee)) return i;
      return index_of(framework_default);
    }
  }
  return npos;
}

std::vector<std::string> KnobSpec::nondeterministic() const {
  std::vector<std::string> out;
  for (const auto& v : variants)
    if (!guaranteed(v.guarantee) && !v.per_shape_guarantee) out.push_back(v.name);
  return out;
}

const KnobSpec& register_knob(KnobSpec spec) {
  validate(spec);
  Registry& r = registry();
  if (find_knob(spec.op, spec.name))
    throw Error(fmt::format("knob {}.{} is registered twice", spec.op.name, spec.name));
  r.specs.push_back(spec);
  r.view.push_back(std::move(spec));
  return r.specs.back();
}

const std::vector<KnobSpec>& knobs() { return registry().view; }

const KnobSpec* find_knob(OpKind op, const std::string& knob) {
  for (const auto& k : registry().specs)
    if (k.op == op && k.name == knob) return &k;
  return nullptr;
}

const KnobSpec& knob_spec(OpKind op, const std::string& knob) {
  if (const KnobSpec* k = find_knob(op, knob)) return *k;
  throw Error(fmt::format("op {} registered no knob '{}'", op.name, knob));
}

std::vector<OpKind> knob_ops() {
  std::vector<OpKind> out;
  for (const auto& k : knobs())
    if (std::find(out.begin(), out.end(), k.op) == out.end()) out.push_back(k.op);
  return out;
}

bool runs_on_cpu(const std::string& knob, const std::string& value) {
  for (const auto& k : knobs())
    if (k.name == knob)
      for (const auto& v : k.variants)
        if (v.on_cpu && value == v.name) return true;
  return false;
}

std::string knob_index() {
  std::vector<std::string> parts;
  for (OpKind op : knob_ops()) {
    std::vector<std::string> names;
    for (const auto& k : knobs())
      if (k.op == op) names.push_back(k.name);
    parts.push_back(fmt::format("{}: {}", op.name, fmt::join(names, ", ")));
  }
  return fmt::format("{}", fmt::join(parts, "; "));
}

std::string describe_variants(const std::string& knob) {
  std::vector<std::string> parts;
  for (const auto& k : knobs())
    if (k.name == knob) parts.push_back(fmt::format("{} layers: {}", k.op.name, fmt::join(k.variant_names(), ", ")));
  return fmt::format("{}", fmt::join(parts, "; "));
}

std::string knob_table_markdown() {
  std::string out =
      "| op | knob | variants (guarantee, implementation) | heuristic | deterministic | nondeterministic | pytorch |\n"
      "|---|---|---|---|---|---|---|\n";
  for (const auto& k : knobs()) {
    std::vector<std::string> vs;
    for (const auto& v : k.variants)
      vs.push_back(fmt::format("`{}` ({}, {})", v.name, guarantee_words(v.guarantee),
                               v.impl == Impl::Ditto ? "ditto" : "library"));
    auto pick = [&](SelectMode m) -> std::string {
      const std::size_t i = k.mode_pick(m);
      return i == npos ? "selected per shape" : fmt::format("`{}`", k.variants[i].name);
    };
    out += fmt::format("| {} | `{}` | {} | {} | {} | {} | {} |\n", k.op.name, k.name, fmt::join(vs, ", "),
                       pick(SelectMode::Heuristic), pick(SelectMode::Deterministic),
                       pick(SelectMode::Nondeterministic), pick(SelectMode::Pytorch));
  }
  return out;
}

}  // namespace ditto
