// Op traces: the JSON-lines file round trip, rejection of damaged files, atomic writing, and
// locating the first divergence between two traces of a synthetic three-step training run.
#include <catch2/catch.hpp>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "engine/error.h"
#include "experiments/diverge.h"
#include "experiments/trace.h"

using namespace ditto;
namespace fs = std::filesystem;
using Catch::Matchers::Contains;

namespace {

// A fresh directory from mkdtemp, removed with everything in it at scope exit.
struct ScratchDir {
  fs::path path;
  ScratchDir() {
    std::string pattern = (fs::temp_directory_path() / "ditto_trace_test_XXXXXX").string();
    REQUIRE(mkdtemp(pattern.data()) != nullptr);
    path = pattern;
  }
  ~ScratchDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

// Where a test plants a difference: the output `tensor` of event (step, phase, layer) gets its
// fingerprint flipped. A traced kernel difference shows in the event's own output; an untraced
// one (an op the tracer does not see, acting after the event) only in what later events read.
struct Plant {
  int64_t step = 0;  // 0: nothing planted
  std::string phase, layer, tensor;
  bool untraced = false;
};

// The simulator's 64-bit values as trace fingerprints (the high word marks them as made up).
Fingerprint as_fingerprint(uint64_t v) { return {0x5157ace0ull, v}; }

uint64_t mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  return h * 0xff51afd7ed558ccdull;
}

uint64_t mix(uint64_t h, const std::string& s) {
  for (char c : s) h = mix(h, static_cast<uint64_t>(static_cast<unsigned char>(c)));
  return h;
}

// Replays a little network (conv1, relu, conv2, loss; Adam on both weights) as a data flow over
// fingerprints: every output is a hash of the op and its inputs, as a deterministic kernel would
// give. A difference planted anywhere therefore reaches exactly the tensors downstream of it.
class SyntheticRun {
 public:
  explicit SyntheticRun(Plant plant) : plant_(std::move(plant)) {
    for (const char* p : {"conv1.weight", "conv2.weight"}) {
      state_[p] = mix(1, p);
      state_[std::string(p) + ".m"] = state_[std::string(p) + ".v"] = 0;
    }
  }

  std::vector<TraceEvent> run(int64_t steps) {
    for (step_ = 1; step_ <= steps; ++step_) {
      seq_ = 0;
      state_["batch"] = mix(7, static_cast<uint64_t>(step_));
      state_["labels"] = mix(8, static_cast<uint64_t>(step_));
      op("fwd", "conv1", "conv2d", {{"x", "batch"}, {"w", "conv1.weight"}}, {{"y", "a1"}});
      op("fwd", "relu#1", "relu", {{"x", "a1"}}, {{"y", "r1"}});
      op("fwd", "conv2", "conv2d", {{"x", "r1"}, {"w", "conv2.weight"}}, {{"y", "a2"}});
      op("fwd", "loss", "cross_entropy", {{"x", "a2"}, {"labels", "labels"}}, {{"y", "loss"}});
      op("bwd", "loss", "cross_entropy", {{"x", "a2"}, {"labels", "labels"}}, {{"dx", "d_a2"}});
      op("bwd", "conv2", "conv2d", {{"dy", "d_a2"}, {"x", "r1"}, {"w", "conv2.weight"}},
         {{"dx", "d_r1"}, {"dw", "g_conv2"}});
      op("bwd", "relu#1", "relu", {{"dy", "d_r1"}, {"x", "a1"}}, {{"dx", "d_a1"}});
      op("bwd", "conv1", "conv2d", {{"dy", "d_a1"}, {"x", "batch"}, {"w", "conv1.weight"}}, {{"dw", "g_conv1"}});
      for (const std::string p : {"conv1", "conv2"}) {
        std::string w = p + ".weight";
        op("update", w, "adam", {{"w_before", w}, {"dw", "g_" + p}, {"m_before", w + ".m"}, {"v_before", w + ".v"}},
           {{"w", w}, {"m", w + ".m"}, {"v", w + ".v"}});
      }
    }
    return std::move(events_);
  }

