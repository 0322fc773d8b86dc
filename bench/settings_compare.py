#!/usr/bin/env python3
"""The four settings in two code bases, side by side: ditto-experiment's report.csv and
bench/peers/torch_settings.py's (the same metric names), one row per setting and code base.

    python3 bench/settings_compare.py --ditto DIR/report.csv --torch DIR/report.csv --out compare.md

Columns: churn with its 95% interval (over test examples) and the range of its replica pairs (how far
the replicas drawn move it), not-all-agree, accuracy mean and std, weight L2 and the number of
distinct final weights. The paper's settings come first, then any other setting either side has (a
custom ditto-experiment --setting such as IMPL-pytorch); one a side lacks is shown as missing there.
Standard library only.
"""
import argparse
import csv
import sys

METRICS = ("churn", "churn_pair_min", "disagreement", "accuracy_mean", "accuracy_std", "weight_l2",
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
    if metric == "disagreement":
        return f"{100 * value:.2f}%"
    if metric == "accuracy_mean":
        std = rep.get((setting, "accuracy_std"))
        return f"{value:.4f}" + (f" ± {std[0]:.4f}" if std and std[0] is not None else "")
    if metric == "distinct_fingerprints":
        return f"{int(value)}"
    return f"{value:.4g}"


def table(ditto, torch):
    present = [s for d in (ditto, torch) for (s, m) in d if m in METRICS]
    settings = [s for s in ORDER if s in present]
    settings += [s for s in dict.fromkeys(present) if s not in settings]
    lines = ["| setting | code base | churn [95% CI] | replica pairs | not-all-agree | top-1 mean ± std | weight L2 "
             "| distinct weights |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for s in settings:
        for name, rep in (("ditto", ditto), ("PyTorch", torch)):
            lines.append(f"| {s} | {name} | " + " | ".join(cell(rep, s, m) for m in METRICS if m != "accuracy_std") + " |")
    return lines


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ditto", required=True, help="ditto-experiment's report.csv")
    ap.add_argument("--torch", required=True, help="torch_settings.py's report.csv")
    ap.add_argument("--out", help="write the table here (default: print it)")
    args = ap.parse_args(argv)
    lines = table(read(args.ditto), read(args.torch))
    text = "\n".join(lines) + "\n"
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main()
