#include "experiments/trace.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <set>
#include <nlohmann/json.hpp>

#include "engine/detail/json_error.h"
#include "engine/error.h"

namespace ditto {
namespace {

// 3: each tensor's value is its digest (engine/digest.h, computed where the tensor lives); 2 held
// XXH3-128 of the bytes copied to the host, 1 the FNV-1a versions' 16-digit fingerprints.
constexpr int kTraceFormatVersion = 3;

// ordered_json keeps step, seq, phase, layer and op at the front of each line, where a person
// scanning a trace with grep or less looks first.
nlohmann::ordered_json tensors_to_json(const std::vector<TraceTensor>& tensors) {
  auto array = nlohmann::ordered_json::array();
  for (const TraceTensor& t : tensors)
    array.push_back({{"name", t.name}, {"fingerprint", t.fingerprint.hex()}, {"numel", t.numel}});
  return array;
}

// A trace must never stop the run it records over a stray byte in a layer name or command line.
template <typename Json>
std::string dump_line(const Json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// One line of a trace file being read, so every complaint names path:line.
struct TraceLine {
  const std::string& path;
  int64_t number;
  [[noreturn]] void fail(const std::string& what) const {
    throw DataError(fmt::format("{}:{}: {}", path, number, what));
  }
  const nlohmann::json& field(const nlohmann::json& object, const char* key) const {
    auto it = object.find(key);
    if (it == object.end()) fail(fmt::format("missing field \"{}\"", key));
    return *it;
  }
  std::string string_field(const nlohmann::json& object, const char* key) const {
    const nlohmann::json& value = field(object, key);
    if (!value.is_string()) fail(fmt::format("field \"{}\" is not a string", key));
    return value.get<std::string>();
  }
  int64_t integer_field(const nlohmann::json& object, const char* key, int64_t minimum) const {
    const nlohmann::json& value = field(object, key);
    if (!value.is_number_integer()) fail(fmt::format("field \"{}\" is not an integer", key));
    auto n = value.get<int64_t>();
    if (n < minimum) fail(fmt::format("field \"{}\" is {}, below {}", key, n, minimum));
    return n;
  }
  // Exactly what the writer produces: 32 lowercase hex digits, so a damaged value is not misread.
  Fingerprint fingerprint(const std::string& hex) const {
    auto f = parse_fingerprint(hex);
    if (!f) fail(fmt::format("fingerprint \"{}\" is not 32 lowercase hex digits", hex));
    return *f;
  }
  std::vector<TraceTensor> tensors(const nlohmann::json& object, const char* key) const {
    const nlohmann::json& array = field(object, key);
    if (!array.is_array()) fail(fmt::format("field \"{}\" is not an array", key));
    std::vector<TraceTensor> out;
    for (const nlohmann::json& t : array) {
      if (!t.is_object()) fail(fmt::format("an entry of \"{}\" is not an object", key));
      out.push_back({string_field(t, "name"), fingerprint(string_field(t, "fingerprint")), integer_field(t, "numel", 0)});
    }
    return out;
  }
  nlohmann::json parse(const std::string& text) const {
    try {
      return nlohmann::json::parse(text);
    } catch (const nlohmann::json::parse_error& e) {
      fail(fmt::format("malformed JSON at byte {} of the line: {}", e.byte > 0 ? e.byte - 1 : 0,
                       detail::json_syntax_problem(e)));
    }
  }
};

// Empty when a and b are the same event of the same run; otherwise what tells them apart.
std::string tensors_difference(const std::vector<TraceTensor>& a, const std::vector<TraceTensor>& b, const char* kind) {
  if (a.size() != b.size()) return fmt::format("{} vs {} {}s", a.size(), b.size(), kind);
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].name != b[i].name) return fmt::format("{} {} is {} vs {}", kind, i, a[i].name, b[i].name);
    if (a[i].numel != b[i].numel)
      return fmt::format("{} {} has {} vs {} elements", kind, a[i].name, a[i].numel, b[i].numel);
  }
  return "";
}

std::string structure_difference(const TraceEvent& a, const TraceEvent& b) {
  if (a.step != b.step || a.seq != b.seq)
    return fmt::format("step {} seq {} vs step {} seq {}", a.step, a.seq, b.step, b.seq);
  if (a.phase != b.phase) return fmt::format("phase {} vs {}", a.phase, b.phase);
  if (a.layer != b.layer) return fmt::format("layer {} vs {}", a.layer, b.layer);
  if (a.op != b.op) return fmt::format("op {} vs {}", a.op, b.op);
  std::string inputs = tensors_difference(a.inputs, b.inputs, "input");
  return inputs.empty() ? tensors_difference(a.outputs, b.outputs, "output") : inputs;
}