 private:
  using Bindings = std::vector<std::pair<std::string, std::string>>;  // tensor name, state key

  void op(const std::string& phase, const std::string& layer, const std::string& op_name, const Bindings& inputs,
          const Bindings& outputs) {
    TraceEvent e{step_, seq_++, phase, layer, op_name, {}, {}};
    uint64_t h = mix(mix(mix(0, phase), layer), op_name);
    for (const auto& [name, key] : inputs) {
      e.inputs.push_back({name, as_fingerprint(state_.at(key)), 64});
      h = mix(h, state_.at(key));
    }
    for (const auto& [name, key] : outputs) {
      uint64_t fingerprint = mix(h, name);
      bool planted = step_ == plant_.step && phase == plant_.phase && layer == plant_.layer && name == plant_.tensor;
      uint64_t flipped = fingerprint ^ 0x8000000000000001ull;
      e.outputs.push_back({name, as_fingerprint(planted && !plant_.untraced ? flipped : fingerprint), 64});
      state_[key] = planted ? flipped : fingerprint;
    }
    events_.push_back(std::move(e));
  }

  Plant plant_;
  std::map<std::string, uint64_t> state_;
  std::vector<TraceEvent> events_;
  int64_t step_ = 0, seq_ = 0;
};

constexpr int64_t kEventsPerStep = 10;

std::vector<TraceEvent> synthetic_trace(const Plant& plant = {}) { return SyntheticRun(plant).run(3); }

void require_same_tensors(const std::vector<TraceTensor>& a, const std::vector<TraceTensor>& b) {
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    CHECK(a[i].name == b[i].name);
    CHECK(a[i].fingerprint == b[i].fingerprint);
    CHECK(a[i].numel == b[i].numel);
  }
}

void require_same_event(const TraceEvent& a, const TraceEvent& b) {
  CHECK(a.step == b.step);
  CHECK(a.seq == b.seq);
  CHECK(a.phase == b.phase);
  CHECK(a.layer == b.layer);
  CHECK(a.op == b.op);
  require_same_tensors(a.inputs, b.inputs);
  require_same_tensors(a.outputs, b.outputs);
}

std::vector<std::string> file_lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// The message of the DataError that reading `path` must throw; any other outcome fails the test.
std::string data_error_reading(const std::string& path) {
  try {
    read_trace(path);
  } catch (const DataError& e) {
    return e.what();
  }
  FAIL("reading " << path << " did not throw DataError");
  return "";
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  REQUIRE(out.good());
}

}  // namespace

TEST_CASE("trace: a written trace reads back field for field", "[trace]") {
  ScratchDir dir;
  Trace t;
  t.meta = {{"model", "smallcnn"}, {"gpu", "NVIDIA H100"}, {"command line", "ditto-train --pin \"conv2.fwd=1\""}};
  t.events = synthetic_trace();
  // Top bit set: such a value is lost as a JSON double or a signed parse.
  t.events.push_back({4, 0, "update", "fc.bias", "sgd", {}, {{"b", Fingerprint{0xfedcba9876543210ull, 0x8000000000000001ull}, 1ll << 40}}});
  std::string path = dir.file("run.trace");
  write_trace(path, t);

  Trace back = read_trace(path);
  CHECK(back.meta == t.meta);
  REQUIRE(back.events.size() == t.events.size());
  for (size_t i = 0; i < t.events.size(); ++i) require_same_event(back.events[i], t.events[i]);
  std::vector<std::string> lines = file_lines(path);
  REQUIRE(lines.size() == t.events.size() + 1);
  CHECK_THAT(lines.back(), Contains("\"fedcba98765432108000000000000001\""));
}

TEST_CASE("trace: identical traces do not diverge", "[trace]") {
  std::vector<TraceEvent> a = synthetic_trace(), b = synthetic_trace();
  Divergence d = first_divergence(a, b);
  CHECK_FALSE(d.found);
  CHECK_FALSE(d.structure_mismatch);
  CHECK(d.events_compared == 3 * kEventsPerStep);
  CHECK_THAT(d.note, Contains("no output differs"));
  using Counts = std::vector<std::pair<int64_t, int64_t>>;
  CHECK(differing_outputs_per_step(a, b) == Counts{{1, 0}, {2, 0}, {3, 0}});
}

