// op_noise: the per-op determinism micro-experiment. For one shape, runs every variant of every
// op family (each conv direction with every algorithm cuDNN supports, max-pool backward, bias
// gradient, batch-norm backward, loss reduction) `--runs` times on the same inputs and reports,
// per variant: how many distinct results (bitwise, by fingerprint), the largest elementwise
// difference from the first result (how big the noise is), and microseconds per call (each call alone, and
// `--runs` calls back to back).
// The scatter and reduction families (scatter-add / embedding backward, upsampling backward,
// pixel-wise loss, sum reduction) run at realistic sizes of their own, fixed below, not at the
// conv shape.
// The conv family runs in each of --precisions (fp32, tf32, bf16, fp16) and --layouts (nchw, nhwc);
// the linear family (every gemm interface, with cuBLAS atomics off and on, at a classifier's shape
// and at a tall one whose dw sums over 8192 rows) in each precision. Each row says its precision
// and layout (column `form`: "bf16", "bf16+nhwc").
// --families picks some of conv, linear, bias, pool, bn, loss, scatter, upsample, pixel_xent, reduce;
// --group picks classic (the families above), sampler-ctc-spmm (spatial transformer, ROI align,
// CTC, sparse matmul at their own sizes: bench/op_noise_sampler_ctc_spmm.h), or all (the default).
// Writes op_noise.csv and op_noise.json to --out.
//   op_noise --n 32 --c 64 --hw 32 --k 64 --r 3 --runs 20 --out runs/op_noise
//   op_noise --families conv,linear --precisions fp32,bf16,fp16 --layouts nchw,nhwc --out runs/op_noise_amp
//   op_noise --families scatter,upsample,pixel_xent,reduce --out runs/op_noise_scatter_reduce
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fmt/format.h>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "engine/context.h"
#include "engine/error.h"
#include "kernels/batchnorm.h"
#include "kernels/bias.h"
#include "kernels/conv2d.h"
#include "kernels/linear.h"
#include "kernels/loss.h"
#include "kernels/pixel_xent.h"
#include "kernels/pool.h"
#include "kernels/reduction.h"
#include "kernels/scatter.h"
#include "kernels/upsample.h"
#include "op_noise_sampler_ctc_spmm.h"

using namespace ditto;

namespace {

struct Row {
  std::string op, knob, variant, shape;
  std::string form = "fp32";  // the precision, and "+nhwc" for a channels-last convolution
  std::size_t distinct = 0;
  int runs = 0;
  // us_per_call: each call alone (queued, then waited for: its host work and launch latency show);
  // us_back_to_back: `runs` calls queued one after another and one wait (as a training loop queues
  // them: the host's work overlaps the GPU's).
  double max_abs_diff = 0, us_per_call = 0, us_back_to_back = 0;
};

const std::vector<std::string> kFamilies = {"conv", "linear", "bias", "pool", "bn", "loss", "scatter", "upsample",
                                            "pixel_xent", "reduce"};

std::vector<int32_t> random_ints(int64_t n, int32_t hi, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::uniform_int_distribution<int32_t> d(0, hi - 1);
  std::vector<int32_t> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = d(g);
  return v;
}

std::vector<float> randoms(int64_t n, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<float> d(-1.f, 1.f);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = d(g);
  return v;
}

// Runs `fn` (one call of the op under test, returning the tensor whose bits are compared)
// `runs` times after 3 warm-ups.
Row measure(Context& ctx, int runs, const std::function<Tensor()>& fn) {
  for (int i = 0; i < 3; ++i) fn();
  ctx.synchronize();
  std::set<Fingerprint> prints;
  std::vector<float> first;
  double max_diff = 0, us = 0;
  for (int i = 0; i < runs; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    Tensor out = fn();
    ctx.synchronize();
    us += std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    prints.insert(out.fingerprint());
    auto v = out.to_host_f32();
    if (first.empty()) first = v;
    for (std::size_t j = 0; j < v.size(); ++j) max_diff = std::max(max_diff, double(std::fabs(v[j] - first[j])));
  }
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < runs; ++i) fn();
  ctx.synchronize();
  const double back_to_back = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  Row r;
  r.us_back_to_back = back_to_back / runs;
  r.distinct = prints.size();
  r.runs = runs;
  r.max_abs_diff = max_diff;
  r.us_per_call = us / runs;
  return r;
}

