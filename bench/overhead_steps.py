#!/usr/bin/env python3
r"""How many timed steps the overhead benchmark needs: the same (tool, model, mode, precision)
measured with different --steps (the paper profiled 100 iterations; earlier tables used 10), side by side.

Reads bench/overhead and bench/peers/torch_overhead.py JSON-lines files (any mix; a record's
"steps" says how many steps it timed; a record without a precision is fp32; failed records are
skipped; when a (tool, model, mode, precision, steps) repeats, the last line read wins) and prints a
markdown table, one row per (tool, model, mode, precision) measured at two or more step counts: for each count the median ms per step and its
spread (p90 - p10) / median, then the change of the median from the fewest to the most steps,
and at the foot the median over rows of that change and of each count's spread.

  python3 bench/overhead_steps.py results-10/overhead.jsonl results-100/overhead.jsonl \
      results-10/torch_overhead.jsonl results-100/torch_overhead.jsonl --out overhead_steps.md

Standard library only.
"""
import argparse
import statistics
import sys

from jsonl_records import iter_records
from precision_compare import precision_of


def load(paths):
    """{(tool, model, mode, precision, steps): record} of the successful records."""
    runs = {}
    for path, lineno, rec in iter_records(paths):
        if "error" in rec or "ms_median" not in rec or "steps" not in rec:
            continue
        runs[(rec["tool"], rec["model"], rec["mode"], precision_of(rec), int(rec["steps"]))] = rec
    return runs


def spread(rec):
    if rec.get("ms_p10") is None or rec.get("ms_p90") is None or not rec["ms_median"]:
        return None
    return (rec["ms_p90"] - rec["ms_p10"]) / rec["ms_median"]


def table(runs):
    counts = sorted({k[4] for k in runs})
    keys = sorted({k[:4] for k in runs})
    head = "| tool | model | mode | precision | " + " | ".join(f"median ms @{c} | spread @{c}" for c in counts)
    head += f" | median @{counts[-1] if counts else '?'} vs @{counts[0] if counts else '?'} |"
    lines = [head, "|" + "---|" * (4 + 2 * len(counts) + 1)]
    changes, spreads = [], {c: [] for c in counts}
    for key in keys:
        have = [c for c in counts if (*key, c) in runs]
        if len(have) < 2:
            continue
        cells = []
        for c in counts:
            rec = runs.get((*key, c))
            if rec is None:
                cells += ["—", "—"]
                continue
            s = spread(rec)
            if s is not None:
                spreads[c].append(s)
            cells += [f"{rec['ms_median']:.3f}", "—" if s is None else f"{100 * s:.1f}%"]
        first, last = runs[(*key, have[0])], runs[(*key, have[-1])]
        change = last["ms_median"] / first["ms_median"] - 1
        changes.append(change)
        lines.append("| " + " | ".join(key) + " | " + " | ".join(cells) + f" | {100 * change:+.1f}% |")
    if not changes:
        return None
    foot = [f"median over rows: change of the median {100 * statistics.median(changes):+.1f}%"]
    for c in counts:
        if spreads[c]:
            foot.append(f"spread @{c} {100 * statistics.median(spreads[c]):.1f}%")
    return "\n".join(lines) + "\n\n" + "; ".join(foot) + ".\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", help="JSON-lines files of bench/overhead and torch_overhead.py")
    ap.add_argument("--out", help="write the markdown here as well")
    args = ap.parse_args()
    text = table(load(args.files))
    if text is None:
        sys.exit("overhead_steps: no (tool, model, mode, precision) was measured at two step counts")
    print(text, end="")
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
