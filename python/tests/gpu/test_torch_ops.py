"""ditto.torch on a CUDA device beside PyTorch's own ops (ctest label gpu, gpu_python): each op agrees
with PyTorch's to float32 accuracy (bench/torch_op_cases.py states the tolerance), repeats bit for
bit over 20 calls, says which variant ran, runs under PyTorch's deterministic mode where PyTorch's own
op raises, orders its work on the caller's (non-default) stream, traces under torch.compile, and its
gradients match directional derivatives."""
import hashlib
import atexit
import os
import pathlib
import shutil
import tempfile
import sys

# torch.compile's caches are per process here: two test processes (the build tree's package and the
# installed one) may compile the same graphs at once, and must not read each other's half-written files.
if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="ditto-torch-compile-")
    atexit.register(shutil.rmtree, os.environ["TORCHINDUCTOR_CACHE_DIR"], True)

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import pytest
import torch
import torch.nn.functional as F

import ditto.torch as dt

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "bench"))
import torch_op_cases as tc  # noqa: E402

CASES = {c.name: c for c in tc.CASES}


def digest(tensors):
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


@pytest.mark.parametrize("name", list(CASES))
def test_agrees_with_pytorch(name):
    case = CASES[name]
    inputs = case.make("cuda", "test")
    ours, theirs = tc.step(case, inputs, "ditto"), tc.step(case, inputs, "torch")
    assert len(ours) == len(theirs)
    for u, v in zip(ours, theirs):
        torch.testing.assert_close(u, v, **tc.tolerance(case, v))


@pytest.mark.parametrize("name", list(CASES))
def test_deterministic_calls_repeat_bit_for_bit(name):
    case = CASES[name]
    inputs = case.make("cuda", "test")
    assert len({digest(tc.step(case, inputs, "ditto")) for _ in range(20)}) == 1


@pytest.mark.parametrize("name", [n for n, c in CASES.items() if c.op])
def test_each_call_records_its_variants_and_their_guarantees(name):
    case = CASES[name]
    inputs = case.make("cuda", "test")
    tc.step(case, inputs, "ditto", deterministic=True)
    ran = dt.variants()[case.op]
    assert ran and all(v["guarantee"] in ("run_to_run", "gpu_to_gpu") for v in ran), ran
    tc.step(case, inputs, "ditto", deterministic=False)
    assert dt.variants()[case.op], "the nondeterministic call records what it ran too"


@pytest.mark.parametrize("out", [(128, 192), (96, 72), (64, 64)])
def test_nearest_forward_copies_pytorchs_bits_at_whole_and_other_scales(out):
    # A copy both ways: ditto's block-copy kernel where the scales are whole, PyTorch's elsewhere.
    x = torch.rand(3, 5, 64, 48, device="cuda", generator=torch.Generator("cuda").manual_seed(7))
    ours = dt.interpolate(x, size=out, mode="nearest")
    assert torch.equal(ours, F.interpolate(x, size=out, mode="nearest"))


def test_the_frameworks_choice_is_named_not_guaranteed():
    case = CASES["grid_sample"]
    tc.step(case, case.make("cuda", "test"), "ditto", deterministic=False)
    assert dt.variants()["grid_sample"] == [{"knob": "bwd", "variant": "atomic", "guarantee": "not_guaranteed"}]


def test_runs_under_pytorch_deterministic_mode_where_pytorch_raises():
    gs, seg = CASES["grid_sample"], CASES["nll_loss-2d"]
    gi, si = gs.make("cuda", "test"), seg.make("cuda", "test")
    torch.use_deterministic_algorithms(True)
    try:
        with pytest.raises(RuntimeError, match="deterministic"):
            tc.step(gs, gi, "torch")
        with pytest.raises(RuntimeError, match="deterministic"):
            tc.step(seg, si, "torch")
        a = tc.step(gs, gi, "ditto")
        b = tc.step(seg, si, "ditto")
        with dt.patch():  # the same calls through torch.nn.functional, routed to ditto
            pa = tc.step(gs, gi, "torch")
            pb = tc.step(seg, si, "torch")
    finally:
        torch.use_deterministic_algorithms(False)
    assert digest(a) == digest(pa) and digest(b) == digest(pb)
    assert F.grid_sample.__module__ == "torch.nn.functional", "leaving the with block restores PyTorch's function"