TEST_CASE("trace: a planted kernel difference is found where it was introduced", "[trace]") {
  std::vector<TraceEvent> a = synthetic_trace();
  std::vector<TraceEvent> b = synthetic_trace({2, "bwd", "conv2", "dw"});
  Divergence d = first_divergence(a, b);
  REQUIRE(d.found);
  CHECK_FALSE(d.structure_mismatch);
  CHECK(d.event_a.step == 2);
  CHECK(d.event_a.phase == "bwd");
  CHECK(d.event_a.layer == "conv2");
  CHECK(d.event_a.op == "conv2d");
  CHECK(d.event_b.seq == d.event_a.seq);
  CHECK(d.tensor == "dw");
  CHECK(d.inputs_identical);
  CHECK(d.events_compared == kEventsPerStep + 6);
  CHECK_THAT(d.note, Contains("step 2, bwd, conv2 (conv2d), output dw"));
  CHECK_THAT(d.note, Contains("kernel introduced"));
  CHECK(describe(d.event_a, "dy") == "step 2, bwd, conv2 (conv2d), input dy");

  // The plant must have reached downstream tensors, or this would test nothing beyond the event.
  CHECK(a.back().outputs[0].fingerprint != b.back().outputs[0].fingerprint);

  // Step 2: dw, then Adam's w, m, v of conv2. Step 3: conv2's y, the loss, its dx, conv2's dx and dw,
  // relu's dx, conv1's dw, both Adam updates (3 each); conv1 and relu forward read no conv2 weight.
  using Counts = std::vector<std::pair<int64_t, int64_t>>;
  CHECK(differing_outputs_per_step(a, b) == Counts{{1, 0}, {2, 4}, {3, 13}});
}

TEST_CASE("trace: a difference made by an untraced op is flagged as such", "[trace]") {
  // relu#1's output is traced as in run a, then changed behind the tracer's back before conv2 reads it.
  std::vector<TraceEvent> a = synthetic_trace();
  std::vector<TraceEvent> b = synthetic_trace({2, "fwd", "relu#1", "y", /*untraced=*/true});
  Divergence d = first_divergence(a, b);
  REQUIRE(d.found);
  CHECK_FALSE(d.inputs_identical);
  CHECK(describe(d.event_b, d.tensor) == "step 2, fwd, conv2 (conv2d), output y");
  CHECK_THAT(d.note, Contains("untraced op"));
  CHECK_THAT(d.note, Contains("input x"));
}

TEST_CASE("trace: traces of different event sequences are a structure mismatch", "[trace]") {
  std::vector<TraceEvent> a = synthetic_trace();

  SECTION("different op at one position") {
    std::vector<TraceEvent> b = a;
    b[kEventsPerStep + 2].op = "conv2d_winograd";
    b[kEventsPerStep + 5].outputs[1].fingerprint.low ^= 1;  // a later difference must not be reported
    Divergence d = first_divergence(a, b);
    CHECK(d.structure_mismatch);
    CHECK_FALSE(d.found);
    CHECK(d.events_compared == kEventsPerStep + 3);
    CHECK(d.event_b.op == "conv2d_winograd");
    CHECK_THAT(d.note, Contains("op conv2d vs conv2d_winograd"));
    using Counts = std::vector<std::pair<int64_t, int64_t>>;
    CHECK(differing_outputs_per_step(a, b) == Counts{{1, 0}, {2, 0}});
  }
  SECTION("renamed tensor") {
    std::vector<TraceEvent> b = a;
    b[4].inputs[0].name = "logits";
    Divergence d = first_divergence(a, b);
    CHECK(d.structure_mismatch);
    CHECK(d.events_compared == 5);
  }
  SECTION("one trace stops early") {
    std::vector<TraceEvent> b(a.begin(), a.end() - 3);
    for (auto [x, y] : {std::pair(&a, &b), std::pair(&b, &a)}) {
      Divergence d = first_divergence(*x, *y);
      CHECK(d.structure_mismatch);
      CHECK_FALSE(d.found);
      CHECK(d.events_compared == static_cast<int64_t>(b.size()));
      CHECK_THAT(d.note, Contains("ends after " + std::to_string(b.size()) + " events"));
    }
    Divergence d = first_divergence(a, b);
    require_same_event(d.event_a, a[b.size()]);
    CHECK(d.event_b.op.empty());
  }
  SECTION("a difference before the truncation is still found") {
    std::vector<TraceEvent> b = synthetic_trace({2, "bwd", "conv2", "dw"});
    b.resize(2 * kEventsPerStep + 1);
    Divergence d = first_divergence(a, b);
    CHECK(d.found);
    CHECK_FALSE(d.structure_mismatch);
    CHECK(d.tensor == "dw");
  }
}

