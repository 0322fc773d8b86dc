// Ops the model zoo needs, on the GPU: sigmoid, SiLU, ReLU6, concatenation along
// channels, the squeeze-and-excitation channel multiply and adaptive average pooling. Each CUDA
// kernel against the double-precision CPU reference on fresh random inputs, within a tolerance
// derived below from float rounding (u = 2^-24, the unit roundoff; one ulp of v is at most
// 2u*|v|); and each op's forward and backward run 10 times with bit-equal results, since all are
// documented deterministic. One DETERMINISM line per op.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>

#include "engine/context.h"
#include "kernels/activation.h"
#include "kernels/activation_ref.h"
#include "kernels/concat.h"
#include "kernels/concat_ref.h"
#include "kernels/pool.h"
#include "kernels/pool_ref.h"
#include "support.h"

using namespace ditto;

namespace {

const double kU = std::ldexp(1.0, -24);  // float unit roundoff

void check_close(const std::vector<float>& got, const std::vector<double>& want, double atol, double rtol,
                 const char* what) {
  auto r = test::all_close(got, want, atol, rtol);
  INFO(what << ": " << r.str());
  CHECK(r.ok);
}

// Runs fwd (and backward with dy) 10 times; forward values and input gradients must each be
// bit-equal across the runs.
void check_bit_equal(Context& gpu, const char* op, const std::function<std::vector<Var>()>& inputs,
                     const std::function<Var(const std::vector<Var>&)>& fwd, const Tensor& dy) {
  std::size_t distinct_y = test::distinct_results(10, [&] { return fwd(inputs()).value(); });
  std::vector<std::size_t> distinct_dx;
  const std::size_t n_in = inputs().size();
  for (std::size_t k = 0; k < n_in; ++k)
    distinct_dx.push_back(test::distinct_results(10, [&] {
      std::vector<Var> in = inputs();
      Var y = fwd(in);
      gpu.tape().backward(gpu, y, gpu.to_device(dy));
      return in[k].grad();
    }));
  const double us = test::us_per_call(gpu, [&] {
    std::vector<Var> in = inputs();
    gpu.tape().backward(gpu, fwd(in), gpu.to_device(dy));
  });
  std::printf("DETERMINISM | %s | fixed-order | %zu/10 | %.1f us\n", op, distinct_y, us);
  CHECK(distinct_y == 1);
  for (std::size_t d : distinct_dx) CHECK(d == 1);
}

}  // namespace

TEST_CASE("gpu sigmoid, silu, relu6: reference and determinism") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  Context gpu(Device::cuda(0));
  const Shape xs = {64, 32, 16, 16};
  const std::size_t n = std::size_t(shape_numel(xs));
  // |x| <= 8 covers both sigmoid branches and its saturating tails; relu6 also sees x > 6.
  auto xv = test::random_vec(n, seed, -8.0, 8.0);
  auto dyv = test::random_vec(n, seed + 1);
  const auto xd = test::to_double(xv), dyd = test::to_double(dyv);
  Tensor x = gpu.from_host(xv, xs), dy = gpu.from_host(dyv, xs);

  // Tolerances. expf is within 2 ulp (CUDA Programming Guide, single-precision functions,
  // without fast math); 1 + e, the division and (silu) the product by x each add half an ulp.
  // sigmoid's relative sensitivity to e is at most 1, so y is within 2 + 0.5 + 0.5 (+0.5) ulp:
  // at most 4.5 ulp <= 9u relative; rtol = 16u = 2^-20.
  // Backward: the GPU starts from its own y (sigmoid) or s (silu), off by at most 9u*|s|, i.e.
  // 9u absolute; (1 - s) inherits that ABSOLUTE error (relative error is unbounded where s ~ 1),
  // so dy*y*(1-y) is off by <= |dy| * (9u + 9u + a few u of rounding) <= 24u with |dy| <= 1:
  // atol = 32u = 2^-19. silu's x*s*(1-s) multiplies (1-s)'s error by |x| <= 8: <= 8*9u + 9u + 9u
  // + rounding of values <= 1.1 (<= 4u) = 94u; atol = 128u = 2^-17.
  // relu6 and its gradient select or clamp: exact.
  struct Op {
    const char* name;
    Var (*fn)(Context&, const Var&);
    double fwd_rtol, bwd_atol, bwd_rtol;
  };
  for (Op op : {Op{"sigmoid", sigmoid, 16 * kU, 32 * kU, 16 * kU}, Op{"silu", silu, 16 * kU, 128 * kU, 16 * kU},
                Op{"relu6", relu6, 0.0, 0.0, 0.0}}) {
    INFO(op.name);
    std::vector<double> y_ref(n), dx_ref(n);
    const std::string name = op.name;
    if (name == "sigmoid") {
      ref::sigmoid_fwd(xd.data(), y_ref.data(), int64_t(n));
      ref::sigmoid_bwd(y_ref.data(), dyd.data(), dx_ref.data(), int64_t(n));
    } else if (name == "silu") {
      ref::silu_fwd(xd.data(), y_ref.data(), int64_t(n));
      ref::silu_bwd(xd.data(), dyd.data(), dx_ref.data(), int64_t(n));
    } else {
      ref::relu6_fwd(xd.data(), y_ref.data(), int64_t(n));
      ref::relu6_bwd(xd.data(), dyd.data(), dx_ref.data(), int64_t(n));
    }
    Var xv_(x, true);
    Var y = op.fn(gpu, xv_);
    gpu.tape().backward(gpu, y, gpu.to_device(dy));
    check_close(y.value().to_host_f32(), y_ref, 0.0, op.fwd_rtol, "forward");
    check_close(xv_.grad().to_host_f32(), dx_ref, op.bwd_atol, op.bwd_rtol, "backward");
    check_bit_equal(
        gpu, op.name, [&] { return std::vector<Var>{Var(x, true)}; },
        [&](const std::vector<Var>& in) { return op.fn(gpu, in[0]); }, dy);
  }
}

