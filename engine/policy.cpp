#include "engine/policy.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>

#include "engine/error.h"

namespace ditto {
namespace {

const std::vector<std::string> kModeWords = {"heuristic", "deterministic", "nondeterministic", "fastest"};

bool is_mode_word(const std::string& v) {
  return std::find(kModeWords.begin(), kModeWords.end(), v) != kModeWords.end();
}

template <class E, std::size_t N>
const char* enum_name(E e, const char* const (&names)[N]) {
  auto i = static_cast<std::size_t>(e);
  return i < N ? names[i] : "?";
}

const char* const kFwdNames[] = {"implicit_gemm", "implicit_precomp_gemm", "gemm", "direct",
                                 "fft", "fft_tiling", "winograd", "winograd_nonfused"};
const char* const kBwdDataNames[] = {"algo0",    "algo1",      "fft",         "fft_tiling",
                                     "winograd", "winograd_nonfused", "ditto-gemm", "ditto-direct"};
const char* const kBwdFilterNames[] = {"algo0",      "algo1",      "fft",         "algo3",       "winograd",
                                       "winograd_nonfused", "fft_tiling", "ditto-gemm", "ditto-direct"};
const char* const kMathNames[] = {"fma", "tf32"};
const char* const kBiasNames[] = {"atomic", "deterministic", "cudnn"};
const char* const kPoolNames[] = {"cudnn", "cudnn-deterministic", "atomic-scatter", "gather"};
const char* const kBnNames[] = {"cudnn", "atomic", "deterministic"};
const char* const kReduceNames[] = {"atomic", "deterministic"};
const char* const kCublasAtomicsNames[] = {"off", "on"};
// ---- issue 18 part A
const char* const kScatterNames[] = {"atomic", "sorted"};
const char* const kUpsampleBwdNames[] = {"atomic", "gather"};
// ---- end of issue 18 part A
// -- issue 18, part B --
const char* const kGridSampleBwdNames[] = {"cudnn", "atomic", "deterministic"};
const char* const kAffineGridBwdNames[] = {"cudnn", "atomic", "deterministic"};
const char* const kRoiAlignBwdNames[] = {"atomic", "deterministic"};
const char* const kCtcAlgoNames[] = {"ditto", "cudnn-deterministic", "cudnn-nondeterministic"};
const char* const kSpmmFwdNames[] = {"ditto", "cusparse-default", "cusparse-alg1", "cusparse-alg2", "cusparse-alg3"};
const char* const kSpmmBwdNames[] = {"atomic", "deterministic", "cusparse"};
// -- issue 19 --
const char* const kAllReduceNames[] = {"fixed-order",     "ring",             "nccl-default", "nccl-ring-simple",
                                       "nccl-ring-ll",    "nccl-ring-ll128",  "nccl-tree-simple", "nccl-tree-ll",
                                       "nccl-tree-ll128"};
const char* const kChannelNames[] = {"auto", "1", "2", "4", "8", "16", "32"};

template <std::size_t N>
std::vector<std::string> names_vec(const char* const (&names)[N]) {
  return std::vector<std::string>(names, names + N);
}

template <class E, std::size_t N>
E parse_enum(const std::string& v, const char* const (&names)[N]) {
  for (std::size_t i = 0; i < N; ++i)
    if (v == names[i]) return static_cast<E>(i);
  throw PolicyError(fmt::format("unknown variant '{}'", v));  // unreachable after validation
}

const KnobSpec* find_spec(const std::string& knob, OpKind kind) {
  for (const auto& k : knobs())
    if (k.name == knob && k.op == kind) return &k;
  return nullptr;
}

std::vector<std::string> knob_names_for(OpKind kind) {
  std::vector<std::string> out;
  for (const auto& k : knobs())
    if (k.op == kind) out.push_back(k.name);
  return out;
}

std::vector<std::string> all_knob_names() {
  std::vector<std::string> out;
  for (const auto& k : knobs())
    if (std::find(out.begin(), out.end(), k.name) == out.end()) out.push_back(k.name);
  return out;
}

bool value_ok(const KnobSpec& spec, const std::string& v) {
  return is_mode_word(v) || std::find(spec.variants.begin(), spec.variants.end(), v) != spec.variants.end();
}

}  // namespace

const char* op_kind_name(OpKind k) {
  switch (k) {
    case OpKind::Conv2d: return "conv2d";
    case OpKind::Linear: return "linear";
    case OpKind::MaxPool2d: return "maxpool2d";
    case OpKind::BatchNorm: return "batchnorm";
    case OpKind::SoftmaxXent: return "softmax_xent";
    // ---- issue 18 part A
    case OpKind::ScatterAdd: return "scatter_add";
    case OpKind::Embedding: return "embedding";
    case OpKind::Upsample: return "upsample";
    case OpKind::PixelXent: return "pixel_xent";
    case OpKind::Reduce: return "reduce";
    // ---- end of issue 18 part A
    // -- issue 18, part B --
    case OpKind::GridSample: return "grid_sample";
    case OpKind::AffineGrid: return "affine_grid";
    case OpKind::RoiAlign: return "roi_align";
    case OpKind::CtcLoss: return "ctc_loss";
    case OpKind::Spmm: return "spmm";
    case OpKind::AllReduce: return "allreduce";
  }
  return "?";
}

const char* select_mode_name(SelectMode m) {
  switch (m) {
    case SelectMode::Pinned: return "pinned";
    case SelectMode::Heuristic: return "heuristic";
    case SelectMode::Deterministic: return "deterministic";
    case SelectMode::Nondeterministic: return "nondeterministic";
    case SelectMode::Fastest: return "fastest";
  }
  return "?";
}

const char* name_of(ConvFwdAlgo a) { return enum_name(a, kFwdNames); }
const char* name_of(ConvBwdDataAlgo a) { return enum_name(a, kBwdDataNames); }
const char* name_of(ConvBwdFilterAlgo a) { return enum_name(a, kBwdFilterNames); }
const char* name_of(MathMode m) { return enum_name(m, kMathNames); }
const char* name_of(BiasBwd b) { return enum_name(b, kBiasNames); }
const char* name_of(PoolBwd p) { return enum_name(p, kPoolNames); }
const char* name_of(BnBwd b) { return enum_name(b, kBnNames); }
const char* name_of(Reduction r) { return enum_name(r, kReduceNames); }
const char* name_of(CublasAtomics c) { return enum_name(c, kCublasAtomicsNames); }
// ---- issue 18 part A
const char* name_of(ScatterAlgo s) { return enum_name(s, kScatterNames); }
const char* name_of(UpsampleBwd u) { return enum_name(u, kUpsampleBwdNames); }
// ---- end of issue 18 part A
// -- issue 18, part B --
const char* name_of(GridSampleBwd v) { return enum_name(v, kGridSampleBwdNames); }
const char* name_of(AffineGridBwd v) { return enum_name(v, kAffineGridBwdNames); }
const char* name_of(RoiAlignBwd v) { return enum_name(v, kRoiAlignBwdNames); }
const char* name_of(CtcAlgo v) { return enum_name(v, kCtcAlgoNames); }
const char* name_of(SpmmFwd v) { return enum_name(v, kSpmmFwdNames); }
const char* name_of(SpmmBwd v) { return enum_name(v, kSpmmBwdNames); }
const char* name_of(AllReduceAlgo v) { return enum_name(v, kAllReduceNames); }

const std::vector<KnobSpec>& knobs() {
  static const std::vector<KnobSpec> table = {
      {"fwd", OpKind::Conv2d, names_vec(kFwdNames)},
      {"bwd_data", OpKind::Conv2d, names_vec(kBwdDataNames), {"algo0"}},
      {"bwd_filter", OpKind::Conv2d, names_vec(kBwdFilterNames), {"algo0", "algo3"}},
      {"math", OpKind::Conv2d, names_vec(kMathNames)},
      {"bias_bwd", OpKind::Conv2d, names_vec(kBiasNames), {"atomic"}},
      {"math", OpKind::Linear, names_vec(kMathNames)},
      {"bias_bwd", OpKind::Linear, {"atomic", "deterministic"}, {"atomic"}},
      {"cublas_atomics", OpKind::Linear, names_vec(kCublasAtomicsNames), {"on"}},
      // cuDNN's CUDNN_POOLING_MAX backward scatters with atomics where windows overlap.
      {"bwd", OpKind::MaxPool2d, names_vec(kPoolNames), {"cudnn", "atomic-scatter"}},
      // cuDNN's batch-norm backward is undocumented either way.
      {"bwd", OpKind::BatchNorm, names_vec(kBnNames), {"cudnn", "atomic"}},
      {"reduce", OpKind::SoftmaxXent, names_vec(kReduceNames), {"atomic"}},
      // ---- issue 18 part A: every atomic variant adds floats in the order threads arrive.
      {"scatter", OpKind::ScatterAdd, names_vec(kScatterNames), {"atomic"}},
      {"scatter", OpKind::Embedding, names_vec(kScatterNames), {"atomic"}},
      {"bwd", OpKind::Upsample, names_vec(kUpsampleBwdNames), {"atomic"}},
      {"reduce", OpKind::PixelXent, names_vec(kReduceNames), {"atomic"}},
      {"reduce", OpKind::Reduce, names_vec(kReduceNames), {"atomic"}},
      // ---- end of issue 18 part A
      // -- issue 18, part B --
      // cuDNN lists cudnnSpatialTfSamplerBackward among its non-reproducible routines.
      {"bwd", OpKind::GridSample, names_vec(kGridSampleBwdNames), {"cudnn", "atomic"}},
      // cudnnSpatialTfGridGeneratorBackward is not on that list, yet gave 10 different results in
      // 10 calls on an H100 with cuDNN 9.14.
      {"bwd", OpKind::AffineGrid, names_vec(kAffineGridBwdNames), {"atomic", "cudnn"}},
      {"bwd", OpKind::RoiAlign, names_vec(kRoiAlignBwdNames), {"atomic"}},
      {"algo", OpKind::CtcLoss, names_vec(kCtcAlgoNames), {"cudnn-nondeterministic"}},
      // cuSPARSE documents bit-wise reproducible SpMM for CSR only with CSR_ALG3, and says a
      // transposed sparse operand may give different results between runs.
      {"fwd", OpKind::Spmm, names_vec(kSpmmFwdNames), {"cusparse-default", "cusparse-alg1", "cusparse-alg2"}},
      {"bwd", OpKind::Spmm, names_vec(kSpmmBwdNames), {"atomic", "cusparse"}},
      // -- issue 19. NCCL documents no reproducibility; with its choice left to it the sum's order
      // follows the rank count, the message size and the topology (docs/determinism.md).
      {"algo", OpKind::AllReduce, names_vec(kAllReduceNames), {"nccl-default"}},
      {"channels", OpKind::AllReduce, names_vec(kChannelNames)},
  };
  return table;
}

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
    bool ok = !shape.empty() && std::isdigit(static_cast<unsigned char>(shape.front())) &&
              std::isdigit(static_cast<unsigned char>(shape.back()));
    for (char ch : shape) ok = ok && (std::isdigit(static_cast<unsigned char>(ch)) || ch == 'x');
    if (!ok) throw PolicyError(fmt::format("policy rule '{}': a shape is written NxCxHxW, got '{}'", rule, shape));
  }
  std::string layer = lhs, knob = "*";
  if (auto dot = lhs.rfind('.'); dot != std::string::npos) {
    layer = lhs.substr(0, dot);
    knob = lhs.substr(dot + 1);
    if (layer.empty() || knob.empty())
      throw PolicyError(fmt::format("policy rule '{}': empty layer or knob name", rule));
  }
  if (!shape.empty() && (layer == "*" || (knob != "fwd" && knob != "bwd_data" && knob != "bwd_filter")))
    throw PolicyError(fmt::format("policy rule '{}': only a named layer's fwd, bwd_data or bwd_filter knob takes @SHAPE",
                                  rule));
  if (knob == "*") {
    if (!is_mode_word(value))
      throw PolicyError(fmt::format("policy rule '{}': a rule for all knobs takes a mode, one of {}; "
                                    "to pin a variant name the knob (knobs: {})",
                                    rule, fmt::join(kModeWords, ", "), fmt::join(all_knob_names(), ", ")));
  } else {
    bool known = false, valid = false;
    std::vector<std::string> accepted = kModeWords;
    for (const auto& k : knobs()) {
      if (k.name != knob) continue;
      known = true;
      valid = valid || value_ok(k, value);
      for (const auto& v : k.variants)
        if (std::find(accepted.begin(), accepted.end(), v) == accepted.end()) accepted.push_back(v);
    }
    if (!known)
      throw PolicyError(fmt::format("policy rule '{}': unknown knob '{}'; knobs are {}", rule, knob,
                                    fmt::join(all_knob_names(), ", ")));
    if (!valid)
      throw PolicyError(fmt::format("policy rule '{}': unknown variant '{}' for knob '{}'; valid: {}", rule,
                                    value, knob, fmt::join(accepted, ", ")));
  }
  rules_.push_back({layer, knob, value, shape});
  rule_text_.push_back(rule);
  return *this;
}