# grid_sample runs through the Python path, the others through ditto's C++ operators (where built).
@pytest.mark.parametrize("name", ["grid_sample", "nll_loss-2d", "cross_entropy-2d", "index_add"])
def test_work_is_ordered_on_the_callers_non_default_stream(name):
    case = CASES[name]
    inputs = case.make("cuda", "test")
    want = digest(tc.step(case, inputs, "ditto"))
    # The input is written on a side stream at the end of a long queue; an op that ran on another
    # stream would read the 7s it held before.
    key = case.grads[0]
    x = torch.full_like(inputs[key], 7.0)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        busy = torch.rand(2048, 2048, device="cuda")
        for _ in range(30):
            busy = torch.tanh(busy @ busy)
        x.copy_(inputs[key].detach())
        got = tc.step(case, dict(inputs, **{key: x.requires_grad_()}), "ditto")
        done = torch.cuda.Event()
        done.record()
    done.synchronize()
    assert digest(got) == want


@pytest.mark.skipif(not dt.native_ops(), reason="ditto was built without PyTorch's C++ operators")
@pytest.mark.parametrize("name", ["nll_loss-2d", "cross_entropy-2d", "index_add", "scatter_add", "conv2d", "grid_sample",
                                  "grid_sample-ac", "embedding", "embedding-hot", "embedding_bag-mean"])
def test_the_cpp_operators_give_the_python_paths_bits(name):
    case = CASES[name]
    inputs = case.make("cuda", "test")
    native = digest(tc.step(case, inputs, "ditto"))
    saved = [(op, op.native) for op in dt._OPS]
    try:
        for op, _ in saved:
            op.native = None  # every op on its Python path
        python = digest(tc.step(case, inputs, "ditto"))
    finally:
        for op, fn in saved:
            op.native = fn
    assert native == python


def test_traces_under_torch_compile():
    case = CASES["grid_sample"]
    inputs = case.make("cuda", "test")

    def loss(x, grid):
        return (dt.grid_sample(x, grid) * 1.5).sum()

    compiled = torch.compile(loss, backend="aot_eager", fullgraph=True)
    x, grid = inputs["x"], inputs["grid"]
    eager = [loss(x, grid)] + list(torch.autograd.grad(loss(x, grid), (x, grid)))
    traced = [compiled(x, grid)] + list(torch.autograd.grad(compiled(x, grid), (x, grid)))
    assert digest(eager) == digest(traced)


@pytest.mark.parametrize("name", [n for n, c in CASES.items() if c.linear or n in ("ctc_loss", "cross_entropy-2d")])
def test_gradients_match_directional_derivatives(name):
    """<grad, v> against the change of <output, u> along v: exact for the ops linear in the input
    (up to rounding), a central difference for the smooth losses."""
    case = CASES[name]
    inputs = case.make("cuda", "test")
    out, *grads = tc.step(case, inputs, "ditto")
    u = tc.upstream(out)
    for name_in, g in zip(case.grads, grads):
        base = inputs[name_in].detach()
        v = tc._rand(base.shape, 5, "cuda") * (base.abs().max() * 0.01 + 1e-3)

        def f(t):
            with torch.no_grad():
                return float((case.ditto(dict(inputs, **{name_in: t}), True).double() * u.double()).sum())

        predicted = float((g.double() * v.double()).sum())
        if case.linear:
            change = f(base + v) - f(base)
        else:
            change = (f(base + v) - f(base - v)) / 2
        assert change == pytest.approx(predicted, rel=2e-2, abs=1e-4 * (abs(f(base)) + 1))


@pytest.mark.parametrize("deterministic", [True, False])
def test_indices_out_of_range_poison_the_result_instead_of_wrapping(deterministic):
    """An int64 index past int32 saturates rather than wrapping onto a valid row (2**32 + 3 is not 3), and a
    scatter coordinate past its row's width does not spill into the next row: both make the GPU output NaN,
    as any out-of-range index does there. In-range int64 indices give the int32 result bit for bit."""
    src = torch.ones(4, 3, device="cuda")
    good = torch.tensor([0, 1, 3, 3], device="cuda")
    want = dt.index_add(torch.zeros(5, 3, device="cuda"), 0, good.int(), src, deterministic=deterministic)
    assert digest([dt.index_add(torch.zeros(5, 3, device="cuda"), 0, good, src, deterministic=deterministic)]) \
        == digest([want])
    for bad in (2**32 + 3, -2**32 - 2, 5, -1):
        index = torch.tensor([0, 1, bad, 3], device="cuda")
        out = dt.index_add(torch.zeros(5, 3, device="cuda"), 0, index, src, deterministic=deterministic)
        assert out.isnan().all(), bad
    grid = torch.zeros(2, 3, device="cuda")
    index = torch.tensor([[0, 1, 3], [2, 2, 2]], device="cuda")  # 3: one past the row's last column
    out = dt.scatter_add(grid, 1, index, torch.ones(2, 3, device="cuda"), deterministic=deterministic)
    assert out.isnan().all()
    ok = dt.scatter_add(grid.t(), 0, index.t().clamp(max=1), torch.ones(3, 2, device="cuda"),
                        deterministic=deterministic)
    assert torch.equal(ok, torch.zeros(3, 2, device="cuda").scatter_add(0, index.t().clamp(max=1),
                                                                         torch.ones(3, 2, device="cuda")))


