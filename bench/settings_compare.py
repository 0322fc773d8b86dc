#!/usr/bin/env python3
"""The four settings in two code bases (or any runs), side by side: ditto-experiment's report.csv and
bench/peers/torch_settings.py's (the same metric names), one row per setting and run.

    python3 bench/settings_compare.py --ditto DIR/report.csv --torch DIR/report.csv --out compare.md
    python3 bench/settings_compare.py --run Adam=DIR/report.csv --run SGD=DIR/report.csv

--ditto and --torch are the runs labelled ditto and PyTorch; --run LABEL=PATH adds a run under its own
label (an optimizer, a precision), in the order given.

Columns: churn with its 95% interval (over test examples), the range of its replica pairs (how far
the replicas drawn move it) and its interval for another draw of replicas (churn_replicas: the
jackknife over replicas, from three on), not-all-agree, accuracy mean and std, weight L2 and the number of
distinct final weights. The paper's settings come first, then any other setting either side has (a
custom ditto-experiment --setting such as IMPL-pytorch); one a side lacks is shown as missing there.
Standard library only (and bench/jsonl_records.py beside it).
"""
import argparse
import csv

from jsonl_records import emit, labelled

METRICS = ("churn", "churn_pair_min", "churn_replicas", "disagreement", "accuracy_mean", "accuracy_std", "weight_l2",
           "distinct_fingerprints")
ORDER = ("ALGO+IMPL", "ALGO", "IMPL", "IMPL-ATOMIC", "CONTROL")


def read(path):
    """{(setting, metric): (value, low, high)} of a report.csv (ditto's columns ci_low / ci_high)."""
    out = {}
    with open(path) as f:
        for r in csv.DictReader(f):
            def num(k):
                v = r.get(k)
                return float(v) if v not in ("", None) else None
            out[(r["setting"], r["metric"])] = (num("value"), num("ci_low"), num("ci_high"))
    return out


def cell(rep, setting, metric):
    v = rep.get((setting, metric))
    if v is None or v[0] is None:
        return "–"
    value, lo, hi = v
    if metric == "churn":
        return f"{100 * value:.2f}%" + (f" [{100 * lo:.2f}, {100 * hi:.2f}]" if lo is not None and hi is not None else "")
    if metric == "churn_pair_min":
        top = rep.get((setting, "churn_pair_max"))
        return f"{100 * value:.2f}–{100 * top[0]:.2f}%" if top and top[0] is not None else "–"
    if metric == "churn_replicas":
        return f"[{100 * lo:.2f}, {100 * hi:.2f}]" if lo is not None and hi is not None else "–"
    if metric == "disagreement":
        return f"{100 * value:.2f}%"
    if metric == "accuracy_mean":
        std = rep.get((setting, "accuracy_std"))
        return f"{value:.4f}" + (f" ± {std[0]:.4f}" if std and std[0] is not None else "")
    if metric == "distinct_fingerprints":
        return f"{int(value)}"
    return f"{value:.4g}"


def table(*runs, column="code base"):
    """Rows of the side-by-side table. runs: (label, report) pairs, or the two reports ditto and PyTorch."""
    if runs and not isinstance(runs[0], tuple):
        runs = (("ditto", runs[0]), ("PyTorch", runs[1]))
    present = [s for _, d in runs for (s, m) in d if m in METRICS]
    settings = [s for s in ORDER if s in present]
    settings += [s for s in dict.fromkeys(present) if s not in settings]
    lines = [f"| setting | {column} | churn [95% CI] | replica pairs | over replicas [95%] | not-all-agree "
             "| top-1 mean ± std | weight L2 | distinct weights |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for s in settings:
        for name, rep in runs:
            lines.append(f"| {s} | {name} | " + " | ".join(cell(rep, s, m) for m in METRICS if m != "accuracy_std") + " |")
    return lines




def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ditto", help="ditto-experiment's report.csv (the run labelled ditto)")
    ap.add_argument("--torch", help="torch_settings.py's report.csv (the run labelled PyTorch)")
    ap.add_argument("--run", type=labelled, action="append", default=[], metavar="LABEL=PATH",
                    help="a report.csv under its own label (repeatable)")
    ap.add_argument("--column", help="the label column's heading (default: code base, or run with --run)")
    ap.add_argument("--out", help="write the table here (default: print it)")
    args = ap.parse_args(argv)
    runs = [(label, path) for label, path in (("ditto", args.ditto), ("PyTorch", args.torch)) if path] + args.run
    if len(runs) < 2:
        ap.error("give at least two reports: --ditto and --torch, or --run LABEL=PATH")
    column = args.column or ("run" if args.run else "code base")
    lines = table(*[(label, read(path)) for label, path in runs], column=column)
    emit("\n".join(lines) + "\n", args.out)


if __name__ == "__main__":
    main()
