// Loss scaling on the CPU (engine/loss_scale.h): the settings and their names, the scale schedule
// for given overflow flags (growth after the interval, backoff, growth held at infinity), overflow
// detection, a skipped step that changes nothing (and Adam's count of updates that skips it), a
// fixed power-of-two scale training bit-identically to no scaling, an injected overflow backing
// off and skipping, the record in the run folder, and a resumed scaled run.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>

#include "engine/context.h"
#include "engine/error.h"
#include "engine/loss_scale.h"
#include "engine/loss_scale_ref.h"
#include "engine/optim.h"
#include "engine/tracer.h"
#include "experiments/cli.h"
#include "experiments/run_dir.h"
#include "experiments/train.h"
#include "loss_scale_support.h"
#include "train_support.h"

using namespace ditto;
using namespace ditto::test;
namespace fs = std::filesystem;

namespace {

TrainConfig scaled_config(const std::string& name, const std::string& loss_scale) {
  TrainConfig c = test::synthetic_config("smallcnn", 256, 64, 16, 32);
  c.deterministic_init = c.deterministic_input = true;
  c.epochs = 2;
  c.lr = 2e-3f;
  c.loss_scale = loss_scale;
  c.out = name.empty() ? "" : test::scratch("loss_scale", name);
  return c;
}

// 2^127: the largest power of two a float holds; a first step's gradients overflow at it.
const std::string kHuge = "dynamic:170141183460469231731687303715884105728:2:0.5:2000";

}  // namespace

TEST_CASE("loss scale: settings parse, name themselves and refuse what unscaling would round") {
  CHECK(parse_loss_scaling("off").mode == LossScaling::Mode::Off);
  const LossScaling d = parse_loss_scaling("dynamic");
  CHECK(d.mode == LossScaling::Mode::Dynamic);
  CHECK(d.init_scale == 65536.0f);
  CHECK(d.growth_factor == 2.0f);
  CHECK(d.backoff_factor == 0.5f);
  CHECK(d.growth_interval == 2000);
  const LossScaling f = parse_loss_scaling("1024");
  CHECK(f.mode == LossScaling::Mode::Fixed);
  CHECK(f.init_scale == 1024.0f);
  for (const char* s : {"off", "dynamic", "1024", "0.5", "dynamic:1024:4:0.25:7"})
    CHECK(loss_scaling_name(parse_loss_scaling(s)) == s);
  CHECK(loss_scaling_name(parse_loss_scaling("1024.0")) == "1024");
  CHECK(loss_scaling_name(parse_loss_scaling(kHuge)) == loss_scaling_name(parse_loss_scaling(
                                                           loss_scaling_name(parse_loss_scaling(kHuge)))));
  for (const char* bad : {"1000", "-2", "0", "inf", "nan", "abc", "", "2x", "1e39", "dynamic:1024:3:0.5:10",
                          "dynamic:1024:2:0.75:10", "dynamic:1024:2:2:10", "dynamic:1024:2:0.5:0",
                          "dynamic:1024:2:0.5", "dynamic:1024:2:0.5:-1"}) {
    INFO(bad);
    CHECK_THROWS_WITH(parse_loss_scaling(bad), Catch::Matchers::Contains("--loss-scale"));
  }
  CHECK(default_loss_scaling("fp16").mode == LossScaling::Mode::Dynamic);
  CHECK(default_loss_scaling("bf16").mode == LossScaling::Mode::Off);
  CHECK(default_loss_scaling("fp32").mode == LossScaling::Mode::Off);
}

TEST_CASE("loss scale: the schedule is a function of the overflow flags") {
  check_schedule(Device::cpu());

  // GradScaler's defaults: 2000 good steps, then 2^17; growth that would be infinite is held.
  float scale = 65536.0f;
  int32_t good = 0;
  for (int i = 0; i < 1999; ++i) ref::update_loss_scale(scale, good, false, 2.0f, 0.5f, 2000);
  CHECK(scale == 65536.0f);
  ref::update_loss_scale(scale, good, false, 2.0f, 0.5f, 2000);
  CHECK(scale == 131072.0f);
  CHECK(good == 0);
  scale = std::ldexp(1.0f, 127);
  ref::update_loss_scale(scale, good, false, 2.0f, 0.5f, 1);
  CHECK(scale == std::ldexp(1.0f, 127));
  CHECK(good == 0);
}

