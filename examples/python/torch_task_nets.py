#!/usr/bin/env python3
"""PyTorch's deterministic mode on the spatial transformer and the U-Net, made to run by ditto.torch.

    PYTHONPATH=build/python python3 examples/python/torch_task_nets.py --mnist DIR --out torch-task-nets.json
    PYTHONPATH=build/python python3 examples/python/torch_task_nets.py --synthetic --device cpu --steps 20

Trains, in PyTorch, the two task networks ditto trains on the same data (mnist-rt: digits rotated by
up to +-45 degrees and shifted on a 40x40 canvas, for the spatial transformer; mnist-seg: each digit's
ink pixels labelled with its class, for the small U-Net), four ways per network:
  pytorch-default        PyTorch's default mode (atomics allowed), twice: do the two runs agree?
  pytorch-deterministic  torch.use_deterministic_algorithms(True) alone: where PyTorch raises
                         (nll_loss2d for the U-Net) the error is reported; where it runs (the
                         spatial transformer samples with align_corners=True, which PyTorch hands to
                         cuDNN's sampler) twice, and the two runs compared
  ditto-deterministic    the same mode with ditto.torch.patch(): grid_sample, affine_grid, interpolate
                         and the pixel-wise loss run ditto's deterministic kernels; twice, the two
                         runs' final weights compared bit for bit (SHA-256 of every parameter)
and reports each way's step time, final weights hash and test accuracy (JSON to --out, written then
renamed; an existing file is never overwritten).
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import pathlib
import sys
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # what PyTorch's deterministic mode asks of cuBLAS

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import ditto.torch as dt  # noqa: E402


# ---- data ---------------------------------------------------------------------------------------------

def read_idx(path: pathlib.Path) -> np.ndarray:
    """An MNIST IDX file (gzipped as distributed): big-endian dimensions after a 4-byte magic."""
    raw = gzip.open(path, "rb").read()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 8:
        raise SystemExit(f"{path}: not an unsigned-byte IDX file (magic {raw[:4].hex()})")
    dims = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(raw[3])]
    body = raw[4 + 4 * len(dims):]
    if len(body) != int(np.prod(dims)):
        raise SystemExit(f"{path}: {len(body)} bytes of data after the header, {int(np.prod(dims))} expected")
    return np.frombuffer(body, np.uint8).reshape(dims)


def mnist(folder: str, train: bool):
    pre = "train" if train else "t10k"
    d = pathlib.Path(folder)
    return (torch.from_numpy(read_idx(d / f"{pre}-images-idx3-ubyte.gz").copy()),
            torch.from_numpy(read_idx(d / f"{pre}-labels-idx1-ubyte.gz").copy()).long())


def synthetic_digits(n: int, seed: int):
    """Blocky stand-ins for digits (one bar pattern per class) when no MNIST is at hand."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 10, (n,), generator=g)
    images = torch.zeros(n, 28, 28, dtype=torch.uint8)
    for c in range(10):
        rows = labels == c
        images[rows, 4 + 2 * c:8 + 2 * c, 6:22] = 255
        images[rows, 6:22, 4 + 2 * ((c * 3) % 10):7 + 2 * ((c * 3) % 10)] = 200
    return images, labels


def rotated_translated(images: torch.Tensor, seed: int) -> torch.Tensor:
    """mnist-rt: each digit centred on a 40x40 canvas, turned by up to +-45 degrees and shifted by up to
    +-6 pixels (one fixed draw per image)."""
    g = torch.Generator().manual_seed(seed)
    n = images.shape[0]
    canvas = F.pad(images.float().unsqueeze(1) / 255.0, (6, 6, 6, 6))
    angle = (torch.rand(n, generator=g) * 2 - 1) * (torch.pi / 4)
    shift = (torch.rand(n, 2, generator=g) * 2 - 1) * (6 / 20)
    theta = torch.stack([torch.stack([angle.cos(), -angle.sin(), shift[:, 0]], 1),
                         torch.stack([angle.sin(), angle.cos(), shift[:, 1]], 1)], 1)
    out = []
    for i in range(0, n, 4096):  # on the CPU, where PyTorch's sampler is one loop, deterministic
        grid = F.affine_grid(theta[i:i + 4096], (min(4096, n - i), 1, 40, 40), align_corners=False)
        out.append(F.grid_sample(canvas[i:i + 4096], grid, align_corners=False))
    return torch.cat(out)


