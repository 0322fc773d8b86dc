// The noise lab on the CPU: candidate lists read off the networks, the tracer's events, a traced
// run that ends with the untraced run's bits, lockstep divergence search, attribution end to end
// (every configuration has churn 0 here: the CPU has one code path per op), and the shared
// training flags' messages in words.
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <unistd.h>

#include "engine/checkpoint.h"
#include "engine/error.h"
#include "experiments/attribute.h"
#include "experiments/cli.h"
#include "experiments/diverge.h"
#include "nets/nets.h"
#include "train_support.h"

using namespace ditto;
namespace fs = std::filesystem;

using Catch::Matchers::Contains;

namespace {

// A made-up fingerprint for the hand-written traces below.
Fingerprint fp(uint64_t v) { return {0, v}; }
std::string scratch(const std::string& name) { return test::scratch("cpu_noise_lab", name); }

TrainConfig tiny(const std::string& model = "two-conv") {
  TrainConfig c = test::synthetic_config(model, 192, 64, 16, 32);
  c.deterministic_init = c.deterministic_input = true;
  return c;
}

std::set<std::string> names(const std::vector<Candidate>& cs) {
  std::set<std::string> s;
  for (const auto& c : cs) s.insert(c.name);
  return s;
}

std::string slurp(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}
}  // namespace

TEST_CASE("candidates: SmallCNN's list is its knob layers times the knob table's nondeterministic variants") {
  auto cs = model_candidates("smallcnn", 10, 3, 32, false);
  std::set<std::string> expected;
  for (const char* conv : {"conv1", "conv2", "conv3"}) {
    // conv1's input (the images) needs no gradient, so its bwd_data never runs.
    if (std::string(conv) != "conv1") expected.insert(std::string(conv) + ".bwd_data=algo0");
    expected.insert(std::string(conv) + ".bwd_filter=algo0");
    expected.insert(std::string(conv) + ".bwd_filter=algo3");
    expected.insert(std::string(conv) + ".bias_bwd=atomic");
  }
  for (const char* pool : {"pool1", "pool2", "pool3"}) {
    expected.insert(std::string(pool) + ".bwd=cudnn");
    expected.insert(std::string(pool) + ".bwd=atomic-scatter");
  }
  for (const char* fc : {"fc1", "fc2"}) {
    expected.insert(std::string(fc) + ".bias_bwd=atomic");
    expected.insert(std::string(fc) + ".cublas_atomics=on");
  }
  expected.insert("loss.reduce=atomic");
  CHECK(names(cs) == expected);

  // Every candidate names a knob layer of the net, and every knob layer has a candidate.
  Context cpu;
  auto layers = make_net(cpu, {"smallcnn", 10, 3})->knob_layers();
  std::set<std::string> layer_names, cand_layers;
  for (const auto& l : layers) layer_names.insert(l.first);
  for (const auto& c : cs) cand_layers.insert(c.layers.at(0));
  CHECK(cand_layers == layer_names);

  auto grouped = model_candidates("smallcnn", 10, 3, 32, true);
  std::set<std::string> groups;
  for (const auto& c : grouped)
    if (c.group) groups.insert(c.name);
  CHECK(groups == std::set<std::string>{"all conv2d.bwd_data=algo0", "all conv2d.bwd_filter=algo0",
                                        "all conv2d.bwd_filter=algo3", "all conv2d.bias_bwd=atomic",
                                        "all maxpool2d.bwd=cudnn", "all maxpool2d.bwd=atomic-scatter",
                                        "all linear.bias_bwd=atomic", "all linear.cublas_atomics=on"});
  for (const auto& c : grouped)
    if (c.name == "all conv2d.bwd_filter=algo0") CHECK(c.layers == std::vector<std::string>{"conv1", "conv2", "conv3"});
    else if (c.name == "all conv2d.bwd_data=algo0") CHECK(c.layers == std::vector<std::string>{"conv2", "conv3"});
}

