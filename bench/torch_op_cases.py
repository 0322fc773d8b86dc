"""The ops of ditto.torch beside PyTorch's own, as cases that bench/torch_ops.py times and
python/tests/gpu/test_torch_ops.py checks: each case makes its inputs (seeded) and runs one forward
and backward through ditto (deterministic or not) or through PyTorch.

Sizes: scale "bench" is bench/op_noise's (its sampler, CTC, scatter, upsampling, pixel-loss and sparse
rows); scale "test" is small enough for a test to run every case twenty times.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable, Dict, List, Optional

import torch
import torch.nn.functional as F

import ditto.torch as dt


@dataclasses.dataclass
class Case:
    name: str
    make: Callable[[str, str], Dict[str, torch.Tensor]]  # (device, scale) -> inputs
    grads: List[str]                                      # inputs whose gradients the case returns
    ditto: Callable[..., torch.Tensor]                    # (inputs, deterministic) -> output
    torch: Callable[..., torch.Tensor]                    # (inputs) -> output
    shape: Callable[[Dict[str, torch.Tensor]], str]       # what the sizes are, for tables
    linear: bool = False                                  # output linear in the gradient inputs

    @property
    def op(self) -> str:
        """The key of ditto.torch.variants() its ditto call records under."""
        base = self.name.split("-")[0]
        return {"interpolate": "upsample", "cross_entropy": "pixel_xent", "index_add": "scatter_add",
                "sparse_mm": "spmm", "nll_loss": "pixel_xent"}.get(base, base)


def _gen(seed: int, device: str) -> torch.Generator:
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    return g


def _rand(shape, seed, device, lo=-1.0, hi=1.0):
    return torch.rand(shape, generator=_gen(seed, device), device=device) * (hi - lo) + lo


def _leaf(t):
    return t.detach().requires_grad_()


def _theta(n, seed, device):
    g = _gen(seed, "cpu")
    a = (torch.rand(n, generator=g) - 0.5) * 1.04
    s = 0.8 + 0.4 * torch.rand(n, generator=g)
    sh = (torch.rand(n, 2, generator=g) - 0.5) * 0.4
    theta = torch.stack([torch.stack([s * a.cos(), -s * a.sin(), sh[:, 0]], 1),
                         torch.stack([s * a.sin(), s * a.cos(), sh[:, 1]], 1)], 1)
    return theta.to(device)


def _sizes(scale, bench, test):
    return bench if scale == "bench" else test


def grid_sample_case(align_corners: bool) -> Case:
    def make(device, scale):
        n, c, hw = _sizes(scale, (128, 64, 64), (4, 3, 12))
        grid = F.affine_grid(_theta(n, 11, device), (n, c, hw, hw), align_corners=align_corners)
        return {"x": _leaf(_rand((n, c, hw, hw), 12, device)), "grid": _leaf(grid)}
    return Case(f"grid_sample{'-ac' if align_corners else ''}", make, ["x", "grid"],
                lambda i, d: dt.grid_sample(i["x"], i["grid"], align_corners=align_corners, deterministic=d),
                lambda i: F.grid_sample(i["x"], i["grid"], align_corners=align_corners),
                lambda i: f"x{list(i['x'].shape)} grid {i['grid'].shape[1]}x{i['grid'].shape[2]}")


def affine_grid_case() -> Case:
    def make(device, scale):
        n, hw = _sizes(scale, (128, 64), (4, 9))
        return {"theta": _leaf(_theta(n, 14, device)), "size": torch.tensor([n, 1, hw, hw])}
    size = lambda i: [int(v) for v in i["size"]]
    return Case("affine_grid", make, ["theta"],
                lambda i, d: dt.affine_grid(i["theta"], size(i), align_corners=False, deterministic=d),
                lambda i: F.affine_grid(i["theta"], size(i), align_corners=False),
                lambda i: f"theta[{i['theta'].shape[0]}, 2, 3] -> {size(i)[2]}x{size(i)[3]}", linear=True)


def interpolate_case(mode: str, align_corners: Optional[bool], out: int) -> Case:
    def make(device, scale):
        n, c, hw = _sizes(scale, (128, 64, 64), (2, 3, 8))
        return {"x": _leaf(_rand((n, c, hw, hw), 15, device))}
    size = lambda i: (i["x"].shape[2] * out // 64,) * 2  # out at a 64-pixel side: 128 is x2, 96 x1.5
    tag = f"interpolate-{mode}{'-ac' if align_corners else ''}{'' if out == 128 else '-x1.5'}"
    return Case(tag, make, ["x"],
                lambda i, d: dt.interpolate(i["x"], size=size(i), mode=mode, align_corners=align_corners,
                                            deterministic=d),
                lambda i: F.interpolate(i["x"], size=size(i), mode=mode, align_corners=align_corners),
                lambda i: f"x{list(i['x'].shape)} to {size(i)[0]}x{size(i)[1]}", linear=True)


def roi_align_case() -> Case:
    def make(device, scale):
        n, c, hw, k = _sizes(scale, (8, 256, 64, 512), (2, 3, 16, 12))
        side = hw * 16
        g = _gen(21, "cpu")
        objects = torch.rand(n * 4, 4, generator=g) * torch.tensor([0.6, 0.6, 0.3, 0.3]) * side + \
            torch.tensor([0.2, 0.2, 0.12, 0.12]) * side
        pick = torch.randint(0, n * 4, (k,), generator=g)
        o = objects[pick] + (torch.rand(k, 4, generator=g) - 0.5) * side * 0.08
        rois = torch.stack([(pick // 4).float(), o[:, 0] - o[:, 2] / 2, o[:, 1] - o[:, 3] / 2,
                            o[:, 0] + o[:, 2] / 2, o[:, 1] + o[:, 3] / 2], 1)
        return {"x": _leaf(_rand((n, c, hw, hw), 22, device)), "rois": rois.to(device)}

    def theirs(i):
        import torchvision.ops
        return torchvision.ops.roi_align(i["x"], i["rois"], 7, 1.0 / 16, -1, True)
    return Case("roi_align", make, ["x"],
                lambda i, d: dt.roi_align(i["x"], i["rois"], 7, 1.0 / 16, -1, True, deterministic=d), theirs,
                lambda i: f"x{list(i['x'].shape)} {i['rois'].shape[0]} rois 7x7", linear=True)


def ctc_case() -> Case:
    def make(device, scale):
        t, n, a, s = _sizes(scale, (100, 64, 11, 10), (30, 4, 6, 5))
        g = _gen(31, "cpu")
        lp = F.log_softmax(_rand((t, n, a), 32, device, -3, 3), 2)
        return {"log_probs": _leaf(lp), "targets": torch.randint(1, a, (n, s), generator=g).to(device),
                "input_lengths": torch.full((n,), t, dtype=torch.long, device=device),
                "target_lengths": torch.full((n,), s, dtype=torch.long, device=device)}
    args = lambda i: (i["log_probs"], i["targets"], i["input_lengths"], i["target_lengths"])
    return Case("ctc_loss", make, ["log_probs"],
                lambda i, d: dt.ctc_loss(*args(i), reduction="sum", deterministic=d),
                lambda i: F.ctc_loss(*args(i), reduction="sum"),
                lambda i: "T{} N{} C{} S{}".format(*i["log_probs"].shape, i["targets"].shape[1]))


def _seg_inputs(device, scale, log_softmax):
    n, c, hw = _sizes(scale, (16, 21, 256), (2, 5, 9))
    g = _gen(41, "cpu")
    labels = torch.randint(0, c, (n, hw, hw), generator=g)
    labels[torch.rand(n, hw, hw, generator=g) < 0.1] = 255
    logits = _rand((n, c, hw, hw), 42, device, -3, 3)
    return {"logits": _leaf(F.log_softmax(logits, 1) if log_softmax else logits), "labels": labels.to(device)}


def cross_entropy_case() -> Case:
    return Case("cross_entropy-2d", lambda dev, sc: _seg_inputs(dev, sc, False), ["logits"],
                lambda i, d: dt.cross_entropy(i["logits"], i["labels"], ignore_index=255, deterministic=d),
                lambda i: F.cross_entropy(i["logits"], i["labels"], ignore_index=255),
                lambda i: f"logits{list(i['logits'].shape)}")


def nll_case() -> Case:
    return Case("nll_loss-2d", lambda dev, sc: _seg_inputs(dev, sc, True), ["logits"],
                lambda i, d: dt.nll_loss(i["logits"], i["labels"], ignore_index=255, deterministic=d),
                lambda i: F.nll_loss(i["logits"], i["labels"], ignore_index=255),
                lambda i: f"log_probs{list(i['logits'].shape)}", linear=True)


def embedding_case(hot: bool) -> Case:
    def make(device, scale):
        rows, d, bags, per = _sizes(scale, (1000000, 64, 4096, 20), (50, 8, 6, 5))
        g = _gen(51, "cpu")
        idx = torch.randint(0, min(1000, rows // 5) if hot else rows, (bags, per), generator=g)
        return {"weight": _leaf(_rand((rows, d), 52, device)), "index": idx.to(device)}
    return Case(f"embedding{'-hot' if hot else ''}", make, ["weight"],
                lambda i, d: dt.embedding(i["index"], i["weight"], deterministic=d),
                lambda i: F.embedding(i["index"], i["weight"]),
                lambda i: f"table{list(i['weight'].shape)} idx{list(i['index'].shape)}", linear=True)


def embedding_bag_case() -> Case:
    def make(device, scale):
        rows, d, bags, per = _sizes(scale, (1000000, 64, 4096, 20), (50, 8, 6, 5))
        idx = torch.randint(0, rows, (bags, per), generator=_gen(53, "cpu"))
        return {"weight": _leaf(_rand((rows, d), 54, device)), "index": idx.to(device)}
    return Case("embedding_bag-mean", make, ["weight"],
                lambda i, d: dt.embedding_bag(i["index"], i["weight"], mode="mean", deterministic=d),
                lambda i: F.embedding_bag(i["index"], i["weight"], mode="mean"),
                lambda i: f"table{list(i['weight'].shape)} {i['index'].shape[0]} bags of {i['index'].shape[1]}",
                linear=True)


def row_scatter_case(kind: str) -> Case:
    """index_add (one destination row per source row) or scatter_add (one per source element)."""
    def make(device, scale):
        m, d, rows = _sizes(scale, (262144, 64, 4096), (40, 6, 7))
        idx = torch.randint(0, rows, (m,) if kind == "index_add" else (m, d), generator=_gen(61, "cpu"))
        return {"base": torch.zeros(rows, d, device=device), "src": _leaf(_rand((m, d), 62, device)),
                "index": idx.to(device)}
    ours = dt.index_add if kind == "index_add" else dt.scatter_add
    return Case(kind, make, ["src"],
                lambda i, d: ours(i["base"], 0, i["index"], i["src"], deterministic=d),
                lambda i: getattr(i["base"], kind)(0, i["index"], i["src"]),
                lambda i: f"src{list(i['src'].shape)} into {list(i['base'].shape)}", linear=True)


def sparse_mm_case() -> Case:
    def make(device, scale):
        n, nnz, k = _sizes(scale, (100000, 1000000, 64), (30, 120, 5))
        g = _gen(71, "cpu")
        rows, cols = torch.randint(0, n, (nnz,), generator=g), torch.randint(0, n, (nnz,), generator=g)
        a = torch.sparse_coo_tensor(torch.stack([rows, cols]), torch.rand(nnz, generator=g) * 2 - 1, (n, n))
        return {"a": a.coalesce().to_sparse_csr().to(device), "b": _leaf(_rand((n, k), 72, device))}
    return Case("sparse_mm", make, ["b"],
                lambda i, d: dt.sparse_mm(i["a"], i["b"], deterministic=d),
                lambda i: torch.sparse.mm(i["a"], i["b"]),
                lambda i: f"A {i['a'].shape[0]}x{i['a'].shape[1]} nnz {i['a'].values().numel()} x {i['b'].shape[1]}",
                linear=True)


def conv2d_case() -> Case:
    def make(device, scale):
        n, c, hw = _sizes(scale, (128, 128, 16), (2, 4, 7))
        return {"x": _leaf(_rand((n, c, hw, hw), 81, device)),
                "w": _leaf(_rand((c, c, 3, 3), 82, device, -0.1, 0.1))}
    return Case("conv2d", make, ["x", "w"],
                lambda i, d: dt.conv2d(i["x"], i["w"], padding=1, deterministic=d),
                lambda i: F.conv2d(i["x"], i["w"], padding=1),
                lambda i: f"x{list(i['x'].shape)} w{list(i['w'].shape)}", linear=True)


CASES: List[Case] = [
    grid_sample_case(False), grid_sample_case(True), affine_grid_case(),
    interpolate_case("nearest", None, 128), interpolate_case("bilinear", False, 128),
    interpolate_case("bilinear", True, 128), interpolate_case("bilinear", False, 96),
    roi_align_case(), ctc_case(), cross_entropy_case(), nll_case(), embedding_case(False), embedding_case(True),
    embedding_bag_case(), row_scatter_case("index_add"), row_scatter_case("scatter_add"), sparse_mm_case(), conv2d_case(),
]


def upstream(out: torch.Tensor, seed: int = 99) -> torch.Tensor:
    """A fixed upstream gradient of the output's shape (ones for a scalar loss)."""
    if out.dim() == 0:
        return torch.ones_like(out)
    return _rand(out.shape, seed, out.device.type)


def step(case: Case, inputs: Dict[str, torch.Tensor], impl: str, dy: Optional[torch.Tensor] = None,
         deterministic: bool = True) -> List[torch.Tensor]:
    """One forward and backward: [output, gradients of case.grads...]."""
    out = case.ditto(inputs, deterministic) if impl == "ditto" else case.torch(inputs)
    grads = torch.autograd.grad(out, [inputs[n] for n in case.grads], upstream(out) if dy is None else dy)
    return [out.detach()] + [g.detach() for g in grads]


def tolerance(case: Case, ref: torch.Tensor) -> Dict[str, float]:
    """float32 agreement: sums of up to K terms in another order differ by about K ulps of the largest
    term; 1e-4 relative (and that much of the reference's largest magnitude, absolute) covers K in the
    hundreds, as these ops' sums are (samples per pixel, taps per input, rows per bag or segment)."""
    scale = float(ref.abs().max()) if ref.numel() else 1.0
    return {"rtol": 1e-4, "atol": 1e-4 * max(scale, 1e-30)}