Policy& Policy::pin(const std::string& l, ConvFwdAlgo a) { return set(l + ".fwd=" + name_of(a)); }
Policy& Policy::pin(const std::string& l, ConvBwdDataAlgo a) { return set(l + ".bwd_data=" + name_of(a)); }
Policy& Policy::pin(const std::string& l, ConvBwdFilterAlgo a) { return set(l + ".bwd_filter=" + name_of(a)); }
Policy& Policy::pin(const std::string& l, MathMode m) { return set(l + ".math=" + name_of(m)); }
Policy& Policy::pin(const std::string& l, BiasBwd b) { return set(l + ".bias_bwd=" + name_of(b)); }
Policy& Policy::pin(const std::string& l, PoolBwd p) { return set(l + ".bwd=" + name_of(p)); }
Policy& Policy::pin(const std::string& l, BnBwd b) { return set(l + ".bwd=" + name_of(b)); }
Policy& Policy::pin(const std::string& l, Reduction r) { return set(l + ".reduce=" + name_of(r)); }
Policy& Policy::pin(const std::string& l, CublasAtomics c) { return set(l + ".cublas_atomics=" + name_of(c)); }
// ---- issue 18 part A
Policy& Policy::pin(const std::string& l, ScatterAlgo s) { return set(l + ".scatter=" + name_of(s)); }
Policy& Policy::pin(const std::string& l, UpsampleBwd u) { return set(l + ".bwd=" + name_of(u)); }
// ---- end of issue 18 part A
// -- issue 18, part B --
Policy& Policy::pin(const std::string& l, GridSampleBwd v) { return set(l + ".bwd=" + name_of(v)); }
Policy& Policy::pin(const std::string& l, AffineGridBwd v) { return set(l + ".bwd=" + name_of(v)); }
Policy& Policy::pin(const std::string& l, RoiAlignBwd v) { return set(l + ".bwd=" + name_of(v)); }
Policy& Policy::pin(const std::string& l, CtcAlgo v) { return set(l + ".algo=" + name_of(v)); }
Policy& Policy::pin(const std::string& l, SpmmFwd v) { return set(l + ".fwd=" + name_of(v)); }
Policy& Policy::pin(const std::string& l, SpmmBwd v) { return set(l + ".bwd=" + name_of(v)); }
Policy& Policy::pin(const std::string& l, AllReduceAlgo v) { return set(l + ".algo=" + name_of(v)); }

