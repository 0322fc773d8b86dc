// Sparse x dense matmul on the GPU: every forward variant (ditto's rows, cuSPARSE default/ALG1/
// ALG2/ALG3) and every backward variant (atomic, deterministic with and without a transpose plan,
// cuSPARSE transposed) against the CPU reference in double, with tolerances from each output's sum
// of |terms|; determinism over 10 runs at the size (100k x 100k, 1M entries, 64 columns):
// bit-equal where promised, more than one result for the atomic backward, cuSPARSE's observed and
// printed; an out-of-range column as NaN; one DETERMINISM line per variant.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "engine/context.h"
#include "engine/error.h"
#include "kernels/spmm.h"
#include "kernels/spmm_ref.h"
#include "support.h"

using namespace ditto;

namespace {

constexpr double kU = 0x1p-24;
const SpmmFwd kFwd[] = {SpmmFwd::Ditto, SpmmFwd::CusparseDefault, SpmmFwd::CusparseAlg1, SpmmFwd::CusparseAlg2,
                        SpmmFwd::CusparseAlg3};
const SpmmBwd kBwd[] = {SpmmBwd::Atomic, SpmmBwd::Deterministic, SpmmBwd::Cusparse};

struct HostCsr {
  int64_t rows = 0, cols = 0;
  std::vector<int32_t> ptr{0}, idx;
  std::vector<float> vals;
};

// Each row gets a random number of entries in [0, 2 * per_row] at distinct sorted random columns.
HostCsr random_csr(int64_t rows, int64_t cols, int64_t per_row, uint64_t seed) {
  std::mt19937_64 g(seed);
  HostCsr a;
  a.rows = rows, a.cols = cols;
  std::vector<int32_t> row;
  for (int64_t r = 0; r < rows; ++r) {
    row.clear();
    const int64_t m = int64_t(g() % uint64_t(2 * per_row + 1));
    for (int64_t i = 0; i < m; ++i) row.push_back(int32_t(g() % uint64_t(cols)));
    std::sort(row.begin(), row.end());
    row.erase(std::unique(row.begin(), row.end()), row.end());
    a.idx.insert(a.idx.end(), row.begin(), row.end());
    a.ptr.push_back(int32_t(a.idx.size()));
  }
  a.vals = test::random_vec(a.idx.size(), seed + 1);
  return a;
}

// |got - ref| <= (terms + 1) u sum|term| elementwise, with `terms` the most terms any element sums.
void check_sum(const std::vector<float>& got, const std::vector<double>& want, const std::vector<double>& abs_sum,
               double terms, const char* what) {
  REQUIRE(got.size() == want.size());
  double worst = 0;
  std::size_t at = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double ratio = std::fabs(got[i] - want[i]) / ((terms + 1) * kU * abs_sum[i] + 1e-30);
    if (!(ratio <= worst)) worst = ratio, at = i;
  }
  INFO(what << ": worst at " << at << ": got " << got[at] << ", reference " << want[at] << ", error / bound "
            << worst);
  CHECK(worst <= 1.0);
}

template <class T>
std::vector<double> absd(const std::vector<T>& v) {
  std::vector<double> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = std::fabs(double(v[i]));
  return out;
}

}  // namespace

