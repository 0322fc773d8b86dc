// The networks of the other task kinds (nets/detail/tasks.h) and what the trainer does for them
// (experiments/task_scoring.h): units, codes, scores and predictions files; the nets' knobs and shapes;
// end-to-end training on the CPU (the loss falls, a repeat is bit-identical, a finished run reads
// back); the noise lab's candidates; an experiment and an attribution over a task net.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>

#include "engine/context.h"
#include "engine/error.h"
#include "experiments/attribute.h"
#include "experiments/ensemble.h"
#include "experiments/run_dir.h"
#include "experiments/task_scoring.h"
#include "net_support.h"
#include "nets/nets.h"
#include "nets/detail/tasks.h"
#include "train_support.h"
#include "ditto/ditto.h"

using namespace ditto;
namespace fs = std::filesystem;

namespace {

TrainConfig task_config(const std::string& model, const std::string& dataset, int train_n, int test_n, int batch) {
  TrainConfig c = test::synthetic_config(model, train_n, test_n, 32, batch);
  c.dataset = dataset;
  c.deterministic_init = c.deterministic_input = true;
  c.epochs = 3;
  return c;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}
void write_file(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

bool has(const std::vector<Candidate>& cs, const std::string& name) {
  return std::any_of(cs.begin(), cs.end(), [&](const Candidate& c) { return c.name == name; });
}

}  // namespace

TEST_CASE("task units: sequence codes are exact and invertible; edit distance; symbols") {
  const std::vector<int32_t> s307 = {4, 1, 8};  // digits 3, 0, 7
  CHECK(sequence_code(s307.data(), 3, 11) == 1307);
  CHECK(sequence_code(nullptr, 0, 11) == 1);
  CHECK(sequence_symbols(1307, 11) == s307);
  CHECK(sequence_symbols(1, 11).empty());
  CHECK(max_code_length(11) == 9);
  const std::vector<int32_t> nines(9, 10), ten(10, 10);
  CHECK(sequence_code(nines.data(), 9, 11) == 1999999999);
  CHECK_THROWS_AS(sequence_code(ten.data(), 10, 11), Error);
  const std::vector<int32_t> blank = {0};
  CHECK_THROWS_AS(sequence_code(blank.data(), 1, 11), Error);
  CHECK_THROWS_AS(sequence_symbols(0, 11), Error);
  // one symbol and the blank: the code counts
  const std::vector<int32_t> ones = {1, 1, 1};
  CHECK(sequence_symbols(sequence_code(ones.data(), 3, 2), 2) == ones);
  // every string of up to 3 digits has its own code
  std::set<int32_t> codes;
  for (int len = 0; len <= 3; ++len)
    for (int v = 0; v < std::pow(10, len); ++v) {
      std::vector<int32_t> s;
      for (int k = len - 1, x = v; k >= 0; --k, x /= 10) s.insert(s.begin(), x % 10 + 1);
      codes.insert(sequence_code(s.data(), len, 11));
    }
  CHECK(codes.size() == 1111);
  CHECK(edit_distance({1, 2, 3}, {1, 3}) == 1);
  CHECK(edit_distance({}, {5, 5}) == 2);
  CHECK(edit_distance({1, 2}, {2, 1}) == 2);
  CHECK(symbols_text({1, 10, 4}) == "093");
  CHECK(class_symbol(0) == '.');
}

TEST_CASE("task units: pixel arg-max and greedy CTC decoding from the outputs") {
  Context cpu;
  // {1, 3, 1, 2}: pixel 0 favours class 2, pixel 1 ties classes 0 and 1 (the lower wins)
  Tensor seg = cpu.from_host(std::vector<float>{0, 5, 1, 5, 2, 1}, {1, 3, 1, 2});
  CHECK(predict_units(Task::Segmentation, seg) == std::vector<int32_t>{2, 0});
  // {T=5, N=2, A=3}: example 0 reads 1 1 _ 1 2 -> "1 1 2"; example 1 reads _ _ 2 2 _ -> "2"
  const std::vector<int> best0 = {1, 1, 0, 1, 2}, best1 = {0, 0, 2, 2, 0};
  std::vector<float> v(5 * 2 * 3, 0.0f);
  for (int t = 0; t < 5; ++t) {
    v[(t * 2 + 0) * 3 + best0[t]] = 1;
    v[(t * 2 + 1) * 3 + best1[t]] = 1;
  }
  auto codes = predict_units(Task::Sequence, cpu.from_host(v, {5, 2, 3}));
  CHECK(sequence_symbols(codes[0], 3) == std::vector<int32_t>{1, 1, 2});
  CHECK(sequence_symbols(codes[1], 3) == std::vector<int32_t>{2});
}

TEST_CASE("task units: scores, and predictions.csv written and read back") {
  const Dataset seg = make_digit_segmentation(make_synthetic_digits(3, 1));
  std::vector<int32_t> perfect = unit_labels(seg), blank(perfect.size(), 0);
  CHECK(score_units(seg, perfect).primary == 1.0);
  CHECK(score_units(seg, perfect).secondary == 1.0);
  const TaskScores bg = score_units(seg, blank);
  int64_t background = std::count(perfect.begin(), perfect.end(), 0);
  CHECK(bg.primary == Approx(double(background) / perfect.size()));
  // IoU: background's is its share, the three digits' classes 0: mean over the 4 present classes
  CHECK(bg.secondary == Approx(bg.primary / 4));
  const std::string path = test::scratch("task_nets", "seg.csv");
  std::vector<int32_t> some = perfect;
  some[5] = 7;
  write_file(path, task_predictions_csv(seg, some));
  CHECK(read_task_predictions_csv(path, seg) == some);

  const Dataset str = make_digit_strings(make_synthetic_digits(20, 1), 10, 3, 1);
  std::vector<int32_t> truth = unit_labels(str), guess = truth;
  guess[0] = 1;  // the empty string: edit distance = the first label's length
  const TaskScores sc = score_units(str, guess);
  CHECK(sc.primary == Approx(0.9));
  int64_t symbols = 0;
  for (int64_t i = 0; i < str.n; ++i) symbols += str.labels[i];
  CHECK(sc.secondary == Approx(double(str.labels[0]) / symbols));
  const std::string spath = test::scratch("task_nets", "seq.csv");
  write_file(spath, task_predictions_csv(str, guess));
  CHECK(read_task_predictions_csv(spath, str) == guess);
  // another test set's file is refused, naming the line
  const Dataset other = make_digit_strings(make_synthetic_digits(20, 1), 10, 3, 2);
  CHECK_THROWS_WITH(read_task_predictions_csv(spath, other), Catch::Contains("seq.csv:2"));
  CHECK_THROWS_WITH(read_task_predictions_csv(path, str), Catch::Contains("header"));
}

TEST_CASE("task nets: knob layers cover parameters; the new ops are knob layers; shapes") {
  Context cpu;
  struct Case {
    std::string model;
    NetConfig cfg;
    Shape input;
    Shape output;
    int64_t params;
    std::vector<std::pair<std::string, OpKind>> must;
    Task task;
  };
  const std::vector<Case> cases = {
      {"unet-small", {"unet-small", 11, 1}, {2, 1, 28, 28}, {2, 11, 28, 28}, 58091,
       {{"up1", op::upsample}, {"up2", op::upsample}, {"loss", op::pixel_xent}}, Task::Segmentation},
      {"stn", {"stn", 10, 1}, {2, 1, kStnCanvas, kStnCanvas}, {2, 10}, 36000,
       {{"affine_grid", op::affine_grid}, {"grid_sample", op::grid_sample}, {"loss", op::softmax_xent}},
       Task::Classification},
      {"ctc-cnn", {"ctc-cnn", 11, 1}, {2, 1, 28, 24 * kStringMaxLength}, {9, 2, 11}, 112619,
       {{"time_major", op::embedding}, {"loss", op::ctc_loss}, {"loss_mean", op::reduce}}, Task::Sequence},
  };
  for (const auto& c : cases) {
    INFO(c.model);
    auto net = make_net(cpu, c.cfg);
    net->init(cpu, 1);
    CHECK(net->task() == c.task);
    CHECK(net->param_count() == c.params);
    test::check_knobs_cover_params(*net);
    const auto layers = net->knob_layers();
    for (const auto& m : c.must) CHECK(std::find(layers.begin(), layers.end(), m) != layers.end());
    Var y = net->forward(cpu, Var(cpu.zeros(c.input)), false);
    CHECK(y.shape() == c.output);
  }
  auto bag = make_net(cpu, NetConfig{"embedding-bag", 2, 1, 78});
  bag->init(cpu, 1);
  test::check_knobs_cover_params(*bag);
  CHECK(bag->param_count() == 4738);
  CHECK(bag->categorical_input());
  CHECK(bag->forward(cpu, Var(cpu.zeros({3, 39}, DType::I32)), false).shape() == Shape{3, 2});
  CHECK(bag->params().front().name == "features.weight");
  CHECK_THROWS_AS(make_net(cpu, NetConfig{"embedding-bag", 2, 1, 0}), Error);
  // inputs the nets cannot read are errors naming them
  auto stn = make_net(cpu, NetConfig{"stn", 10, 1});
  CHECK_THROWS_WITH(stn->forward(cpu, Var(cpu.zeros({1, 1, 28, 28})), false), Catch::Contains("stn"));
  auto ctc = make_net(cpu, NetConfig{"ctc-cnn", 11, 1});
  CHECK_THROWS_AS(ctc->forward(cpu, Var(cpu.zeros({1, 1, 40, 72})), false), ShapeError);
  CHECK_THROWS_AS(bag->forward(cpu, Var(cpu.zeros({1, 1, 1, 39})), false), ShapeError);
  // The time-major permutation names every element once.
  auto index = tasks::time_major_index(2, 3, 4);
  std::sort(index.begin(), index.end());
  for (std::size_t k = 0; k < index.size(); ++k) CHECK(index[k] == static_cast<int32_t>(k));
}

TEST_CASE("task nets: the STN starts at the identity map") {
  Context cpu;
  auto net = make_net(cpu, NetConfig{"stn", 10, 1});
  net->init(cpu, 3);
  for (const auto& p : net->params()) {
    if (p.name == "loc.fc2.bias") CHECK(p.var.value().to_host_f32() == std::vector<float>{1, 0, 0, 0, 1, 0});
    if (p.name == "loc.fc2.weight") {
      auto w = p.var.value().to_host_f32();
      CHECK(std::all_of(w.begin(), w.end(), [](float v) { return v == 0.0f; }));
    }
  }
}

TEST_CASE("task nets: each trains end to end on the CPU; a repeat is bit-identical; the run reads back") {
  struct Case {
    std::string model, dataset;
    int train_n, test_n, batch;
    float lr;
  };
  const std::vector<Case> cases = {{"unet-small", "synthetic-seg", 24, 8, 8, 3e-3f},
                                   {"stn", "synthetic-rt", 64, 16, 16, 2e-3f},
                                   {"ctc-cnn", "synthetic-strings", 32, 8, 8, 2e-3f},
                                   {"embedding-bag", "synthetic-attrs", 512, 128, 32, 1e-2f}};
  for (const auto& k : cases) {
    INFO(k.model);
    TrainConfig c = task_config(k.model, k.dataset, k.train_n, k.test_n, k.batch);
    c.lr = k.lr;
    c.out = test::scratch("task_nets", k.model + "-a");
    fs::remove_all(c.out);
    const TrainResult a = train(c);
    c.out = test::scratch("task_nets", k.model + "-b");
    fs::remove_all(c.out);
    const TrainResult b = train(c);
    REQUIRE(a.log.size() == 3);
    CHECK(a.log[2].loss < a.log[0].loss);
    CHECK(std::isfinite(a.log[2].loss));
    CHECK(a.weights_fingerprint == b.weights_fingerprint);
    CHECK(a.predictions == b.predictions);
    CHECK(a.log[2].test_top1 == b.log[2].test_top1);
    const auto data = load_train_data(c);
    CHECK(a.task == data->test.task);
    CHECK(a.predictions.size() == static_cast<std::size_t>(data->test.n * units_per_example(data->test)));
    CHECK(a.test_labels == unit_labels(data->test));
    // what a finished run folder holds is what train returned
    int done = 0;
    const TrainResult back = read_run_result(c.out, *data, &done);
    CHECK(done == 3);
    CHECK(back.predictions == a.predictions);
    CHECK(back.units_per_example == a.units_per_example);
    CHECK(back.weights_fingerprint == a.weights_fingerprint);
    if (a.task != Task::Classification) {
      CHECK(std::isnan(a.log[0].train_acc));
      const std::string log = slurp(c.out + "/log.csv");
      CHECK(log.find(std::string("test_") + primary_score(a.task)) != std::string::npos);
    }
  }
}

TEST_CASE("task nets: a resumed CTC run ends bit-identical to an uninterrupted one") {
  TrainConfig c = task_config("ctc-cnn", "synthetic-strings", 16, 8, 8);
  c.out = test::scratch("task_nets", "ctc-whole");
  fs::remove_all(c.out);
  const TrainResult whole = train(c);
  c.epochs = 2;
  c.out = test::scratch("task_nets", "ctc-part");
  fs::remove_all(c.out);
  train(c);
  c.epochs = 3;
  c.resume = c.out;
  c.out.clear();
  const TrainResult resumed = train(c);
  CHECK(resumed.weights_fingerprint == whole.weights_fingerprint);
  CHECK(resumed.predictions == whole.predictions);
}

TEST_CASE("task nets: a model and a dataset of different tasks, or augmentation of targets, are errors") {
  TrainConfig c = task_config("smallcnn", "synthetic-seg", 8, 4, 4);
  CHECK_THROWS_WITH(train(c), Catch::Contains("--model smallcnn") && Catch::Contains("segmentation"));
  c = task_config("unet-small", "synthetic-strings", 8, 4, 4);
  CHECK_THROWS_WITH(train(c), Catch::Contains("--dataset synthetic-strings"));
  c = task_config("mnist-cnn", "synthetic-attrs", 8, 4, 4);
  CHECK_THROWS_WITH(train(c), Catch::Contains("category ids"));
  c = task_config("embedding-bag", "synthetic-rt", 8, 4, 4);
  CHECK_THROWS_WITH(train(c), Catch::Contains("--model embedding-bag reads category ids") &&
                                  Catch::Contains("--dataset synthetic-rt holds images"));
  c = task_config("unet-small", "synthetic-seg", 8, 4, 4);
  c.augment = true;
  CHECK_THROWS_WITH(train(c), Catch::Contains("--augment"));
  c = task_config("embedding-bag", "synthetic-attrs", 8, 4, 4);
  c.standardize = true;
  CHECK_THROWS_WITH(train(c), Catch::Contains("--standardize"));
  c = task_config("stn", "mnist-rt", 8, 4, 4);
  c.data = test::scratch("task_nets", "no-such-folder");
  CHECK_THROWS_WITH(train(c), Catch::Contains("--data"));
}

TEST_CASE("task nets: the noise lab's candidates include every new knob each step runs") {
  auto candidates = [](const std::string& model, const std::string& dataset) {
    TrainConfig c;
    c.model = model;
    c.dataset = dataset;
    const auto probe = probe_examples(c);
    REQUIRE(probe);
    return model_candidates(model, *probe, true);
  };
  const auto unet = candidates("unet-small", "mnist-seg");
  for (const char* n : {"up1.bwd=atomic", "up2.bwd=atomic", "loss.reduce=atomic", "all upsample.bwd=atomic",
                        "dec1.bwd_filter=algo0", "pool1.bwd=atomic-scatter"})
    CHECK(has(unet, n));
  CHECK(!has(unet, "enc1.bwd_data=algo0"));  // the images need no gradient
  const auto stn = candidates("stn", "mnist-rt");
  for (const char* n : {"grid_sample.bwd=atomic", "grid_sample.bwd=cudnn", "affine_grid.bwd=atomic", "loss.reduce=atomic",
                        "loc.fc2.bias_bwd=atomic"})
    CHECK(has(stn, n));
  const auto ctc = candidates("ctc-cnn", "mnist-strings");
  for (const char* n : {"loss.algo=cudnn-nondeterministic", "loss_mean.reduce=atomic", "time_major.scatter=atomic",
                        "conv4.bwd_filter=algo0"})
    CHECK(has(ctc, n));
  const auto bag = candidates("embedding-bag", "celeba-attrs");
  for (const char* n : {"features.scatter=atomic", "fc1.bias_bwd=atomic", "loss.reduce=atomic"}) CHECK(has(bag, n));
  TrainConfig classic;
  classic.dataset = "cifar10";
  CHECK(!probe_examples(classic));
}

TEST_CASE("task nets: an experiment and an attribution over task nets (units, churn, CONTROL)") {
  EnsembleOptions o;
  o.base = task_config("ctc-cnn", "synthetic-strings", 16, 8, 8);
  o.base.epochs = 1;
  o.settings = {parse_setting("ALGO"), parse_setting("CONTROL")};
  o.replicas = 2;
  o.bootstrap = 50;
  o.verbose = false;
  o.out = test::scratch("task_nets", "experiment");
  fs::remove_all(o.out);
  auto data = load_train_data(o.base);
  auto runs = run_settings(o, data);
  ReportData rep = summarize(runs, o, *data);
  auto value = [&](const std::string& setting, const std::string& metric) {
    for (const auto& m : rep.metrics)
      if (m.setting == setting && m.metric == metric) return m.value;
    FAIL("no " << setting << " " << metric);
    return -1.0;
  };
  CHECK(value("CONTROL", "churn") == 0.0);
  CHECK(value("CONTROL", "distinct_fingerprints") == 1.0);
  CHECK(value("ALGO", "distinct_fingerprints") == 2.0);
  CHECK(value("ALGO", "cer_mean") >= 0.0);
  bool lengths = false;
  for (const auto& g : rep.groups) lengths = lengths || g.kind == "length";
  CHECK(lengths);
  for (const auto& e : rep.unstable) CHECK(e.label.front() == '"');  // strings, quoted
  // read back on --resume, the same summary
  o.resume = true;
  auto again = run_settings(o, data);
  CHECK(again[0].runs[0].predictions == runs[0].runs[0].predictions);

  // segmentation churn is per pixel: a replica pair that differs on some pixels has a churn
  // below 1 and above 0, and CONTROL none
  EnsembleOptions s = o;
  s.resume = false;
  s.base = task_config("unet-small", "synthetic-seg", 16, 4, 8);
  s.base.epochs = 1;
  s.out = test::scratch("task_nets", "experiment-seg");
  fs::remove_all(s.out);
  auto sdata = load_train_data(s.base);
  ReportData srep = summarize(run_settings(s, sdata), s, *sdata);
  for (const auto& m : srep.metrics)
    if (m.metric == "churn") CHECK((m.setting == "CONTROL" ? m.value == 0.0 : (m.value > 0.0 && m.value < 1.0)));
  CHECK(srep.unstable.empty());  // pixels are not shown as examples

  AttributeOptions ao;
  ao.replicas = 2;
  ao.bootstrap = 20;
  ao.l2_steps = {1, 2};
  ao.log = [](const std::string&) {};
  TrainConfig base = task_config("embedding-bag", "synthetic-attrs", 128, 64, 32);
  base.epochs = 1;
  auto probe = probe_examples(base);
  auto all = model_candidates("embedding-bag", *probe, false);
  std::vector<Candidate> one;
  for (const auto& c : all)
    if (c.name == "features.scatter=atomic") one.push_back(c);
  REQUIRE(one.size() == 1);
  AttributionResult r = attribute(base, one, ao);
  for (const auto& row : r.rows) {
    INFO(row.name << ": " << row.message);
    CHECK(row.status == "ok");
    CHECK(row.distinct_fingerprints == 1);  // the CPU runs one implementation per op
  }
}