struct Options {
  int64_t n = 32, c = 64, hw = 32, k = 64;
  int r = 3, stride = 1, runs = 20;
  std::vector<std::string> families = kFamilies;
  std::vector<std::string> precisions = {"fp32"}, layouts = {"nchw"};
  std::string device = "cuda", out = "runs/op_noise", group = "all";

  bool want(const char* family) const { return std::find(families.begin(), families.end(), family) != families.end(); }
  // The families at the conv shape (conv, bias, pool, bn, loss) run unless --group picks the
  // sampling, CTC and sparse rows alone; those rows run unless it picks classic.
  bool classic() const { return group != "sampler-ctc-spmm"; }
  bool sampler_ctc_spmm() const { return group != "classic"; }
};

void add_options(CLI::App& app, Options& o) {
  app.add_option("--n", o.n, "batch")->check(CLI::PositiveNumber);
  app.add_option("--c", o.c, "input channels")->check(CLI::PositiveNumber);
  app.add_option("--hw", o.hw, "height = width")->check(CLI::PositiveNumber);
  app.add_option("--k", o.k, "output channels")->check(CLI::PositiveNumber);
  app.add_option("--r", o.r, "kernel size (padding r/2)")->check(CLI::PositiveNumber);
  app.add_option("--stride", o.stride)->check(CLI::PositiveNumber);
  app.add_option("--runs", o.runs, "calls per variant")->check(CLI::Range(2, 10000));
  app.add_option("--device", o.device);
  app.add_option("--out", o.out);
  app.add_option("--families", o.families, "op families to run (default: all)")
      ->delimiter(',')
      ->check(CLI::IsMember(kFamilies));
  app.add_option("--precisions", o.precisions, "precisions of the conv and linear rows (default fp32)")
      ->delimiter(',')
      ->check(CLI::IsMember({"fp32", "tf32", "bf16", "fp16"}));
  app.add_option("--layouts", o.layouts, "layouts of the conv rows (default nchw)")
      ->delimiter(',')
      ->check(CLI::IsMember({"nchw", "nhwc"}));
  app.add_option("--group", o.group, "rows: classic, sampler-ctc-spmm or all")
      ->check(CLI::IsMember({"all", "classic", "sampler-ctc-spmm"}));
}

// The rows measured so far, each printed as it is added.
struct Rows {
  std::vector<Row> rows;

  void add(Row row, std::string op, std::string knob, std::string variant, std::string sh,
           std::string form = "fp32") {
    row.op = std::move(op);
    row.knob = std::move(knob);
    row.variant = std::move(variant);
    row.shape = std::move(sh);
    row.form = std::move(form);
    std::printf("%-13s %-11s %-22s %-9s %4zu/%-4d  max|diff| %-10.3g %9.1f us %9.1f us back to back\n",
                row.op.c_str(), row.knob.c_str(), row.variant.c_str(), row.form.c_str(), row.distinct, row.runs,
                row.max_abs_diff, row.us_per_call, row.us_back_to_back);
    std::fflush(stdout);
    rows.push_back(row);
  }
};

// The classic families' shape (--n --c --hw --k --r --stride) and its inputs.
struct ConvCase {
  Conv2dParams p;
  Shape xs, ws, ys;
  std::string shape;
  std::vector<float> xv, wv, dyv;
};

ConvCase conv_case(const Options& o) {
  ConvCase cc;
  cc.p.stride_h = cc.p.stride_w = o.stride;
  cc.p.pad_h = cc.p.pad_w = o.r / 2;
  cc.xs = {o.n, o.c, o.hw, o.hw};
  cc.ws = {o.k, o.c, o.r, o.r};
  cc.ys = conv2d_output_shape("conv", cc.xs, cc.ws, cc.p);
  cc.shape = fmt::format("x{} w{}", shape_str(cc.xs), shape_str(cc.ws));
  cc.xv = randoms(shape_numel(cc.xs), 1);
  cc.wv = randoms(shape_numel(cc.ws), 2);
  cc.dyv = randoms(shape_numel(cc.ys), 3);
  return cc;
}