TEST_CASE("gpu concat_channels: exact copies and determinism") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  Context gpu(Device::cuda(0));
  const int64_t batch = 16, h = 14, w = 14, hw = h * w;
  const int64_t cs[] = {24, 40, 8};
  const int64_t c = cs[0] + cs[1] + cs[2];
  std::vector<std::vector<float>> host;
  std::vector<Tensor> xs;
  for (int i = 0; i < 3; ++i) {
    host.push_back(test::random_vec(std::size_t(batch * cs[i] * hw), seed + uint64_t(i)));
    xs.push_back(gpu.from_host(host.back(), {batch, cs[i], h, w}));
  }
  auto dyv = test::random_vec(std::size_t(batch * c * hw), seed + 7);
  Tensor dy = gpu.from_host(dyv, {batch, c, h, w});

  std::vector<double> y_ref(dyv.size());
  std::vector<Var> in;
  int64_t off = 0;
  for (int i = 0; i < 3; ++i) {
    auto d = test::to_double(host[std::size_t(i)]);
    ref::copy_channels(d.data(), cs[i], 0, y_ref.data(), c, off, batch, cs[i], hw);
    off += cs[i];
    in.emplace_back(xs[std::size_t(i)], true);
  }
  Var y = concat_channels(gpu, in);
  gpu.tape().backward(gpu, y, gpu.to_device(dy));
  // Copies: bit-exact, tolerance 0.
  check_close(y.value().to_host_f32(), y_ref, 0.0, 0.0, "forward");
  const auto dyd = test::to_double(dyv);
  off = 0;
  for (int i = 0; i < 3; ++i) {
    std::vector<double> dx_ref(host[std::size_t(i)].size());
    ref::copy_channels(dyd.data(), c, off, dx_ref.data(), cs[i], 0, batch, cs[i], hw);
    off += cs[i];
    check_close(in[std::size_t(i)].grad().to_host_f32(), dx_ref, 0.0, 0.0, "backward");
  }
  check_bit_equal(
      gpu, "concat_channels",
      [&] { return std::vector<Var>{Var(xs[0], true), Var(xs[1], true), Var(xs[2], true)}; },
      [&](const std::vector<Var>& v) { return concat_channels(gpu, v); }, dy);
}

