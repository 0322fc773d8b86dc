#!/usr/bin/env python3
"""The table of bench/eval_invariance's JSON lines: per model and evaluation batch size, the time
of one pass over the examples under the fastest, the framework-default (heuristic) and the
batch-invariant kernels, batch-invariant's cost against the fastest, and how many examples' logits
changed bitwise against the first batch size under each.

    python3 bench/eval_invariance_table.py eval_invariance.jsonl [--out table.md]

A line that is not JSON or lacks a field is reported with its file and line number and skipped.
"""
import argparse
import sys

from jsonl_records import emit, iter_records

KERNELS = ("fastest", "heuristic", "batch-invariant")
FIELDS = ("model", "image", "examples", "kernels", "batch", "ms_per_pass", "differing", "differing_vs_batch")


def read(paths):
    rows = {}
    for _path, _lineno, r in iter_records(paths, FIELDS):
        rows[(r["model"], r["image"], r["batch"], r["kernels"])] = r
    return rows


def table(rows):
    out = ["| model (px, examples) | batch | fastest ms | heuristic ms | batch-invariant ms | invariant ÷ fastest "
           "| examples whose logits differ from the first batch size (fastest / heuristic / invariant) |",
           "|---|---:|---:|---:|---:|---:|---|"]
    keys = []
    for (model, image, batch, _k) in rows:
        if (model, image, batch) not in keys:
            keys.append((model, image, batch))
    for model, image, batch in keys:
        got = {k: rows.get((model, image, batch, k)) for k in KERNELS}
        any_row = next(r for r in got.values() if r)
        ms = {k: (f"{r['ms_per_pass']:.1f}" if r else "–") for k, r in got.items()}
        ratio = (f"{got['batch-invariant']['ms_per_pass'] / got['fastest']['ms_per_pass']:.2f}×"
                 if got["batch-invariant"] and got["fastest"] else "–")
        diff = " / ".join(str(got[k]["differing"]) if got[k] else "–" for k in KERNELS)
        out.append(f"| {model} ({image}, {any_row['examples']}) | {batch} | {ms['fastest']} | {ms['heuristic']} | "
                   f"{ms['batch-invariant']} | {ratio} | {diff} (vs batch {any_row['differing_vs_batch']}) |")
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("jsonl", nargs="+")
    ap.add_argument("--out", help="markdown file to write (default: stdout)")
    a = ap.parse_args()
    rows = read(a.jsonl)
    if not rows:
        sys.exit("eval_invariance_table: no valid lines in " + ", ".join(a.jsonl))
    text = table(rows)
    emit(text, a.out)


if __name__ == "__main__":
    main()