std::string shape_key(const std::vector<int64_t>& shape) {
  std::string out;
  for (std::size_t i = 0; i < shape.size(); ++i) out += (i ? "x" : "") + std::to_string(shape[i]);
  return out;
}

std::string Policy::lookup(const std::string& layer, const std::string& knob, OpKind kind,
                           const std::string& shape) const {
  const KnobSpec* spec = find_spec(knob, kind);
  int best_rank = -1;
  std::string best = "heuristic";
  for (const auto& r : rules_) {
    bool layer_specific = r.layer == layer;
    if (!layer_specific && r.layer != "*") continue;
    if (layer_specific && r.knob != "*") {
      const KnobSpec* own = find_spec(r.knob, kind);
      if (!own)
        throw PolicyError(fmt::format("layer '{}' ({}) has no knob '{}'; its knobs: {}", layer,
                                      op_kind_name(kind), r.knob, fmt::join(knob_names_for(kind), ", ")));
      if (!value_ok(*own, r.value))
        throw PolicyError(fmt::format("layer '{}' ({}): '{}' is not a variant of {}; valid: {}, {}", layer,
                                      op_kind_name(kind), r.value, r.knob, fmt::join(own->variants, ", "),
                                      fmt::join(kModeWords, ", ")));
    }
    if (r.knob != "*" && r.knob != knob) continue;
    if (!r.shape.empty() && r.shape != shape) continue;  // a rule for another input shape
    // A wildcard-layer rule applies only where the value fits this op kind (`*.bwd=gather` is
    // meant for pools, not batch norm).
    if (!layer_specific && r.knob != "*" && !(spec && value_ok(*spec, r.value))) continue;
    int rank = (layer_specific ? 2 : 0) + (r.knob != "*" ? 1 : 0) + (r.shape.empty() ? 0 : 4);
    if (rank >= best_rank) {
      best_rank = rank;
      best = r.value;
    }
  }
  return best;
}