// DenseNet's pattern: inputs read by several concatenations, so their gradients accumulate. On the
// GPU the backward adds a slice straight into a gradient that already holds a sum; the host
// context copies each slice and adds it with accumulate_grad. The gradients must agree bit for bit:
// the same float adds in the same order. Covers a launch's 32-segment table overflowing (40
// inputs), fresh and added slices in one launch, an input given twice (the ordered path) and both
// kernel widths (hw a multiple of 4, and not).
TEST_CASE("gpu concat_channels: gradients accumulated in the launch equal the host's ordered sums") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  Context gpu(Device::cuda(0));
  Context cpu;
  for (const int64_t side : {7, 8}) {
    const int64_t batch = 3;
    std::vector<std::vector<float>> host;
    std::vector<Shape> shapes;
    for (int k = 0; k < 40; ++k) {
      shapes.push_back({batch, 4 + (k % 3) * 4, side, side});
      host.push_back(test::random_vec(std::size_t(shape_numel(shapes.back())), seed + uint64_t(k)));
    }
    auto run = [&](Context& ctx) {
      std::vector<Var> xs;
      for (int k = 0; k < 40; ++k) xs.emplace_back(ctx.from_host(host[std::size_t(k)], shapes[std::size_t(k)]), true);
      Var y1 = concat_channels(ctx, xs);
      Var y2 = concat_channels(ctx, {xs[0], xs[1], xs[2]});
      Var y3 = concat_channels(ctx, {xs[0], xs[0], xs[3]});
      Var z = concat_channels(ctx, {y1, y2, y3});
      auto dyv = test::random_vec(std::size_t(z.value().numel()), seed + 99);
      ctx.tape().backward(ctx, z, ctx.from_host(dyv, z.shape()));
      std::vector<std::vector<float>> grads;
      for (const Var& x : xs) grads.push_back(x.grad().to_host_f32());
      return grads;
    };
    const auto on_gpu = run(gpu), on_cpu = run(cpu);
    for (std::size_t k = 0; k < on_gpu.size(); ++k) {
      INFO("side " << side << ", input " << k);
      REQUIRE(on_gpu[k].size() == on_cpu[k].size());
      CHECK(std::memcmp(on_gpu[k].data(), on_cpu[k].data(), on_gpu[k].size() * sizeof(float)) == 0);
    }
  }
}

TEST_CASE("gpu channel_mul: reference (with the fixed-order ds reduction) and determinism") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  Context gpu(Device::cuda(0));
  // A squeeze-and-excitation site of a ResNet-50-like net, and a large plane (56x56: each lane
  // adds 98 products) where a reordered sum would show.
  for (Shape xs : {Shape{32, 256, 14, 14}, Shape{8, 64, 56, 56}}) {
    const int64_t planes = xs[0] * xs[1], hw = xs[2] * xs[3];
    auto xv = test::random_vec(std::size_t(shape_numel(xs)), seed);
    auto sv = test::random_vec(std::size_t(planes), seed + 1);
    auto dyv = test::random_vec(xv.size(), seed + 2);
    const auto xd = test::to_double(xv), sd = test::to_double(sv), dyd = test::to_double(dyv);
    std::vector<double> y_ref(xv.size()), dx_ref(xv.size()), ds_ref(sv.size());
    ref::channel_mul_fwd(xd.data(), sd.data(), y_ref.data(), planes, hw);
    ref::channel_mul_bwd(xd.data(), sd.data(), dyd.data(), dx_ref.data(), ds_ref.data(), planes, hw);

    Tensor xt = gpu.from_host(xv, xs), st = gpu.from_host(sv, {xs[0], xs[1], 1, 1}), dy = gpu.from_host(dyv, xs);
    Var x(xt, true), s(st, true);
    Var y = channel_mul(gpu, x, s);
    gpu.tape().backward(gpu, y, gpu.to_device(dy));
    // y and dx are one rounded float product each: within u relative.
    check_close(y.value().to_host_f32(), y_ref, 0.0, kU, "forward");
    check_close(x.grad().to_host_f32(), dx_ref, 0.0, kU, "dx");
    // ds: each lane sums m = ceil(hw/32) rounded products in order, then 5 butterfly levels; the
    // standard recursive-summation bound gives |error| <= (m + 5 + 1) * u * sum|dy*x| (the +1 is
    // the product's own rounding), to first order. Checked per plane with its own sum|dy*x|.
    auto ds = s.grad().to_host_f32();
    REQUIRE(ds.size() == ds_ref.size());
    const double gamma = double((hw + 31) / 32 + 6) * kU;
    bool ok = true;
    for (int64_t p = 0; p < planes && ok; ++p) {
      double abs_sum = 0;
      for (int64_t i = 0; i < hw; ++i) abs_sum += std::fabs(dyd[std::size_t(p * hw + i)] * xd[std::size_t(p * hw + i)]);
      const double err = std::fabs(double(ds[std::size_t(p)]) - ds_ref[std::size_t(p)]);
      if (!(err <= gamma * abs_sum)) {
        ok = false;
        INFO("ds plane " << p << ": got " << ds[std::size_t(p)] << ", reference " << ds_ref[std::size_t(p)]
                         << ", bound " << gamma * abs_sum);
        CHECK(ok);
      }
    }
    CHECK(ok);
    check_bit_equal(
        gpu, "channel_mul", [&] { return std::vector<Var>{Var(xt, true), Var(st, true)}; },
        [&](const std::vector<Var>& v) { return channel_mul(gpu, v[0], v[1]); }, dy);
  }
}