def test_scatter_add_runs_the_privatized_scatter_where_it_fits_and_the_sort_elsewhere():
    g = torch.Generator(device="cuda").manual_seed(8)
    src = torch.rand(5000, 64, device="cuda", generator=g)
    index = torch.randint(0, 300, (5000, 64), device="cuda", generator=g)
    base = torch.rand(300, 64, device="cuda", generator=g)
    got = {digest([dt.scatter_add(base, 0, index, src)]) for _ in range(5)}
    assert len(got) == 1
    assert dt.variants()["scatter_add"] == [{"knob": "scatter", "variant": "privatized", "guarantee": "gpu_to_gpu"}]
    torch.testing.assert_close(dt.scatter_add(base, 0, index, src), base.scatter_add(0, index, src))
    # The backward (ditto's gather along dim, from shared memory) is torch.gather's copy, bit for bit;
    # int32 and int64 indices give the same bits.
    leaf = src.clone().requires_grad_()
    dy = torch.rand(300, 64, device="cuda", generator=g)
    dt.scatter_add(base, 0, index, leaf).backward(dy)
    assert torch.equal(leaf.grad, torch.gather(dy, 0, index))
    assert digest([dt.scatter_add(base, 0, index.int(), src)]) == digest([dt.scatter_add(base, 0, index, src)])
    if dt._scatter_add.native is not None:  # the Python path gives the C++ operator's bits
        saved, dt._scatter_add.native = dt._scatter_add.native, None
        try:
            python = digest([dt.scatter_add(base, 0, index, src)])
        finally:
            dt._scatter_add.native = saved
        assert python == digest([dt.scatter_add(base, 0, index, src)])
    # Out of range where the privatized scatter runs: past the rows, and past int32 (2^32 + 5 is not 5):
    # the output NaN, and the gradient NaN at that position only.
    for bad in (300, 2**32 + 5):
        broken = index.clone()
        broken[7, 3] = bad
        leaf = src.clone().requires_grad_()
        out = dt.scatter_add(base, 0, broken, leaf)
        assert out.isnan().all(), bad
        out.backward(dy)
        assert leaf.grad[7, 3].isnan() and leaf.grad.isnan().sum() == 1, bad
    dt.scatter_add(base[:, :6], 0, index[:, :6], src[:, :6])  # 6 inner columns: not a multiple of 8
    assert dt.variants()["scatter_add"][0]["variant"] == "sorted"


def test_index_add_runs_the_privatized_scatter_for_rows_of_8_floats_and_the_sort_elsewhere():
    g = torch.Generator(device="cuda").manual_seed(9)
    base = torch.rand(300, 64, device="cuda", generator=g)
    src = torch.rand(5000, 64, device="cuda", generator=g, requires_grad=True)
    index = torch.randint(0, 300, (5000,), device="cuda", generator=g)
    got = {digest([dt.index_add(base, 0, index, src)]) for _ in range(5)}
    assert len(got) == 1
    assert dt.variants()["scatter_add"] == [{"knob": "scatter", "variant": "privatized", "guarantee": "gpu_to_gpu"}]
    torch.testing.assert_close(dt.index_add(base, 0, index, src), base.index_add(0, index, src))
    if dt._index_add.native is not None:  # the Python path gives the C++ operator's bits
        saved, dt._index_add.native = dt._index_add.native, None
        try:
            python = digest([dt.index_add(base, 0, index, src)])
            assert dt.variants()["scatter_add"][0]["variant"] == "privatized"
        finally:
            dt._index_add.native = saved
        assert python == digest([dt.index_add(base, 0, index, src)])
    bad = index.clone()
    bad[11] = 300
    assert dt.index_add(base, 0, bad, src).isnan().all()
    dt.index_add(base[:, :6], 0, index, src[:, :6])  # rows of 6 floats: not a multiple of 8
    assert dt.variants()["scatter_add"][0]["variant"] == "sorted"
