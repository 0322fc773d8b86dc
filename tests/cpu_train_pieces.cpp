// Optimizers against hand-computed values, LR schedules, safetensors round trip and corrupt
// files, top-k metrics.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>

#include "engine/checkpoint.h"
#include "engine/error.h"
#include "engine/optim.h"
#include "engine/tensor_ops.h"
#include "kernels/metrics.h"
#include "support.h"

using namespace ditto;

namespace {
Param make_param(Context& ctx, const std::string& name, std::vector<float> value, std::vector<float> grad) {
  Shape s{static_cast<int64_t>(value.size())};
  Var v(ctx.from_host(value, s), true);
  v.grad() = ctx.from_host(grad, s);
  return {name, v};
}
}  // namespace

TEST_CASE("sgd: plain, momentum, nesterov, weight decay against hand-computed values") {
  Context ctx;
  {
    auto p = make_param(ctx, "w", {1.0f, -2.0f}, {0.5f, 0.25f});
    Sgd opt(ctx, {p}, {});
    opt.step(ctx, 0.1f);
    auto v = p.var.value().to_host_f32();
    CHECK(v[0] == 1.0f - 0.1f * 0.5f);
    CHECK(v[1] == -2.0f - 0.1f * 0.25f);
  }
  {
    // momentum 0.9, wd 0.01: g1 = 0.5 + 0.01*1 = 0.51, buf1 = 0.51, p1 = 1 - 0.1*0.51 = 0.949
    // step 2 (same grad 0.5): g2 = 0.5 + 0.01*0.949 = 0.50949, buf2 = 0.9*0.51 + 0.50949 = 0.96849,
    // p2 = 0.949 - 0.1*0.96849 = 0.852151
    auto p = make_param(ctx, "w", {1.0f}, {0.5f});
    Sgd opt(ctx, {p}, {0.9f, false, 0.01f});
    opt.step(ctx, 0.1f);
    CHECK(p.var.value().to_host_f32()[0] == Approx(0.949).epsilon(1e-6));
    opt.step(ctx, 0.1f);
    CHECK(p.var.value().to_host_f32()[0] == Approx(0.852151).epsilon(1e-6));
    CHECK(opt.steps() == 2);
    REQUIRE(opt.state().size() == 1);
    CHECK(opt.state()[0].name == "w.momentum");
    CHECK(opt.state()[0].tensor->to_host_f32()[0] == Approx(0.96849).epsilon(1e-6));
  }
  {
    // nesterov: buf1 = g = 0.5; update = g + 0.9*buf1 = 0.95; p = 1 - 0.1*0.95 = 0.905
    auto p = make_param(ctx, "w", {1.0f}, {0.5f});
    Sgd opt(ctx, {p}, {0.9f, true, 0.0f});
    opt.step(ctx, 0.1f);
    CHECK(p.var.value().to_host_f32()[0] == Approx(0.905).epsilon(1e-6));
  }
  CHECK_THROWS_AS(Sgd(ctx, {}, {0.0f, true, 0.0f}), Error);
}

TEST_CASE("adam: two steps against hand-computed values") {
  Context ctx;
  auto p = make_param(ctx, "w", {1.0f}, {0.5f});
  Adam opt(ctx, {p}, {});
  // step 1: m = 0.05, v = 0.00025; m_hat = 0.5, v_hat = 0.25; p = 1 - 0.01 * 0.5/(0.5+1e-8)
  opt.step(ctx, 0.01f);
  CHECK(p.var.value().to_host_f32()[0] == Approx(0.99).epsilon(1e-6));
  // step 2 with grad 0.5 again: m = 0.095, v = 0.00049975, m_hat = 0.5, v_hat = 0.25 → p -= 0.01
  opt.step(ctx, 0.01f);
  CHECK(p.var.value().to_host_f32()[0] == Approx(0.98).epsilon(1e-6));
  auto st = opt.state();
  REQUIRE(st.size() == 2);
  CHECK(st[0].name == "w.exp_avg");
  CHECK(st[0].tensor->to_host_f32()[0] == Approx(0.095).epsilon(1e-6));
  // 1 - 0.999f is 0.00100004673 in float, 4.7e-5 relative from the decimal, hence 1e-4 here.
  CHECK(st[1].tensor->to_host_f32()[0] == Approx(0.00049975).epsilon(1e-4));
  // a parameter without gradient is left alone
  auto q = make_param(ctx, "q", {3.0f}, {1.0f});
  q.var.zero_grad();
  Adam opt2(ctx, {q}, {});
  opt2.step(ctx, 0.1f);
  CHECK(q.var.value().to_host_f32()[0] == 3.0f);
}

