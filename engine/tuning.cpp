#include "engine/tuning.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "engine/error.h"
#include "engine/knob.h"
#include "engine/manifest.h"
#include "engine/policy.h"
#include "engine/tensor.h"

namespace ditto {
namespace {

using json = nlohmann::json;

// The variants of the tuned knob (op, knob); empty when it is not one a tuning file holds.
std::vector<std::string> algos_of(const std::string& op, const std::string& direction) {
  // A tuning file names its knob as the op that runs it: "bias_add" entries tune the bias_bwd
  // knob, whose variants are the conv layers' (linear's are a subset).
  const bool tuned = (op == "conv2d" && (direction == "fwd" || direction == "bwd_data" || direction == "bwd_filter")) ||
                     (op == "maxpool2d" && direction == "bwd") || (op == "bias_add" && direction == "bias_bwd");
  if (!tuned) return {};
  const KnobSpec* k = find_knob(OpKind{op == "bias_add" ? "conv2d" : op.c_str()}, direction);
  return k ? k->variant_names() : std::vector<std::string>{};
}

}  // namespace

std::string TuningEntry::key() const {
  // Convolution keys read as they always have, so older files keep their keys.
  return fmt::format("{}{}|x{}|w{}|s{},{}|p{},{}|d{},{}|g{}|{}{}", op == "conv2d" ? "" : op + ":", direction,
                     fmt::join(x, "x"), fmt::join(w, "x"), stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w,
                     groups, precision, layout.empty() ? "" : "|" + layout);
}

TuningTable TuningTable::load(const std::string& path, const std::string& expect_gpu, const std::string& expect_cudnn) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError(fmt::format("{}: cannot open tuning file", path));
  const std::string text((std::istreambuf_iterator<char>(in)), {});
  json doc;
  try {
    doc = json::parse(text);
  } catch (const json::parse_error& e) {
    throw DataError(fmt::format("{}: malformed JSON at byte {}: {}", path, e.byte, e.what()));
  }
  TuningTable t;
  t.reading_ = true;
  t.path_ = path;
  t.file_hash_ = fingerprint_bytes(text.data(), text.size());
  try {
    if (doc.at("ditto_tuning").get<int>() != 1)
      throw DataError(fmt::format("{}: tuning file version {} is not 1", path, doc.at("ditto_tuning").dump()));
    t.gpu = doc.at("gpu").get<std::string>();
    t.cudnn = doc.at("cudnn").get<std::string>();
    t.workspace_budget = doc.value("workspace_budget_bytes", std::size_t(0));
  } catch (const json::exception& e) {
    throw DataError(fmt::format("{}: not a ditto tuning file: {}", path, e.what()));
  }
  if (!expect_gpu.empty() && t.gpu != expect_gpu)
    throw DataError(fmt::format("{}: tuned on '{}', this run is on '{}'; tune again for this GPU", path, t.gpu, expect_gpu));
  if (!expect_cudnn.empty() && t.cudnn != expect_cudnn)
    throw DataError(fmt::format("{}: tuned with cuDNN {}, this run loads cuDNN {}; tune again", path, t.cudnn,
                                expect_cudnn));
  const json& list = doc.contains("entries") ? doc["entries"] : json();
  if (!list.is_array()) throw DataError(fmt::format("{}: no \"entries\" list", path));
  for (std::size_t i = 0; i < list.size(); ++i) {
    TuningEntry e;
    const json& j = list[i];
    auto where = [&] { return fmt::format("{}: entry {}{}", path, i, e.direction.empty() ? "" : " (" + e.key() + ")"); };
    try {
      e.op = j.value("op", std::string("conv2d"));
      e.direction = j.at("direction").get<std::string>();
      e.x = j.at("x").get<std::vector<int64_t>>();
      e.w = j.at("w").get<std::vector<int64_t>>();
      auto pair = [&](const char* k, int& a, int& b) {
        auto v = j.at(k).get<std::vector<int>>();
        if (v.size() != 2) throw DataError(fmt::format("{}: \"{}\" must hold 2 numbers", where(), k));
        a = v[0];
        b = v[1];
      };
      pair("stride", e.stride_h, e.stride_w);
      pair("pad", e.pad_h, e.pad_w);
      pair("dilation", e.dilation_h, e.dilation_w);
      e.groups = j.at("groups").get<int>();
      // Files written before precisions had "math": fma (now fp32) or tf32.
      e.precision = j.contains("precision") ? j.at("precision").get<std::string>()
                                            : legacy_precision(j.at("math").get<std::string>());
      e.layout = j.value("layout", "");
      e.algo = j.at("algo").get<std::string>();
      e.time_ms = j.value("time_ms", 0.0);
      e.workspace_bytes = j.value("workspace_bytes", std::size_t(0));
      e.layer = j.value("layer", "");
    } catch (const json::exception& ex) {
      throw DataError(fmt::format("{}: {}", where(), ex.what()));
    }
    const auto algos = algos_of(e.op, e.direction);
    if (algos.empty())
      throw DataError(fmt::format("{}: unknown knob '{}' of op '{}'; tuned knobs are conv2d fwd, bwd_data, bwd_filter, "
                                  "maxpool2d bwd and bias_add bias_bwd",
                                  where(), e.direction, e.op));
    const bool conv = e.op == "conv2d";
    const auto& precisions = knob_spec(OpKind{"conv2d"}, "precision").variant_names();
    if (conv && std::find(precisions.begin(), precisions.end(), e.precision) == precisions.end())
      throw DataError(fmt::format("{}: unknown precision '{}'; precisions are {}", where(), e.precision,
                                  fmt::join(precisions, ", ")));
    if (!e.layout.empty() && (e.layout != "nhwc" || !conv))
      throw DataError(fmt::format("{}: layout '{}': convolutions may say \"nhwc\", nothing else has a layout", where(),
                                  e.layout));
    if (!conv && !e.precision.empty())
      throw DataError(fmt::format("{}: precision '{}' applies to convolutions only", where(), e.precision));
    if (std::find(algos.begin(), algos.end(), e.algo) == algos.end())
      throw DataError(fmt::format("{}: '{}' is not a {}{} {}; valid: {}", where(), e.algo, conv ? "" : e.op + " ",
                                  e.direction, conv ? "algorithm" : "variant", fmt::join(algos, ", ")));
    const std::size_t want_w = conv ? 4 : e.op == "maxpool2d" ? 2 : 0;
    if (e.x.size() != 4 && !(e.op == "bias_add" && e.x.size() == 2))
      throw DataError(fmt::format("{}: x must be a 4-D shape{}", where(), e.op == "bias_add" ? " (or 2-D)" : ""));
    if (e.w.size() != want_w)
      throw DataError(fmt::format("{}: w must hold {} numbers for {}", where(), want_w, e.op));
    if (t.find(e.key())) throw DataError(fmt::format("{}: a second entry for the same problem", where()));
    if (t.workspace_budget && e.workspace_bytes > t.workspace_budget)
      throw DataError(fmt::format("{}: '{}' takes a workspace of {} bytes, over the file's budget of {} bytes", where(),
                                  e.algo, e.workspace_bytes, t.workspace_budget));
    t.add(std::move(e));
  }
  return t;
}

