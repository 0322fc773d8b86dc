// Sparse x dense matmul on the CPU: the reference's gradients (to the dense operand and to the
// sparse values) against central differences in double, a hand-computed product, the CPU op and
// its transpose plan against the reference, CSR validation (DataErrors naming the row or entry),
// shape errors, knobs, mode words and the manifest.
#include <catch2/catch.hpp>

#include <set>

#include "engine/context.h"
#include "engine/error.h"
#include "kernels/spmm.h"
#include "kernels/spmm_ref.h"
#include "support.h"

using namespace ditto;

namespace {

struct HostCsr {
  int64_t rows, cols;
  std::vector<int32_t> ptr, idx;
  std::vector<double> vals;
};

// A random rows x cols pattern with about `per_row` entries per row (some rows empty), sorted.
HostCsr random_csr(int64_t rows, int64_t cols, int64_t per_row, uint64_t seed) {
  std::mt19937_64 g(seed);
  HostCsr a{rows, cols, {0}, {}, {}};
  for (int64_t r = 0; r < rows; ++r) {
    std::set<int32_t> cs;
    const int64_t m = int64_t(g() % uint64_t(2 * per_row + 1));
    for (int64_t i = 0; i < m; ++i) cs.insert(int32_t(g() % uint64_t(cols)));
    for (int32_t c : cs) a.idx.push_back(c);
    a.ptr.push_back(int32_t(a.idx.size()));
  }
  a.vals = test::random_vec<double>(a.idx.size(), seed + 1);
  return a;
}

}  // namespace

TEST_CASE("spmm reference: gradients to the dense operand and to the sparse values in double") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  const HostCsr a = random_csr(7, 9, 3, seed);
  const ref::SpmmDims d{a.rows, a.cols, 5, int64_t(a.idx.size())};
  auto b = test::random_vec<double>(std::size_t(d.cols * d.k), seed + 2);
  auto w = test::loss_weights(std::size_t(d.rows * d.k), seed);
  std::vector<double> db(b.size()), dv(a.vals.size());
  ref::spmm_bwd_dense(a.ptr.data(), a.idx.data(), a.vals.data(), w.data(), db.data(), d);
  ref::spmm_bwd_values(a.ptr.data(), a.idx.data(), b.data(), w.data(), dv.data(), d);
  auto loss_b = [&](const std::vector<double>& bin) {
    std::vector<double> c(w.size());
    ref::spmm_fwd(a.ptr.data(), a.idx.data(), a.vals.data(), bin.data(), c.data(), d);
    return test::weighted_sum(c, w);
  };
  auto loss_v = [&](const std::vector<double>& vin) {
    std::vector<double> c(w.size());
    ref::spmm_fwd(a.ptr.data(), a.idx.data(), vin.data(), b.data(), c.data(), d);
    return test::weighted_sum(c, w);
  };
  CHECK(test::gradcheck(loss_b, b, db) < 1e-6);
  CHECK(test::gradcheck(loss_v, a.vals, dv) < 1e-6);
}

TEST_CASE("spmm on the CPU: a hand-computed product and its gradients") {
  Context ctx;
  // A = [[1, 0, 2], [0, 0, 0], [0, 3, 0]], B = [[1, 2], [3, 4], [5, 6]].
  CsrMatrix a = csr_from_host(ctx, 3, 3, {0, 2, 2, 3}, {0, 2, 1}, {1, 2, 3}, true);
  Var b(ctx.from_host(std::vector<float>{1, 2, 3, 4, 5, 6}, {3, 2}), true);
  Var c = spmm(ctx, "sp", a, b);
  CHECK(c.value().to_host_f32() == std::vector<float>{11, 14, 0, 0, 9, 12});
  ctx.tape().backward(ctx, c, ctx.from_host(std::vector<float>{1, 0, 0, 0, 0, 1}, {3, 2}));
  // dB = A^T dC: row 0 gets 1*(1,0), row 1 gets 3*(0,1), row 2 gets 2*(1,0).
  CHECK(b.grad().to_host_f32() == std::vector<float>{1, 0, 0, 3, 2, 0});
  // dvalues[e] = dC[row] . B[col]: (1,0).(1,2) = 1, (1,0).(5,6) = 5, (0,1).(3,4) = 4.
  CHECK(a.values.grad().to_host_f32() == std::vector<float>{1, 5, 4});
}

