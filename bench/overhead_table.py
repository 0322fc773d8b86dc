#!/usr/bin/env python3
r"""The cost of determinism per model (the paper's figure 6): ditto's bench/overhead against the
PyTorch peer bench/peers/torch_overhead.py, as markdown tables and an SVG bar chart.

Reads JSON-lines files (lines with "tool": "ditto" or "pytorch"; others are skipped with a note on
stderr; a line without a precision is fp32; when a (tool, model, mode, precision) repeats, the last
line read wins) and writes:
  1. a header: GPU, dates, ditto commit, torch / torchvision / cuDNN versions;
  2. the main table, one row per model and precision: ditto's median ms/step under heuristic, fastest,
     deterministic, deterministic-tuned and nondeterministic; deterministic / heuristic,
     deterministic / fastest and deterministic-tuned / fastest; PyTorch's default and
     deterministic ms (marked "w" where strict mode raised and the run is warn_only) and their
     ratio; ditto deterministic / PyTorch deterministic; peak memory (GiB) of ditto deterministic
     and PyTorch deterministic. A failed cell reads OOM or err (the errors are listed below);
  3. per model and precision: ditto deterministic / ditto fastest, ditto deterministic / PyTorch
     default in that precision (AMP for bf16 and fp16), and peak memory ditto deterministic /
     PyTorch default (bench/precision_compare.py);
  4. which op pays for determinism: per model, precision and op kind, ms per step of deterministic minus
     fastest (from ditto's profiled steps; linear = fwd + bwd, pool, batchnorm, bias, activation
     and loss likewise), and the op kind that pays most;
  5. the convolution algorithms behind it: per model, precision and direction, ms per step per
     algorithm under deterministic and under fastest;
  6. --svg: grouped bars per model (and precision, other than fp32): ditto deterministic / fastest,
     ditto deterministic-tuned / fastest, PyTorch deterministic / default, with a line at 1
     (hand-written SVG).

  python3 bench/overhead_table.py overhead.jsonl torch_overhead.jsonl --out overhead.md --svg overhead.svg

Standard library only.
"""
import argparse
import sys
from xml.sax.saxutils import escape

from jsonl_records import iter_records
from precision_compare import Row, note_lines, precision_of, precision_rank, table_lines

MODEL_ORDER = ["vgg16", "vgg19", "resnet34", "resnet50", "resnet101", "resnet152", "densenet121", "densenet169",
               "densenet201", "mobilenet", "mobilenet-v2", "efficientnet-b0", "inception-v3", "xception",
               "mediumcnn-k1", "mediumcnn-k3", "mediumcnn-k5", "mediumcnn-k7"]
DITTO_MODES = ["heuristic", "fastest", "deterministic", "deterministic-tuned", "nondeterministic"]
KIND_GROUPS = [("conv.fwd", ["conv.fwd"]), ("conv.bwd_data", ["conv.bwd_data"]),
               ("conv.bwd_filter", ["conv.bwd_filter"]), ("linear", ["linear.fwd", "linear.bwd"]),
               ("pool", ["pool.fwd", "pool.bwd"]), ("batchnorm", ["batchnorm.fwd", "batchnorm.bwd"]),
               ("bias", ["bias.fwd", "bias.bwd"]), ("activation", ["activation.fwd", "activation.bwd"]),
               ("loss", ["loss.fwd", "loss.bwd"]), ("optimizer", ["optimizer"]), ("other", ["other"])]
ERROR_WIDTH = 160


def load(paths):
    """{(tool, model, mode, precision): record}, the last line winning in its own reading position."""
    records = {}
    for path, lineno, rec in iter_records(paths):
        if rec["tool"] not in ("ditto", "pytorch"):
            print(f"{path}:{lineno}: tool {rec['tool']!r}, skipped", file=sys.stderr)
            continue
        key = (rec["tool"], rec["model"], rec["mode"], precision_of(rec))
        records.pop(key, None)
        records[key] = rec
    return records


def models_of(records):
    seen = {k[1] for k in records}
    return [m for m in MODEL_ORDER if m in seen] + sorted(seen - set(MODEL_ORDER))


def model_precisions(records, models):
    """(model, precision) in table order: the models' order, then fp32, tf32, bf16, fp16."""
    have = {(k[1], k[3]) for k in records}
    return [(m, p) for m in models for p in sorted({p for mm, p in have if mm == m}, key=precision_rank)]