def segmentation(images: torch.Tensor, labels: torch.Tensor):
    """mnist-seg: the image, and per pixel 1 + its digit's class where the ink is >= 128, else 0."""
    x = images.float().unsqueeze(1) / 255.0
    y = torch.where(images >= 128, labels.view(-1, 1, 1) + 1, torch.zeros_like(labels).view(-1, 1, 1))
    return x, y


# ---- the networks (as ditto's nets/stn.cpp and nets/unet_small.cpp) -------------------------------------

class Stn(nn.Module):
    def __init__(self):
        super().__init__()
        self.loc = nn.Sequential(nn.Conv2d(1, 8, 7), nn.MaxPool2d(2), nn.ReLU(), nn.Conv2d(8, 10, 5), nn.MaxPool2d(2),
                                 nn.ReLU(), nn.Flatten(), nn.Linear(10 * 6 * 6, 32), nn.ReLU(), nn.Linear(32, 6))
        nn.init.zeros_(self.loc[-1].weight)
        with torch.no_grad():
            self.loc[-1].bias.copy_(torch.tensor([1.0, 0, 0, 0, 1, 0]))
        self.cls = nn.Sequential(nn.Conv2d(1, 10, 5), nn.MaxPool2d(2), nn.ReLU(), nn.Conv2d(10, 20, 5),
                                 nn.MaxPool2d(2), nn.ReLU(), nn.Flatten(), nn.Linear(20 * 4 * 4, 50), nn.ReLU(),
                                 nn.Linear(50, 10))

    def forward(self, x):
        theta = self.loc(x).view(-1, 2, 3)
        grid = F.affine_grid(theta, (x.shape[0], 1, 28, 28), align_corners=True)
        return self.cls(F.grid_sample(x, grid, align_corners=True))


class UnetSmall(nn.Module):
    def __init__(self, classes: int = 11):
        super().__init__()
        conv = lambda i, o: nn.Conv2d(i, o, 3, padding=1)  # noqa: E731
        self.enc1, self.enc2, self.mid = conv(1, 16), conv(16, 32), conv(32, 64)
        self.dec2, self.dec1, self.head = conv(64 + 32, 32), conv(32 + 16, 16), nn.Conv2d(16, classes, 1)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight)
                nn.init.zeros_(m.bias)

    def forward(self, x):
        e1 = F.relu(self.enc1(x))
        e2 = F.relu(self.enc2(F.max_pool2d(e1, 2)))
        m = F.relu(self.mid(F.max_pool2d(e2, 2)))
        u2 = F.interpolate(m, size=e2.shape[2:], mode="bilinear", align_corners=False)
        d2 = F.relu(self.dec2(torch.cat([u2, e2], 1)))
        u1 = F.interpolate(d2, size=e1.shape[2:], mode="nearest")
        d1 = F.relu(self.dec1(torch.cat([u1, e1], 1)))
        return self.head(d1)


# ---- training -------------------------------------------------------------------------------------------

