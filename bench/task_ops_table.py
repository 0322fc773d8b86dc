#!/usr/bin/env python3
"""The task networks' ops beside PyTorch: bench/op_noise's rows for those ops (op_noise.csv) and the
PyTorch peers' rows (bench/peers/torch_scatter_reduce.py, torch_sampler_ctc_spmm.py; JSON lines),
one markdown file.

    task_ops_table.py OP_NOISE_CSV... TORCH_JSONL... [--out table.md]

ditto's rows: every (op, knob, variant, shape) with its distinct results out of its runs and
microseconds per call; a variant whose results differ is marked. PyTorch's rows: every (op, path,
shape, mode) with the same two numbers, and where deterministic mode raised, that it did (the row's
timing is then of PyTorch's nondeterministic path run with warn_only). Which rows op_noise ran is
its own choice (the pipeline's task-ops step: --families scatter,upsample,pixel_xent,reduce --group all).
"""
import argparse
import csv
import json
import sys

from jsonl_records import emit

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+", help="op_noise.csv files and the peers' JSON-lines files")
    ap.add_argument("--out")
    a = ap.parse_args()
    csvs = [p for p in a.files if p.endswith(".csv")]
    jsonls = [p for p in a.files if not p.endswith(".csv")]
    if not csvs:
        sys.exit("task_ops_table: no op_noise.csv given")
    lines = ["## ditto (bench/op_noise)", "",
             "| op | knob | variant | shape | distinct / runs | µs per call |", "|---|---|---|---|---:|---:|"]
    for path in csvs:
        with open(path) as f:
            for r in csv.DictReader(f):
                mark = "" if r["distinct"] == "1" else " **(differs)**"
                lines.append(f"| {r['op']} | {r['knob']} | {r['variant']} | {r['shape']} | "
                             f"{r['distinct']} / {r['runs']}{mark} | {float(r['us_per_call']):.1f} |")
    lines += ["", "## PyTorch (bench/peers/torch_scatter_reduce.py, torch_sampler_ctc_spmm.py)", "",
              "| op | path / tensor | shape | mode | distinct / runs | µs per call (median) | deterministic mode |",
              "|---|---|---|---|---:|---:|---|"]
    meta = set()
    for path in jsonls:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                r = json.loads(line)
                meta.add((r.get("gpu", "?"), r.get("torch", "?"), r.get("cuda", "?"), r.get("date", "?")))
                what = " / ".join(str(r[k]) for k in ("path", "variant", "tensor") if r.get(k))
                if "error" in r:
                    lines.append(f"| {r.get('op')} | {what} | {r.get('shape', '')} | {r.get('mode')} | – | – | "
                                 f"failed: {str(r['error'])[:80]} |")
                    continue
                strict = r.get("strict_error")
                note = "raises (timed with warn_only)" if strict else ("runs" if r.get("mode") == "deterministic" else "")
                mark = "" if r.get("distinct") == 1 else " **(differs)**"
                lines.append(f"| {r['op']} | {what} | {r.get('shape', '')} | {r['mode']} | {r['distinct']} / {r['runs']}{mark} | "
                             f"{float(r['us_median']):.1f} | {note} |")
    if meta:
        lines += ["", "PyTorch: " + "; ".join(f"{g}, torch {t}, CUDA {c}, {d}" for g, t, c, d in sorted(meta))]
    text = "\n".join(lines) + "\n"
    emit(text, a.out)


if __name__ == "__main__":
    main()
