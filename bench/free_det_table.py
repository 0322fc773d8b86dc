#!/usr/bin/env python3
"""The rows of "free determinism" that are measured against a goal, from one device session's files:
deterministic training beside PyTorch's default (DenseNet step time, SmallCNN and ResNet-18 graphed,
VGG and EfficientNet peak memory) and the deterministic variants of the scatter-like ops against
their atomic ones (op_noise). Each row: the two numbers, their ratio, the goal, met or not.

  python3 bench/free_det_table.py --overhead overhead.jsonl --torch-overhead torch_overhead.jsonl \\
      --step-time step_time.jsonl --torch-step-time torch_step_time.jsonl --op-noise op_noise.csv \\
      --out free_det.md [--json free_det.json]

Inputs are what bench/gpu_pipeline.sh's free-det step writes (bench/overhead, bench/step_time,
bench/op_noise and their PyTorch peers). A row whose inputs are missing is an error, not a blank:
the table claims every row of one session or none.
"""
import argparse
import csv
import json
import sys

from jsonl_records import emit, iter_records

GIB = 1024 ** 3


def read_jsonl(path):
    return [rec for _, _, rec in iter_records([path], required=("model", "mode"))]


def pick(rows, what, **want):
    """The last record whose fields equal `want` (a later measurement of a configuration replaces an
    earlier one); an error naming `what` when none does or when it records an error."""
    found = [r for r in rows if all(r.get(k) == v for k, v in want.items())]
    if not found:
        raise ValueError(f"{what}: no record with {want}")
    r = found[-1]
    if r.get("error"):
        raise ValueError(f"{what}: the record with {want} holds an error: {r['error']}")
    return r


def op_noise_rows(rows, op, variant):
    """op_noise's rows of one op's backward (knob bwd or scatter) in one variant, by shape."""
    return {r["shape"]: r for r in rows if r["op"] == op and r["variant"] == variant and r["knob"] in ("bwd", "scatter")}


def op_rows(ops, op, det, atomic):
    """One goal row per shape of an op: the deterministic variant against the atomic one, each call
    alone (op_noise's us_per_call: the goal's measure) and, where op_noise recorded it, back to back."""
    ours, theirs = op_noise_rows(ops, op, det), op_noise_rows(ops, op, atomic)
    if not ours or set(ours) != set(theirs):
        raise ValueError(f"op_noise: {op} has {det} rows for {sorted(ours)} and {atomic} rows for {sorted(theirs)}")
    plans = op_noise_rows(ops, op, "deterministic+plan")
    out = []
    for shape, d in ours.items():
        a = theirs[shape]
        also = f"{shape}; {d['distinct']}/{d['runs']} distinct"
        if d.get("us_back_to_back") and a.get("us_back_to_back"):
            bd, ba = float(d["us_back_to_back"]), float(a["us_back_to_back"])
            also += f"; back to back {bd:.1f} vs {ba:.1f} µs ({bd / ba:.2f}×)"
        if shape in plans:
            us_p = float(plans[shape]["us_per_call"])
            also += f"; with a plan {us_p:.1f} µs ({us_p / float(a['us_per_call']):.2f}×)"
        out.append({"row": f"{op} backward, {det} vs {atomic}", "unit": "µs", "ditto": float(d["us_per_call"]),
                    "reference": float(a["us_per_call"]), "goal": 1.20, "also": also})
    return out


