"""Do ditto's reduced-precision gradients agree with PyTorch's autocast on the same weights and batch?

Reads what bench/grad_agreement wrote (DIR/<model>-inputs.safetensors: initial weights, batch and
labels; DIR/<model>-<precision>-grads.safetensors: ditto's gradients of one step's mean cross-entropy),
loads the weights into the PyTorch model of the same architecture (parameter names are the same, up
to the renaming in TORCH_NAME), and computes the same step's gradients three ways on the GPU:
  fp64    the model and batch in float64: the reference both sides are measured against;
  fp32    float32 with TF32 off (cuBLAS and cuDNN), PyTorch's fp32 training;
  bf16, fp16  automatic mixed precision as people train with it (peer_common.Precision: autocast
          around forward and loss, channels-last), unscaled: a power-of-two loss scale is exact
          barring overflow and underflow, and ditto's gradients are unscaled too.
BatchNorm runs in training mode (batch statistics) on both sides.

For each model, precision and gradient tensor: err = ||g - g64|| / ||g64|| for ditto's gradient
and for PyTorch's, and ||g_ditto - g_torch|| / ||g64||; the same over all gradients at once.

The tolerance, and why. Both sides round at different places (PyTorch's autocast keeps activations
in bf16/fp16 between layers; ditto keeps them in fp32 and rounds each convolution's and linear
layer's inputs and outputs, kernels/precision.h), so their rounding errors are not the same numbers
and a bitwise or ulp-level match is not the claim. The claim is "agrees to bf16/fp16 accuracy": ditto's
gradient is no further from the fp64 truth than PyTorch's own autocast gradient, up to a factor 2,
with a floor of the format's unit roundoff u (2^-8 bf16, 2^-11 fp16, 2^-24 fp32) for tensors that
PyTorch happens to get almost exactly:
    err_ditto <= 2 * err_torch + u       for every gradient tensor and for all of them at once.
A tensor whose reference norm is 0 is compared by its absolute norm against u instead.

Writes one JSON line per (model, precision) to --out and a markdown table to --md; exits 1 when a
model and precision disagree, 2 when an input is missing or unreadable.
    python3 bench/peers/torch_grad_agreement.py --dir DIR --out agreement.jsonl --md agreement.md
"""

import argparse
import json
import math
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision
from safetensors import safe_open

from peer_common import Precision, short_error
from torch_train import SmallCNN

UNIT_ROUNDOFF = {"fp32": 2.0 ** -24, "tf32": 2.0 ** -11, "bf16": 2.0 ** -8, "fp16": 2.0 ** -11}
FACTOR = 2.0


def cifar_resnet18(classes):
    """ditto's "resnet18": torchvision's ResNet-18 with a 3x3 stride-1 stem and no max pool."""
    m = torchvision.models.resnet18(num_classes=classes)
    m.conv1 = nn.Conv2d(3, 64, 3, 1, 1, bias=False)
    m.maxpool = nn.Identity()
    return m


BUILDERS = {
    "smallcnn": lambda classes: SmallCNN(classes),
    "resnet18": cifar_resnet18,
    "resnet34": lambda classes: torchvision.models.resnet34(num_classes=classes),
    "resnet50": lambda classes: torchvision.models.resnet50(num_classes=classes),
}


def torch_name(model, name):
    """PyTorch's name of ditto's parameter `name` (ditto's CIFAR ResNet-18 calls its shortcut
    "downsample.conv" / ".bn" where torchvision's Sequential says "downsample.0" / ".1")."""
    if model == "resnet18":
        return name.replace(".downsample.conv.", ".downsample.0.").replace(".downsample.bn.", ".downsample.1.")
    return name