TEST_CASE("gpu spmm: every forward and backward variant against the CPU reference") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  Context gpu(Device::cuda(0));
  const HostCsr h = random_csr(3000, 1200, 12, seed);
  const ref::SpmmDims d{h.rows, h.cols, 70, int64_t(h.idx.size())};  // 70: a partial second lane pass
  auto bv = test::random_vec(std::size_t(d.cols * d.k), seed + 2);
  auto dcv = test::random_vec(std::size_t(d.rows * d.k), seed + 3);
  std::vector<double> vd(h.vals.begin(), h.vals.end()), bd(bv.begin(), bv.end()), dcd(dcv.begin(), dcv.end());
  std::vector<double> c_ref(dcv.size()), db_ref(bv.size()), dv_ref(h.vals.size());
  ref::spmm_fwd(h.ptr.data(), h.idx.data(), vd.data(), bd.data(), c_ref.data(), d);
  ref::spmm_bwd_dense(h.ptr.data(), h.idx.data(), vd.data(), dcd.data(), db_ref.data(), d);
  ref::spmm_bwd_values(h.ptr.data(), h.idx.data(), bd.data(), dcd.data(), dv_ref.data(), d);
  // The scale of each output's rounding error: the same sums over absolute values.
  const auto va = absd(h.vals), ba = absd(bv), dca = absd(dcv);
  std::vector<double> c_abs(c_ref.size()), db_abs(db_ref.size()), dv_abs(dv_ref.size());
  ref::spmm_fwd(h.ptr.data(), h.idx.data(), va.data(), ba.data(), c_abs.data(), d);
  ref::spmm_bwd_dense(h.ptr.data(), h.idx.data(), va.data(), dca.data(), db_abs.data(), d);
  ref::spmm_bwd_values(h.ptr.data(), h.idx.data(), ba.data(), dca.data(), dv_abs.data(), d);
  int64_t max_row = 0;
  std::vector<int64_t> per_col(std::size_t(d.cols), 0);
  for (int64_t r = 0; r < d.rows; ++r) max_row = std::max<int64_t>(max_row, h.ptr[r + 1] - h.ptr[r]);
  for (int32_t c : h.idx) ++per_col[c];
  const double max_col = double(*std::max_element(per_col.begin(), per_col.end()));

  Tensor b = gpu.from_host(bv, {d.cols, d.k}), dc = gpu.from_host(dcv, {d.rows, d.k});
  for (SpmmFwd f : kFwd) {
    INFO("fwd " << name_of(f));
    gpu.policy().pin("sp", f);
    CsrMatrix a = csr_from_host(gpu, h.rows, h.cols, h.ptr, h.idx, h.vals);
    Var c = spmm(gpu, "sp", a, Var(b));
    // Each C element sums at most max_row products (one rounding each), in any order.
    check_sum(c.value().to_host_f32(), c_ref, c_abs, double(max_row) + 1, "C");
    const ManifestEntry* e = gpu.manifest().find("sp", "fwd");
    REQUIRE(e != nullptr);
    CHECK(e->variant == name_of(f));
    CHECK(e->guarantee == (f == SpmmFwd::Ditto           ? Guarantee::GpuToGpu
                           : f == SpmmFwd::CusparseAlg3 ? Guarantee::RunToRun
                                                        : Guarantee::NotGuaranteed));
  }
  gpu.policy().pin("sp", SpmmFwd::Ditto);
  for (SpmmBwd v : kBwd)
    for (bool planned : {false, true}) {
      if (planned && v != SpmmBwd::Deterministic) continue;
      INFO("bwd " << name_of(v) << (planned ? " with a transpose plan" : ""));
      gpu.policy().pin("sp", v);
      CsrMatrix a = csr_from_host(gpu, h.rows, h.cols, h.ptr, h.idx, h.vals, true);
      if (planned) csr_plan_transpose(gpu, a);
      Var bvar(b, true);
      Var c = spmm(gpu, "sp", a, bvar);
      gpu.tape().backward(gpu, c, gpu.to_device(dc));
      check_sum(bvar.grad().to_host_f32(), db_ref, db_abs, max_col + 1, "dB");
      check_sum(a.values.grad().to_host_f32(), dv_ref, dv_abs, double(d.k) + 1, "dvalues");
      const ManifestEntry* e = gpu.manifest().find("sp", "bwd");
      REQUIRE(e != nullptr);
      CHECK(e->variant == name_of(v));
      CHECK(e->guarantee == (v == SpmmBwd::Deterministic ? Guarantee::GpuToGpu : Guarantee::NotGuaranteed));
    }
}