// Index of the first tensor whose fingerprint differs, or -1; the lists are structurally equal.
int first_differing(const std::vector<TraceTensor>& a, const std::vector<TraceTensor>& b) {
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].fingerprint != b[i].fingerprint) return static_cast<int>(i);
  return -1;
}

}  // namespace

TraceWriter::TraceWriter(const std::string& path, const TraceMeta& meta)
    : path_(path), temporary_path_(fmt::format("{}.tmp.{}", path, ::getpid())) {
  file_ = std::fopen(temporary_path_.c_str(), "wb");
  if (!file_) throw IoError(fmt::format("{}: cannot open for writing: {}", temporary_path_, std::strerror(errno)));
  nlohmann::ordered_json header{{"ditto_trace", kTraceFormatVersion}, {"meta", meta}};
  write_line(dump_line(header));  // on failure write_line has already removed the temporary file
}

TraceWriter::~TraceWriter() { discard_temporary(); }

void TraceWriter::discard_temporary() {
  if (!file_) return;
  std::fclose(file_);
  file_ = nullptr;
  std::remove(temporary_path_.c_str());
}

void TraceWriter::write_line(const std::string& line) {
  if (!file_) throw Error(fmt::format("{}: trace writer used after close or after a failed write", path_));
  if (std::fwrite(line.data(), 1, line.size(), file_) != line.size() || std::fputc('\n', file_) == EOF) {
    int err = errno;
    discard_temporary();  // a trace with a hole would mislead a comparison
    throw IoError(fmt::format("{}: write failed: {}", temporary_path_, std::strerror(err)));
  }
}

void TraceWriter::write(const TraceEvent& e) {
  nlohmann::ordered_json j{{"step", e.step}, {"seq", e.seq}, {"phase", e.phase}, {"layer", e.layer}, {"op", e.op},
                           {"inputs", tensors_to_json(e.inputs)}, {"outputs", tensors_to_json(e.outputs)}};
  write_line(dump_line(j));
}

void TraceWriter::close() {
  if (!file_) return;
  // fsync before rename: otherwise a crash can leave the final name pointing at an empty file.
  bool ok = std::fflush(file_) == 0;
  ok = (::fsync(::fileno(file_)) == 0) && ok;
  ok = (std::fclose(file_) == 0) && ok;
  file_ = nullptr;
  if (!ok || std::rename(temporary_path_.c_str(), path_.c_str()) != 0) {
    int err = errno;
    std::remove(temporary_path_.c_str());
    throw IoError(fmt::format("{}: cannot finish the trace: {}", path_, std::strerror(err)));
  }
}

void write_trace(const std::string& path, const Trace& t) {
  TraceWriter writer(path, t.meta);
  for (const TraceEvent& e : t.events) writer.write(e);
  writer.close();
}

Trace read_trace(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw IoError(fmt::format("{}: cannot open for reading: {}", path, std::strerror(errno)));
  Trace trace;
  std::string text;
  TraceLine line{path, 1};
  if (!std::getline(in, text)) line.fail("empty file, expected the {\"ditto_trace\": 1, ...} header");
  nlohmann::json header = line.parse(text);
  if (header.is_object() && header.value("ditto_trace", nlohmann::json()) == 1)
    line.fail("a trace of format 1, whose fingerprints are the FNV-1a versions' 64-bit ones (paired changes cancel "
              "out in them, so a comparison could miss a difference); record it again with this ditto");
  if (header.is_object() && header.value("ditto_trace", nlohmann::json()) == 2)
    line.fail("a trace of format 2, whose tensors carry XXH3 fingerprints of their bytes where this ditto records "
              "device digests (a different function: every tensor would differ); record it again with this ditto");
  if (!header.is_object() || header.value("ditto_trace", nlohmann::json()) != kTraceFormatVersion)
    line.fail(fmt::format("not a ditto trace (first line must be {{\"ditto_trace\": {}, \"meta\": {{...}}}})",
                          kTraceFormatVersion));
  const nlohmann::json& meta = line.field(header, "meta");
  if (!meta.is_object()) line.fail("field \"meta\" is not an object");
  for (const auto& [key, value] : meta.items()) trace.meta[key] = line.string_field(meta, key.c_str());

  while (std::getline(in, text)) {
    ++line.number;
    nlohmann::json j = line.parse(text);
    if (!j.is_object()) line.fail("event is not a JSON object");
    TraceEvent e{line.integer_field(j, "step", 1), line.integer_field(j, "seq", 0), line.string_field(j, "phase"),
                 line.string_field(j, "layer"), line.string_field(j, "op"), line.tensors(j, "inputs"),
                 line.tensors(j, "outputs")};
    // first_divergence walks events in lockstep; out-of-order events would pair up wrongly.
    if (!trace.events.empty()) {
      const TraceEvent& previous = trace.events.back();
      if (std::make_pair(e.step, e.seq) <= std::make_pair(previous.step, previous.seq))
        line.fail(fmt::format("event step {} seq {} does not follow step {} seq {}", e.step, e.seq, previous.step,
                              previous.seq));
    }
    trace.events.push_back(std::move(e));
  }
  if (in.bad()) throw IoError(fmt::format("{}: read failed: {}", path, std::strerror(errno)));
  return trace;
}