// A CUDA graph replays the updates with their scalars read from the optimizer's plan; those
// updates must give exactly step()'s bits. On the CPU the planned path reads the same table.
TEST_CASE("optimizers: planned steps give step()'s bits, and stepping past the plan is an error") {
  const std::vector<float> lrs = {1e-2f, 7e-3f, 3e-3f, 5e-4f};  // a falling schedule
  auto run = [&](const std::string& which, bool planned) {
    Context ctx;
    auto p = make_param(ctx, "w", {0.5f, -1.25f, 2.0f, 1e-3f}, {0.0f, 0.0f, 0.0f, 0.0f});
    std::unique_ptr<Optimizer> opt;
    if (which == "adam")
      opt = std::make_unique<Adam>(ctx, std::vector<Param>{p}, AdamOptions{0.9f, 0.999f, 1e-8f, 1e-4f});
    else
      opt = std::make_unique<Sgd>(ctx, std::vector<Param>{p}, SgdOptions{0.9f, true, 1e-4f});
    if (planned) opt->plan(ctx, lrs);
    for (std::size_t i = 0; i < lrs.size(); ++i) {
      float g = 0.1f * float(i + 1);
      p.var.grad() = ctx.from_host(std::vector<float>{g, -g, 0.5f * g, 2.0f * g}, {4});
      if (planned)
        opt->step_planned(ctx);
      else
        opt->step(ctx, lrs[i]);
    }
    CHECK(opt->steps() == int64_t(lrs.size()));
    if (planned) CHECK_THROWS_WITH(opt->step_planned(ctx), Catch::Matchers::Contains("was not planned"));
    return p.var.value().fingerprint();
  };
  for (const char* which : {"adam", "sgd"}) {
    INFO(which);
    CHECK(run(which, true) == run(which, false));
  }
  Context ctx;
  auto p = make_param(ctx, "w", {1.0f}, {1.0f});
  Adam opt(ctx, {p}, {});
  CHECK_THROWS_WITH(opt.step_planned(ctx), Catch::Matchers::Contains("was not planned"));
  CHECK_THROWS_WITH(opt.plan(ctx, {}), Catch::Matchers::Contains("at least one step"));
}

TEST_CASE("lr schedules") {
  CHECK(lr_at(LrSchedule::Constant, 0.1f, 70, 150) == 0.1f);
  CHECK(lr_at(LrSchedule::Step, 0.1f, 49, 150) == Approx(0.1));
  CHECK(lr_at(LrSchedule::Step, 0.1f, 50, 150) == Approx(0.01));
  CHECK(lr_at(LrSchedule::Step, 0.1f, 100, 150) == Approx(0.001));
  CHECK(lr_at(LrSchedule::Cosine, 0.1f, 0, 10) == Approx(0.1));
  CHECK(lr_at(LrSchedule::Cosine, 0.1f, 5, 10) == Approx(0.05));
  CHECK(lr_at(LrSchedule::Cosine, 0.1f, 9.999, 10) < 1e-6);           // per step: falls to zero
  CHECK(lr_at(LrSchedule::Step, 0.1f, 49.9, 150) == Approx(0.1));     // step: constant within an epoch
  CHECK(parse_lr_schedule("cosine") == LrSchedule::Cosine);
  CHECK(parse_lr_schedule("onecycle") == LrSchedule::OneCycle);
  CHECK_THROWS_WITH(parse_lr_schedule("linear"), Catch::Matchers::Contains("constant, step, cosine, onecycle"));
}