// Convolution: every algorithm cuDNN supports for each direction, in each precision and layout
// (a fresh context each, so no cache or autotuning state carries over).
void conv_rows(const Device& dev, const Options& o, const ConvCase& cc, Rows& out) {
  for (const std::string& precision : o.precisions) {
    for (const std::string& layout : o.layouts) {
      const std::string form = layout == "nhwc" ? precision + "+nhwc" : precision;
      for (std::string dir : {"fwd", "bwd_data", "bwd_filter"}) {
        std::vector<std::string> algos;
        {
          Context probe(dev);
          algos = conv_supported_algos(probe, dir, cc.xs, cc.ws, cc.p, parse_precision(precision),
                                       layout == "nhwc" ? ConvLayout::Nhwc : ConvLayout::Nchw);
        }
        for (const auto& algo : algos) {
          Context ctx(dev, Policy::parse({"conv." + dir + "=" + algo, "conv.precision=" + precision,
                                          "conv.layout=" + layout}));
          Tensor x = ctx.from_host(cc.xv, cc.xs), w = ctx.from_host(cc.wv, cc.ws), dy = ctx.from_host(cc.dyv, cc.ys);
          Row row = measure(ctx, o.runs, [&] {
            if (dir == "fwd") return conv2d_forward(ctx, "conv", x, w, cc.p);
            if (dir == "bwd_data") return conv2d_backward_data(ctx, "conv", dy, w, cc.xs, cc.p);
            return conv2d_backward_filter(ctx, "conv", x, dy, cc.ws, cc.p);
          });
          out.add(row, "conv2d", dir, algo, cc.shape, form);
        }
      }
    }
  }
}

// Linear layers (cuBLAS): each gemm interface (cuBLAS's own pick with atomics off and on, and
// cuBLASLt's recorded algorithm without split-K) in each precision, at a classifier's shape and
// at a tall one whose weight gradient sums over 8192 rows; one row per product (y, dx, dw).
void linear_rows(const Device& dev, const Options& o, Rows& out) {
  struct Gemm {
    const char* variant;
    std::vector<std::string> rules;
  };
  const std::vector<Gemm> gemms = {{"cublas", {"fc.gemm=cublas", "fc.cublas_atomics=off"}},
                                   {"cublas+atomics", {"fc.gemm=cublas", "fc.cublas_atomics=on"}},
                                   {"cublaslt", {"fc.gemm=cublaslt"}}};
  for (auto [n, in, outf] : {std::tuple<int64_t, int64_t, int64_t>{512, 2048, 1000}, {8192, 128, 32}}) {
    const auto xv = randoms(n * in, 16), wv = randoms(outf * in, 17), dyv = randoms(n * outf, 18);
    for (const std::string& precision : o.precisions) {
      for (const Gemm& g : gemms) {
        auto rules = g.rules;
        rules.push_back("fc.precision=" + precision);
        Context ctx(dev, Policy::parse(rules));
        Tensor xd = ctx.from_host(xv, {n, in}), wd = ctx.from_host(wv, {outf, in}), dyd = ctx.from_host(dyv, {n, outf});
        for (const char* product : {"y", "dx", "dw"}) {
          const std::string p = product;
          out.add(measure(ctx, o.runs,
                          [&] {
                            Var x(xd, p == "dx"), w(wd, p == "dw");
                            Var y = linear(ctx, "fc", x, w);
                            if (p == "y") return y.value();
                            ctx.tape().backward(ctx, y, dyd);
                            return p == "dx" ? x.grad() : w.grad();
                          }),
                  "linear", "gemm", g.variant, fmt::format("x[{}, {}] w[{}, {}] {}", n, in, outf, in, p), precision);
        }
      }
    }
  }
}

// Bias gradient of the conv output (db over N*H*W per channel).
void bias_rows(const Device& dev, int runs, const ConvCase& cc, Rows& out) {
  for (std::string v : {"atomic", "deterministic", "cudnn"}) {
    Context ctx(dev, Policy::parse({"conv.bias_bwd=" + v}));
    Var y(ctx.from_host(cc.dyv, cc.ys), true), b(ctx.zeros({cc.ys[1]}), true);
    Tensor seed = ctx.from_host(cc.dyv, cc.ys);
    out.add(measure(ctx, runs, [&] {
              b.zero_grad();
              ctx.tape().backward(ctx, bias_add(ctx, "conv", op::conv2d, y, b), seed);
              return b.grad();
            }),
            "bias_add", "bias_bwd", v, fmt::format("dy{}", shape_str(cc.ys)));
  }
}