TEST_CASE("candidates: ResNet-18's convs have no bias, every batch norm is a candidate, the stem has no bwd_data") {
  auto cs = model_candidates("resnet18", 10, 3, 32, false);
  Context cpu;
  auto layers = make_net(cpu, {"resnet18", 10, 3})->knob_layers();
  int convs = 0, bns = 0;
  for (const auto& [name, kind] : layers) {
    convs += kind == op::conv2d;
    bns += kind == op::batchnorm;
  }
  REQUIRE(convs == 20);  // stem, 16 in the blocks, 3 shortcut projections
  REQUIRE(bns == 20);
  std::size_t bwd_filter = 0, bwd_data = 0, bias = 0, bn = 0;
  for (const auto& c : cs) {
    bwd_filter += c.knob == "bwd_filter";
    bwd_data += c.knob == "bwd_data";
    bias += c.knob == "bias_bwd" && c.op == op::conv2d;
    bn += c.op == op::batchnorm;
  }
  CHECK(bwd_filter == 2 * 20);  // algo0 and algo3 for every conv
  CHECK(bwd_data == 19);        // all but the stem conv1
  CHECK(bias == 0);
  CHECK(bn == 2 * 20);          // cudnn and atomic
  CHECK(names(cs).count("conv1.bwd_data=algo0") == 0);
  CHECK(names(cs).count("fc.bias_bwd=atomic") == 1);
  CHECK(names(cs).count("loss.reduce=atomic") == 1);
}

TEST_CASE("candidates: forms and pins") {
  auto cs = model_candidates("two-conv", 10, 3, 16, true);
  auto loo = candidates_for(cs, AttributionForm::LeaveOneOut);
  // algo0 and algo3 of one bwd_filter collapse to one leave-one-out candidate.
  CHECK(names(loo).count("conv2.bwd_filter") == 1);
  CHECK(loo.size() < cs.size());
  const Candidate* g = nullptr;
  for (const auto& c : cs)
    if (c.name == "all conv2d.bwd_filter=algo0") g = &c;
  REQUIRE(g);
  CHECK(candidate_pins(*g, AttributionForm::AddOne) ==
        std::vector<std::string>{"conv1.bwd_filter=algo0", "conv2.bwd_filter=algo0"});
  CHECK(candidate_pins(*g, AttributionForm::LeaveOneOut) ==
        std::vector<std::string>{"conv1.bwd_filter=deterministic", "conv2.bwd_filter=deterministic"});
  CHECK(form_kernels(AttributionForm::AddOne) == "deterministic");
  CHECK(form_kernels(AttributionForm::LeaveOneOut) == "nondeterministic");
  CHECK_THROWS_AS(parse_form("add-two"), Error);
}

TEST_CASE("tracer: a traced run ends with exactly the untraced run's checkpoint, and sees every op") {
  TrainConfig plain = tiny(), traced = tiny();
  plain.out = scratch("plain");
  traced.out = scratch("traced");
  auto a = train(plain);
  const std::string trace_path = scratch("run.trace");
  auto b = record_trace(traced, trace_path);
  CHECK(a.weights_fingerprint == b.weights_fingerprint);
  CHECK(slurp(plain.out + "/checkpoint.safetensors") == slurp(traced.out + "/checkpoint.safetensors"));

  Trace t = read_trace(trace_path);
  REQUIRE(t.events.size() > 0);
  CHECK(t.events.back().step == a.steps);
  std::set<std::string> seen;
  for (const auto& e : t.events)
    if (e.step == 1) seen.insert(e.phase + ":" + e.layer + ":" + e.op);
  for (const char* want : {"data:data:loader", "fwd:conv1:conv2d", "fwd:conv1:bias_add", "fwd:relu#1:relu",
                           "fwd:pool1:maxpool2d", "fwd:conv2:conv2d", "fwd:fc:linear", "fwd:loss:softmax_xent",
                           "bwd:loss:softmax_xent", "bwd:conv2:conv2d", "bwd:relu#1:relu", "bwd:conv1:conv2d",
                           "update:conv2.weight:adam", "update:fc.bias:adam"})
    CHECK(seen.count(want) == 1);
  // conv2's backward reads dy, x and w and writes dx and dw; conv1's writes only dw.
  for (const auto& e : t.events)
    if (e.step == 1 && e.phase == "bwd" && e.op == "conv2d") {
      std::vector<std::string> outs;
      for (const auto& o : e.outputs) outs.push_back(o.name);
      CHECK(outs == (e.layer == "conv2" ? std::vector<std::string>{"dx", "dw"} : std::vector<std::string>{"dw"}));
    }
  // The same run traced twice gives the same trace.
  const std::string again = scratch("again.trace");
  TrainConfig t2 = tiny();
  record_trace(t2, again);
  auto cmp = compare_trace_files(trace_path, again);
  CHECK_FALSE(cmp.first.found);
  CHECK_FALSE(cmp.first.structure_mismatch);
}