def get(records, tool, model, mode, precision="fp32"):
    return records.get((tool, model, mode, precision))


def ok(rec):
    return rec is not None and not rec.get("error") and isinstance(rec.get("ms_median"), (int, float))


def ms(records, tool, model, mode, precision="fp32"):
    rec = get(records, tool, model, mode, precision)
    return float(rec["ms_median"]) if ok(rec) else None


def ratio(a, b):
    return a / b if a is not None and b not in (None, 0) else None


def fmt_ms(v):
    return "–" if v is None else (f"{v:.1f}" if v >= 10 else f"{v:.2f}")


def fmt_ratio(v):
    return "–" if v is None else f"{v:.2f}×"


def fmt_gib(rec):
    if not ok(rec) or rec.get("peak_mem_bytes") in (None, 0):
        return "–"
    return f"{rec['peak_mem_bytes'] / 2**30:.1f}"


class Cells:
    """Formats a record's cell and remembers its error for the list under the table."""

    def __init__(self):
        self.errors = []

    def ms(self, records, tool, model, mode, precision, mark_warn_only=False):
        rec = get(records, tool, model, mode, precision)
        if rec is None:
            return "–"
        if not ok(rec):
            err = str(rec.get("error") or "no time")
            self.errors.append((tool, model, mode, precision, err))
            if rec.get("skipped"):
                return "skipped"
            return "OOM" if rec.get("oom") else "err"
        text = fmt_ms(float(rec["ms_median"]))
        if mark_warn_only and rec.get("warn_only"):
            text += " w"
        return text


def header(records):
    def distinct(field, tool=None):
        vals = []
        for (t, _, _, _), rec in records.items():
            if tool and t != tool:
                continue
            v = rec.get(field)
            if v not in (None, "") and str(v) not in vals:
                vals.append(str(v))
        return ", ".join(vals) or "?"

    return [
        "# The cost of determinism per model",
        "",
        f"GPU: {distinct('gpu')} · date: {distinct('date')} · ditto commit: {distinct('commit', 'ditto')} · "
        f"cuDNN (ditto): {distinct('cudnn', 'ditto')} · torch: {distinct('torch', 'pytorch')} · torchvision: "
        f"{distinct('torchvision', 'pytorch')} · cuDNN (torch): {distinct('cudnn', 'pytorch')}",
        "",
        f"Precisions: {', '.join(sorted({k[3] for k in records}, key=precision_rank))}. fp32: FMA (TF32 off in "
        "both); tf32: TF32 on in both; bf16, fp16: ditto's rule `*.precision=VALUE` against PyTorch's automatic "
        f"mixed precision. SGD momentum 0.9, synthetic data, batch {distinct('batch')}, images "
        f"{distinct('image_size')} px, {distinct('classes')} classes, eager; median of {distinct('steps')} timed "
        f"steps after {distinct('warmup')} warm-up steps. Peak memory: ditto's context pool high-water mark, "
        "PyTorch's max_memory_allocated, both over the timed steps.",
        "",
    ]


def main_table(records, models):
    cells = Cells()
    lines = ["## ms per step and overhead ratios", "",
             "| model | precision | heuristic | fastest | det | det-tuned | nondet | det ÷ heur | det ÷ fastest | "
             "tuned ÷ fastest | torch default | torch det | torch det ÷ default | ditto det ÷ torch det | "
             "peak GiB ditto det | peak GiB torch det |",
             "|---|---|" + "---:|" * 14]
    for m, p in model_precisions(records, models):
        row = [m, p] + [cells.ms(records, "ditto", m, mode, p) for mode in DITTO_MODES]
        heur, fast = ms(records, "ditto", m, "heuristic", p), ms(records, "ditto", m, "fastest", p)
        det, tuned = ms(records, "ditto", m, "deterministic", p), ms(records, "ditto", m, "deterministic-tuned", p)
        tdef, tdet = ms(records, "pytorch", m, "default", p), ms(records, "pytorch", m, "deterministic", p)
        row += [fmt_ratio(ratio(det, heur)), fmt_ratio(ratio(det, fast)), fmt_ratio(ratio(tuned, fast))]
        row += [cells.ms(records, "pytorch", m, "default", p), cells.ms(records, "pytorch", m, "deterministic", p, True)]
        row += [fmt_ratio(ratio(tdet, tdef)), fmt_ratio(ratio(det, tdet))]
        row += [fmt_gib(get(records, "ditto", m, "deterministic", p)), fmt_gib(get(records, "pytorch", m, "deterministic", p))]
        lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    strict = [(m, p, rec.get("strict_error")) for (t, m, mode, p), rec in records.items()
              if t == "pytorch" and mode == "deterministic" and rec.get("strict_error")]
    if strict:
        lines.append("w: PyTorch's strict deterministic mode raised (an op without a deterministic implementation); "
                     "the time is of a warn_only run, in which that op stays nondeterministic:")
        lines.append("")
    for m, p, err in strict:
        lines.append(f"- {m} {p}: {escape_md(shorten(err))}")
    if cells.errors:
        lines += ["", "Failed or skipped:", ""]
        for tool, m, mode, p, err in cells.errors:
            lines.append(f"- {tool} {m} {mode} {p}: {escape_md(shorten(err))}")
    lines.append("")
    return lines