// Max-pool 3x3 stride 2 pad 1 (overlapping windows) on the conv input.
void pool_rows(const Device& dev, int runs, const ConvCase& cc, Rows& out) {
  const PoolParams pp{3, 3, 2, 2, 1, 1};
  const Shape ps = pool_output_shape(cc.xs, pp);
  const auto pdy = randoms(shape_numel(ps), 4);
  for (std::string v : {"cudnn", "cudnn-deterministic", "atomic-scatter", "gather"}) {
    Context ctx(dev, Policy::parse({"pool.bwd=" + v}));
    Var x(ctx.from_host(cc.xv, cc.xs), true);
    Tensor seed = ctx.from_host(pdy, ps);
    out.add(measure(ctx, runs, [&] {
              x.zero_grad();
              ctx.tape().backward(ctx, max_pool2d(ctx, "pool", x, pp), seed);
              return x.grad();
            }),
            "max_pool2d", "bwd", v, fmt::format("x{} 3x3/2", shape_str(cc.xs)));
  }
}

// Batch norm (training) on the conv input: dgamma is the reduced quantity.
void bn_rows(const Device& dev, int runs, const ConvCase& cc, Rows& out) {
  const int64_t c = cc.xs[1];
  for (std::string v : {"cudnn", "atomic", "deterministic"}) {
    Context ctx(dev, Policy::parse({"bn.bwd=" + v}));
    Var x(ctx.from_host(cc.xv, cc.xs), true), g(ctx.full({c}, 1.f), true), be(ctx.zeros({c}), true);
    BatchNormState st{ctx.zeros({c}), ctx.full({c}, 1.f)};
    Tensor seed = ctx.from_host(cc.xv, cc.xs);
    out.add(measure(ctx, runs, [&] {
              g.zero_grad();
              ctx.tape().backward(ctx, batch_norm(ctx, "bn", x, g, be, st, true), seed);
              return g.grad();
            }),
            "batch_norm", "bwd", v, fmt::format("x{}", shape_str(cc.xs)));
  }
}

// Loss over a batch of n*hw*hw rows of 10 classes (the batch reduction is what varies).
void loss_rows(const Device& dev, int runs, const ConvCase& cc, Rows& out) {
  const int64_t rows_n = cc.xs[0] * cc.xs[2] * cc.xs[3];
  const auto logits_v = randoms(rows_n * 10, 5);
  std::vector<int32_t> labels(static_cast<std::size_t>(rows_n));
  for (int64_t i = 0; i < rows_n; ++i) labels[i] = static_cast<int32_t>(i % 10);
  for (const std::string& v : knob_spec(op::softmax_xent, "reduce").variant_names()) {
    Context ctx(dev, Policy::parse({"loss.reduce=" + v}));
    Var logits(ctx.from_host(logits_v, {rows_n, 10}), false);
    Tensor lab = ctx.from_host(labels, {rows_n});
    out.add(measure(ctx, runs, [&] { return softmax_cross_entropy(ctx, "loss", logits, lab).value(); }),
            "softmax_xent", "reduce", v, fmt::format("logits[{}, 10]", rows_n));
  }
}