TEST_CASE("record: an existing trace file is refused before training unless --overwrite; a folder always") {
  const std::string path = scratch("kept.trace");
  { std::ofstream(path) << "someone's trace\n"; }
  TrainConfig c = tiny();
  CHECK_THROWS_WITH(record_trace(c, path), Contains("--trace") && Contains("exists") && Contains("--overwrite"));
  CHECK(slurp(path) == "someone's trace\n");
  CHECK_THROWS_WITH(record_trace(c, scratch("")), Contains("--trace") && Contains("folder"));
  CHECK_THROWS_WITH(record_trace(c, scratch("no/such/folder/x.trace")), Contains("--trace") && Contains("does not exist"));
  record_trace(c, path, {}, true);
  CHECK(read_trace(path).events.size() > 0);
}

TEST_CASE("diverge: two lockstep CPU runs never part; a changed learning rate is found at the first update") {
  TrainConfig c = tiny();
  c.max_steps = 4;
  c.out = scratch("diverge");
  DivergeOptions o;
  o.eval_every = 2;
  o.log = [](const std::string&) {};
  auto r = diverge(c, o);
  CHECK_FALSE(r.first.found);
  CHECK_FALSE(r.first.structure_mismatch);
  CHECK(r.steps == 4);
  CHECK(r.growth.size() == 4);
  CHECK(r.events_per_step > 20);
  for (const auto& g : r.growth) {
    CHECK(g.differing_outputs == 0);
    CHECK(g.weights_max_ulp == 0);
  }
  CHECK(r.growth[1].prediction_diffs == 0);  // evaluated at step 2
  CHECK(r.growth[0].prediction_diffs == -1);
  CHECK(r.run_a.weights_fingerprint == r.run_b.weights_fingerprint);
  // Per layer: named layers in forward order, every distance zero, every norm positive.
  const std::vector<std::string> want = {"conv1", "conv2", "fc"};
  for (const auto& layer : want) CHECK(std::count(r.layers.begin(), r.layers.end(), layer) == 1);
  REQUIRE(r.layer_growth.size() == 4);
  for (const auto& row : r.layer_growth)
    for (std::size_t l = 0; l < row.size(); ++l) {
      INFO(r.layers[l]);
      CHECK(row[l].weights_l2 == 0);
      CHECK(row[l].activations_l2 == 0);
      if (row[l].has_weights) CHECK(row[l].weights_norm > 0);
    }
  const auto conv1 = std::find(r.layers.begin(), r.layers.end(), "conv1") - r.layers.begin();
  CHECK(r.layer_growth[0][conv1].has_weights);
  CHECK(r.layer_growth[0][conv1].has_activations);
  CHECK(r.layer_growth[0][conv1].activations_norm > 0);
  write_divergence(r, c.out);
  CHECK(fs::exists(c.out + "/diverge.json"));
  CHECK(fs::exists(c.out + "/growth.csv"));
  const std::string csv = slurp(c.out + "/layer_growth.csv");
  CHECK(csv.rfind("step,layer,weights_l2,weights_relative,activations_l2,activations_relative\n", 0) == 0);
  CHECK(csv.find("\n4,conv2,0,0,0,0\n") != std::string::npos);
  // Nothing differs, so the heat maps have no coloured cell, only the colour bar.
  CHECK(fs::exists(c.out + "/layer_growth_activations.svg"));
  CHECK(fs::exists(c.out + "/layer_growth_weights.svg"));
}