namespace {
template <class Algo, std::size_t N>
AlgoChoice<Algo> algo_choice(const std::string& v, const char* const (&names)[N]) {
  if (v == "heuristic") return {SelectMode::Heuristic, Algo{}};
  if (v == "deterministic") return {SelectMode::Deterministic, Algo{}};
  if (v == "nondeterministic") return {SelectMode::Nondeterministic, Algo{}};
  if (v == "fastest") return {SelectMode::Fastest, Algo{}};
  return {SelectMode::Pinned, parse_enum<Algo>(v, names)};
}
}  // namespace

AlgoChoice<ConvFwdAlgo> Policy::conv_fwd(const std::string& layer, const std::string& shape) const {
  return algo_choice<ConvFwdAlgo>(lookup(layer, "fwd", OpKind::Conv2d, shape), kFwdNames);
}
AlgoChoice<ConvBwdDataAlgo> Policy::conv_bwd_data(const std::string& layer, const std::string& shape) const {
  return algo_choice<ConvBwdDataAlgo>(lookup(layer, "bwd_data", OpKind::Conv2d, shape), kBwdDataNames);
}
AlgoChoice<ConvBwdFilterAlgo> Policy::conv_bwd_filter(const std::string& layer, const std::string& shape) const {
  return algo_choice<ConvBwdFilterAlgo>(lookup(layer, "bwd_filter", OpKind::Conv2d, shape), kBwdFilterNames);
}