// Embedding backward (the weight gradient is a scatter-add of dy by the indices): a 1M x 64
// table and a batch of 4096 x 20 lookups, uniform over the table and from 1000 hot rows; an
// embedding bag of 4096 bags of 20 (sum, mean); TensorFlow's unsorted_segment_sum of 262144
// rows of 64 into 4096 segments.
void scatter_rows(const Device& dev, int runs, Rows& out) {
  const int64_t table_rows = 1000000, d = 64, bags = 4096, per_bag = 20, m = bags * per_bag;
  const auto emb_dy = randoms(m * d, 6), bag_dy = randoms(bags * d, 7);
  const auto uniform = random_ints(m, int32_t(table_rows), 8), hot = random_ints(m, 1000, 9);
  for (std::string v : {"atomic", "sorted"}) {
    for (const auto* idx_v : {&uniform, &hot}) {
      Context ctx(dev, Policy::parse({"emb.scatter=" + v}));
      Tensor idx = ctx.from_host(*idx_v, {bags, per_bag}), dy = ctx.from_host(emb_dy, {bags, per_bag, d});
      out.add(measure(ctx, runs, [&] { return embedding_backward(ctx, "emb", dy, idx, table_rows); }), "embedding",
              "scatter", v,
              fmt::format("table[{}, {}] idx[{}, {}] {}", table_rows, d, bags, per_bag,
                          idx_v == &uniform ? "uniform" : "of 1000 rows"));
    }
    for (BagMode mode : {BagMode::Sum, BagMode::Mean}) {
      Context ctx(dev, Policy::parse({"bag.scatter=" + v}));
      Tensor idx = ctx.from_host(uniform, {bags, per_bag}), dy = ctx.from_host(bag_dy, {bags, d});
      out.add(
          measure(ctx, runs, [&] { return embedding_bag_backward(ctx, "bag", dy, idx, Tensor(), mode, table_rows); }),
          "embedding_bag", "scatter", v,
          fmt::format("table[{}, {}] {} bags of {} ({})", table_rows, d, bags, per_bag, bag_mode_name(mode)));
    }
    Context ctx(dev, Policy::parse({"seg.scatter=" + v}));
    const int64_t seg_m = 262144, segments = 4096;
    Tensor src = ctx.from_host(randoms(seg_m * d, 10), {seg_m, d});
    Tensor ids = ctx.from_host(random_ints(seg_m, int32_t(segments), 11), {seg_m});
    out.add(measure(ctx, runs, [&] { return unsorted_segment_sum(ctx, "seg", Var(src), ids, segments).value(); }),
            "scatter_add", "scatter", v, fmt::format("src[{}, {}] into {} rows", seg_m, d, segments));
  }
}

// Upsampling backward at a size of its own: 128x64x64x64 to 128x128 (scale 2),
// nearest and bilinear both ways, and bilinear to 96x96 (scale 1.5).
void upsample_rows(const Device& dev, int runs, Rows& out) {
  const Shape ux{128, 64, 64, 64};
  struct Up {
    UpsampleMode mode;
    bool align;
    int64_t out;
  };
  for (Up u : {Up{UpsampleMode::Nearest, false, 128}, Up{UpsampleMode::Bilinear, false, 128},
               Up{UpsampleMode::Bilinear, true, 128}, Up{UpsampleMode::Bilinear, false, 96}}) {
    UpsampleParams up;
    up.mode = u.mode;
    up.align_corners = u.align;
    up.out_h = up.out_w = u.out;
    const auto up_dy = randoms(ux[0] * ux[1] * u.out * u.out, 12);
    for (std::string v : {"atomic", "gather"}) {
      Context ctx(dev, Policy::parse({"up.bwd=" + v}));
      Tensor dy = ctx.from_host(up_dy, {ux[0], ux[1], u.out, u.out});
      out.add(measure(ctx, runs, [&] { return upsample2d_backward(ctx, "up", dy, ux, up); }), "upsample", "bwd", v,
              fmt::format("x{} to {}x{} {}{}", shape_str(ux), u.out, u.out, upsample_mode_name(u.mode),
                          u.align ? " align_corners" : ""));
    }
  }
}

// Pixel-wise cross-entropy (forward: the reduction over pixels is what varies) on a
// segmentation batch: 16 images, 21 classes, 256x256, one pixel in ten ignored (255).
void pixel_xent_rows(const Device& dev, int runs, Rows& out) {
  const int64_t pn = 16, pc = 21, ph = 256;
  const auto lv = randoms(pn * pc * ph * ph, 13);
  auto lab = random_ints(pn * ph * ph, int32_t(pc), 14);
  for (std::size_t i = 0; i < lab.size(); i += 10) lab[i] = 255;
  for (const std::string& v : knob_spec(op::pixel_xent, "reduce").variant_names()) {
    Context ctx(dev, Policy::parse({"seg.reduce=" + v}));
    Var logits(ctx.from_host(lv, {pn, pc, ph, ph}), false);
    Tensor labels = ctx.from_host(lab, {pn, ph, ph});
    out.add(measure(ctx, runs, [&] { return pixel_cross_entropy(ctx, "seg", logits, labels, 255).value(); }),
            "pixel_xent", "reduce", v, fmt::format("logits[{}, {}, {}, {}]", pn, pc, ph, ph));
  }
}

