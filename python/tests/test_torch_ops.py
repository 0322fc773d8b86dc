"""ditto.torch on the CPU (ditto's double-accumulating references under PyTorch's tensors): the ops
agree with PyTorch's, record the variant that ran, refuse what they do not implement with an error
naming it, and patch() routes and restores. Needs PyTorch (skipped where it is not installed; the
GPU half, python/tests/gpu/test_torch_ops.py, runs beside PyTorch on the GPU host)."""
import atexit
import os
import pathlib
import shutil
import tempfile
import sys
import time

# torch.compile's caches are per process here: two test processes (the build tree's package and the
# installed one) may compile the same graphs at once, and must not read each other's half-written files.
if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="ditto-torch-compile-")
    atexit.register(shutil.rmtree, os.environ["TORCHINDUCTOR_CACHE_DIR"], True)

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import ditto  # noqa: E402
import ditto.torch as dt  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "bench"))
import torch_op_cases as tc  # noqa: E402

# roi_align's peer is torchvision's, which this interpreter may lack; its CPU check is by definition.
CPU_CASES = [c for c in tc.CASES if c.name != "roi_align"]


@pytest.mark.parametrize("case", CPU_CASES, ids=lambda c: c.name)
def test_agrees_with_pytorch_on_the_cpu(case):
    inputs = case.make("cpu", "test")
    for u, v in zip(tc.step(case, inputs, "ditto"), tc.step(case, inputs, "torch")):
        torch.testing.assert_close(u, v, **tc.tolerance(case, v))
    if case.op:
        assert {v["variant"] for v in dt.variants()[case.op]} == {"cpu-reference"}


def test_roi_align_matches_its_definition_at_one_bin():
    # One roi covering pixels 0..2 of a 1x1x4x4 ramp, one 1x1 bin, one sample at its centre (1.0, 1.0):
    # the value there; its gradient lands on that pixel alone.
    x = torch.arange(16, dtype=torch.float32).view(1, 1, 4, 4).requires_grad_()
    y = dt.roi_align(x, torch.tensor([[0.0, 0.0, 0.0, 2.0, 2.0]]), 1, 1.0, 1, aligned=False)
    assert float(y.detach()) == 5.0  # x[1, 1]
    (g,) = torch.autograd.grad(y.sum(), x)
    assert float(g[0, 0, 1, 1]) == 1.0 and float(g.sum()) == 1.0


def test_whole_scale_nearest_is_decided_by_the_libraries_rule():
    # The GPU forward's choice between ditto's block copy and PyTorch's kernel (kernels/upsample_ref.h).
    whole = ditto._ditto._torch_upsample_nearest_whole
    assert whole(4, 6, 8, 12) and whole(4, 6, 4, 18) and whole(3, 3, 3, 3)
    assert not whole(4, 6, 6, 12) and not whole(4, 6, 8, 9) and not whole(0, 6, 8, 12)


def test_what_ditto_does_not_implement_is_refused_by_name():
    x = torch.rand(1, 2, 4, 4)
    with pytest.raises(ValueError, match="bilinear with zeros"):
        dt.grid_sample(x, torch.zeros(1, 2, 2, 2), mode="nearest")
    with pytest.raises(ValueError, match="pass size="):
        dt.interpolate(x, scale_factor=1.3, mode="bilinear", align_corners=False)
    with pytest.raises(ValueError, match="float32"):
        dt.grid_sample(x.double(), torch.zeros(1, 2, 2, 2, dtype=torch.float64))
    with pytest.raises(ValueError, match="class 0 as the blank"):
        dt.ctc_loss(torch.zeros(3, 1, 4), torch.ones(1, 1, dtype=torch.long), [3], [1], blank=2)


def test_ditto_errors_keep_their_type_and_message():
    logits = torch.rand(1, 3, 2, 2)
    with pytest.raises(ditto.DataError, match="outside \\[0, 3\\)"):
        dt.cross_entropy(logits, torch.full((1, 2, 2), 5, dtype=torch.long))
    with pytest.raises(ditto.ShapeError, match="grid"):
        dt.grid_sample(torch.rand(2, 1, 4, 4), torch.zeros(3, 2, 2, 2))