TEST_CASE("trace: damaged files are rejected naming file and line", "[trace]") {
  ScratchDir dir;
  std::string good = dir.file("good.trace");
  write_trace(good, {{{"model", "smallcnn"}}, synthetic_trace()});
  std::vector<std::string> lines = file_lines(good);
  auto joined = [](const std::vector<std::string>& ls) {
    std::ostringstream out;
    for (const auto& l : ls) out << l << '\n';
    return out.str();
  };
  std::string bad = dir.file("bad.trace");
  REQUIRE_NOTHROW(read_trace(good));

  SECTION("truncated line") {
    std::vector<std::string> cut(lines.begin(), lines.begin() + 4);
    cut.back().resize(cut.back().size() / 2);
    write_text(bad, joined(cut));
    CHECK_THAT(data_error_reading(bad), Contains(bad + ":4:") && Contains("malformed JSON"));
  }
  SECTION("bad hex fingerprint") {
    std::string key = "\"fingerprint\":\"";
    size_t at = lines[2].find(key);
    REQUIRE(at != std::string::npos);
    lines[2].replace(at + key.size(), 32, "0123456789abcdef0123456789abcdeZ");
    write_text(bad, joined(lines));
    CHECK_THAT(data_error_reading(bad), Contains(bad + ":3:") && Contains("0123456789abcdef0123456789abcdeZ"));
  }
  SECTION("short hex fingerprint") {
    std::string key = "\"fingerprint\":\"";
    size_t at = lines[5].find(key);
    lines[5].replace(at + key.size(), 32, "abc");
    write_text(bad, joined(lines));
    CHECK_THAT(data_error_reading(bad), Contains(bad + ":6:"));
  }
  SECTION("wrong first line") {
    lines[0] = R"({"ditto_manifest": 1, "meta": {}})";
    write_text(bad, joined(lines));
    CHECK_THAT(data_error_reading(bad), Contains(bad + ":1:") && Contains("not a ditto trace"));
  }
  SECTION("missing field") {
    size_t at = lines[7].find("\"op\":");
    REQUIRE(at != std::string::npos);
    lines[7].replace(at, 5, "\"kernel\":");
    write_text(bad, joined(lines));
    CHECK_THAT(data_error_reading(bad), Contains(bad + ":8:") && Contains("\"op\""));
  }
  SECTION("events out of order") {
    std::swap(lines[3], lines[4]);
    write_text(bad, joined(lines));
    CHECK_THAT(data_error_reading(bad), Contains(bad + ":5:"));
  }
  SECTION("empty file") {
    write_text(bad, "");
    CHECK_THAT(data_error_reading(bad), Contains(bad + ":1:"));
  }
  SECTION("missing file") {
    CHECK_THROWS_AS(read_trace(dir.file("absent.trace")), IoError);
  }
}