// Sum of 16M values.
void reduce_rows(const Device& dev, int runs, Rows& out) {
  const int64_t rn = int64_t(1) << 24;
  const auto xv2 = randoms(rn, 15);
  for (const std::string& v : reduce_knob().variant_names()) {  // every variant the family declares
    Context ctx(dev, Policy::parse({"sum.reduce=" + v}));
    Var x(ctx.from_host(xv2, {rn}), false);
    out.add(measure(ctx, runs, [&] { return reduce_sum(ctx, "sum", x).value(); }), "reduce_sum", "reduce", v,
            fmt::format("x[{}]", rn));
  }
}

// op_noise.csv and op_noise.json (the rows, with the GPU, cuDNN and commit) in `out`.
void write_rows(const Device& dev, const std::string& out, const std::vector<Row>& rows) {
  std::string csv = "op,knob,variant,form,shape,distinct,runs,max_abs_diff,us_per_call,us_back_to_back\n";
  nlohmann::json j = nlohmann::json::array();
  for (const auto& row : rows) {
    csv += fmt::format("{},{},{},{},\"{}\",{},{},{:.6g},{:.2f},{:.2f}\n", row.op, row.knob, row.variant, row.form,
                       row.shape, row.distinct, row.runs, row.max_abs_diff, row.us_per_call, row.us_back_to_back);
    j.push_back({{"op", row.op}, {"knob", row.knob}, {"variant", row.variant}, {"form", row.form}, {"shape", row.shape},
                 {"distinct", row.distinct}, {"runs", row.runs}, {"max_abs_diff", row.max_abs_diff},
                 {"us_per_call", row.us_per_call}, {"us_back_to_back", row.us_back_to_back}});
  }
  Context info_ctx(dev);
  auto info = info_ctx.runtime_info();
  nlohmann::json doc{{"gpu", info.gpu_name}, {"cudnn", info.cudnn}, {"git_commit", info.git_commit}, {"rows", j}};
  std::filesystem::create_directories(out);
  write_file_atomic((std::filesystem::path(out) / "op_noise.csv").string(), csv);
  write_file_atomic((std::filesystem::path(out) / "op_noise.json").string(), doc.dump(2));
  std::printf("wrote %s/op_noise.{csv,json}\n", out.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"op_noise: distinct results per kernel variant, on one shape"};
  Options o;
  add_options(app, o);
  CLI11_PARSE(app, argc, argv);

  try {
    const Device dev = Device::parse(o.device);
    if (!dev.is_cuda()) throw Error("--device: op_noise measures GPU kernels; the CPU has one path per op");
    const ConvCase cc = conv_case(o);
    Rows rows;
    if (o.classic()) {
      if (o.want("conv")) conv_rows(dev, o, cc, rows);
      if (o.want("linear")) linear_rows(dev, o, rows);
      if (o.want("bias")) bias_rows(dev, o.runs, cc, rows);
      if (o.want("pool")) pool_rows(dev, o.runs, cc, rows);
      if (o.want("bn")) bn_rows(dev, o.runs, cc, rows);
      if (o.want("loss")) loss_rows(dev, o.runs, cc, rows);
    }
    if (o.sampler_ctc_spmm())
      bench::sampler_ctc_spmm_rows(
          dev, o.runs, [&](Context& ctx, int r, const std::function<Tensor()>& fn) { return measure(ctx, r, fn); },
          [&](Row row, const char* op, const char* knob, const std::string& variant, const std::string& sh) {
            rows.add(std::move(row), op, knob, variant, sh);
          });
    if (o.want("scatter")) scatter_rows(dev, o.runs, rows);
    if (o.want("upsample")) upsample_rows(dev, o.runs, rows);
    if (o.want("pixel_xent")) pixel_xent_rows(dev, o.runs, rows);
    if (o.want("reduce")) reduce_rows(dev, o.runs, rows);
    write_rows(dev, o.out, rows.rows);
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "op_noise: %s\n", e.what());
    return 2;
  }
}