TEST_CASE("trace: a format-2 trace (XXH3 of host bytes) is refused by name") {
  const std::string path = scratch("format2.trace");
  { std::ofstream(path) << "{\"ditto_trace\":2,\"meta\":{}}\n"; }
  CHECK_THROWS_WITH(read_trace(path), Contains("format 2") && Contains("record it again"));
}

TEST_CASE("diverge: traces of two machines compare to the first differing op") {
  // Two runs of one configuration whose kernels differ at conv1's first update, as two GPUs'
  // would: the CPU has one kernel per op, so the difference is planted in the second trace.
  TrainConfig a = tiny();
  a.max_steps = 3;
  record_trace(a, scratch("m_a.trace"));
  Trace t = read_trace(scratch("m_a.trace"));
  bool planted = false;
  for (auto& e : t.events)
    if (!planted && e.step == 1 && e.phase == "update" && e.layer == "conv1.weight") {
      for (auto& out : e.outputs)
        if (out.name == "w") out.fingerprint.low ^= 1, planted = true;
    }
  REQUIRE(planted);
  write_trace(scratch("m_b.trace"), t);
  auto cmp = compare_trace_files(scratch("m_a.trace"), scratch("m_b.trace"));
  REQUIRE(cmp.first.found);
  CHECK(cmp.first.inputs_identical);
  CHECK(cmp.first.event_a.step == 1);
  CHECK(cmp.first.event_a.phase == "update");
  CHECK(cmp.first.event_a.layer == "conv1.weight");
  CHECK(cmp.first.tensor == "w");
  CHECK(format_comparison(cmp).find("first divergence: ") != std::string::npos);
}

TEST_CASE("diverge: traces of different models or settings are not compared") {
  using Catch::Matchers::Contains;
  TrainConfig a = tiny("two-conv"), b = tiny("smallcnn");
  a.max_steps = b.max_steps = 1;
  record_trace(a, scratch("model_a.trace"));
  record_trace(b, scratch("model_b.trace"));
  CHECK_THROWS_WITH(compare_trace_files(scratch("model_a.trace"), scratch("model_b.trace")),
                    Contains("different trainings") && Contains("--model two-conv vs smallcnn"));
  b = tiny("two-conv");
  b.max_steps = 1;
  b.lr = 1e-3f;
  record_trace(b, scratch("lr_b.trace"));
  CHECK_THROWS_WITH(compare_trace_files(scratch("model_a.trace"), scratch("lr_b.trace")), Contains("--lr 0.002 vs 0.001"));
}

TEST_CASE("attribute: end to end on the CPU, every configuration bit-identical, outputs written") {
  TrainConfig c = tiny();
  c.max_steps = 3;
  c.checkpoint = false;
  auto all = model_candidates("two-conv", 10, 3, 16, true);
  std::vector<Candidate> some;
  for (const auto& k : all)
    if (k.name == "conv2.bwd_filter=algo0" || k.name == "pool1.bwd=atomic-scatter" || k.name == "all conv2d.bwd_filter=algo3")
      some.push_back(k);
  REQUIRE(some.size() == 3);
  AttributeOptions o;
  o.replicas = 2;
  o.l2_steps = {1, 2};
  o.bootstrap = 50;
  o.out = scratch("attribution");
  std::vector<std::string> lines;
  o.log = [&](const std::string& s) { lines.push_back(s); };
  auto r = attribute(c, some, o);
  CHECK(lines.size() == 5 * 2);  // one line per replica, with an ETA
  CHECK(lines.back().find("ETA") != std::string::npos);
  REQUIRE(r.rows.size() == 5);
  CHECK(r.rows[0].name == "all-deterministic");
  CHECK(r.rows[1].name == "all-nondeterministic");
  for (const auto& row : r.rows) {
    INFO(row.name);
    CHECK(row.status == "ok");
    CHECK(row.churn.value == 0);
    CHECK(row.churn.high == 0);
    CHECK(row.weight_l2 == 0);
    CHECK(row.distinct_fingerprints == 1);
    CHECK(row.first_divergence_step == 0);
    CHECK(row.l2_at == std::vector<std::pair<int64_t, double>>{{1, 0.0}, {2, 0.0}});
    CHECK_FALSE(row.diverged());
    CHECK(row.ms_per_step > 0);
    CHECK(row.run_dirs.size() == 2);
  }
  write_attribution(r, o.out);
  for (const char* f : {"attribution.csv", "attribution.json", "attribution.svg", "attribution_l2.svg"})
    CHECK(fs::exists(fs::path(o.out) / f));
  const std::string table = format_attribution(r);
  CHECK(table.find("no divergence") != std::string::npos);
  CHECK(fs::exists(fs::path(o.out) / "add-one" / "conv2.bwd_filter_algo0" / "r1" / "manifest.json"));
  CHECK_FALSE(fs::exists(fs::path(o.out) / "add-one" / "conv2.bwd_filter_algo0" / "r1" / "checkpoint.safetensors"));
}