def test_patch_routes_the_matching_calls_and_restores_them():
    original = F.grid_sample
    x, grid = torch.rand(1, 2, 5, 5), torch.rand(1, 3, 3, 2) * 2 - 1
    with dt.patch():
        assert F.grid_sample is not original
        dt._latest.pop("grid_sample", None)
        y = F.grid_sample(x, grid, align_corners=False)
        assert "grid_sample" in dt.variants()
        torch.testing.assert_close(y, original(x, grid, align_corners=False))
        # A call ditto does not implement goes to PyTorch's own function.
        F.grid_sample(x, grid, mode="nearest", align_corners=False)
    assert F.grid_sample is original


def test_patched_functions_do_not_route_back_into_themselves():
    # ditto's ops call PyTorch's own kernels where they have no reduction (embedding's gather): through
    # the ATen ops, which patch() leaves alone, so a patched call cannot recurse.
    w = torch.rand(10, 4, requires_grad=True)
    idx = torch.tensor([[1, 2, 1], [9, 1, 0]])
    with dt.patch():
        e = F.embedding(idx, w)
        b = F.embedding_bag(idx, w, mode="sum")
        (g,) = torch.autograd.grad(e.sum() + b.sum(), w)
    assert dt.variants()["embedding"] and dt.variants()["embedding_bag"]
    assert torch.equal(g[1], torch.full((4,), 6.0)) and not g[3].any()  # row 1: three lookups in each


@pytest.mark.parametrize("name", ["grid_sample", "interpolate-bilinear", "cross_entropy-2d", "nll_loss-2d", "ctc_loss",
                                  "embedding_bag-mean"])
def test_the_traced_custom_op_gives_the_eager_path_bits(name):
    # Eager calls run the op's implementation through an autograd.Function; torch.compile traces the
    # custom op. Both must be the same computation.
    case = {c.name: c for c in tc.CASES}[name]
    inputs = case.make("cpu", "test")
    eager = tc.step(case, inputs, "ditto")
    compiled = torch.compile(lambda i: tc.step(case, i, "ditto"), backend="aot_eager")
    traced = compiled(inputs)
    for u, v in zip(eager, traced):
        assert torch.equal(u, v)


def test_the_host_profile_names_where_a_call_spends_its_host_time(tmp_path):
    # bench/torch_ops.py --profile's host view, on the CPU: wall time per call and the events with the
    # most self time, PyTorch's conversions and ditto's call among them; written into the table.
    import torch_ops
    case = next(c for c in tc.CASES if c.name == "nll_loss-2d")
    inputs = case.make("cpu", "test")
    host = torch_ops.host_profile(lambda: tc.step(case, inputs, "ditto"), steps=3)
    assert host["wall_us"] > 0
    assert 0 < len(host["events"]) <= 6
    assert all(e["self_us"] > 0 and e["calls"] > 0 for e in host["events"])
    assert host["events"] == sorted(host["events"], key=lambda e: -e["self_us"])
    meta = {"gpu": "cpu", "torch": torch.__version__, "ditto_commit": "test", "date": "today", "runs": 1}
    torch_ops.write(tmp_path / "t", meta, [{"op": case.name, "mode": "ditto-deterministic", "shape": "s", "host": host}])
    md = (tmp_path / "t" / "torch_ops.md").read_text()
    assert "## Host side per call" in md and f"| {case.name} | ditto-deterministic | {host['wall_us']:.0f} |" in md


