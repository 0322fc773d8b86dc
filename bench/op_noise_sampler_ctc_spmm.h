// op_noise's rows for the sampling ops (spatial transformer, ROI align), CTC loss and sparse x dense
// matmul (--group sampler-ctc-spmm), at sizes of their own, independent of op_noise's --n/--c/--hw/--k:
//   grid_sample  x 128x64x64x64, a 64x64 grid of random rotations (+-30 deg), scales (0.8-1.2) and
//                shifts (+-0.2), align_corners (cuDNN's convention, so every variant runs): dx and
//                dgrid of each bwd variant;
//   affine_grid  theta 128x2x3 -> 64x64 grids: dtheta;
//   roi_align    512 rois of 7x7 crowded around 4 objects per image on 8x256x64x64 (a stride-16 map
//                of 1024x1024 images), adaptive sampling, aligned: dx;
//   ctc_loss     batch 64, T 100, alphabet 11, labels of 10: the logits' gradient;
//   spmm         100k x 100k with ~1M entries times 64 columns: C for each fwd variant, dB for each
//                bwd variant (deterministic twice: transpose built in backward, and planned once).
// Each row's time is one forward + backward (forward only for spmm's fwd rows). Included by
// bench/op_noise.cpp; `measure(ctx, runs, fn)` and `add(row, op, knob, variant, shape)` are its own.
#pragma once
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "engine/context.h"
#include "kernels/ctc.h"
#include "kernels/grid_sample.h"
#include "kernels/roi_align.h"
#include "kernels/spmm.h"

