#!/usr/bin/env python3
"""Before/after table of two sets of bench/op_noise runs (such as before and after a kernel change).

    op_noise_compare.py BEFORE_DIR AFTER_DIR [--out table.md]

Each directory holds one op_noise.csv per shape, in subfolders (BEFORE_DIR/3x32/op_noise.csv).
Rows are matched by (shape, op, knob, variant); the two runs must list the same variants. For each
row: distinct results before and after (bitwise, out of `runs` calls) and microseconds per call.
A deterministic variant must stay at 1 distinct result; an atomic variant's count is a sample (it
changes from run to run), so what is checked for it is that it stays above 1 where it was. The
exit status is 1 when a variant's class (1 vs more than 1 distinct) changed.
"""
import argparse
import csv
import os
import statistics
import sys


def load(root):
    rows = {}
    for shape in sorted(os.listdir(root)):
        path = os.path.join(root, shape, "op_noise.csv")
        if not os.path.isfile(path):
            continue
        with open(path) as f:
            for r in csv.DictReader(f):
                rows[(shape, r["op"], r["knob"], r["variant"])] = r
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--out", help="markdown file (default: stdout)")
    args = ap.parse_args()
    before, after = load(args.before), load(args.after)
    if before.keys() != after.keys():
        sys.exit(f"the runs list different variants: only before {sorted(before.keys() - after.keys())}, "
                 f"only after {sorted(after.keys() - before.keys())}")
    lines = ["| shape | op | knob | variant | distinct before | distinct after | µs before | µs after | after ÷ before |",
             "|---|---|---|---|---:|---:|---:|---:|---:|"]
    class_changed = []
    control = {}
    for key in before:
        b, a = before[key], after[key]
        db, da = int(b["distinct"]), int(a["distinct"])
        tb, ta = float(b["us_per_call"]), float(a["us_per_call"])
        if (db == 1) != (da == 1):
            class_changed.append(key)
        if key[1] == "conv2d":  # code unchanged: the spread of its ratios is the timing noise
            control.setdefault(key[0], []).append(ta / tb)
            continue
        lines.append(f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | {db}/{b['runs']} | {da}/{a['runs']} | "
                     f"{tb:.1f} | {ta:.1f} | {ta / tb:.2f} |")
    lines.append("")
    lines.append("Timing noise, from the convolution rows (code unchanged between the runs): after ÷ before per shape, "
                 "median [min, max] over its cuDNN algorithms:")
    for shape, r in control.items():
        lines.append(f"- {shape}: {statistics.median(r):.2f} [{min(r):.2f}, {max(r):.2f}] over {len(r)} rows; "
                     f"distinct counts of every conv row unchanged: "
                     f"{all(before[k]['distinct'] == after[k]['distinct'] for k in before if k[0] == shape and k[1] == 'conv2d')}")
    lines.append("")
    lines.append(f"Variants whose class (1 distinct result vs more) changed: {len(class_changed)} "
                 f"{'' if not class_changed else class_changed}")
    text = "\n".join(lines) + "\n"
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 1 if class_changed else 0


if __name__ == "__main__":
    sys.exit(main())