TEST_CASE("attribute: a knob the net never calls is reported as not run, not as quiet") {
  TrainConfig c = tiny();
  c.max_steps = 2;
  Candidate never{"conv1.bwd_data=algo0", op::conv2d, "bwd_data", "algo0", {"conv1"}, false};
  AttributeOptions o;
  o.replicas = 2;
  o.baselines = false;
  o.log = [](const std::string&) {};
  auto r = attribute(c, {never}, o);
  REQUIRE(r.rows.size() == 1);
  CHECK(r.rows[0].status == "not run");
  CHECK(r.rows[0].message.find("conv1 never runs bwd_data") != std::string::npos);
}

TEST_CASE("ranking: diverged configurations first, by early weight distance") {
  ConfigResult quiet{"q", "candidate", "ok"}, loud{"l", "candidate", "ok"}, louder{"L", "candidate", "ok"},
      base{"all-deterministic", "baseline", "ok"}, refused{"u", "candidate", "unsupported"};
  quiet.distinct_fingerprints = 1;
  loud.distinct_fingerprints = louder.distinct_fingerprints = 3;
  loud.l2_at = {{100, 0.5}};
  louder.l2_at = {{100, 2.0}};
  std::vector<ConfigResult> rows{quiet, refused, loud, base, louder};
  rank_rows(rows);
  std::vector<std::string> order;
  for (const auto& r : rows) order.push_back(r.name);
  CHECK(order == std::vector<std::string>{"all-deterministic", "L", "l", "q", "u"});
}

TEST_CASE("flags: one definition, ranges in words") {
  auto parse = [](std::vector<std::string> args) {
    TrainConfig c;
    TrainFlags f;
    CLI::App app;
    add_train_flags(app, c, f);
    std::reverse(args.begin(), args.end());
    app.parse(args);
    return c;
  };
  try {
    parse({"--epochs", "0"});
    FAIL("--epochs 0 accepted");
  } catch (const CLI::ValidationError& e) {
    CHECK(std::string(e.what()).find("must be a whole number from 1 to 1000000, got 0") != std::string::npos);
  }
  try {
    parse({"--lr", "-1"});
    FAIL("--lr -1 accepted");
  } catch (const CLI::ValidationError& e) {
    CHECK(std::string(e.what()).find("must be a finite number above 0 and at most 3.40282e+38, got -1") !=
          std::string::npos);
  }
  CHECK(parse({"--steps", "7", "--model", "two-conv"}).max_steps == 7);
  CHECK_THROWS_AS(parse({"--model", "nonet"}), CLI::ValidationError);
}