def build_rows(a):
    ov, tov = read_jsonl(a.overhead), read_jsonl(a.torch_overhead)
    st, tst = read_jsonl(a.step_time), read_jsonl(a.torch_step_time)
    with open(a.op_noise, newline="") as f:
        ops = list(csv.DictReader(f))
    rows, meta = [], {}

    def ours(model):
        return pick(ov, f"overhead {model}", model=model, mode="deterministic-tuned", precision="fp32")

    def theirs(model):
        return pick(tov, f"torch_overhead {model}", model=model, mode="default", precision="fp32")

    for model, name in (("densenet169", "DenseNet-169"), ("densenet201", "DenseNet-201")):
        d, t = ours(model), theirs(model)
        meta.setdefault("gpu", d.get("gpu")), meta.setdefault("commit", d.get("commit"))
        rows.append({"row": f"{name} step, deterministic-tuned vs PyTorch default", "unit": "ms",
                     "ditto": d["ms_median"], "reference": t["ms_median"], "goal": 1.00})
    for model, name in (("vgg16", "VGG-16"), ("vgg19", "VGG-19"), ("efficientnet-b0", "EfficientNet-B0")):
        d, t = ours(model), theirs(model)
        budget = d.get("tuning_workspace_mb", 0)
        note = f"tuning file with a {budget} MiB workspace budget" if budget else "tuning file, no workspace budget"
        rows.append({"row": f"{name} peak memory, deterministic-tuned vs PyTorch default ({note})", "unit": "GiB",
                     "ditto": d["peak_mem_bytes"] / GIB, "reference": t["peak_mem_bytes"] / GIB, "goal": 1.00,
                     "also": f"step {d['ms_median']:.2f} vs {t['ms_median']:.2f} ms"})
    d = pick(st, "step_time smallcnn", model="smallcnn", mode="deterministic-tuned", graph=True, precision="fp32")
    t = pick(tst, "torch_step_time smallcnn", model="smallcnn", mode="default", graph=True, precision="fp32")
    rows.append({"row": "SmallCNN graphed step, deterministic-tuned vs PyTorch graphed default", "unit": "ms",
                 "ditto": d["ms_median"], "reference": t["ms_median"], "goal": 1.00})
    d = pick(st, "step_time resnet18", model="resnet18", mode="deterministic-tuned", graph=True, precision="fp32")
    t = pick(tst, "torch_step_time resnet18", model="resnet18", mode="default", graph=True, precision="fp32")
    rows.append({"row": "ResNet-18 CIFAR fp32 graphed step, deterministic-tuned (goal: 9.6 ms)", "unit": "ms",
                 "ditto": d["ms_median"], "reference": 9.6, "goal": 1.00,
                 "also": f"PyTorch graphed default {t['ms_median']:.2f} ms; "
                         f"{d['flops_per_step'] / d['ms_median'] / 1e9:.1f} TFLOP/s"})
    for op, det, atomic in (("roi_align", "deterministic", "atomic"), ("embedding", "sorted", "atomic"),
                            ("embedding_bag", "sorted", "atomic"), ("scatter_add", "sorted", "atomic"),
                            ("spmm", "deterministic", "atomic")):
        rows += op_rows(ops, op, det, atomic)
    for r in rows:
        r["ratio"] = r["ditto"] / r["reference"]
        r["met"] = r["ratio"] <= r["goal"]
    return rows, meta


def render(rows, meta):
    met = sum(r["met"] for r in rows)
    lines = [f"# Free determinism: every measured row ({meta.get('gpu')}, commit {meta.get('commit')})", "",
             f"{met} of {len(rows)} rows meet their goal.", "",
             "| row | ditto | reference | ratio | goal | met | also |", "|---|---:|---:|---:|---:|---|---|"]
    for r in rows:
        u = r["unit"]
        lines.append(f"| {r['row']} | {r['ditto']:.2f} {u} | {r['reference']:.2f} {u} | {r['ratio']:.3f} | "
                     f"≤ {r['goal']:.2f} | {'yes' if r['met'] else '**no**'} | {r.get('also', '')} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for name in ("overhead", "torch-overhead", "step-time", "torch-step-time", "op-noise"):
        ap.add_argument(f"--{name}", required=True)
    ap.add_argument("--out", required=True, help="the Markdown table")
    ap.add_argument("--json", help="also the rows as JSON")
    a = ap.parse_args(argv)
    try:
        rows, meta = build_rows(a)
    except (OSError, ValueError, KeyError) as e:
        print(f"free_det_table: {e}", file=sys.stderr)
        return 1
    text = render(rows, meta)
    emit(text, a.out)
    if a.json:
        emit(json.dumps({"meta": meta, "rows": rows}, indent=1), a.json)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