TEST_CASE("gpu spmm: determinism over 10 runs, 100k x 100k with 1M entries times 64 columns") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  Context gpu(Device::cuda(0));
  const HostCsr h = random_csr(100000, 100000, 10, seed);  // about 1M entries, ~10 per column
  const int64_t k = 64;
  Tensor b = gpu.from_host(test::random_vec(std::size_t(h.cols * k), seed + 2), {h.cols, k});
  Tensor dc = gpu.from_host(test::random_vec(std::size_t(h.rows * k), seed + 3), {h.rows, k});
  std::printf("spmm determinism: A %lldx%lld with %zu entries\n", (long long)h.rows, (long long)h.cols, h.idx.size());
  for (SpmmFwd f : kFwd) {
    gpu.policy().pin("sp", f);
    CsrMatrix a = csr_from_host(gpu, h.rows, h.cols, h.ptr, h.idx, h.vals);
    auto fwd = [&] { return spmm(gpu, "sp", a, Var(b)).value(); };
    const std::size_t distinct = test::distinct_results(10, fwd);
    const double us = test::us_per_call(gpu, [&] { fwd(); });
    std::printf("DETERMINISM | spmm | fwd=%s | %zu/10 | %.1f us\n", name_of(f), distinct, us);
    if (f == SpmmFwd::Ditto || f == SpmmFwd::CusparseAlg3) CHECK(distinct == 1);
    // default, alg1, alg2: not documented as reproducible; observed above.
  }
  gpu.policy().pin("sp", SpmmFwd::Ditto);
  for (SpmmBwd v : kBwd)
    for (bool planned : {false, true}) {
      if (planned && v != SpmmBwd::Deterministic) continue;
      gpu.policy().pin("sp", v);
      CsrMatrix a = csr_from_host(gpu, h.rows, h.cols, h.ptr, h.idx, h.vals);
      if (planned) csr_plan_transpose(gpu, a);
      auto step = [&] {
        Var bvar(b, true);
        gpu.tape().backward(gpu, spmm(gpu, "sp", a, bvar), gpu.to_device(dc));
        return bvar.grad();
      };
      const std::size_t distinct = test::distinct_results(10, step);
      const double us = test::us_per_call(gpu, [&] { step(); });
      std::printf("DETERMINISM | spmm | bwd=%s%s | %zu/10 | %.1f us (forward included)\n", name_of(v),
                  planned ? " (transpose planned)" : "", distinct, us);
      if (v == SpmmBwd::Deterministic) CHECK(distinct == 1);
      if (v == SpmmBwd::Atomic) CHECK(distinct > 1);
      // cusparse: cuSPARSE says the transposed product may differ between runs; observed above.
    }
}

TEST_CASE("gpu spmm: an out-of-range column gives NaN in its row, never a read outside the arrays") {
  Context gpu(Device::cuda(0), Policy::parse({"sp.fwd=ditto", "sp.bwd=deterministic"}));
  CsrMatrix a;
  a.rows = 3, a.cols = 4;
  a.row_ptr = gpu.from_host(std::vector<int32_t>{0, 1, 2, 3}, {4});
  a.col_idx = gpu.from_host(std::vector<int32_t>{0, 9, 3}, {3});  // entry 1: column 9 of 4
  a.values = Var(gpu.from_host(std::vector<float>{1, 1, 1}, {3}));
  CHECK_THROWS_AS(csr_check(a), DataError);
  Var b(gpu.from_host(test::random_vec(4 * 5, 3), {4, 5}), true);
  Var c = spmm(gpu, "sp", a, b);
  auto cv = c.value().to_host_f32();
  for (int j = 0; j < 5; ++j) {
    CHECK(std::isfinite(cv[j]));
    CHECK(std::isnan(cv[5 + j]));
    CHECK(std::isfinite(cv[10 + j]));
  }
  gpu.tape().backward(gpu, c, gpu.full(c.shape(), 1.f));
  for (float g : b.grad().to_host_f32()) CHECK(std::isfinite(g));  // the bad entry adds into no row
}