TEST_CASE("trace: only a closed writer leaves a trace under the final name", "[trace]") {
  ScratchDir dir;
  std::string path = dir.file("run.trace");
  std::vector<TraceEvent> events = synthetic_trace();
  {
    TraceWriter writer(path, {{"model", "smallcnn"}});
    writer.write(events[0]);
    CHECK_FALSE(fs::exists(path));  // visible only once complete
  }
  CHECK_FALSE(fs::exists(path));
  CHECK(fs::is_empty(dir.path));  // the temporary is gone too

  TraceWriter writer(path, {});
  for (const TraceEvent& e : events) writer.write(e);
  writer.close();
  writer.close();  // harmless
  CHECK_THROWS_AS(writer.write(events[0]), Error);
  CHECK(read_trace(path).events.size() == events.size());
  CHECK(std::distance(fs::directory_iterator(dir.path), fs::directory_iterator()) == 1);
}

TEST_CASE("trace: an input that differs while every output agreed is a divergence too", "[trace]") {
  std::vector<TraceEvent> a = synthetic_trace(), b = a;
  std::size_t at = kEventsPerStep;  // step 2's first event with an input
  while (b[at].inputs.empty()) ++at;
  b[at].inputs[0].fingerprint.low ^= 1;  // as if its data had been fed differently, or the file edited
  Divergence d = first_divergence(a, b);
  REQUIRE(d.found);
  CHECK(d.input_only);
  CHECK_FALSE(d.inputs_identical);
  CHECK(d.event_a.step == 2);
  CHECK(d.tensor == a[at].inputs[0].name);
  CHECK_THAT(d.note, Contains("input " + d.tensor) && Contains("fed different inputs"));
  CHECK(first_read_divergence(a, b).input_only);

  ScratchDir dir;
  write_trace(dir.file("a.trace"), {{{"--model", "smallcnn"}}, a});
  write_trace(dir.file("b.trace"), {{{"--model", "smallcnn"}}, b});
  TraceComparison c = compare_trace_files(dir.file("a.trace"), dir.file("b.trace"));
  REQUIRE(c.first.found);
  CHECK_THAT(format_comparison(c), Contains("input " + d.tensor) && Contains("fed different inputs"));
}

TEST_CASE("trace: traces of different trainings are refused, naming what differs", "[trace]") {
  ScratchDir dir;
  const std::vector<TraceEvent> events = synthetic_trace();
  auto write = [&](const std::string& name, const TraceMeta& meta) {
    write_trace(dir.file(name), {meta, events});
    return dir.file(name);
  };
  const std::string a = write("a.trace", {{"--model", "smallcnn"}, {"--lr", "0.002"}, {"gpu", "NVIDIA H100"},
                                          {"kernels", "heuristic"}, {"train_fingerprint", "000000000000000000000000000000aa"}});
  // Another GPU and other kernels: what a comparison is for.
  const std::string same = write("same.trace", {{"--model", "smallcnn"}, {"--lr", "0.002"}, {"gpu", "NVIDIA H200"},
                                                {"kernels", "deterministic"}, {"train_fingerprint", "000000000000000000000000000000aa"}});
  CHECK_NOTHROW(compare_trace_files(a, same));
  const std::string model = write("model.trace", {{"--model", "resnet18"}, {"--lr", "0.002"}, {"gpu", "NVIDIA H100"},
                                                  {"kernels", "heuristic"}, {"train_fingerprint", "000000000000000000000000000000aa"}});
  CHECK_THROWS_WITH(compare_trace_files(a, model), Contains("--model smallcnn vs resnet18") && !Contains("gpu"));
  const std::string data = write("data.trace", {{"--model", "smallcnn"}, {"--lr", "0.002"},
                                                {"train_fingerprint", "000000000000000000000000000000bb"}});
  CHECK_THROWS_WITH(compare_trace_files(a, data), Contains("train_fingerprint 000000000000000000000000000000aa vs 000000000000000000000000000000bb"));
  const std::string lr = write("lr.trace", {{"--model", "smallcnn"}, {"train_fingerprint", "000000000000000000000000000000aa"}});
  CHECK_THROWS_WITH(compare_trace_files(a, lr), Contains("--lr 0.002 vs (not recorded)"));
  // Traces written before the flags were recorded still name their model.
  CHECK_THAT(trace_config_difference({{"model", "smallcnn"}}, {{"model", "two-conv"}}),
             Contains("model smallcnn vs two-conv"));
}