def test_the_table_gives_both_timings_and_their_ratios(tmp_path):
    # Each call alone and calls back to back, each with its ratio to PyTorch's default; a row without
    # a timing (a mode PyTorch refuses) shows dashes, not zeros.
    import torch_ops
    rows = [{"op": "nll_loss-2d", "mode": "pytorch-default", "shape": "s", "us": 200.0, "vs_pytorch_default": 1.0,
             "us_back_to_back": 100.0, "back_to_back_vs_pytorch_default": 1.0, "distinct": 2, "runs": 20},
            {"op": "nll_loss-2d", "mode": "pytorch-deterministic", "shape": "s", "error": "raises"},
            {"op": "nll_loss-2d", "mode": "ditto-deterministic", "shape": "s", "us": 500.0, "vs_pytorch_default": 2.5,
             "us_back_to_back": 110.0, "back_to_back_vs_pytorch_default": 1.1, "distinct": 1, "runs": 20}]
    meta = {"gpu": "g", "torch": torch.__version__, "ditto_commit": "test", "date": "today", "runs": 20}
    torch_ops.write(tmp_path / "t", meta, rows)
    md = (tmp_path / "t" / "torch_ops.md").read_text()
    assert "| nll_loss-2d | s | ditto-deterministic | 500 | 2.50 | 110 | 1.10 | — | 1/20 |" in md
    assert "| nll_loss-2d | s | pytorch-deterministic | — | — | — | — | — | — |" in md


def test_scatter_and_index_add_take_int64_indices_without_wrapping():
    """In-range int64 indices give the int32 result; one past int32 (2**32 + 3 is not 3) and a scatter
    coordinate past its row's width (not the next row's first element) are errors naming the value."""
    src = torch.arange(12, dtype=torch.float32).reshape(4, 3)
    good = torch.tensor([0, 1, 3, 3])
    want = torch.zeros(5, 3).index_add(0, good, src)
    assert torch.equal(dt.index_add(torch.zeros(5, 3), 0, good, src), want)
    assert torch.equal(dt.index_add(torch.zeros(5, 3), 0, good.int(), src), want)
    with pytest.raises(ditto.DataError, match="element 2 is 4294967299, outside int32"):
        dt.index_add(torch.zeros(5, 3), 0, torch.tensor([0, 1, 2**32 + 3, 3]), src)
    with pytest.raises(ditto.DataError, match="element 2 is -8589934592, outside int32"):
        dt.index_add(torch.zeros(5, 3), 0, torch.tensor([0, 1, -2**33, 3]), src)
    with pytest.raises(ditto.DataError, match="index 7"):  # an int32 index: scatter_add's own check
        dt.index_add(torch.zeros(5, 3), 0, torch.tensor([0, 1, 7, 3], dtype=torch.int32), src)

    index = torch.tensor([[0, 2, 1], [2, 2, 0]])
    ones = torch.ones(2, 3)
    assert torch.equal(dt.scatter_add(torch.zeros(2, 3), 1, index, ones),
                       torch.zeros(2, 3).scatter_add(1, index, ones))
    with pytest.raises(ditto.DataError, match="is 3, outside"):
        dt.scatter_add(torch.zeros(2, 3), 1, torch.tensor([[0, 1, 3], [2, 2, 2]]), ones)
    with pytest.raises(ditto.DataError, match="is 4294967296, outside"):
        dt.scatter_add(torch.zeros(2, 3), 1, torch.tensor([[0, 1, 2**32], [2, 2, 2]]), ones)
    # A strided input: the destinations follow the row-major result, not the input's strides.
    base = torch.arange(6, dtype=torch.float32).reshape(2, 3).t()  # (3, 2), not contiguous
    idx = torch.tensor([[2, 0], [1, 1], [0, 2]])
    assert torch.equal(dt.scatter_add(base, 0, idx, torch.ones(3, 2)), base.scatter_add(0, idx, torch.ones(3, 2)))


