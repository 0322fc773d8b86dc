// The knob registry: every choice that can change bits, declared by the op family that owns it.
//
// A knob is one choice of one op family ("maxpool2d" layers have knob "bwd"). Its family declares
// it once, beside its kernels (kernels/pool.cpp registers maxpool2d.bwd), with
//   - its variants in the order of the family's enum, each with the guarantee it gives and who
//     implements it (ditto's own kernel or a library's);
//   - its framework default: the variant the libraries' own defaults amount to (cuDNN's pick,
//     cuDNN's pooling and batch norm, atomics where the fast path has them);
//   - what PyTorch 2.11 runs with default settings, where that is another variant;
//   - whether the op selects among its variants at run time (convolution algorithms, which
//     cuDNN ranks per shape): then the mode words pass through to the op's own selection.
// The policy (engine/policy.h) resolves LAYER.KNOB=VARIANT rules against this registry and
// names no family; the CLI's help, the errors that list valid variants, the README's knob table
// (ditto-knobs --markdown) and the noise lab's candidates all read it.
//
// What each mode picks, the one rule for every knob whose op does not select at run time:
//   heuristic         the framework default.
//   pytorch           what PyTorch 2.11 runs with default settings (cudnn.benchmark and
//                     deterministic off): the knob's pytorch_default, else its framework default.
//                     The precision is a knob of its own in every mode (PyTorch's default lets
//                     cuDNN convolutions use TF32: pin *.precision=tf32 on those layers for that).
//   fastest           as heuristic (only run-time selection has anything to time).
//   deterministic     the variant with the strongest guarantee (gpu_to_gpu over run_to_run),
//                     the first declared among equals; never one declared by_name_only.
//   nondeterministic  the first variant that is not guaranteed and is ditto's own (atomics whose
//                     order is the only difference); else the first not guaranteed or unknown of
//                     a library; a knob with none picks its framework default.
#pragma once
#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

#include "engine/manifest.h"

namespace ditto {

// An op family's name as the registry knows it. Each family defines its own constant
// (kernels/pool.h: op::maxpool2d); the engine knows none of them.
struct OpKind {
  const char* name = "";
  friend bool operator==(OpKind a, OpKind b) { return std::strcmp(a.name, b.name) == 0; }
  friend bool operator!=(OpKind a, OpKind b) { return !(a == b); }
  friend bool operator<(OpKind a, OpKind b) { return std::strcmp(a.name, b.name) < 0; }
};
inline const char* op_kind_name(OpKind k) { return k.name; }

// How a knob's value was chosen: pinned by a rule naming a variant, or one of the four modes.
enum class SelectMode { Pinned, Heuristic, Deterministic, Nondeterministic, Fastest, Pytorch };
const char* select_mode_name(SelectMode m);
// "heuristic" -> Heuristic, ...; false for anything that is not a mode word.
bool parse_mode_word(const std::string& word, SelectMode& out);
const std::vector<std::string>& mode_words();

struct VariantSpec {
  const char* name;       // as policy strings and manifests write it ("gather")
  Guarantee guarantee;    // what the variant promises across runs and GPUs (engine/manifest.h)
  Impl impl;              // ditto's own kernel, or a library's
  const char* summary;    // one line: what it does
  // The CPU runs this variant itself (a choice of order between ranks, or of statistics), where
  // for every other variant it runs the op's one double-accumulating reference.
  bool on_cpu = false;
  // No mode picks it: a rule names it. For a slower kernel kept for a property beyond run-to-run
  // determinism (batch invariance), which `deterministic` should not trade speed for.
  bool by_name_only = false;
  // Its guarantee is the configuration's the op picks per shape (recorded in the manifest), so the
  // registry's is "unknown"; the noise lab does not list it among its candidates (a run reaches it
  // through the mode that picks it).
  bool per_shape_guarantee = false;
};

struct KnobSpec {
  OpKind op;
  std::string name;                    // "bwd"
  std::vector<VariantSpec> variants;   // in the order of the family's enum
  std::string framework_default;       // heuristic's pick ("" where the op selects at run time)
  bool selected_at_run_time = false;   // the op ranks its variants per shape (cuDNN's algorithms)
  std::string summary;                 // one line: what the knob chooses
  // The variant PyTorch 2.11 runs with default settings where it is not the framework default
  // ("" where they are the same, or the op selects at run time): the pytorch mode's pick.
  std::string pytorch_default;

