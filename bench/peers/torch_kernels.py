#!/usr/bin/env python3
"""The CUDA kernels PyTorch launches for a few training steps and one evaluation batch, in launch
order: what PyTorch 2.11 runs by default (cudnn.benchmark and deterministic off, TF32 off as in
torch_settings.py), to put beside the kernels ditto runs for the same work (bench/layer_kernels.py
reads both; ditto's come from Nsight Compute).

The work is torch_settings.py's model and recipe on random CIFAR-shaped data: --steps training
steps (forward, cross-entropy, backward, Adam) of --batch images from a fresh process, then one
forward of --eval-batch images in evaluation mode (ditto-train's epoch end with --test-size equal to
it). The whole run is profiled, so algorithm selection on first use is in it, as it is in ditto's.
Writes one JSON object to --out: {"model", "batch", "steps", "eval_batch", "torch", "cudnn" (the
cuDNN PyTorch loaded: its wheels bundle their own), "gpu",
"kernels": [names in launch order]}.

    python3 bench/peers/torch_kernels.py --model smallcnn --out torch_kernels.json
"""
import argparse
import json
import pathlib
import sys

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from torch_train import ResNet18, SmallCNN  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=("smallcnn", "resnet18"), default="smallcnn")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--eval-batch", type=int, default=128)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("torch_kernels: needs a CUDA device")
    dev = torch.device("cuda")
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(0)
    model = (SmallCNN() if a.model == "smallcnn" else ResNet18()).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=4e-4)
    g = torch.Generator(device=dev).manual_seed(1)
    x = torch.randn(a.batch, 3, 32, 32, device=dev, generator=g)
    y = torch.randint(0, 10, (a.batch,), device=dev, generator=g)
    xe = torch.randn(a.eval_batch, 3, 32, 32, device=dev, generator=g)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        model.train()
        for _ in range(a.steps):
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        model.eval()
        with torch.no_grad():
            model(xe).argmax(1)
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA and
               not e.name.startswith(("Memcpy", "Memset"))]
    kernels.sort(key=lambda e: e.time_range.start)
    rec = {"model": a.model, "batch": a.batch, "steps": a.steps, "eval_batch": a.eval_batch,
           "torch": torch.__version__, "cudnn": torch.backends.cudnn.version(), "gpu": torch.cuda.get_device_name(),
           "kernels": [e.name for e in kernels]}
    with open(a.out, "w") as f:
        json.dump(rec, f, indent=1)
    print(f"torch_kernels: {len(kernels)} kernels -> {a.out}")


if __name__ == "__main__":
    main()