MathMode Policy::math(const std::string& layer, OpKind kind) const {
  auto v = lookup(layer, "math", kind);
  return is_mode_word(v) ? MathMode::Fma : parse_enum<MathMode>(v, kMathNames);
}

BiasBwd Policy::bias_bwd(const std::string& layer, OpKind kind) const {
  auto v = lookup(layer, "bias_bwd", kind);
  if (v == "deterministic") return BiasBwd::Deterministic;
  if (v == "nondeterministic") return BiasBwd::Atomic;
  if (v == "heuristic" || v == "fastest") return kind == OpKind::Conv2d ? BiasBwd::Cudnn : BiasBwd::Atomic;
  return parse_enum<BiasBwd>(v, kBiasNames);
}

PoolBwd Policy::pool_bwd(const std::string& layer) const {
  auto v = lookup(layer, "bwd", OpKind::MaxPool2d);
  if (v == "deterministic") return PoolBwd::Gather;
  if (v == "nondeterministic") return PoolBwd::AtomicScatter;
  if (v == "heuristic" || v == "fastest") return PoolBwd::Cudnn;
  return parse_enum<PoolBwd>(v, kPoolNames);
}

BnBwd Policy::bn_bwd(const std::string& layer) const {
  auto v = lookup(layer, "bwd", OpKind::BatchNorm);
  if (v == "deterministic") return BnBwd::Deterministic;
  if (v == "nondeterministic") return BnBwd::Atomic;
  if (v == "heuristic" || v == "fastest") return BnBwd::Cudnn;
  return parse_enum<BnBwd>(v, kBnNames);
}

Reduction Policy::loss_reduce(const std::string& layer) const {
  auto v = lookup(layer, "reduce", OpKind::SoftmaxXent);
  if (v == "deterministic") return Reduction::Deterministic;
  if (is_mode_word(v)) return Reduction::Atomic;
  return parse_enum<Reduction>(v, kReduceNames);
}

CublasAtomics Policy::cublas_atomics(const std::string& layer) const {
  auto v = lookup(layer, "cublas_atomics", OpKind::Linear);
  if (v == "nondeterministic") return CublasAtomics::On;
  if (is_mode_word(v)) return CublasAtomics::Off;
  return parse_enum<CublasAtomics>(v, kCublasAtomicsNames);
}

// ---- issue 18 part A
ScatterAlgo Policy::scatter(const std::string& layer, OpKind kind) const {
  if (kind != OpKind::ScatterAdd && kind != OpKind::Embedding)
    throw Error(fmt::format("layer '{}': the scatter knob belongs to scatter_add and embedding layers, not {}", layer,
                            op_kind_name(kind)));
  auto v = lookup(layer, "scatter", kind);
  if (v == "deterministic") return ScatterAlgo::Sorted;
  if (is_mode_word(v)) return ScatterAlgo::Atomic;
  return parse_enum<ScatterAlgo>(v, kScatterNames);
}

UpsampleBwd Policy::upsample_bwd(const std::string& layer) const {
  auto v = lookup(layer, "bwd", OpKind::Upsample);
  if (v == "deterministic") return UpsampleBwd::Gather;
  if (is_mode_word(v)) return UpsampleBwd::Atomic;
  return parse_enum<UpsampleBwd>(v, kUpsampleBwdNames);
}