TEST_CASE("loss scale: overflow detection catches +inf, -inf and nan anywhere, not large finite values") {
  check_overflow_detection(Device::cpu());
}

TEST_CASE("loss scale: a skipped step changes no weight or optimizer state, and skipping equals never stepping") {
  check_skip_equals_never_stepping(Device::cpu());
}

TEST_CASE("loss scale: a loss whose scaled gradient overflows halves the scale and skips the update") {
  // loss = 1e10 * sum(w), seeded with 2^120: dw = 2^120 * 1e10, beyond the float range.
  Context ctx;
  auto w = make_param(ctx, "w", {1.0f, -1.0f});
  LossScaler s(ctx, parse_loss_scaling("dynamic:1329227995784915872903807060280344576:2:0.5:2000"));
  Adam opt(ctx, {w}, AdamOptions{});
  opt.set_skip_flag(ctx, s.found_inf());
  auto step = [&] {
    Var loss(ctx.zeros({1}), true);
    ctx.tape().record("blowup", "loss", {{"w", w.var}}, loss, [wr = w.var.grad_ref(), lr = loss.grad_ref()](Context& c) {
      const float dl = lr.grad().to_host_f32()[0];
      accumulate_grad(c, wr, c.full({2}, dl * 1e10f));
    });
    ctx.tape().backward(ctx, loss, s.seed());
    s.reserve(ctx, 1);
    s.unscale(ctx, {w});
    opt.step(ctx, 0.1f);
    opt.zero_grad();
    s.update(ctx);
  };
  const Fingerprint before = fingerprint_of({w}, opt);
  step();
  CHECK(fingerprint_of({w}, opt) == before);
  CHECK(s.seed().to_host_f32()[0] == std::ldexp(1.0f, 119));
  // 1e10 is 2^33.2: the product overflows while the scale is 2^95 or more, so 26 steps in all.
  for (int i = 0; i < 30; ++i) step();
  const std::vector<LossScaleStep> record = s.take_record(ctx);
  int overflows = 0;
  for (const LossScaleStep& r : record) overflows += r.overflow;
  CHECK(overflows == 26);
  CHECK_FALSE(record.back().overflow);
  CHECK(fingerprint_of({w}, opt) != before);
  CHECK(opt.state().back().tensor->to_host_i32()[0] == 31 - 26);  // updates applied
}

TEST_CASE("loss scale: a fixed power-of-two scale trains bit-identically to no scaling (SGD and Adam)") {
  for (const std::string which : {"sgd", "adam"}) {
    INFO(which);
    TrainConfig off = scaled_config("", "off");
    off.optimizer = which;
    off.lr = which == "sgd" ? 0.05f : 2e-3f;
    TrainConfig fixed = off;
    fixed.loss_scale = "1024";
    const TrainResult a = train(off), b = train(fixed);
    CHECK(a.loss_scale.empty());
    REQUIRE(b.loss_scale.size() == static_cast<std::size_t>(b.steps));
    for (const LossScaleStep& r : b.loss_scale) {
      CHECK(r.scale == 1024.0f);
      CHECK_FALSE(r.overflow);
    }
    CHECK(b.weights_fingerprint == a.weights_fingerprint);
    CHECK(b.weights == a.weights);
    REQUIRE(b.log.size() == a.log.size());
    for (std::size_t e = 0; e < a.log.size(); ++e) CHECK(b.log[e].loss == a.log[e].loss);
  }
}