TEST_CASE("lr schedules: onecycle and warm-up, by hand") {
  // onecycle without warm-up: linear from base to 0 over the run.
  CHECK(lr_at(LrSchedule::OneCycle, 0.2f, 0, 10) == Approx(0.2));
  CHECK(lr_at(LrSchedule::OneCycle, 0.2f, 2.5, 10) == Approx(0.15));
  CHECK(lr_at(LrSchedule::OneCycle, 0.2f, 9.5, 10) == Approx(0.01));
  // 15 epochs, 3 warm-up: 0 at the first step, up to base at epoch 3, then linearly to 0 at 15.
  const std::vector<int> m = {50, 100};
  CHECK(lr_at(LrSchedule::OneCycle, 0.2f, 0, 15, m, 3) == 0.0f);
  CHECK(lr_at(LrSchedule::OneCycle, 0.2f, 1.5, 15, m, 3) == Approx(0.1));
  CHECK(lr_at(LrSchedule::OneCycle, 0.2f, 3, 15, m, 3) == Approx(0.2));
  CHECK(lr_at(LrSchedule::OneCycle, 0.2f, 9, 15, m, 3) == Approx(0.1));
  CHECK(lr_at(LrSchedule::OneCycle, 0.2f, 14.88, 15, m, 3) == Approx(0.2 * 0.12 / 12));
  // Cosine after a warm-up decays over the remaining epochs; constant holds after it.
  CHECK(lr_at(LrSchedule::Cosine, 0.1f, 1, 10, m, 2) == Approx(0.05));
  CHECK(lr_at(LrSchedule::Cosine, 0.1f, 2, 10, m, 2) == Approx(0.1));
  CHECK(lr_at(LrSchedule::Cosine, 0.1f, 6, 10, m, 2) == Approx(0.05));
  CHECK(lr_at(LrSchedule::Constant, 0.1f, 0.5, 10, m, 1) == Approx(0.05));
  CHECK(lr_at(LrSchedule::Constant, 0.1f, 7, 10, m, 1) == 0.1f);
  // Without a warm-up the cosine is evaluated as it always was (bit for bit).
  for (double e : {0.0, 0.37, 3.3, 7.77})
    CHECK(lr_at(LrSchedule::Cosine, 0.1f, e, 15) == static_cast<float>(0.1f * 0.5 * (1.0 + std::cos(M_PI * e / 15.0))));
  CHECK_THROWS_WITH(lr_at(LrSchedule::OneCycle, 0.1f, 0, 10, m, 10), Catch::Matchers::Contains("warm-up of 10"));
  CHECK_THROWS_WITH(lr_at(LrSchedule::OneCycle, 0.1f, 0, 10, m, -1), Catch::Matchers::Contains("warm-up of -1"));
}

TEST_CASE("safetensors: round trip keeps names, shapes, bits and metadata") {
  Context ctx;
  auto w = test::random_vec(37, test::fresh_seed());
  Tensor a = ctx.from_host(w, {37});
  Tensor b = ctx.from_host(std::vector<int32_t>{1, -2, 3, 4, 5, 6}, {2, 3});
  save_safetensors("rt.safetensors", {{"conv1.weight", a}, {"step", b}}, {{"epoch", "3"}});
  auto f = load_safetensors("rt.safetensors");
  REQUIRE(f.tensors.size() == 2);
  CHECK(f.tensors.at("conv1.weight").fingerprint() == a.fingerprint());
  CHECK(f.tensors.at("step").to_host_i32() == std::vector<int32_t>{1, -2, 3, 4, 5, 6});
  CHECK(f.metadata.at("epoch") == "3");
  // header length is a multiple of 8 (alignment the reference writer keeps)
  std::ifstream in("rt.safetensors", std::ios::binary);
  uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), 8);
  CHECK(n % 8 == 0);

  Tensor dst = ctx.zeros({37});
  restore_tensors(ctx, f, "rt.safetensors", {{"conv1.weight", &dst}});
  CHECK(dst.fingerprint() == a.fingerprint());
  Tensor wrong = ctx.zeros({36});
  CHECK_THROWS_WITH(restore_tensors(ctx, f, "rt.safetensors", {{"conv1.weight", &wrong}}),
                    Catch::Matchers::Contains("conv1.weight") && Catch::Matchers::Contains("[36]"));
  CHECK_THROWS_WITH(restore_tensors(ctx, f, "rt.safetensors", {{"fc.bias", &dst}}),
                    Catch::Matchers::Contains("'fc.bias' is missing"));
  std::remove("rt.safetensors");
}