TEST_CASE("gpu adaptive_avg_pool2d: reference (down and up sampling) and determinism") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  Context gpu(Device::cuda(0));
  struct Case {
    Shape x;
    int64_t oh, ow;
  };
  for (Case k : {Case{{8, 32, 29, 23}, 7, 7}, Case{{4, 16, 5, 3}, 7, 7}, Case{{16, 64, 14, 14}, 1, 1}}) {
    ref::AdaptivePoolDims d;
    d.planes = k.x[0] * k.x[1], d.h = k.x[2], d.w = k.x[3], d.oh = k.oh, d.ow = k.ow;
    auto xv = test::random_vec(std::size_t(shape_numel(k.x)), seed);
    auto dyv = test::random_vec(std::size_t(d.planes * d.oh * d.ow), seed + 1);
    const auto xd = test::to_double(xv), dyd = test::to_double(dyv);
    std::vector<double> y_ref(dyv.size()), dx_ref(xv.size());
    ref::adaptive_avg_pool_fwd(xd.data(), y_ref.data(), d);
    ref::adaptive_avg_pool_bwd(dyd.data(), dx_ref.data(), d);
    // Largest window (k_max elements) and most windows covering one input (m_max).
    int64_t k_max = 0, m_max = 0;
    for (int64_t o = 0; o < d.oh; ++o)
      for (int64_t q = 0; q < d.ow; ++q)
        k_max = std::max(k_max, (ref::adaptive_end(o, d.h, d.oh) - ref::adaptive_start(o, d.h, d.oh)) *
                                    (ref::adaptive_end(q, d.w, d.ow) - ref::adaptive_start(q, d.w, d.ow)));
    for (int64_t i = 0; i < d.h; ++i)
      for (int64_t j = 0; j < d.w; ++j)
        m_max = std::max(m_max, (ref::adaptive_last_out(i, d.h, d.oh) - ref::adaptive_first_out(i, d.h, d.oh)) *
                                    (ref::adaptive_last_out(j, d.w, d.ow) - ref::adaptive_first_out(j, d.w, d.ow)));
    // Forward: k values with |x| <= 1 summed in order (error <= (k-1) u sum|x| <= (k-1) u k),
    // divided by k (+ u |y| <= u): <= k_max * u. Backward: m terms dy/k, each rounded (u), summed
    // in order ((m-1) u), |dy/k| <= 1: <= (m_max + 1) * m_max * u.
    const double fwd_tol = double(k_max) * kU, bwd_tol = double((m_max + 1) * m_max) * kU;
    INFO("x " << shape_str(k.x) << " -> " << k.oh << "x" << k.ow << ", k_max " << k_max << ", m_max " << m_max);
    Tensor xt = gpu.from_host(xv, k.x), dy = gpu.from_host(dyv, {k.x[0], k.x[1], k.oh, k.ow});
    Var x(xt, true);
    Var y = adaptive_avg_pool2d(gpu, x, k.oh, k.ow);
    gpu.tape().backward(gpu, y, gpu.to_device(dy));
    check_close(y.value().to_host_f32(), y_ref, fwd_tol, 0.0, "forward");
    check_close(x.grad().to_host_f32(), dx_ref, bwd_tol, 0.0, "backward");
    check_bit_equal(
        gpu, "adaptive_avg_pool2d", [&] { return std::vector<Var>{Var(xt, true)}; },
        [&](const std::vector<Var>& v) { return adaptive_avg_pool2d(gpu, v[0], k.oh, k.ow); }, dy);
  }
}