Reduction Policy::reduction(const std::string& layer, OpKind kind) const {
  if (kind != OpKind::PixelXent && kind != OpKind::Reduce)
    throw Error(fmt::format("layer '{}': Policy::reduction serves pixel_xent and reduce layers, not {}", layer,
                            op_kind_name(kind)));
  auto v = lookup(layer, "reduce", kind);
  if (v == "deterministic") return Reduction::Deterministic;
  if (is_mode_word(v)) return Reduction::Atomic;
  return parse_enum<Reduction>(v, kReduceNames);
}
// ---- end of issue 18 part A
// -- issue 18, part B --
GridSampleBwd Policy::grid_sample_bwd(const std::string& layer) const {
  auto v = lookup(layer, "bwd", OpKind::GridSample);
  if (v == "deterministic") return GridSampleBwd::Deterministic;
  if (is_mode_word(v)) return GridSampleBwd::Atomic;
  return parse_enum<GridSampleBwd>(v, kGridSampleBwdNames);
}

AffineGridBwd Policy::affine_grid_bwd(const std::string& layer) const {
  auto v = lookup(layer, "bwd", OpKind::AffineGrid);
  if (v == "nondeterministic") return AffineGridBwd::Atomic;
  if (is_mode_word(v)) return AffineGridBwd::Deterministic;
  return parse_enum<AffineGridBwd>(v, kAffineGridBwdNames);
}

RoiAlignBwd Policy::roi_align_bwd(const std::string& layer) const {
  auto v = lookup(layer, "bwd", OpKind::RoiAlign);
  if (v == "deterministic") return RoiAlignBwd::Deterministic;
  if (is_mode_word(v)) return RoiAlignBwd::Atomic;
  return parse_enum<RoiAlignBwd>(v, kRoiAlignBwdNames);
}

CtcAlgo Policy::ctc_algo(const std::string& layer) const {
  auto v = lookup(layer, "algo", OpKind::CtcLoss);
  if (v == "deterministic") return CtcAlgo::Ditto;
  if (is_mode_word(v)) return CtcAlgo::CudnnNondeterministic;
  return parse_enum<CtcAlgo>(v, kCtcAlgoNames);
}

SpmmFwd Policy::spmm_fwd(const std::string& layer) const {
  auto v = lookup(layer, "fwd", OpKind::Spmm);
  if (v == "deterministic") return SpmmFwd::Ditto;
  if (is_mode_word(v)) return SpmmFwd::CusparseDefault;
  return parse_enum<SpmmFwd>(v, kSpmmFwdNames);
}

SpmmBwd Policy::spmm_bwd(const std::string& layer) const {
  auto v = lookup(layer, "bwd", OpKind::Spmm);
  if (v == "deterministic") return SpmmBwd::Deterministic;
  if (v == "nondeterministic") return SpmmBwd::Atomic;
  if (is_mode_word(v)) return SpmmBwd::Cusparse;
  return parse_enum<SpmmBwd>(v, kSpmmBwdNames);
}

AllReduceAlgo Policy::allreduce_algo(const std::string& layer) const {
  auto v = lookup(layer, "algo", OpKind::AllReduce);
  if (v == "deterministic") return AllReduceAlgo::FixedOrder;
  if (is_mode_word(v)) return AllReduceAlgo::NcclDefault;
  return parse_enum<AllReduceAlgo>(v, kAllReduceNames);
}

int Policy::allreduce_channels(const std::string& layer) const {
  auto v = lookup(layer, "channels", OpKind::AllReduce);
  return is_mode_word(v) || v == "auto" ? 0 : std::stoi(v);
}

std::string Policy::requested(const std::string& layer, const std::string& knob, OpKind kind) const {
  auto v = lookup(layer, knob, kind);
  return is_mode_word(v) ? v : "pinned";
}

void Policy::check_layers(const std::vector<std::pair<std::string, OpKind>>& layers) const {
  std::vector<std::string> names;
  for (const auto& l : layers) names.push_back(l.first);
  for (const auto& r : rules_) {
    if (r.layer == "*") continue;
    auto it = std::find_if(layers.begin(), layers.end(), [&](const auto& l) { return l.first == r.layer; });
    if (it == layers.end())
      throw PolicyError(fmt::format("policy names unknown layer '{}'; layers are {}", r.layer,
                                    fmt::join(names, ", ")));
    lookup(it->first, r.knob == "*" ? knob_names_for(it->second).front() : r.knob, it->second);
  }
}

}  // namespace ditto