namespace ditto::bench {

inline std::vector<float> uniform(int64_t n, uint64_t seed, float lo = -1.f, float hi = 1.f) {
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = d(g);
  return v;
}

// Spatial transformer: grid_sample's dx and dgrid, affine_grid's dtheta.
template <class Measure, class Add>
void spatial_transformer_rows(const Device& dev, int runs, Measure&& measure, Add&& add) {
  const int64_t n = 128, c = 64, hw = 64;
  std::mt19937_64 g(11);
  std::uniform_real_distribution<double> angle(-0.52, 0.52), scale(0.8, 1.2), shift(-0.2, 0.2);
  std::vector<float> theta;
  for (int64_t i = 0; i < n; ++i) {
    const double a = angle(g), s = scale(g);
    theta.insert(theta.end(), {float(s * std::cos(a)), float(-s * std::sin(a)), float(shift(g)),
                               float(s * std::sin(a)), float(s * std::cos(a)), float(shift(g))});
  }
  const auto xv = uniform(n * c * hw * hw, 12), dyv = uniform(n * c * hw * hw, 13);
  const std::string shape = fmt::format("x[{}, {}, {}, {}] grid {}x{}", n, c, hw, hw, hw, hw);
  for (std::string v : {"atomic", "deterministic", "cudnn"}) {
    Context ctx(dev, Policy::parse({"stn.bwd=" + v, "loc.bwd=deterministic"}));
    Tensor grid = affine_grid(ctx, "loc", Var(ctx.from_host(theta, {n, 2, 3})), hw, hw, true).value();
    Var x(ctx.from_host(xv, {n, c, hw, hw}), true), gv(grid, true);
    Tensor seed = ctx.from_host(dyv, {n, c, hw, hw});
    auto step = [&] {
      x.zero_grad();
      gv.zero_grad();
      ctx.tape().backward(ctx, grid_sample(ctx, "stn", x, gv, true), seed);
    };
    add(measure(ctx, runs, [&] { step(); return x.grad(); }), "grid_sample", "bwd", v, shape + " dx");
    add(measure(ctx, runs, [&] { step(); return gv.grad(); }), "grid_sample", "bwd", v, shape + " dgrid");
  }
  for (std::string v : {"atomic", "deterministic", "cudnn"}) {
    Context ctx(dev, Policy::parse({"loc.bwd=" + v}));
    Var th(ctx.from_host(theta, {n, 2, 3}), true);
    Tensor seed = ctx.from_host(uniform(n * hw * hw * 2, 14), {n, hw, hw, 2});
    add(measure(ctx, runs, [&] {
          th.zero_grad();
          ctx.tape().backward(ctx, affine_grid(ctx, "loc", th, hw, hw, true), seed);
          return th.grad();
        }),
        "affine_grid", "bwd", v, fmt::format("theta[{}, 2, 3] -> {}x{}", n, hw, hw));
  }
}

// ROI align's dx.
template <class Measure, class Add>
void roi_align_rows(const Device& dev, int runs, Measure&& measure, Add&& add) {
  const int64_t n = 8, c = 256, hw = 64, k = 512;
  std::mt19937_64 g(21);
  std::uniform_real_distribution<double> centre(200, 824), size(120, 400), jitter(-40, 40);
  std::vector<double> objects;
  for (int64_t i = 0; i < n * 4; ++i) objects.insert(objects.end(), {centre(g), centre(g), size(g), size(g)});
  std::vector<float> rois;
  for (int64_t i = 0; i < k; ++i) {
    const int64_t o = int64_t(g() % uint64_t(n * 4));
    const double cx = objects[o * 4] + jitter(g), cy = objects[o * 4 + 1] + jitter(g);
    const double w = objects[o * 4 + 2] + jitter(g), h = objects[o * 4 + 3] + jitter(g);
    rois.insert(rois.end(), {float(o / 4), float(cx - w / 2), float(cy - h / 2), float(cx + w / 2), float(cy + h / 2)});
  }
  const auto xv = uniform(n * c * hw * hw, 22), dyv = uniform(k * c * 49, 23);
  const RoiAlignParams p{7, 7, 1.f / 16, -1, true};
  for (std::string v : {"atomic", "deterministic"}) {
    Context ctx(dev, Policy::parse({"roi.bwd=" + v}));
    Var x(ctx.from_host(xv, {n, c, hw, hw}), true);
    Tensor r = ctx.from_host(rois, {k, 5}), seed = ctx.from_host(dyv, {k, c, 7, 7});
    add(measure(ctx, runs, [&] {
          x.zero_grad();
          ctx.tape().backward(ctx, roi_align(ctx, "roi", x, r, p), seed);
          return x.grad();
        }),
        "roi_align", "bwd", v, fmt::format("x[{}, {}, {}, {}] {} rois 7x7", n, c, hw, hw, k));
  }
}

// CTC loss: the logits' gradient.
template <class Measure, class Add>
void ctc_rows(const Device& dev, int runs, Measure&& measure, Add&& add) {
  const int64_t t = 100, n = 64, a = 11, s = 10;
  std::mt19937_64 g(31);
  std::vector<int32_t> labels(static_cast<std::size_t>(n * s));
  const std::vector<int32_t> llen(static_cast<std::size_t>(n), static_cast<int32_t>(s));
  const std::vector<int32_t> ilen(static_cast<std::size_t>(n), static_cast<int32_t>(t));
  for (auto& l : labels) l = int32_t(1 + g() % uint64_t(a - 1));
  const auto xv = uniform(t * n * a, 32, -3.f, 3.f);
  for (std::string v : {"ditto", "cudnn-deterministic", "cudnn-nondeterministic"}) {
    Context ctx(dev, Policy::parse({"ctc.algo=" + v}));
    Var x(ctx.from_host(xv, {t, n, a}), true);
    Tensor lab = ctx.from_host(labels, {n, s}), ll = ctx.from_host(llen, {n}), il = ctx.from_host(ilen, {n});
    Tensor seed = ctx.full({n}, 1.f);
    add(measure(ctx, runs, [&] {
          x.zero_grad();
          ctx.tape().backward(ctx, ctc_loss(ctx, "ctc", x, lab, ll, il), seed);
          return x.grad();
        }),
        "ctc_loss", "algo", v, fmt::format("logits[{}, {}, {}] labels {}", t, n, a, s));
  }
}

// Sparse x dense matmul: C of each forward variant, dB of each backward one.
template <class Measure, class Add>
void spmm_rows(const Device& dev, int runs, Measure&& measure, Add&& add) {
  const int64_t rows = 100000, cols = 100000, k = 64;
  std::mt19937_64 g(41);
  std::vector<int32_t> ptr{0}, idx, row;
  for (int64_t r = 0; r < rows; ++r) {
    row.clear();
    const int64_t m = int64_t(g() % 21);  // 0..20 entries, ~10 on average: ~1M in all
    for (int64_t i = 0; i < m; ++i) row.push_back(int32_t(g() % uint64_t(cols)));
    std::sort(row.begin(), row.end());
    row.erase(std::unique(row.begin(), row.end()), row.end());
    idx.insert(idx.end(), row.begin(), row.end());
    ptr.push_back(int32_t(idx.size()));
  }
  const auto vals = uniform(int64_t(idx.size()), 42), bv = uniform(cols * k, 43), dcv = uniform(rows * k, 44);
  const std::string shape = fmt::format("A {}x{} ({} entries) x [{}, {}]", rows, cols, idx.size(), cols, k);
  for (std::string v : {"ditto", "cusparse-default", "cusparse-alg1", "cusparse-alg2", "cusparse-alg3"}) {
    Context ctx(dev, Policy::parse({"sp.fwd=" + v}));
    CsrMatrix a = csr_from_host(ctx, rows, cols, ptr, idx, vals);
    Var b(ctx.from_host(bv, {cols, k}), false);
    add(measure(ctx, runs, [&] { return spmm(ctx, "sp", a, b).value(); }), "spmm", "fwd", v, shape + " C");
  }
  for (std::string v : {"atomic", "deterministic", "deterministic+plan", "cusparse"}) {
    const bool planned = v == "deterministic+plan";
    Context ctx(dev, Policy::parse({"sp.fwd=ditto", "sp.bwd=" + std::string(planned ? "deterministic" : v)}));
    CsrMatrix a = csr_from_host(ctx, rows, cols, ptr, idx, vals);
    if (planned) csr_plan_transpose(ctx, a);
    Var b(ctx.from_host(bv, {cols, k}), true);
    Tensor seed = ctx.from_host(dcv, {rows, k});
    add(measure(ctx, runs, [&] {
          b.zero_grad();
          ctx.tape().backward(ctx, spmm(ctx, "sp", a, b), seed);
          return b.grad();
        }),
        "spmm", "bwd", v, shape + " dB");
  }
}

template <class Measure, class Add>
void sampler_ctc_spmm_rows(const Device& dev, int runs, Measure&& measure, Add&& add) {
  spatial_transformer_rows(dev, runs, measure, add);
  roi_align_rows(dev, runs, measure, add);
  ctc_rows(dev, runs, measure, add);
  spmm_rows(dev, runs, measure, add);
}

}  // namespace ditto::bench
