#!/usr/bin/env python3
"""One training step's kernels from Nsight Compute, per tool: how many launches a step makes and where
its kernel time goes. Reads the CSV of

  ncu --clock-control none --metrics gpu__time_duration.sum --csv --print-units base \\
      build-gpu/bench/step_time --models smallcnn --modes deterministic-tuned --graph graph --warmup 2 --steps 3

(or the same around bench/peers/torch_step_time.py), finds the step as the sequence of kernel names
whose back-to-back repeats cover the most launches (the replays of a captured step), and prints kernels per step, their summed time, and a table of kernel families (the name up to its
argument list) by time. Each kernel ran alone under the profiler, so the sum is not the step's wall time;
the launch count and the families are what compare across tools and commits.

  python3 bench/ncu_step_table.py A.csv [B.csv ...] [--json OUT]

With --blocks, a file is read as a sequence of repeated calls instead (a micro-benchmark such as
bench/op_noise under ncu, each variant called several times): every run of back-to-back repeats of a
kernel sequence becomes one row with the sequence, its repeat count and each kernel's mean time, in
launch order, so one call of each variant can be read off.
"""
import argparse
import csv
import json
import re
import sys
from collections import OrderedDict
from pathlib import Path


def load(path):
    """(kernel name, µs) for every profiled kernel of the CSV, in launch order."""
    out = []
    with open(path, newline="") as f:
        for row in csv.reader(f):
            if len(row) < 15 or row[0] == "ID" or row[12] != "gpu__time_duration.sum":
                continue
            unit, value = row[13], float(row[14].replace(",", ""))
            scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}.get(unit)
            if scale is None:
                raise ValueError(f"{path}: gpu__time_duration.sum in unit '{unit}'; ns, us or ms expected")
            out.append((row[4], value * scale))
    if not out:
        raise ValueError(f"{path}: no gpu__time_duration.sum rows (was it written by ncu --csv with that metric?)")
    return out


def last_step(kernels, min_period=2):
    """The kernels of one step: the period p whose back-to-back repeats cover the most kernels (the
    replayed steps; a few identical kernels in a row cover few), the shortest such p on a tie, and the
    last whole period of that run. Where the run starts within a step is arbitrary: a step's kernels
    are the same whichever launch is taken as its first. Raises when nothing repeats."""
    ids = {}
    names = [ids.setdefault(n, len(ids)) for n, _ in kernels]
    n = len(names)
    best = None  # (coverage, -p, end of the run)
    for p in range(min_period, n // 2 + 1):
        run = 0
        for i in range(n - p):
            run = run + 1 if names[i] == names[i + p] else 0
            if run >= p:  # names[i-run+1 .. i+p] are at least two whole copies
                cand = (run + p, -p, i + p + 1)
                if best is None or cand > best:
                    best = cand
    if best is None:
        raise ValueError(f"no step repeats in {n} kernels: profile at least two identical steps")
    _, neg_p, end = best
    return kernels[end + neg_p:end]


def blocks(kernels, max_period=64):
    """The kernel sequence as runs of repeated blocks, in launch order: at each position the block
    (period p <= max_period, the shortest on a tie) whose back-to-back repeats cover the most kernels,
    or the single kernel when nothing repeats. Each: (names of one block, repeats, mean µs per kernel
    of the block over its repeats)."""
    names = [n for n, _ in kernels]
    out, i, n = [], 0, len(kernels)
    while i < n:
        best_p, best_r = 1, 1
        for p in range(1, min(max_period, (n - i) // 2) + 1):
            r = 1
            while i + (r + 1) * p <= n and names[i + r * p:i + (r + 1) * p] == names[i:i + p]:
                r += 1
            if r > 1 and r * p > best_r * best_p:
                best_p, best_r = p, r
        span = kernels[i:i + best_p * best_r]
        means = [sum(span[k + j * best_p][1] for j in range(best_r)) / best_r for k in range(best_p)]
        out.append((names[i:i + best_p], best_r, means))
        i += best_p * best_r
    return out


def blocks_report(path):
    lines = [f"### {Path(path).name}: repeated blocks in launch order", "",
             "| block | repeats | kernels of one repeat: mean µs each | µs per repeat |", "|---:|---:|---|---:|"]
    for b, (names, reps, means) in enumerate(blocks(load(path)), 1):
        ks = ", ".join(f"`{family(nm)[:60]}` {us:.1f}" for nm, us in zip(names, means))
        lines.append(f"| {b} | {reps} | {ks} | {sum(means):.1f} |")
    return "\n".join(lines)


def family(name):
    """A kernel's name without its argument list and return type, as Nsight prints demangled names."""
    base = re.sub(r"\(.*$", "", name)
    depth, cut = 0, None
    for i, ch in enumerate(base):  # drop a leading return type ("void ") outside template brackets
        depth += ch == "<"
        depth -= ch == ">"
        if ch == " " and depth == 0:
            cut = i
    return base[cut + 1:] if cut is not None else base


def summary(path):
    step = last_step(load(path))
    fams = OrderedDict()
    for name, us in step:
        n, t = fams.get(family(name), (0, 0.0))
        fams[family(name)] = (n + 1, t + us)
    rows = sorted(([f, n, t] for f, (n, t) in fams.items()), key=lambda r: -r[2])
    return {"file": str(path), "kernels": len(step), "kernel_us": round(sum(us for _, us in step), 3),
            "families": [{"family": f, "launches": n, "us": round(t, 3)} for f, n, t in rows]}


def report(summaries):
    lines = ["| file | kernels per step | kernel µs per step (each alone) |", "|---|---:|---:|"]
    lines += [f"| {Path(s['file']).name} | {s['kernels']} | {s['kernel_us']:.1f} |" for s in summaries]
    for s in summaries:
        lines += ["", f"### {Path(s['file']).name}", "", "| kernel family | launches | µs |", "|---|---:|---:|"]
        lines += [f"| `{r['family'][:90]}` | {r['launches']} | {r['us']:.1f} |" for r in s["families"]]
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv", nargs="+", help="Nsight Compute CSV files (ncu --csv --metrics gpu__time_duration.sum)")
    ap.add_argument("--json", help="also write the summaries here as JSON")
    ap.add_argument("--blocks", action="store_true", help="each file as repeated calls: its runs of repeated blocks")
    args = ap.parse_args(argv)
    if args.blocks:
        try:
            print("\n\n".join(blocks_report(p) for p in args.csv))
        except (OSError, ValueError) as e:
            print(f"ncu_step_table: {e}", file=sys.stderr)
            return 1
        return 0
    try:
        summaries = [summary(p) for p in args.csv]
    except (OSError, ValueError) as e:
        print(f"ncu_step_table: {e}", file=sys.stderr)
        return 1
    print(report(summaries))
    if args.json:
        tmp = Path(args.json + ".tmp")
        tmp.write_text(json.dumps(summaries, indent=1))
        tmp.replace(args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