def read(path):
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: not found (run bench/grad_agreement first)")
    with safe_open(path, framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, f.metadata() or {}


def torch_grads(model_name, weights, x, labels, classes, mode):
    """{ditto name: gradient (float64 on the CPU)} and the loss, for mode fp64, fp32, bf16 or fp16."""
    model = BUILDERS[model_name](classes)
    state = {torch_name(model_name, k): v for k, v in weights.items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected:
        raise KeyError(f"{model_name}: ditto parameters PyTorch's model lacks: {unexpected[:5]}")
    trained = {n for n, _ in model.named_parameters()}
    if any(m in trained for m in missing):
        raise KeyError(f"{model_name}: PyTorch parameters ditto did not write: {[m for m in missing if m in trained][:5]}")
    model = model.cuda().train()
    x = x.cuda()
    labels = labels.cuda().long()
    if mode == "fp64":
        model, x = model.double(), x.double()
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        loss = F.cross_entropy(model(x), labels)
        loss.backward()
    else:
        precision = Precision(mode)
        precision.apply_switches()
        model, x = precision.prepare(model, x)
        with precision.autocast():
            loss = F.cross_entropy(model(x), labels)
        loss.backward()
    by_torch = {n: p.grad for n, p in model.named_parameters()}
    return {k: by_torch[torch_name(model_name, k)].detach().double().cpu() for k in weights}, float(loss)


def rel(a, b, ref):
    d = (a - b).norm().item()
    n = ref.norm().item()
    return d / n if n > 0 else d


def compare(model_name, precision, ditto, torch_p, ref):
    u = UNIT_ROUNDOFF[precision]
    rows, worst = [], None
    for name in ref:
        e_d, e_t = rel(ditto[name], ref[name], ref[name]), rel(torch_p[name], ref[name], ref[name])
        ok = e_d <= FACTOR * e_t + u
        rows.append({"tensor": name, "err_ditto": e_d, "err_torch": e_t,
                     "ditto_vs_torch": rel(ditto[name], torch_p[name], ref[name]), "ok": ok})
        if worst is None or e_d / (FACTOR * e_t + u) > worst["err_ditto"] / (FACTOR * worst["err_torch"] + u):
            worst = rows[-1]
    cat = lambda g: torch.cat([g[n].flatten() for n in ref])
    all_d, all_t, all_r = cat(ditto), cat(torch_p), cat(ref)
    e_d, e_t = rel(all_d, all_r, all_r), rel(all_t, all_r, all_r)
    return {"model": model_name, "precision": precision, "tensors": len(rows),
            "err_ditto": e_d, "err_torch": e_t, "ditto_vs_torch": rel(all_d, all_t, all_r),
            "tolerance": FACTOR * e_t + u, "unit_roundoff": u,
            "tensors_ok": sum(r["ok"] for r in rows), "worst_tensor": worst,
            "agree": e_d <= FACTOR * e_t + u and all(r["ok"] for r in rows)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", required=True, help="bench/grad_agreement's --out")
    ap.add_argument("--models", default="smallcnn,resnet18,resnet50")
    ap.add_argument("--precisions", default="fp32,bf16,fp16")
    ap.add_argument("--out", required=True, help="JSON lines, one per model and precision")
    ap.add_argument("--md", help="markdown table")
    a = ap.parse_args()
    lines = []
    try:
        for model_name in a.models.split(","):
            if model_name not in BUILDERS:
                raise KeyError(f"{model_name}: no PyTorch model here (known: {', '.join(BUILDERS)})")
            inputs, meta = read(os.path.join(a.dir, f"{model_name}-inputs.safetensors"))
            x, labels = inputs.pop("input.x"), inputs.pop("input.labels")
            classes = int(meta["classes"])
            ref, loss64 = torch_grads(model_name, inputs, x, labels, classes, "fp64")
            for precision in a.precisions.split(","):
                ditto, dmeta = read(os.path.join(a.dir, f"{model_name}-{precision}-grads.safetensors"))
                ditto = {k: v.double() for k, v in ditto.items()}
                torch_p, loss_t = torch_grads(model_name, inputs, x, labels, classes, precision)
                line = compare(model_name, precision, ditto, torch_p, ref)
                line.update({"loss_fp64": loss64, "loss_torch": loss_t, "loss_ditto": float(dmeta.get("loss", "nan")),
                             "batch": int(x.shape[0]), "image": list(x.shape[1:]), "gpu": dmeta.get("gpu"),
                             "cudnn_ditto": dmeta.get("cudnn"), "commit": dmeta.get("commit"),
                             "torch": torch.__version__, "cudnn_torch": torch.backends.cudnn.version()})
                lines.append(line)
                print(f"{model_name} {precision}: err ditto {line['err_ditto']:.3e}, torch {line['err_torch']:.3e}, "
                      f"agree {line['agree']}", flush=True)
    except (OSError, KeyError, RuntimeError) as e:
        print(f"torch_grad_agreement: {short_error(e)}", file=sys.stderr)
        return 2
    with open(a.out + ".tmp", "w") as f:
        for line in lines:
            f.write(json.dumps(line) + "\n")
    os.replace(a.out + ".tmp", a.out)
    if a.md:
        head = ("| model | precision | ‖g−g64‖/‖g64‖ ditto | PyTorch | ditto vs PyTorch | tolerance 2·torch+u | "
                "tensors within | worst tensor (ditto / torch) | agree |\n|---|---|---:|---:|---:|---:|---:|---|---|\n")
        body = "".join(
            f"| {l['model']} | {l['precision']} | {l['err_ditto']:.2e} | {l['err_torch']:.2e} | "
            f"{l['ditto_vs_torch']:.2e} | {l['tolerance']:.2e} | {l['tensors_ok']}/{l['tensors']} | "
            f"`{l['worst_tensor']['tensor']}` {l['worst_tensor']['err_ditto']:.1e} / {l['worst_tensor']['err_torch']:.1e} | "
            f"{'yes' if l['agree'] else '**no**'} |\n" for l in lines)
        with open(a.md + ".tmp", "w") as f:
            f.write(head + body)
        os.replace(a.md + ".tmp", a.md)
    return 0 if all(l["agree"] for l in lines) and lines else 1


if __name__ == "__main__":
    sys.exit(main())