def test_int64_labels_and_indices_cross_as_they_are_and_are_never_wrapped():
    """int64 labels give the int32 result bit for bit (ditto narrows their words in its call); a value
    past int32 is an error naming it, not a wrapped class or row (2**32 + 1 is not 1)."""
    torch.manual_seed(3)
    logits = torch.randn(2, 4, 3, 3, requires_grad=True)
    labels = torch.randint(0, 4, (2, 3, 3))
    labels[0, 0, 0] = -100  # ignored
    got = {}
    for kind in (torch.int64, torch.int32):
        logits.grad = None
        loss = dt.cross_entropy(logits, labels.to(kind))
        loss.backward()
        got[kind] = (loss.detach().clone(), logits.grad.clone())
    assert torch.equal(got[torch.int64][0], got[torch.int32][0])
    assert torch.equal(got[torch.int64][1], got[torch.int32][1])
    bad = labels.clone()
    bad[1, 2, 2] = 2**32 + 1
    with pytest.raises(ditto.DataError, match="element 17 is 4294967297, outside int32"):
        dt.nll_loss(logits.log_softmax(1), bad)
    table = torch.randn(6, 3, requires_grad=True)
    idx = torch.tensor([[0, 5], [5, 2]])
    dt.embedding(idx, table).sum().backward()
    g64 = table.grad.clone()
    table.grad = None
    dt.embedding(idx.int(), table).sum().backward()
    assert torch.equal(g64, table.grad)


def test_scatter_add_gradient_is_the_gather_of_the_output_gradient():
    src = torch.rand(4, 5, dtype=torch.float32, requires_grad=True)
    index = torch.tensor([[0, 1, 2, 0, 1], [2, 2, 2, 2, 2], [1, 0, 1, 0, 1], [0, 0, 0, 0, 0]])
    g = torch.rand(3, 5)
    (dt.scatter_add(torch.zeros(3, 5), 0, index, src) * g).sum().backward()
    assert torch.equal(src.grad, g.gather(0, index))


def _both_paths(op, args, wrt):
    """An op's outputs and the gradients of their float sum through its C++ operator and through its
    Python autograd function (the path without the operator)."""
    got = []
    for run in (op.native, op._function.apply):
        for t in wrt:
            t.grad = None
        out = run(*args)
        out = out if isinstance(out, tuple) else (out,)
        sum(o.sum() * (i + 1) for i, o in enumerate(out) if o.is_floating_point() and o.requires_grad).backward()
        got.append([o.detach().clone() for o in out] + [t.grad.clone() for t in wrt])
    return got


@pytest.mark.skipif(not dt.native_ops(), reason="ditto was built without PyTorch's C++ operators")
@pytest.mark.parametrize("labels", [torch.int64, torch.int32])
def test_the_cpp_operators_give_the_python_paths_bits(labels):
    torch.manual_seed(5)
    assert dt.native_ops() == ["ditto::conv2d", "ditto::embedding", "ditto::embedding_bag", "ditto::grid_sample",
                               "ditto::index_add", "ditto::pixel_cross_entropy", "ditto::pixel_nll", "ditto::scatter_add"]
    logits = torch.randn(2, 5, 4, 3, requires_grad=True)
    target = torch.randint(0, 5, (2, 4, 3)).to(labels)
    target[1, 0, 2] = 3  # an ignored pixel
    cases = [(dt._pixel_nll, (logits, target, 3, True), [logits]),
             (dt._pixel_xent, (logits, target, 3, True), [logits])]
    base, source = torch.randn(4, 6, 5, requires_grad=True), torch.randn(4, 9, 5, requires_grad=True)
    index = torch.randint(0, 6, (9,)).to(labels)
    cases += [(dt._index_add, (base, 1, index, source, 2.5, True), [base, source]),
              (dt._index_add, (base.detach(), 1, index, source, 1.0, False), [source])]
    grid, src = torch.randn(4, 6, 5, requires_grad=True), torch.randn(4, 9, 5, requires_grad=True)
    along = torch.randint(0, 6, (4, 9, 5)).to(labels)
    cases += [(dt._scatter_add, (grid, 1, along, src, True), [grid, src]),
              (dt._scatter_add, (grid.detach(), 1, along, src, False), [src])]
    x, w = torch.randn(2, 3, 6, 5, requires_grad=True), torch.randn(4, 3, 3, 3, requires_grad=True)
    cases += [(dt._conv2d, (x, w, [1, 1], [1, 1], [1, 1], 1, True), [x, w]),
              (dt._conv2d, (x, w, [2, 1], [0, 1], [1, 1], 1, True), [x, w]),
              (dt._conv2d, (x.detach(), w, [1, 1], [1, 1], [1, 1], 1, False), [w])]
    image, where = torch.randn(2, 3, 5, 4, requires_grad=True), (torch.rand(2, 6, 7, 2) * 2.2 - 1.1).requires_grad_()
    cases += [(dt._grid_sample, (image, where, False, True), [image, where]),
              (dt._grid_sample, (image, where, True, True), [image, where]),
              (dt._grid_sample, (image.detach(), where, False, False), [where])]
    table = torch.randn(7, 4, requires_grad=True)
    rows = torch.randint(0, 7, (3, 5)).to(labels)
    bags, starts = torch.randint(0, 7, (9,)).to(labels), torch.tensor([0, 2, 2, 6]).to(labels)
    cases += [(dt._embedding, (table, rows, -1, True), [table]), (dt._embedding, (table, rows, 2, True), [table]),
              (dt._embedding, (table, rows, -1, False), [table]),
              (dt._embedding_bag, (table, bags, starts, "mean", True), [table]),
              (dt._embedding_bag, (table, bags, starts, "sum", False), [table]),
              (dt._embedding_bag, (table, bags.view(3, 3), None, "mean", True), [table])]
    for op, args, wrt in cases:
        native, python = _both_paths(op, args, wrt)
        assert len(native) == len(python)
        for u, v in zip(native, python):
            assert u.dtype == v.dtype and u.shape == v.shape and torch.equal(u, v), op.name


