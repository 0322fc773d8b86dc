#!/usr/bin/env python3
"""Which kernels PyTorch and ditto run for the same work, side by side: PyTorch's from
bench/peers/torch_kernels.py (its profiler), ditto's from Nsight Compute's CSV of a ditto-train run
of the same steps (one file per kernel mode):

    ncu --csv --metrics gpu__time_duration.sum --log-file ditto-pytorch.csv \\
        build-gpu/examples/ditto-train --model smallcnn --dataset synthetic --synthetic-train 256 \\
        --synthetic-test 128 --synthetic-size 32 --batch-size 128 --epochs 1 --kernels pytorch ...
    python3 bench/layer_kernels.py torch_kernels.json pytorch=ditto-pytorch.csv heuristic=ditto-heuristic.csv

Kernels are compared by name up to the first '<' or '(' (the two tools print template arguments
differently), counted over the whole run. Convolution kernels (cuDNN's: fprop / dgrad / wgrad
engines, implicit GEMMs, Winograd, FFT, layout transforms) come first: whether ditto's mode runs
the convolution kernels PyTorch runs is what the table is for. Prints a Markdown table and one
summary line per ditto file: how many of PyTorch's convolution launches it matches by name.
"""
import argparse
import csv
import json
import re
import sys
from collections import Counter

from jsonl_records import emit, labelled

CONV = re.compile(r"fprop|dgrad|wgrad|convolve|winograd|fft|cudnn|conv2d|nchwToNhwc|nhwcToNchw", re.IGNORECASE)


def base_name(name):
    name = name.strip()
    if name.startswith("void "):
        name = name[5:]
    return re.split(r"[<(]", name, 1)[0].strip()


def read_torch(path):
    with open(path) as f:
        rec = json.load(f)
    if "kernels" not in rec:
        sys.exit(f"{path}: no 'kernels' (not bench/peers/torch_kernels.py's output)")
    return Counter(base_name(k) for k in rec["kernels"]), rec


def read_ncu(path):
    """Kernel names of an ncu --csv log: one row per (kernel launch, metric); launches by ID."""
    with open(path, newline="") as f:
        lines = [ln for ln in f if not ln.startswith("==")]
    start = next((i for i, ln in enumerate(lines) if ln.startswith('"ID"')), None)
    if start is None:
        sys.exit(f"{path}: no CSV header (\"ID\", ...): not an ncu --csv log")
    names = {}
    for row in csv.DictReader(lines[start:]):
        if "Kernel Name" not in row or "ID" not in row:
            sys.exit(f"{path}: rows without 'ID' / 'Kernel Name'")
        names[row["ID"]] = row["Kernel Name"]
    return Counter(base_name(n) for n in names.values())


def table(torch_counts, dittos):
    labels = [lab for lab, _ in dittos]
    names = set(torch_counts)
    for _, c in dittos:
        names |= set(c)
    order = sorted(names, key=lambda n: (not CONV.search(n), -torch_counts.get(n, 0), n))
    out = ["| kernel | convolution | PyTorch | " + " | ".join(f"ditto {lab}" for lab in labels) + " |",
           "|---|---|---:|" + "---:|" * len(labels)]
    for n in order:
        cells = [str(c.get(n, 0)) for _, c in dittos]
        out.append(f"| `{n}` | {'yes' if CONV.search(n) else ''} | {torch_counts.get(n, 0)} | " + " | ".join(cells) + " |")
    summary = []
    conv_torch = {n: k for n, k in torch_counts.items() if CONV.search(n)}
    total = sum(conv_torch.values())
    for lab, c in dittos:
        matched = sum(min(k, c.get(n, 0)) for n, k in conv_torch.items())
        own = sum(k for n, k in c.items() if CONV.search(n))
        summary.append(f"ditto {lab}: {matched} of PyTorch's {total} convolution launches run the same kernel "
                       f"({own} convolution launches in all)")
    return "\n".join(out) + "\n", summary


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("torch_json")
    ap.add_argument("ditto", nargs="+", type=lambda t: labelled(t, "LABEL=NCU_CSV"),
                    help="LABEL=NCU_CSV, one per ditto kernel mode")
    ap.add_argument("--out", help="markdown file to write (default: stdout)")
    a = ap.parse_args()
    torch_counts, rec = read_torch(a.torch_json)
    dittos = []
    for lab, path in a.ditto:
        dittos.append((lab, read_ncu(path)))
    text, summary = table(torch_counts, dittos)
    head = (f"PyTorch {rec.get('torch', '?')} (cuDNN {rec.get('cudnn', 'not recorded')}) on {rec.get('gpu', '?')}: "
            f"{rec.get('model')}, {rec.get('steps')} "
            f"training steps of {rec.get('batch')} and one evaluation batch of {rec.get('eval_batch')}\n\n")
    emit(head + "\n".join(f"- {s}" for s in summary) + "\n\n" + text, a.out)
    for s in summary:
        print(s, file=sys.stderr)


if __name__ == "__main__":
    main()
