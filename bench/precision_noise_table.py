#!/usr/bin/env python3
"""The four settings across precisions: one ditto-experiment run folder per precision, one table.

    precision_noise_table.py fp32=RUN_DIR bf16=RUN_DIR ... [--out TABLE.md]

Each RUN_DIR is a finished `ditto-experiment --settings ...` folder (its report.csv). Per precision
and setting: mean and standard deviation of test top-1, churn with its 95% interval, weight L2
distance, how many distinct final weights the replicas ended with, and seconds per epoch; below,
per precision, the churn decomposition (ALGO+IMPL against ALGO and IMPL alone). The question it
answers: does computing in reduced precision change how much the tooling's noise moves a model?

Standard library only (and bench/jsonl_records.py beside it).
"""
import argparse
import csv
import os
import sys

from jsonl_records import emit, labelled

SETTINGS = ["ALGO+IMPL", "ALGO", "IMPL", "IMPL-ATOMIC", "CONTROL"]
DECOMPOSITION = ["excess", "additive", "interaction"]


def read_report(folder):
    """{(setting, metric): (value, low, high)} from FOLDER/report.csv; DataError-style exit on a bad file."""
    path = os.path.join(folder, "report.csv")
    rows = {}
    try:
        with open(path, newline="") as f:
            for i, row in enumerate(csv.DictReader(f)):
                try:
                    value = float(row["value"])
                except (KeyError, TypeError, ValueError):
                    sys.exit(f"{path}: row {i + 2} has no numeric value: {row}")
                low = row.get("ci_low") or ""
                high = row.get("ci_high") or ""
                rows[(row["setting"], row["metric"])] = (value, float(low) if low else None, float(high) if high else None)
    except OSError as e:
        sys.exit(f"{path}: {e.strerror}")
    if not rows:
        sys.exit(f"{path}: no rows")
    return rows


def pct(v):
    return "" if v is None else f"{100 * v:.2f}%"


def table(runs):
    """runs: [(precision, rows)] -> markdown lines."""
    out = ["| precision | setting | top-1 (mean) | std | churn [95% CI] | weight L2 | distinct weights | s/epoch |",
           "|---|---|---:|---:|---:|---:|---:|---:|"]
    for precision, rows in runs:
        for s in SETTINGS:
            if (s, "accuracy_mean") not in rows:
                continue
            get = lambda m: rows.get((s, m), (None, None, None))
            churn, lo, hi = get("churn")
            ci = f" [{100 * lo:.2f}, {100 * hi:.2f}]" if lo is not None and hi is not None else ""
            l2 = get("weight_l2")[0]
            distinct = get("distinct_fingerprints")[0]
            secs = get("seconds_per_epoch")[0]
            out.append(f"| {precision} | {s} | {pct(get('accuracy_mean')[0])} | {pct(get('accuracy_std')[0])} | "
                       f"{pct(churn)}{ci} | {'' if l2 is None else f'{l2:.3g}'} | "
                       f"{'' if distinct is None else int(distinct)} | {'' if secs is None else f'{secs:.2f}'} |")
    out += ["", "churn decomposition:", "", "| precision | " + " | ".join(DECOMPOSITION) + " |", "|---|" + "---:|" * len(DECOMPOSITION)]
    for precision, rows in runs:
        cells = []
        for m in DECOMPOSITION:
            if ("decomposition:churn", m) not in rows:
                cells.append("")
                continue
            v, lo, hi = rows[("decomposition:churn", m)]
            cells.append(f"{100 * v:.2f}%" + (f" [{100 * lo:.2f}, {100 * hi:.2f}]" if lo is not None else ""))
        out.append(f"| {precision} | " + " | ".join(cells) + " |")
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", metavar="PRECISION=RUN_DIR", type=lambda t: labelled(t, "PRECISION=RUN_DIR"))
    ap.add_argument("--out", help="write the table here (write, then rename); stdout otherwise")
    a = ap.parse_args(argv)
    runs = [(precision, read_report(folder)) for precision, folder in a.runs]
    emit("\n".join(table(runs)) + "\n", a.out)


if __name__ == "__main__":
    main()