def weights_hash(model: nn.Module) -> str:
    h = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(p.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def train(task: str, data, device: str, steps: int, batch: int, seed: int) -> dict:
    torch.manual_seed(seed)
    model = (Stn() if task == "stn" else UnetSmall()).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.02 if task == "stn" else 0.05, momentum=0.9)
    (xtr, ytr), (xte, yte) = data
    order = torch.randperm(xtr.shape[0], generator=torch.Generator().manual_seed(seed + 1))
    times = []
    for step in range(steps):
        idx = order[(step * batch) % (xtr.shape[0] - batch):][:batch]
        x, y = xtr[idx].to(device), ytr[idx].to(device)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    with torch.no_grad():
        correct = total = 0
        for i in range(0, xte.shape[0], 1000):
            pred = model(xte[i:i + 1000].to(device)).argmax(1).cpu()
            correct += int((pred == yte[i:i + 1000]).sum())
            total += yte[i:i + 1000].numel()
    warm = times[min(10, len(times) // 2):]
    return {"weights_sha256": weights_hash(model), "ms_per_step": 1000 * sum(warm) / len(warm),
            "test_accuracy": correct / total, "final_loss": float(loss.detach())}


def ways(task: str, data, a) -> dict:
    out = {}
    run = lambda: train(task, data, a.device, a.steps, a.batch, a.seed)  # noqa: E731
    torch.backends.cudnn.benchmark = False
    out["pytorch-default"] = [run(), run()]
    torch.use_deterministic_algorithms(True)
    try:
        try:
            out["pytorch-deterministic"] = [run(), run()]
        except RuntimeError as e:
            out["pytorch-deterministic"] = [{"error": str(e).splitlines()[0]}]
        with dt.patch():
            out["ditto-deterministic"] = [run(), run()]
            out["ditto-variants"] = dt.variants()
    finally:
        torch.use_deterministic_algorithms(False)
    for way in ("pytorch-default", "pytorch-deterministic", "ditto-deterministic"):
        runs = out[way]
        if len(runs) == 2:
            out[way + "-bit-identical"] = runs[0]["weights_sha256"] == runs[1]["weights_sha256"]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mnist", help="folder with MNIST's four .gz IDX files")
    ap.add_argument("--synthetic", action="store_true", help="blocky stand-in digits instead of MNIST")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--tasks", default="stn,unet", help="comma-separated: stn, unet")
    ap.add_argument("--out", default="", help="JSON of the results (must not exist)")
    a = ap.parse_args()
    if bool(a.mnist) == a.synthetic:
        ap.error("give --mnist DIR or --synthetic")
    if a.out and os.path.exists(a.out):
        ap.error(f"--out {a.out}: exists; finished results are never overwritten")
    if a.mnist:
        (tr_x, tr_y), (te_x, te_y) = mnist(a.mnist, True), mnist(a.mnist, False)
    else:
        (tr_x, tr_y), (te_x, te_y) = synthetic_digits(4096, 1), synthetic_digits(1024, 2)
    results = {"device": torch.cuda.get_device_name() if a.device.startswith("cuda") else "cpu",
               "torch": torch.__version__, "steps": a.steps, "batch": a.batch, "data": "mnist" if a.mnist else "synthetic"}
    for task in a.tasks.split(","):
        if task == "stn":
            data = ((rotated_translated(tr_x, 3), tr_y), (rotated_translated(te_x, 4), te_y))
        elif task == "unet":
            data = (segmentation(tr_x, tr_y), segmentation(te_x[:2000], te_y[:2000]))
        else:
            ap.error(f"--tasks: '{task}' is neither stn nor unet")
        r = ways(task, data, a)
        results[task] = r
        for way in ("pytorch-default", "pytorch-deterministic", "ditto-deterministic"):
            for i, run in enumerate(r[way]):
                if "error" in run:
                    print(f"{task:5s} {way:22s} raises: {run['error']}")
                else:
                    print(f"{task:5s} {way:22s} run {i}: {run['ms_per_step']:.2f} ms/step, accuracy "
                          f"{run['test_accuracy']:.4f}, weights {run['weights_sha256'][:16]}")
        same = ", ".join(f"{w} {r[w + '-bit-identical']}" for w in ("pytorch-default", "pytorch-deterministic",
                                                                   "ditto-deterministic") if w + "-bit-identical" in r)
        print(f"{task:5s} bit-identical runs: {same}")
    if a.out:
        tmp = a.out + ".partial"
        with open(tmp, "w") as f:
            json.dump(results, f, indent=1)
        os.replace(tmp, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