  std::vector<std::string> variant_names() const;
  // The index of a variant by name; npos when it has no such variant.
  std::size_t index_of(const std::string& variant) const;
  // What a mode picks (the rule above). For a knob selected at run time, npos: the op decides.
  std::size_t mode_pick(SelectMode mode) const;
  // Variants not guaranteed to give the same bits on every call (atomics, or a library path
  // labelled nondeterministic or documented neither way), but for those whose guarantee follows a
  // per-shape configuration: the noise lab's candidates.
  std::vector<std::string> nondeterministic() const;
};

// Adds a family's knob; throws Error when (op, name) is registered twice or the declaration
// breaks the rule's assumptions (no variant, duplicate names, a framework default that is not a
// variant, no guaranteed variant, a variant named like a mode that the mode does not pick: a
// rule's value is read as a mode word first, so `bwd=deterministic` means the mode, whose pick
// must then be the variant of that name). Returns the stored spec, which lives for the program.
const KnobSpec& register_knob(KnobSpec spec);
// Every registered knob, in registration order (families register at load time).
const std::vector<KnobSpec>& knobs();
// The spec of (op, knob); null when none.
const KnobSpec* find_knob(OpKind op, const std::string& knob);
// The spec of (op, knob); throws Error naming both when none (a family asking for a knob it
// never registered).
const KnobSpec& knob_spec(OpKind op, const std::string& knob);
// Every op kind that has at least one knob, in registration order.
std::vector<OpKind> knob_ops();
// Whether a pin's value takes effect on the CPU: some knob named `knob` has a variant `value` that
// the CPU runs itself (VariantSpec::on_cpu). Mode words and every other variant run the reference.
bool runs_on_cpu(const std::string& knob, const std::string& value);
// Every op kind with its knobs: "conv2d: fwd, bwd_data, ...; linear: math, ...".
std::string knob_index();
// The variant names of `knob` grouped by op: "conv2d: algo0, algo1, ...; spmm: ditto, ...".
std::string describe_variants(const std::string& knob);
// The registry as a Markdown table: op, knob, variants with their guarantees, and what each mode
// picks. README's knob table is this text (a CPU test compares them).
std::string knob_table_markdown();

// A family's enum value as a variant name: knob's variant at the enum's index.
template <class E>
const char* variant_name(const KnobSpec& knob, E value) {
  const auto i = static_cast<std::size_t>(value);
  return i < knob.variants.size() ? knob.variants[i].name : "?";
}

}  // namespace ditto

// Declares `const KnobSpec& FN()`, the family's knob, registered when the library loads (so
// knobs() lists it before anyone asks) and on first use (so no caller can see it unregistered).
// The arguments are a KnobSpec's fields, in a family's source file:
//   DITTO_KNOB(pool_bwd_knob, {op::maxpool2d, "bwd", {{"cudnn", ...}, ...}, "cudnn", false, "..."})
// (A pointer, not a reference, holds the registered spec: GCC 13's -Wdangling-reference takes a
// reference returned by a call with a temporary argument for one into that temporary.)
#define DITTO_KNOB(FN, ...)                                                       \
  const ::ditto::KnobSpec& FN() {                                                 \
    static const ::ditto::KnobSpec* registered = &::ditto::register_knob(__VA_ARGS__); \
    return *registered;                                                           \
  }                                                                               \
  namespace {                                                                     \
  [[maybe_unused]] const ::ditto::KnobSpec& FN##_at_load = FN();                  \
  }