TEST_CASE("loss scale: the backward pass is seeded with the scale, and the update sees unscaled gradients") {
  // The loss op's upstream gradient is the seed; the update's gradient is the unscaled one.
  struct SeedTracer : Tracer {
    std::vector<float> seeds, update_grads;
    void begin_step(int64_t) override {}
    void event(const std::string& phase, const std::string&, const std::string& op,
               const std::vector<TracedTensor>& in, const std::vector<TracedTensor>&) override {
      for (const TracedTensor& t : in) {
        if (phase == "bwd" && op == "softmax_xent" && t.name == "dy") seeds.push_back(t.tensor->to_host_f32()[0]);
        if (phase == "update" && t.name == "dw" && update_grads.empty()) update_grads = t.tensor->to_host_f32();
      }
    }
  };
  std::vector<float> first_grads;
  for (const char* setting : {"off", "1024"}) {
    INFO(setting);
    TrainConfig c = scaled_config("", setting);
    c.max_steps = 3;
    SeedTracer tracer;
    train(c, TrainHooks{&tracer, {}});
    CHECK(tracer.seeds == std::vector<float>(3, std::string(setting) == "off" ? 1.0f : 1024.0f));
    if (first_grads.empty()) first_grads = tracer.update_grads;
    else CHECK(tracer.update_grads == first_grads);
  }
}

TEST_CASE("loss scale: an overflowing step is skipped and backs the scale off; the run folder records every step") {
  // SGD at lr 10 from a scale of 2^127: once a gradient reaches 2, the scaled one overflows.
  TrainConfig c = scaled_config("huge", kHuge);
  c.optimizer = "sgd";
  c.lr = 10.0f;
  c.epochs = 1;
  std::vector<Fingerprint> weights;
  TrainHooks hooks;
  hooks.after_step = [&](const StepView& v) { weights.push_back(params_fingerprint(v.params)); };
  const TrainResult r = train(c, hooks);
  REQUIRE(r.loss_scale.size() == static_cast<std::size_t>(r.steps));
  REQUIRE(weights.size() == r.loss_scale.size());
  CHECK(r.loss_scale[0].scale == std::ldexp(1.0f, 127));
  int64_t overflows = 0;
  for (std::size_t i = 0; i < r.loss_scale.size(); ++i) {
    INFO("step " << i + 1);
    const LossScaleStep& s = r.loss_scale[i];
    overflows += s.overflow;
    if (i > 0 && s.overflow) CHECK(weights[i] == weights[i - 1]);  // skipped: not a bit moved
    if (i > 0 && !s.overflow) CHECK(weights[i] != weights[i - 1]);
    if (i + 1 < r.loss_scale.size()) CHECK(r.loss_scale[i + 1].scale == (s.overflow ? s.scale / 2 : s.scale));
  }
  CHECK(overflows >= 2);
  for (float w : r.weights) REQUIRE(std::isfinite(w));
  // The record in the folder is the run's, and the manifest says what it holds.
  const auto file = read_loss_scale_csv((fs::path(c.out) / "loss_scale.csv").string());
  REQUIRE(file.size() == r.loss_scale.size());
  for (std::size_t i = 0; i < file.size(); ++i) {
    CHECK(file[i].scale == r.loss_scale[i].scale);
    CHECK(file[i].overflow == r.loss_scale[i].overflow);
  }
  const TrainResult read_back = read_run_result(c.out, *load_train_data(c));
  CHECK(read_back.loss_scale.size() == r.loss_scale.size());
  std::ifstream in(fs::path(c.out) / "manifest.json");
  const nlohmann::json m = nlohmann::json::parse(in);
  CHECK(m["flags"]["--loss-scale"] == loss_scaling_name(parse_loss_scaling(kHuge)));
  CHECK(m["loss_scaling"]["steps"] == r.loss_scale.size());
  CHECK(m["loss_scaling"]["overflow_steps"] == overflows);
  CHECK(m["replay"].get<std::string>().find("--loss-scale dynamic:") != std::string::npos);
  // The same run again: the same flags, the same bits.
  TrainConfig again = c;
  again.out.clear();
  const TrainResult r2 = train(again);
  CHECK(r2.weights_fingerprint == r.weights_fingerprint);
  REQUIRE(r2.loss_scale.size() == r.loss_scale.size());
  for (std::size_t i = 0; i < r.loss_scale.size(); ++i) {
    CHECK(r2.loss_scale[i].scale == r.loss_scale[i].scale);
    CHECK(r2.loss_scale[i].overflow == r.loss_scale[i].overflow);
  }
}