Fingerprint TuningTable::save(const std::string& path) const {
  json list = json::array();
  for (const auto& e : entries_) {
    list.push_back({{"op", e.op}, {"direction", e.direction}, {"x", e.x}, {"w", e.w}, {"stride", {e.stride_h, e.stride_w}},
                    {"pad", {e.pad_h, e.pad_w}}, {"dilation", {e.dilation_h, e.dilation_w}}, {"groups", e.groups},
                    {"precision", e.precision}, {"algo", e.algo}, {"time_ms", e.time_ms}, {"layer", e.layer}});
    if (!e.layout.empty()) list.back()["layout"] = e.layout;
    if (e.workspace_bytes) list.back()["workspace_bytes"] = e.workspace_bytes;
  }
  json doc{{"ditto_tuning", 1}, {"gpu", gpu}, {"cudnn", cudnn}, {"entries", list}};
  if (workspace_budget) doc["workspace_budget_bytes"] = workspace_budget;
  const std::string text = doc.dump(1);
  write_file_atomic(path, text);
  return fingerprint_bytes(text.data(), text.size());
}

const TuningEntry* TuningTable::find(const std::string& key) const {
  auto it = index_.find(key);
  return it == index_.end() ? nullptr : &entries_[it->second];
}

void TuningTable::add(TuningEntry e) {
  const std::string k = e.key();
  if (auto it = index_.find(k); it != index_.end()) {
    entries_[it->second] = std::move(e);
    return;
  }
  index_[k] = entries_.size();
  entries_.push_back(std::move(e));
}

}  // namespace ditto