Divergence first_divergence(const std::vector<TraceEvent>& a, const std::vector<TraceEvent>& b) {
  Divergence d;
  size_t common = std::min(a.size(), b.size());
  for (size_t i = 0; i < common; ++i) {
    d.events_compared = static_cast<int64_t>(i + 1);
    std::string mismatch = structure_difference(a[i], b[i]);
    int output = mismatch.empty() ? first_differing(a[i].outputs, b[i].outputs) : -1;
    int input = mismatch.empty() ? first_differing(a[i].inputs, b[i].inputs) : -1;
    if (mismatch.empty() && output < 0 && input < 0) continue;
    d.event_a = a[i];
    d.event_b = b[i];
    if (!mismatch.empty()) {
      d.structure_mismatch = true;
      d.note = fmt::format("the traces ran different events at position {} ({}): {} vs {}", i, mismatch,
                           describe(a[i]), describe(b[i]));
      return d;
    }
    d.found = true;
    if (output < 0) {
      // Every output so far agreed, so nothing traced made this input differ: the data fed to the
      // runs (the batch, the labels) differ, or an untraced op changed it.
      d.input_only = true;
      d.tensor = a[i].inputs[input].name;
      d.note = fmt::format("{} is the first tensor that differs, while every traced output before it was identical: "
                           "the runs were fed different inputs (or an untraced op changed it)",
                           describe(a[i], d.tensor));
      return d;
    }
    d.tensor = a[i].outputs[output].name;
    d.inputs_identical = input < 0;
    d.note = d.inputs_identical
                 ? fmt::format("{} is the first output that differs while all {} inputs were identical: this op's "
                               "kernel introduced the difference", describe(a[i], d.tensor), a[i].inputs.size())
                 : fmt::format("{} is the first output that differs, but its input {} differed already although no "
                               "traced op before produced a differing output: an untraced op must have changed it",
                               describe(a[i], d.tensor), a[i].inputs[input].name);
    return d;
  }
  if (a.size() != b.size()) {
    bool a_longer = a.size() > b.size();
    d.structure_mismatch = true;
    (a_longer ? d.event_a : d.event_b) = (a_longer ? a : b)[common];
    d.note = fmt::format("trace {} ends after {} events while trace {} goes on with {}", a_longer ? 'b' : 'a', common,
                         a_longer ? 'a' : 'b', describe((a_longer ? a : b)[common]));
    return d;
  }
  d.note = fmt::format("no output differs in the {} events of either trace", common);
  return d;
}

std::vector<std::pair<int64_t, int64_t>> differing_outputs_per_step(const std::vector<TraceEvent>& a,
                                                                     const std::vector<TraceEvent>& b) {
  std::vector<std::pair<int64_t, int64_t>> counts;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    if (!structure_difference(a[i], b[i]).empty()) break;
    if (counts.empty() || counts.back().first != a[i].step) counts.emplace_back(a[i].step, 0);
    for (size_t j = 0; j < a[i].outputs.size(); ++j)
      counts.back().second += a[i].outputs[j].fingerprint != b[i].outputs[j].fingerprint;
  }
  return counts;
}

std::string trace_config_difference(const TraceMeta& a, const TraceMeta& b) {
  auto must_agree = [](const std::string& key) {
    return key.rfind("--", 0) == 0 || key == "train_fingerprint" || key == "test_fingerprint" || key == "model" ||
           key == "dataset" || key == "batch_size";
  };
  std::set<std::string> keys;
  for (const auto* m : {&a, &b})
    for (const auto& [key, value] : *m)
      if (must_agree(key)) keys.insert(key);
  std::string out;
  for (const auto& key : keys) {
    auto ia = a.find(key), ib = b.find(key);
    const std::string va = ia == a.end() ? "(not recorded)" : ia->second;
    const std::string vb = ib == b.end() ? "(not recorded)" : ib->second;
    if (va != vb) out += fmt::format("{}{} {} vs {}", out.empty() ? "" : "; ", key, va, vb);
  }
  return out;
}

std::string describe(const TraceEvent& e, const std::string& tensor) {
  std::string event = fmt::format("step {}, {}, {} ({})", e.step, e.phase, e.layer, e.op);
  if (tensor.empty()) return event;
  auto named = [&](const std::vector<TraceTensor>& ts) {
    return std::any_of(ts.begin(), ts.end(), [&](const TraceTensor& t) { return t.name == tensor; });
  };
  const char* role = named(e.outputs) ? "output" : named(e.inputs) ? "input" : "tensor";
  return fmt::format("{}, {} {}", event, role, tensor);
}

}  // namespace ditto