TEST_CASE("spmm on the CPU: the op against the reference, with and without a transpose plan") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  Context ctx;
  const HostCsr h = random_csr(40, 30, 4, seed);
  std::vector<float> vals(h.vals.begin(), h.vals.end());
  const ref::SpmmDims d{h.rows, h.cols, 6, int64_t(h.idx.size())};
  auto bv = test::random_vec(std::size_t(d.cols * d.k), seed + 2);
  auto dcv = test::random_vec(std::size_t(d.rows * d.k), seed + 3);
  std::vector<float> cref(dcv.size()), dbref(bv.size()), dvref(vals.size());
  ref::spmm_fwd(h.ptr.data(), h.idx.data(), vals.data(), bv.data(), cref.data(), d);
  ref::spmm_bwd_dense(h.ptr.data(), h.idx.data(), vals.data(), dcv.data(), dbref.data(), d);
  ref::spmm_bwd_values(h.ptr.data(), h.idx.data(), bv.data(), dcv.data(), dvref.data(), d);
  for (bool planned : {false, true}) {
    INFO("transpose plan " << planned);
    CsrMatrix a = csr_from_host(ctx, h.rows, h.cols, h.ptr, h.idx, vals, true);
    if (planned) {
      csr_plan_transpose(ctx, a);
      // A^T's structure: column c's entries in row order, t_perm pointing back into A.
      auto tp = a.t_row_ptr.to_host_i32(), ti = a.t_col_idx.to_host_i32(), tq = a.t_perm.to_host_i32();
      CHECK(tp.front() == 0);
      CHECK(tp.back() == d.nnz);
      for (int64_t c = 0; c < d.cols; ++c)
        for (int32_t p = tp[c]; p < tp[c + 1]; ++p) {
          CHECK(h.idx[tq[p]] == c);
          CHECK(h.ptr[ti[p]] <= tq[p]);
          CHECK(tq[p] < h.ptr[ti[p] + 1]);
          if (p > tp[c]) CHECK(ti[p] > ti[p - 1]);
        }
    }
    Var b(ctx.from_host(bv, {d.cols, d.k}), true);
    Var c = spmm(ctx, "sp", a, b);
    CHECK(c.value().to_host_f32() == cref);
    ctx.tape().backward(ctx, c, ctx.from_host(dcv, c.shape()));
    CHECK(b.grad().to_host_f32() == dbref);
    CHECK(a.values.grad().to_host_f32() == dvref);
  }
}