TEST_CASE("diverge: a difference no op reads (a reported loss value) is not the drift's source") {
  auto ev = [](int64_t seq, const char* phase, const char* layer, const char* op, std::vector<TraceTensor> in,
               std::vector<TraceTensor> out) { return TraceEvent{1, seq, phase, layer, op, in, out}; };
  // loss forward writes y (read by nobody); loss backward reads logits; conv2 backward writes dw,
  // which the update reads.
  std::vector<TraceEvent> a = {
      ev(0, "fwd", "loss", "softmax_xent", {{"logits", fp(1), 10}}, {{"y", fp(2), 1}}),
      ev(1, "bwd", "loss", "softmax_xent", {{"dy", fp(3), 1}, {"logits", fp(1), 10}}, {{"dlogits", fp(4), 10}}),
      ev(2, "bwd", "conv2", "conv2d", {{"dy", fp(4), 10}, {"x", fp(5), 8}, {"w", fp(6), 4}}, {{"dw", fp(7), 4}}),
      ev(3, "update", "conv2.weight", "adam", {{"w_before", fp(6), 4}, {"dw", fp(7), 4}}, {{"w", fp(8), 4}})};
  auto b = a;
  b[0].outputs[0].fingerprint = fp(20);  // the loss value differs by an ULP
  CHECK_FALSE(output_is_read(a, 0, "y"));
  CHECK(output_is_read(a, 2, "dw"));
  CHECK(output_is_read(a, 3, "w"));
  // Only the unread difference: the training never diverged.
  std::vector<Divergence> unread;
  Divergence none = first_read_divergence(a, b, &unread);
  CHECK_FALSE(none.found);
  REQUIRE(unread.size() == 1);
  CHECK(unread[0].event_a.layer == "loss");
  // Plus conv2's dw (and the update it feeds): that is the source.
  b[2].outputs[0].fingerprint = fp(70);
  b[3].inputs[1].fingerprint = fp(70);
  b[3].outputs[0].fingerprint = fp(80);
  Divergence src = first_read_divergence(a, b);
  REQUIRE(src.found);
  CHECK(src.event_a.layer == "conv2");
  CHECK(src.tensor == "dw");
  CHECK(src.inputs_identical);
  CHECK(first_divergence(a, b).event_a.layer == "loss");
}

TEST_CASE("attribute: attribution.json reads back as written, and ranks again") {
  TrainConfig c = tiny();
  c.max_steps = 2;
  c.checkpoint = false;
  Candidate k{"conv2.bias_bwd=atomic", op::conv2d, "bias_bwd", "atomic", {"conv2"}, false};
  AttributeOptions o;
  o.replicas = 2;
  o.l2_steps = {1, 2};
  o.bootstrap = 20;
  o.log = [](const std::string&) {};
  auto r = attribute(c, {k}, o);
  const std::string dir = scratch("reread");
  write_attribution(r, dir);
  auto back = read_attribution(dir + "/attribution.json");
  REQUIRE(back.rows.size() == r.rows.size());
  CHECK(back.model == "two-conv");
  CHECK(back.l2_steps == r.l2_steps);
  for (std::size_t i = 0; i < r.rows.size(); ++i) {
    CHECK(back.rows[i].name == r.rows[i].name);
    CHECK(back.rows[i].l2_at == r.rows[i].l2_at);
    CHECK(back.rows[i].distinct_fingerprints == r.rows[i].distinct_fingerprints);
    CHECK(back.rows[i].pins == r.rows[i].pins);
  }
  CHECK(format_attribution(back) == format_attribution(r));
  std::ofstream(dir + "/bad.json") << "{\"form\": \"add-one\"}";
  CHECK_THROWS_AS(read_attribution(dir + "/bad.json"), DataError);
}

TEST_CASE("ranking: an earlier first divergence outranks a larger early distance") {
  ConfigResult early{"early", "candidate", "ok"}, late{"late", "candidate", "ok"};
  early.distinct_fingerprints = late.distinct_fingerprints = 2;
  early.first_divergence_step = 1;
  early.l2_at = {{1, 1e-9}, {10, 1e-6}};
  late.first_divergence_step = 7;
  late.l2_at = {{1, 0.0}, {10, 1e-3}};
  std::vector<ConfigResult> rows{late, early};
  rank_rows(rows);
  CHECK(rows[0].name == "early");
}