def peak_bytes(records, tool, model, mode, precision):
    rec = get(records, tool, model, mode, precision)
    return rec["peak_mem_bytes"] if ok(rec) and rec.get("peak_mem_bytes") else None


def precision_lines(records, models):
    """Per model and precision: ditto deterministic against ditto fastest and PyTorch default, time and memory."""
    rows = []
    for m, p in model_precisions(records, models):
        row = Row(m, p, ms(records, "ditto", m, "deterministic", p), ms(records, "ditto", m, "fastest", p),
                  ms(records, "pytorch", m, "default", p), peak_bytes(records, "ditto", m, "deterministic", p),
                  peak_bytes(records, "pytorch", m, "default", p))
        if any(v is not None for v in (row.det, row.fastest, row.torch_default)):
            rows.append(row)
    if not rows:
        return ["No model has a ditto deterministic, ditto fastest or PyTorch default step."]
    return table_lines(rows, fmt_ms) + note_lines(((k[0], rec) for k, rec in records.items()),
                                                  "Peak memory over the timed steps.")


def shorten(text, width=ERROR_WIDTH):
    text = " ".join(str(text).split())
    return text if len(text) <= width else text[: width - 1] + "…"


def escape_md(text):
    return text.replace("|", "\\|")


def kind_ms(rec, kinds):
    b = rec.get("breakdown_ms") or {}
    return sum(float(b.get(k, 0.0)) for k in kinds)


def breakdown_table(records, models):
    lines = ["## Which op pays for determinism", "",
             "ms per step, deterministic minus fastest, from ditto's profiled steps (CUDA events around each op's "
             "launch; the time between ops is \"other\"). Positive: determinism costs time there.", "",
             "| model | precision | " + " | ".join(k for k, _ in KIND_GROUPS) + " | Δ profiled | Δ median | pays most |",
             "|---|---|" + "---:|" * (len(KIND_GROUPS) + 3)]
    any_row = False
    for m, p in model_precisions(records, models):
        det, fast = get(records, "ditto", m, "deterministic", p), get(records, "ditto", m, "fastest", p)
        if not (ok(det) and ok(fast) and det.get("breakdown_ms") and fast.get("breakdown_ms")):
            continue
        any_row = True
        deltas = [(k, kind_ms(det, kinds) - kind_ms(fast, kinds)) for k, kinds in KIND_GROUPS]
        top = max(deltas, key=lambda kv: kv[1])
        row = [m, p] + [f"{d:+.2f}" for _, d in deltas]
        row += [f"{float(det.get('profile_ms', 0)) - float(fast.get('profile_ms', 0)):+.2f}",
                f"{float(det['ms_median']) - float(fast['ms_median']):+.2f}",
                top[0] if top[1] > 0.01 else "–"]
        lines.append("| " + " | ".join(row) + " |")
    if not any_row:
        lines.append("| (no model has both a deterministic and a fastest breakdown) |" + " |" * (len(KIND_GROUPS) + 4))
    lines.append("")
    return lines


def algo_summary(rec, kind):
    parts = [(e["variant"] or "–", float(e["ms"])) for e in rec.get("breakdown") or [] if e.get("kind") == kind]
    parts.sort(key=lambda p: -p[1])
    return ", ".join(f"{v} {t:.1f}" for v, t in parts) or "–"