TEST_CASE("safetensors: truncated and corrupt files name the file and offset") {
  Context ctx;
  save_safetensors("full.safetensors", {{"x", ctx.full({100}, 1.0f)}});
  std::ifstream in("full.safetensors", std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), {});
  auto write = [](const std::string& path, const std::string& s) {
    std::ofstream(path, std::ios::binary) << s;
  };
  write("trunc.safetensors", bytes.substr(0, bytes.size() - 10));
  CHECK_THROWS_WITH(load_safetensors("trunc.safetensors"),
                    Catch::Matchers::Contains("trunc.safetensors") && Catch::Matchers::Contains("truncated"));
  write("short.safetensors", bytes.substr(0, 5));
  CHECK_THROWS_WITH(load_safetensors("short.safetensors"), Catch::Matchers::Contains("offset 5"));
  std::string bad = bytes;
  bad[8] = '!';
  write("bad.safetensors", bad);
  CHECK_THROWS_WITH(load_safetensors("bad.safetensors"),
                    Catch::Matchers::Contains("bad.safetensors") && Catch::Matchers::Contains("malformed JSON header at byte 8") &&
                        Catch::Matchers::Contains("bare word") && !Catch::Matchers::Contains("json.exception"));
  CHECK_THROWS_AS(load_safetensors("missing.safetensors"), IoError);
  // Well-formed JSON of the wrong structure (found by tests/fuzz/fuzz_safetensors): each is a
  // DataError naming the file, never a JSON library exception or a huge allocation.
  auto with_header = [&](const std::string& path, const std::string& header) {
    std::string s(8, '\0');
    for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
    write(path, s + header);
  };
  const std::vector<std::pair<std::string, std::string>> wrong = {
      {"[1, 2]", "not a JSON object"},
      {R"({"x": {"dtype": "F32", "shape": [2]}})", "data_offsets"},
      {R"({"x": 5})", "not an object"},
      {R"({"__metadata__": {"epoch": 3}})", "metadata 'epoch'"},
      {R"({"x": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 0]}})", "shape"},
      {R"({"x": {"dtype": "F32", "shape": [4611686018427387904, 4], "data_offsets": [0, 0]}})", "shape"},
      {R"({"x": {"dtype": "F32", "shape": "2", "data_offsets": [0, 8]}})", "tensor 'x'"}};
  for (const auto& [header, says] : wrong) {
    INFO(header);
    with_header("wrong.safetensors", header);
    CHECK_THROWS_WITH(load_safetensors("wrong.safetensors"),
                      Catch::Matchers::Contains("wrong.safetensors") && Catch::Matchers::Contains(says));
  }
  for (auto p : {"full.safetensors", "trunc.safetensors", "short.safetensors", "bad.safetensors", "wrong.safetensors"})
    std::remove(p);
}

TEST_CASE("safetensors: tensors whose bytes overlap, leave a gap or leave bytes over are refused, naming them") {
  using Catch::Matchers::Contains;
  auto file = [](const std::string& header, std::size_t data_bytes) {
    std::string s(8, '\0');
    for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
    std::ofstream("layout.safetensors", std::ios::binary) << s + header + std::string(data_bytes, '\x01');
  };
  file(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
           "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})", 12);
  CHECK_THROWS_WITH(load_safetensors("layout.safetensors"),
                    Contains("layout.safetensors") && Contains("tensor 'b' data_offsets [4, 12] overlap tensor 'a' [0, 8]"));
  file(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
           "b": {"dtype": "F32", "shape": [2], "data_offsets": [12, 20]}})", 20);
  CHECK_THROWS_WITH(load_safetensors("layout.safetensors"), Contains("bytes 8 to 12 of the data") && Contains("'b'"));
  file(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})", 12);
  CHECK_THROWS_WITH(load_safetensors("layout.safetensors"), Contains("4 bytes after the last tensor"));
  file(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
           "b": {"dtype": "I32", "shape": [0], "data_offsets": [8, 8]}})", 8);
  CHECK_NOTHROW(load_safetensors("layout.safetensors"));  // an empty tensor takes no bytes
  file(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": "0-8"}})", 8);
  CHECK_THROWS_WITH(load_safetensors("layout.safetensors"),
                    Contains("data_offsets \"0-8\"") && Contains("expected [begin, end]") && !Contains("json.exception"));
  std::remove("layout.safetensors");
}

TEST_CASE("metrics: topk and correct counts") {
  Context ctx;
  Tensor logits = ctx.from_host(std::vector<float>{0.1f, 0.9f, 0.5f, 0.5f, /*row 2*/ 3, 2, 1, 0}, {2, 4});
  auto t = topk(ctx, logits, 3).to_host_i32();
  CHECK(t == std::vector<int32_t>{1, 2, 3, 0, 1, 2});  // tie 0.5/0.5 → lower index first
  Tensor counts = ctx.zeros({2}, DType::I32);
  accumulate_correct(ctx, logits, ctx.from_host(std::vector<int32_t>{2, 0}, {2}), counts);
  CHECK(counts.to_host_i32() == std::vector<int32_t>{1, 2});
  CHECK_THROWS_AS(topk(ctx, logits, 5), ShapeError);
  // bf16 logits (a classifier's native result) are ranked as their exact widening to f32.
  const Tensor narrow = to_dtype(ctx, logits, DType::BF16);
  CHECK(topk(ctx, narrow, 3).to_host_i32() == t);
  Tensor narrow_counts = ctx.zeros({2}, DType::I32);
  accumulate_correct(ctx, narrow, ctx.from_host(std::vector<int32_t>{2, 0}, {2}), narrow_counts);
  CHECK(narrow_counts.to_host_i32() == std::vector<int32_t>{1, 2});
  CHECK_THROWS_AS(topk(ctx, ctx.zeros({2, 4}, DType::I32), 1), ShapeError);
}