TEST_CASE("loss scale: a resumed scaled run equals an uninterrupted one, and keeps its setting") {
  // SGD at lr 2 from 2^127 overflows in the first epoch's last steps: the scale, its counter and
  // the record all cross the resume.
  TrainConfig whole = scaled_config("", kHuge);
  whole.optimizer = "sgd";
  whole.lr = 2.0f;
  whole.epochs = 3;
  const TrainResult full = train(whole);
  TrainConfig first = scaled_config("resumed", kHuge);
  first.optimizer = "sgd";
  first.lr = 2.0f;
  first.epochs = 1;
  train(first);
  TrainConfig wrong = first;
  wrong.epochs = 3;
  wrong.resume = first.out;
  wrong.out.clear();
  wrong.loss_scale = "off";
  CHECK_THROWS_WITH(train(wrong), Catch::Matchers::Contains("--loss-scale"));
  TrainConfig rest = wrong;
  rest.loss_scale = kHuge;
  const TrainResult resumed = train(rest);
  CHECK(resumed.weights_fingerprint == full.weights_fingerprint);
  int64_t overflows = 0;
  for (const LossScaleStep& s : full.loss_scale) overflows += s.overflow;
  CHECK(overflows > 0);
  REQUIRE(resumed.loss_scale.size() == full.loss_scale.size());
  for (std::size_t i = 0; i < full.loss_scale.size(); ++i) {
    CHECK(resumed.loss_scale[i].scale == full.loss_scale[i].scale);
    CHECK(resumed.loss_scale[i].overflow == full.loss_scale[i].overflow);
  }
}

TEST_CASE("loss scale: refused with data parallelism, and absent from unscaled runs' flags") {
  TrainConfig c = scaled_config("", "dynamic");
  c.gpus = 2;
  CHECK_THROWS_WITH(train(c), Catch::Matchers::Contains("--loss-scale"));
  TrainConfig off = scaled_config("", "off");
  for (const DefiningFlag& f : defining_flags(off)) CHECK(f.flag != "--loss-scale");
}

TEST_CASE("loss scale: --loss-scale parses, is checked, and stays when the precision's default applies") {
  // As a front end does it: its own flags, parsed from argv, applied, then the precision's default.
  auto parse = [](std::vector<std::string> words, const std::string& precision) {
    words.insert(words.begin(), "ditto-train");
    std::vector<char*> argv;
    for (auto& w : words) argv.push_back(w.data());
    TrainConfig c;
    TrainFlags f;
    CLI::App app;
    add_train_flags(app, c, f, kFlagsOptim);
    app.parse(static_cast<int>(argv.size()), argv.data());
    apply_train_flags(c, f, static_cast<int>(argv.size()), argv.data());
    default_loss_scale(c, f, precision);
    return c.loss_scale;
  };
  CHECK(parse({}, "fp32") == "off");
  CHECK(parse({}, "fp16") == "dynamic");
  CHECK(parse({"--loss-scale", "off"}, "fp16") == "off");
  CHECK(parse({"--loss-scale", "1024"}, "fp16") == "1024");
  CHECK(parse({"--loss-scale", "dynamic:256:2:0.5:100"}, "fp32") == "dynamic:256:2:0.5:100");
  CHECK_THROWS_WITH(parse({"--loss-scale", "1000"}, "fp32"), Catch::Matchers::Contains("--loss-scale"));
  // A replay line carries the setting.
  TrainConfig c = scaled_config("", "4096.0");
  CHECK(replay_line(c, 1, 2, 3).find(" --loss-scale 4096 ") != std::string::npos);
}