def algo_table(records, models):
    lines = ["## Convolution algorithms behind it", "",
             "ms per step per cuDNN algorithm (profiled), deterministic | fastest.", "",
             "| model | precision | direction | deterministic | fastest |", "|---|---|---|---|---|"]
    for m, p in model_precisions(records, models):
        det, fast = get(records, "ditto", m, "deterministic", p), get(records, "ditto", m, "fastest", p)
        if not (ok(det) and ok(fast)):
            continue
        for kind in ("conv.fwd", "conv.bwd_data", "conv.bwd_filter"):
            lines.append(f"| {m} | {p} | {kind} | {algo_summary(det, kind)} | {algo_summary(fast, kind)} |")
    lines.append("")
    return lines


SERIES = [("ditto deterministic ÷ fastest", "#1f77b4"), ("ditto deterministic-tuned ÷ fastest", "#9ecae1"),
          ("PyTorch deterministic ÷ default", "#ff7f0e")]


def chart_values(records, models):
    """[(label, values)] per model and precision; the label names the precision unless it is fp32."""
    rows = []
    for m, p in model_precisions(records, models):
        fast = ms(records, "ditto", m, "fastest", p)
        vals = [ratio(ms(records, "ditto", m, "deterministic", p), fast),
                ratio(ms(records, "ditto", m, "deterministic-tuned", p), fast),
                ratio(ms(records, "pytorch", m, "deterministic", p), ms(records, "pytorch", m, "default", p))]
        if any(v is not None for v in vals):
            rows.append((m if p == "fp32" else f"{m} {p}", vals))
    return rows


def svg_chart(records, models):
    rows = chart_values(records, models)
    left, top, plot_h, group_w, bar_w = 60, 40, 260, 64, 16
    width = max(left + max(1, len(rows)) * group_w + 20, left + 230 * len(SERIES))
    height = top + plot_h + 110
    vmax = max([v for _, vals in rows for v in vals if v is not None] + [1.0])
    vmax = max(1.5, (int(vmax * 2) + 1) / 2)  # round up to a half

    def y(v):
        return top + plot_h - v / vmax * plot_h

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{left}" y="20" font-size="14">Cost of determinism: step time ratio per model</text>']
    tick = 0.5 if vmax <= 4 else 1.0
    t = 0.0
    while t <= vmax + 1e-9:
        out.append(f'<line x1="{left}" x2="{width - 10}" y1="{y(t):.1f}" y2="{y(t):.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{left - 6}" y="{y(t) + 4:.1f}" text-anchor="end">{t:g}</text>')
        t += tick
    out.append(f'<line x1="{left}" x2="{width - 10}" y1="{y(1):.1f}" y2="{y(1):.1f}" stroke="black" '
               'stroke-dasharray="4 3"/>')
    for i, (m, vals) in enumerate(rows):
        x0 = left + i * group_w + (group_w - bar_w * len(vals)) / 2
        for j, v in enumerate(vals):
            if v is None:
                continue
            x = x0 + j * bar_w
            out.append(f'<rect x="{x:.1f}" y="{y(v):.1f}" width="{bar_w - 2}" height="{y(0) - y(v):.1f}" '
                       f'fill="{SERIES[j][1]}"><title>{escape(m)} {escape(SERIES[j][0])}: {v:.2f}</title></rect>')
        cx = left + i * group_w + group_w / 2
        out.append(f'<text x="{cx:.1f}" y="{top + plot_h + 14}" text-anchor="end" '
                   f'transform="rotate(-40 {cx:.1f} {top + plot_h + 14})">{escape(m)}</text>')
    ly = height - 22
    for j, (name, color) in enumerate(SERIES):
        lx = left + j * 230
        out.append(f'<rect x="{lx}" y="{ly - 9}" width="10" height="10" fill="{color}"/>')
        out.append(f'<text x="{lx + 14}" y="{ly}">{escape(name)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("jsonl", nargs="+", help="bench/overhead and bench/peers/torch_overhead.py output")
    ap.add_argument("--out", help="markdown file (default: stdout)")
    ap.add_argument("--svg", help="also write the bar chart here")
    args = ap.parse_args()
    records = load(args.jsonl)
    if not records:
        sys.exit("overhead_table.py: no records")
    models = models_of(records)
    lines = (header(records) + main_table(records, models)
             + ["## Precisions: ditto deterministic against ditto fastest and PyTorch default", ""]
             + precision_lines(records, models) + [""] + breakdown_table(records, models) + algo_table(records, models))
    if args.svg:
        with open(args.svg, "w") as f:
            f.write(svg_chart(records, models))
        lines.append(f"Chart: {args.svg}")
        lines.append("")
    text = "\n".join(lines)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main()