TEST_CASE("spmm: invalid CSR structures are DataErrors naming the row or entry; shapes are checked") {
  Context ctx;
  using Catch::Matchers::Contains;
  CHECK_THROWS_WITH(csr_from_host(ctx, 2, 3, {0, 2, 3}, {2, 1, 0}, {1, 1, 1}), Contains("row 0") && Contains("ascending"));
  CHECK_THROWS_WITH(csr_from_host(ctx, 2, 3, {0, 2, 3}, {0, 1, 3}, {1, 1, 1}), Contains("entry 2") && Contains("[0, 3)"));
  CHECK_THROWS_WITH(csr_from_host(ctx, 2, 3, {0, 2, 2}, {0, 1, 2}, {1, 1, 1}), Contains("3 entries"));
  CHECK_THROWS_WITH(csr_from_host(ctx, 2, 3, {0, 2}, {0, 1}, {1, 1}), Contains("rows + 1"));
  // A matrix assembled by hand is checked by the op on the CPU.
  CsrMatrix bad;
  bad.rows = 2, bad.cols = 3;
  bad.row_ptr = ctx.from_host(std::vector<int32_t>{0, 1, 2}, {3});
  bad.col_idx = ctx.from_host(std::vector<int32_t>{0, 7}, {2});
  bad.values = Var(ctx.from_host(std::vector<float>{1, 1}, {2}));
  Var b(ctx.zeros({3, 4}), true);
  CHECK_THROWS_WITH(spmm(ctx, "sp", bad, b), Contains("spmm (layer 'sp')") && Contains("column 7"));
  CHECK_THROWS_AS(csr_check(bad), DataError);
  CsrMatrix a = csr_from_host(ctx, 2, 3, {0, 1, 2}, {0, 2}, {1, 1});
  CHECK_NOTHROW(csr_check(a));
  CHECK_THROWS_WITH(spmm(ctx, "sp", a, Var(ctx.zeros({4, 4}))), Contains("needs 3 rows"));
  CsrMatrix wrong_vals = a;
  wrong_vals.values = Var(ctx.zeros({3}));
  CHECK_THROWS_WITH(spmm(ctx, "sp", wrong_vals, b), Contains("values"));
  CsrMatrix wrong_ptr = a;
  wrong_ptr.row_ptr = ctx.from_host(std::vector<int32_t>{0, 1}, {2});
  CHECK_THROWS_WITH(spmm(ctx, "sp", wrong_ptr, b), Contains("row_ptr"));
}

TEST_CASE("spmm: knobs, mode words and the manifest") {
  Policy p;
  CHECK(p.variant<SpmmFwd>("sp", op::spmm) == SpmmFwd::CusparseDefault);
  CHECK(p.variant<SpmmBwd>("sp", op::spmm) == SpmmBwd::Cusparse);
  const Policy det = Policy::parse({"*=deterministic"}), nondet = Policy::parse({"*=nondeterministic"});
  CHECK(det.variant<SpmmFwd>("sp", op::spmm) == SpmmFwd::Ditto);
  CHECK(det.variant<SpmmBwd>("sp", op::spmm) == SpmmBwd::Deterministic);
  CHECK(nondet.variant<SpmmFwd>("sp", op::spmm) == SpmmFwd::CusparseDefault);
  CHECK(nondet.variant<SpmmBwd>("sp", op::spmm) == SpmmBwd::Atomic);
  p.pin("sp", SpmmFwd::CusparseAlg3).pin("sp", SpmmBwd::Atomic);
  CHECK(p.variant<SpmmFwd>("sp", op::spmm) == SpmmFwd::CusparseAlg3);
  CHECK(p.variant<SpmmBwd>("sp", op::spmm) == SpmmBwd::Atomic);
  // A conv algorithm is no variant of spmm's fwd; a wildcard conv pin leaves spmm alone.
  CHECK_THROWS_AS(Policy::parse({"sp.fwd=winograd"}).variant<SpmmFwd>("sp", op::spmm), PolicyError);
  CHECK(Policy::parse({"*.fwd=winograd"}).variant<SpmmFwd>("sp", op::spmm) == SpmmFwd::CusparseDefault);
  CHECK(std::string(op_kind_name(op::spmm)) == "spmm");

  Context ctx(Device::cpu(), p);
  CsrMatrix a = csr_from_host(ctx, 2, 3, {0, 1, 2}, {0, 2}, {1, 1});
  spmm(ctx, "sp", a, Var(ctx.zeros({3, 4})));
  const ManifestEntry* f = ctx.manifest().find("sp", "fwd");
  const ManifestEntry* b = ctx.manifest().find("sp", "bwd");
  REQUIRE(f != nullptr);
  REQUIRE(b != nullptr);
  CHECK(f->op == "spmm");
  CHECK(f->variant == "cpu-reference");
  CHECK(f->requested == "pinned");
  CHECK(b->requested == "pinned");
  CHECK(ctx.tape().size() == 0);
}