@pytest.mark.skipif(not dt.native_ops(), reason="ditto was built without PyTorch's C++ operators")
def test_the_cpp_operators_raise_dittos_errors_and_record_their_variants():
    with pytest.raises(ditto.DataError, match="outside \\[0, 3\\)"):
        dt.nll_loss(torch.rand(1, 3, 2, 2), torch.full((1, 2, 2), 4))
    with pytest.raises(ValueError, match="input is torch.float64; ditto's ops here take float32"):
        dt.nll_loss(torch.rand(1, 3, 2, 2, dtype=torch.float64), torch.zeros(1, 2, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="source is torch.float64"):
        dt.index_add(torch.zeros(3, 2), 0, torch.tensor([0, 2]), torch.rand(2, 2, dtype=torch.float64))
    dt._latest.pop("scatter_add", None)
    dt.index_add(torch.zeros(3, 2), 0, torch.tensor([0, 2]), torch.rand(2, 2), deterministic=False)
    assert dt.variants()["scatter_add"] == [{"knob": "scatter", "variant": "cpu-reference", "guarantee": "run_to_run"}]
    # The two paths stamp their records by one clock: a later call on the Python path (scatter_add's)
    # is the newer record.
    native = {row.split("\t")[0]: int(row.split("\t")[1]) for row in dt._native.latest_variants()}
    saved, dt._scatter_add.native = dt._scatter_add.native, None
    try:
        dt.scatter_add(torch.zeros(2, 3), 1, torch.tensor([[0, 2, 1]]), torch.ones(1, 3))
    finally:
        dt._scatter_add.native = saved
    assert native["scatter_add"] < dt._latest["scatter_add"][0] < time.monotonic_ns()
    # scatter_add's operator raises ditto's errors as the Python path does.
    with pytest.raises(ditto.DataError, match="is 3, outside \\[0, 3\\)"):
        dt.scatter_add(torch.zeros(2, 3), 1, torch.tensor([[0, 3, 1]]), torch.ones(1, 3))


@pytest.mark.skipif(not dt.native_ops(), reason="ditto was built without PyTorch's C++ operators")
def test_the_cpp_operators_load_only_under_the_pytorch_they_were_built_for(monkeypatch):
    monkeypatch.setattr(torch, "__version__", "0.0.0+elsewhere")
    with pytest.warns(RuntimeWarning, match="built for PyTorch .*, this is 0.0.0\\+elsewhere"):
        assert dt._load_native() is None
    monkeypatch.setenv("DITTO_TORCH_NATIVE", "0")
    assert dt._load_native() is None
