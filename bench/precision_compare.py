"""What the step-time and overhead tables share about precisions (bench/step_time_table.py,
bench/overhead_table.py, scripts/render_docs.py).

A record's precision is its "precision" field. Lines written before the benchmarks had precisions
carry none and ran in fp32, except bench/step_time's former modes "tf32" and "tf32-deterministic"
and the PyTorch peer's modes of those names, which ran TF32 math and so read as tf32.

The comparison table: per model and precision (and, for step times, eager or graphed), ditto's
deterministic step against ditto's fastest in the same precision, against PyTorch's default mode in
that precision (automatic mixed precision for bf16 and fp16: autocast, channels-last, GradScaler for
fp16), and the peak memory of ditto's deterministic step against PyTorch's default one.

Standard library only.
"""

PRECISION_ORDER = ["fp32", "tf32", "bf16", "fp16"]
TF32_MODES = ("tf32", "tf32-deterministic")

HEADER = ["model", "precision", "ditto det ms", "ditto fastest ms", "det ÷ fastest", "PyTorch default ms",
          "ditto det ÷ PyTorch default", "peak MiB ditto det", "peak MiB PyTorch default", "peak ditto ÷ PyTorch"]


def precision_of(rec):
    """The record's precision; see the module comment for lines without one."""
    value = rec.get("precision")
    if value:
        return str(value)
    return "tf32" if rec.get("mode") in TF32_MODES else "fp32"


def precision_rank(precision):
    return (PRECISION_ORDER.index(precision), "") if precision in PRECISION_ORDER else (len(PRECISION_ORDER), precision)


def ratio(a, b):
    return a / b if a is not None and b else None


def fmt_ratio(v):
    return "–" if v is None else f"{v:.2f}×"


def fmt_mib(v):
    if v is None:
        return "–"
    mib = v / 2**20
    return f"{mib:.0f}" if mib >= 100 else f"{mib:.1f}"


class Row:
    """One row of the comparison: ms per step (None where missing or failed) and peak bytes (None
    where not comparable, e.g. a graphed step, whose temporaries are the graph's own memory)."""

    def __init__(self, model, precision, det, fastest, torch_default, det_peak=None, torch_peak=None, setting=None):
        self.model, self.precision, self.setting = model, precision, setting
        self.det, self.fastest, self.torch_default = det, fastest, torch_default
        self.det_peak, self.torch_peak = det_peak, torch_peak

    def cells(self, fmt_ms):
        first = [self.model, self.precision] + ([self.setting] if self.setting is not None else [])
        return first + [fmt_ms(self.det), fmt_ms(self.fastest), fmt_ratio(ratio(self.det, self.fastest)),
                        fmt_ms(self.torch_default), fmt_ratio(ratio(self.det, self.torch_default)),
                        fmt_mib(self.det_peak), fmt_mib(self.torch_peak),
                        fmt_ratio(ratio(self.det_peak, self.torch_peak))]


def table_lines(rows, fmt_ms):
    """The markdown table of the rows (a "setting" column when the rows have one)."""
    with_setting = any(r.setting is not None for r in rows)
    header = HEADER[:2] + (["setting"] if with_setting else []) + HEADER[2:]
    lines = ["| " + " | ".join(header) + " |", "|---|---|" + ("---|" if with_setting else "") + "---:|" * 8]
    lines += ["| " + " | ".join(r.cells(fmt_ms)) + " |" for r in rows]
    return lines


def note_lines(records, memory):
    """The lines under the table: what each precision ran, what the peak memory is (memory), and the
    fp16 records' loss scaling per tool. records: an iterable of (tool, record)."""
    lines = ["", "In each precision: ditto's modes under the rule `*.precision=VALUE`; PyTorch's default mode with "
             "TF32 off (fp32), on (tf32), or automatic mixed precision (bf16, fp16: autocast, channels-last, "
             f"GradScaler for fp16). {memory}"]
    seen = {}
    for tool, rec in records:
        if precision_of(rec) == "fp16" and not rec.get("error"):
            value = str(rec.get("loss_scale") or "not recorded")
            if value not in seen.setdefault(tool, []):
                seen[tool].append(value)
    if seen:
        lines.append("fp16 loss scaling: " + "; ".join(f"{tool}: {', '.join(v)}" for tool, v in seen.items()) + ".")
    return lines
