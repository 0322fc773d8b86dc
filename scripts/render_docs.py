#!/usr/bin/env python3
r"""Renders the measured numbers of README.md and docs/determinism.md from the committed results.

Each doc holds regions between marker lines

    <!-- generated:NAME begin -->
    ...
    <!-- generated:NAME end -->

whose text this script writes from the JSON, JSON-lines and CSV files under bench/results/ (a line
inside each region names them). Everything outside the regions is left as it is.

    scripts/render_docs.py --write   # rewrite the regions in place (write a temporary file, then rename)
    scripts/render_docs.py --check   # exit 1 and print a diff where a committed doc differs

A region in a doc without a renderer, or a renderer whose region is missing, is an error: a table
cannot be dropped or left behind silently. Standard library only; reuses bench/'s table scripts.
"""
import argparse
import csv
import difflib
import json
import os
import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import overhead_steps  # noqa: E402
import overhead_table  # noqa: E402
import settings_compare  # noqa: E402
import step_time_table  # noqa: E402

RESULTS = ROOT / "bench" / "results"
ZOO = RESULTS / "2026-11-24-h100-zoo"
ZOO_BEFORE = RESULTS / "2026-11-23-h100-zoo"
SPEED_BEFORE = RESULTS / "2026-11-22-h100-speed"
NOISE_LAB = RESULTS / "2026-11-22-h100-noise-lab"
TASKS = RESULTS / "2026-11-24-h100-tasks"
PROTOCOLS = RESULTS / "2026-11-23-h100-protocols"
PROTOCOLS_FULL = RESULTS / "2026-11-24-h100-protocols"
STUDY = RESULTS / "2026-11-27-h100x4-study"
TASK_OPS_CSV = TASKS / "ops18" / "op_noise.csv"
TASK_OPS_TORCH = [TASKS / "ops18" / "torch_ops18.jsonl", TASKS / "ops18" / "torch_ops18b.jsonl"]

GOAL = 1.2  # a fixed-order variant's time within this factor of its atomic variant's


# ---- small formatting helpers ----

def rel(path):
    return str(Path(path).relative_to(ROOT))


def sources_line(*paths):
    return "<sub>Rendered by `scripts/render_docs.py` from " + ", ".join(f"`{rel(p)}`" for p in paths) + ".</sub>"


def fmt_ms(v):
    if v is None:
        return "–"
    return f"{v:.1f}" if v >= 10 else (f"{v:.2f}" if v >= 1 else f"{v:.3f}")


def fmt_x(v):
    return "–" if v is None else f"{v:.2f}×"


def pct(v, digits=1):
    return "–" if v is None else f"{100 * v:.{digits}f}%"


def ratio(a, b):
    return a / b if a is not None and b else None


def span(values, fmt):
    values = sorted(v for v in values if v is not None)
    if not values:
        return "–"
    lo, hi = fmt(values[0]), fmt(values[-1])
    return lo if lo == hi else f"{lo}–{hi}"


def ratio_span(values):
    return span(values, lambda v: f"{v:.2f}") + "×"


def table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return lines


# ---- step times: bench/step_time and its PyTorch peer ----

def step_data(folder):
    return step_time_table.Data(step_time_table.load([folder / "step_time.jsonl", folder / "torch_step_time.jsonl"]))


STEP_COLUMNS = [("heuristic", "ditto", "heuristic"), ("deterministic", "ditto", "deterministic"),
                ("deterministic + tuning file", "ditto", "deterministic-tuned"), ("fastest", "ditto", "fastest"),
                ("nondeterministic", "ditto", "nondeterministic"), ("PyTorch default", "pytorch", "default"),
                ("PyTorch deterministic", "pytorch", "deterministic")]
STEP_ROWS = [("ResNet-18", "resnet18"), ("SmallCNN", "smallcnn")]


def step_time_rows(data):
    rows = []
    for title, model in STEP_ROWS:
        for graph in (False, True):
            cells = [fmt_ms(data.ms(tool, model, mode, graph)) for _, tool, mode in STEP_COLUMNS]
            rows.append([f"{title}, {'graphed' if graph else 'eager'}"] + cells)
    return rows


def resnet18_tuned(data):
    """ResNet-18's graphed tuned deterministic step against PyTorch's graphed steps and ditto's fastest."""
    tuned = data.ms("ditto", "resnet18", "deterministic-tuned", True)
    return {"tuned": tuned, "fastest": data.ms("ditto", "resnet18", "fastest", True),
            "torch_default": data.ms("pytorch", "resnet18", "default", True),
            "torch_det": data.ms("pytorch", "resnet18", "deterministic", True)}


def render_step_time():
    data, before = step_data(ZOO), step_data(SPEED_BEFORE)
    now, then = resnet18_tuned(data), resnet18_tuned(before)
    header = ["ms per step, batch 128"] + [name for name, _, _ in STEP_COLUMNS]
    sources = sources_line(ZOO / "step_time.jsonl", ZOO / "torch_step_time.jsonl",
                           SPEED_BEFORE / "step_time.jsonl", SPEED_BEFORE / "torch_step_time.jsonl")
    return table(header, step_time_rows(data)) + ["", resnet18_sentence(now, then), "", sources]


def resnet18_sentence(now, then):
    def against(key, what):
        return f"{fmt_x(ratio(now['tuned'], now[key]))} {what} ({fmt_ms(now[key])} ms)"
    torch_default = against("torch_default", "PyTorch's default graphed step")
    torch_det = against("torch_det", "PyTorch's deterministic one")
    fastest = against("fastest", "ditto's `fastest`")
    return (f"Graphed, a tuned deterministic ResNet-18 step takes {fmt_ms(now['tuned'])} ms: {torch_default}, "
            f"{torch_det} and {fastest}. "
            f"On 2026-11-22, before ditto's own convolution backward, the same step took {fmt_ms(then['tuned'])} ms, "
            f"{fmt_x(ratio(then['tuned'], then['fastest']))} ditto's `fastest` ({fmt_ms(then['fastest'])} ms).")


# ---- the cost of determinism per zoo model: bench/overhead and its PyTorch peer ----

def zoo_records(folder, ditto_name, torch_name):
    return overhead_table.load([folder / ditto_name, folder / torch_name])


def zoo_now():
    return zoo_records(ZOO, "overhead-10steps.jsonl", "torch_overhead-10steps.jsonl")


def peak_gib(records, tool, model, mode):
    rec = overhead_table.get(records, tool, model, mode)
    if not overhead_table.ok(rec) or not rec.get("peak_mem_bytes"):
        return None
    return rec["peak_mem_bytes"] / 2**30


class ZooRow:
    """One row of the cost table: ditto's fastest, deterministic and tuned step beside PyTorch's."""

    def __init__(self, name, fastest, det, tuned, torch_default, torch_det, peaks=None, warn_only=False):
        self.name, self.fastest, self.det, self.tuned = name, fastest, det, tuned
        self.torch_default, self.torch_det, self.warn_only = torch_default, torch_det, warn_only
        self.peaks = peaks  # (ditto det, ditto det-tuned, PyTorch default) GiB, or None

    def cells(self):
        peaks = "–" if self.peaks is None else " / ".join("–" if p is None else f"{p:.2f}" for p in self.peaks)
        torch_det = fmt_ms(self.torch_det) + (" (w)" if self.warn_only else "")
        return [self.name, fmt_ms(self.fastest), fmt_ms(self.det), fmt_ms(self.tuned),
                fmt_x(ratio(self.tuned, self.fastest)), fmt_ms(self.torch_default),
                fmt_x(ratio(self.tuned, self.torch_default)), torch_det, fmt_x(ratio(self.tuned, self.torch_det)), peaks]


def zoo_model_rows(records):
    rows = []
    for m in overhead_table.models_of(records):
        def get(tool, mode):
            return overhead_table.ms(records, tool, m, mode)
        torch_det = overhead_table.get(records, "pytorch", m, "deterministic") or {}
        peaks = (peak_gib(records, "ditto", m, "deterministic"), peak_gib(records, "ditto", m, "deterministic-tuned"),
                 peak_gib(records, "pytorch", m, "default"))
        rows.append(ZooRow(m, get("ditto", "fastest"), get("ditto", "deterministic"), get("ditto", "deterministic-tuned"),
                           get("pytorch", "default"), get("pytorch", "deterministic"), peaks,
                           bool(torch_det.get("warn_only"))))
    return rows


def step_time_zoo_rows(data):
    rows = []
    for title, model, graph in (("ResNet-18 CIFAR, graphed", "resnet18", True), ("SmallCNN, graphed", "smallcnn", True),
                                ("SmallCNN, eager", "smallcnn", False)):
        def get(tool, mode):
            return data.ms(tool, model, mode, graph)
        rows.append(ZooRow(title, get("ditto", "fastest"), get("ditto", "deterministic"),
                           get("ditto", "deterministic-tuned"), get("pytorch", "default"), get("pytorch", "deterministic")))
    return rows


ZOO_HEADER = ["model", "ditto fastest", "ditto det", "ditto det-tuned", "tuned ÷ fastest", "PyTorch default",
              "tuned ÷ PyTorch default", "PyTorch det", "tuned ÷ PyTorch det",
              "peak GiB: ditto det / det-tuned / PyTorch default"]


def over_list(rows, limit):
    """'name (1.08×), ...' for the rows whose tuned step is over limit(row), or None when there is none."""
    out = [f"{r.name} ({fmt_x(ratio(r.tuned, limit(r)))})" for r in rows
           if r.tuned is not None and limit(r) is not None and r.tuned > limit(r)]
    return ", ".join(out) or None


def memory_summary(models):
    def over(index):
        out = []
        for r in models:
            mine, theirs = r.peaks[index], r.peaks[2]
            if mine is not None and theirs is not None and mine > theirs:
                out.append(f"{r.name} ({mine:.2f} vs {theirs:.2f} GiB, {100 * (mine / theirs - 1):+.1f}%)")
        return ", ".join(out) or "none"
    return (f"Peak memory above PyTorch's default step: untuned deterministic on {over(0)}; "
            f"with the tuning file on {over(1)}.")


def render_zoo_overhead():
    records, data = zoo_now(), step_data(ZOO)
    models = zoo_model_rows(records)
    rows = step_time_zoo_rows(data) + models
    note = ("(w): PyTorch's strict deterministic mode raised; timed with `warn_only`, so that op stayed "
            "nondeterministic. The first three rows come from `bench/step_time` (100 timed steps), the zoo rows "
            "from `bench/overhead` (10 timed steps).")
    sources = sources_line(ZOO / "overhead-10steps.jsonl", ZOO / "torch_overhead-10steps.jsonl",
                           ZOO / "step_time.jsonl", ZOO / "torch_step_time.jsonl")
    return table(ZOO_HEADER, [r.cells() for r in rows]) + ["", note, "", zoo_summary(rows, models), "", sources]


def within_fastest(r):
    return r.tuned is not None and r.fastest is not None and r.tuned <= 1.05 * r.fastest


def under_torch_default(r):
    return r.tuned is not None and r.torch_default is not None and r.tuned <= r.torch_default


def under_torch_det(r):
    return r.tuned is not None and r.torch_det is not None and r.tuned < r.torch_det


def zoo_summary(rows, models):
    slow = over_list(rows, lambda r: 1.05 * r.fastest if r.fastest else None)
    over_default = over_list(rows, lambda r: r.torch_default)
    return (f"The tuned deterministic step is within 1.05× of ditto's `fastest` on "
            f"{sum(map(within_fastest, rows))} of {len(rows)} rows ({ratio_span(ratio(r.tuned, r.fastest) for r in rows)}"
            f"{'; not on ' + slow if slow else ''}), at or under PyTorch's default (nondeterministic) step on "
            f"{sum(map(under_torch_default, rows))} of {len(rows)}{' (not on ' + over_default + ')' if over_default else ''}"
            f", and under PyTorch's deterministic mode on {sum(map(under_torch_det, models))} of {len(models)} zoo "
            f"models. {memory_summary(models)}")


def other_ms(records, model, mode):
    rec = overhead_table.get(records, "ditto", model, mode)
    return overhead_table.kind_ms(rec, ["other"]) if overhead_table.ok(rec) else None


def slower_than_torch_lines(records):
    """A line per zoo model whose tuned step is slower than PyTorch's default one, with ditto's fastest beside."""
    lines = []
    for r in zoo_model_rows(records):
        if under_torch_default(r) or r.tuned is None or r.torch_default is None:
            continue
        lines.append(f"- {r.name}: the tuned deterministic step is {fmt_x(ratio(r.tuned, r.torch_default))} PyTorch's "
                     f"default, and ditto's own `fastest` already {fmt_x(ratio(r.fastest, r.torch_default))}; the "
                     f"profile of the tuned step puts {fmt_ms(other_ms(records, r.name, 'deterministic-tuned'))} ms "
                     "per step outside the profiled op kinds (\"other\").")
    return lines


def smallcnn_graphed_lines(data):
    tuned = data.ms("ditto", "smallcnn", "deterministic-tuned", True)
    torch_graphed = data.ms("pytorch", "smallcnn", "default", True)
    nondet = data.ms("ditto", "smallcnn", "nondeterministic", True)
    if tuned is None or torch_graphed is None or tuned <= torch_graphed:
        return []
    return [f"- SmallCNN graphed: {fmt_ms(tuned)} ms against PyTorch's graphed {fmt_ms(torch_graphed)} ms "
            f"(ditto's nondeterministic graphed step: {fmt_ms(nondet)} ms)."]


STEP_COUNT_FILES = [ZOO / "overhead-resnet50-100steps.jsonl", ZOO / "torch_overhead-resnet50-100steps.jsonl",
                    ZOO / "overhead-10steps.jsonl", ZOO / "torch_overhead-10steps.jsonl"]


def step_count_line():
    """How far the median moves between 10 and 100 timed steps (bench/overhead_steps.py's pairing)."""
    runs = overhead_steps.load(STEP_COUNT_FILES)
    changes = [abs(rec["ms_median"] / runs[(*key, 10)]["ms_median"] - 1)
               for (*key, steps), rec in runs.items() if steps == 100 and (*key, 10) in runs]
    return (f"- Ten and a hundred timed steps: the median moves by at most {pct(max(changes))} "
            f"({len(changes)} rows: ResNet-50, every mode of both tools; `overhead_steps.md`).")


def render_zoo_not_free():
    records, data = zoo_now(), step_data(ZOO)
    lines = slower_than_torch_lines(records) + smallcnn_graphed_lines(data) + [step_count_line()]
    return lines + ["", sources_line(ZOO / "overhead-10steps.jsonl", ZOO / "torch_overhead-10steps.jsonl",
                                     ZOO / "step_time.jsonl", ZOO / "torch_step_time.jsonl", *STEP_COUNT_FILES[:2])]


def render_zoo_before():
    records = zoo_records(ZOO_BEFORE, "overhead.jsonl", "torch_overhead.jsonl")
    rows = zoo_model_rows(records)
    memory = [ratio(peak_gib(records, "ditto", r.name, "deterministic"), peak_gib(records, "pytorch", r.name, "deterministic"))
              for r in rows]
    return [f"The 2026-11-23 run is the before: on its {len(rows)} zoo models the tuned deterministic step took "
            f"{ratio_span(ratio(r.tuned, r.fastest) for r in rows)} ditto's `fastest`, and ditto's deterministic "
            f"peak memory was {ratio_span(memory)} PyTorch's deterministic one.",
            "", sources_line(ZOO_BEFORE / "overhead.jsonl", ZOO_BEFORE / "torch_overhead.jsonl")]


def render_readme_speed():
    data, records = step_data(ZOO), zoo_now()
    r18 = resnet18_tuned(data)
    models = zoo_model_rows(records)
    within, under_default, under_det = (sum(map(f, models)) for f in (within_fastest, under_torch_default, under_torch_det))
    wall = concurrent_wall_s(SPEED_BEFORE / "concurrent" / "stdout-10.txt")
    over_default = over_list(models, lambda r: r.torch_default)
    return [f"On the H100 a tuned deterministic ResNet-18 step (graphed) takes {fmt_x(ratio(r18['tuned'], r18['torch_default']))} "
            f"the time of PyTorch's default one and {fmt_x(ratio(r18['tuned'], r18['fastest']))} ditto's `fastest`, "
            f"and SmallCNN's 4 settings x 10 replicas x 10 epochs take {wall:.1f} s (10 replicas at a time, graphed, "
            f"with a tuning file). Across the {len(models)} zoo models the tuned deterministic step is within 5% of "
            f"ditto's fastest on {within}, at or under PyTorch's default (nondeterministic) step on {under_default}"
            f"{' (not on ' + over_default + ')' if over_default else ''} and under PyTorch's deterministic mode on "
            f"{under_det} (`docs/determinism.md`, \"What determinism costs per model\").",
            "", sources_line(ZOO / "step_time.jsonl", ZOO / "torch_step_time.jsonl", ZOO / "overhead-10steps.jsonl",
                             ZOO / "torch_overhead-10steps.jsonl", SPEED_BEFORE / "concurrent" / "stdout-10.txt")]


def concurrent_wall_s(path):
    match = re.search(r"in ([0-9.]+) s wall", path.read_text())
    if not match:
        raise ValueError(f"{rel(path)}: no 'in N s wall' line")
    return float(match.group(1))


# ---- precisions: ditto's tf32 / bf16 / fp16 beside PyTorch's (bench/gpu_pipeline.sh step `precision`) ----

def precision_lines(step, zoo):
    """The precision comparison of one `precision` step: step (a step_time_table.Data of bench/step_time and
    its peer) and zoo (overhead_table.load of bench/overhead and its peer)."""
    return (["**CIFAR-10 shapes** (`bench/step_time`, 32×32, eager and graphed)", ""]
            + step_time_table.precision_lines(step)
            + ["", "**Zoo models** (`bench/overhead`, 224×224 / 299×299, eager)", ""]
            + overhead_table.precision_lines(zoo, overhead_table.models_of(zoo)))


def render_precision(folder):
    """A region's lines from a committed results folder of the `precision` step (step_time.jsonl,
    torch_step_time.jsonl, overhead.jsonl, torch_overhead.jsonl). To put it in a doc: a constant for the
    folder beside ZOO, an entry `"precision": lambda: render_precision(FOLDER)` under the doc in DOCS, and
    the region's marker pair in the doc; then --write."""
    zoo_files = [folder / "overhead.jsonl", folder / "torch_overhead.jsonl"]
    return (precision_lines(step_data(folder), overhead_table.load(zoo_files))
            + ["", sources_line(folder / "step_time.jsonl", folder / "torch_step_time.jsonl", *zoo_files)])


# ---- the noise lab's cost line ----

def attribution_rows(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def render_noise_lab_cost():
    resnet, small = NOISE_LAB / "resnet18-confirm" / "attribution.csv", NOISE_LAB / "smallcnn-add-one" / "attribution.csv"

    def baselines(path):
        rows = {r["configuration"]: float(r["ms_per_step"]) for r in attribution_rows(path) if r["kind"] == "baseline"}
        return rows["all-deterministic"], rows["all-nondeterministic"]

    det, nondet = baselines(resnet)
    candidates = [float(r["ms_per_step"]) for r in attribution_rows(resnet) if r["kind"] == "candidate"]
    sdet, snondet = baselines(small)
    return [f"ResNet-18, 3 epochs: all-deterministic {det:.2f} ms/step, all-nondeterministic {nondet:.2f} "
            f"({100 * (det / nondet - 1):+.0f}% for determinism); with one atomic kernel left (the confirmed candidates) "
            f"{span(candidates, lambda v: f'{v:.2f}')} ms/step. SmallCNN: {sdet:.2f} against {snondet:.2f} ms/step.",
            "", sources_line(resnet, small)]


NOISE_LAB_RUNS = [("SmallCNN, add-one (3 replicas x 10 epochs)", "smallcnn-add-one"),
                  ("SmallCNN, leave-one-out (3 replicas x 10 epochs)", "smallcnn-leave-one-out"),
                  ("ResNet-18, add-one screen (2 replicas x 50 steps, 2,000 test images)", "resnet18-screen"),
                  ("ResNet-18, add-one confirmation of the screen's top three (3 replicas x 3 epochs)",
                   "resnet18-confirm")]
LAYER_KINDS = {"conv": "conv", "bn": "batch norm", "pool": "max-pool", "fc": "linear", "loss": "loss"}


def kernel_kind(configuration):
    """'conv bwd_filter=algo0' for 'layer3.0.conv2.bwd_filter=algo0': the op by its layer's name, then the knob."""
    layer, knob = configuration.rsplit(".", 1)
    stem = re.sub(r"[0-9]", "", layer.split(".")[-1])
    return f"{LAYER_KINDS.get(stem, stem)} {knob}"


def early_l2_column(rows):
    """The last early step the run recorded the weight distance at (l2_step100, or the steps it had)."""
    return next(k for k in ("l2_step100", "l2_step50", "l2_step10") if k in rows[0] and any(float(r[k]) for r in rows))


def noise_lab_row(label, rows, early):
    diverged = [r for r in rows if int(r["first_divergence_step"]) == 1]
    def spread(key, fmt):
        return span([float(r[key]) for r in diverged], fmt) if diverged else "–"
    return [label, str(len(rows)), str(len(diverged)), spread("l2_step1", lambda v: f"{v:.2g}"),
            spread(early, lambda v: f"{v:.2g}"), spread("growth_per_step", lambda v: f"{v:.2f}"),
            span([100 * float(r["churn"]) for r in rows], lambda v: f"{v:.1f}")]


def noise_lab_table(folder):
    rows = attribution_rows(NOISE_LAB / folder / "attribution.csv")
    early = early_l2_column(rows)
    kinds = {}
    for r in rows:
        if r["kind"] == "candidate":
            kinds.setdefault(kernel_kind(r["configuration"]), []).append(r)
    body = [noise_lab_row(r["configuration"], [r], early) for r in rows if r["kind"] == "baseline"]
    body += [noise_lab_row(kind, members, early) for kind, members in kinds.items()]
    body += [noise_lab_row(f"group: {r['configuration']}", [r], early) for r in rows if r["kind"] == "group"]
    header = ["configuration (kernel kind: every layer's candidate)", "configurations", "diverge at step 1",
              "weight L2 after step 1", f"after step {early.rsplit('step', 1)[1]}", "growth per step", "churn %"]
    return table(header, body)


def render_noise_lab_tables():
    lines, sources = [], []
    for title, folder in NOISE_LAB_RUNS:
        lines += [f"**{title}**", ""] + noise_lab_table(folder) + [""]
        sources.append(NOISE_LAB / folder / "attribution.csv")
    return lines + ["Ranges over the configurations of a kind that diverge at step 1 (churn: over all of them). "
                    "Add-one turns the kernel on alone in a deterministic step; leave-one-out fixes it alone in a "
                    "nondeterministic one.", "", sources_line(*sources)]


def render_noise_lab_quadrature():
    path = NOISE_LAB / "smallcnn-add-one" / "attribution.csv"
    rows = attribution_rows(path)
    group = next(r for r in rows if r["configuration"] == "all conv2d.bias_bwd=atomic")
    members = [r for r in rows if r["kind"] == "candidate" and r["configuration"] in group["pins"].split()]
    seeds = [float(r["l2_step1"]) for r in members]
    return [f"SmallCNN's {len(members)} conv bias atomics give " + ", ".join(f"{v:.3g}" for v in seeds)
            + f" alone, the group {float(group['l2_step1']):.3g} (√Σ² = {sum(v * v for v in seeds) ** 0.5:.3g}).",
            "", sources_line(path)]


# ---- the paper's four settings: churn and its decomposition ----

SETTINGS_RUNS = [("SmallCNN (CIFAR-10, Adam, 10 epochs, 5 replicas)", PROTOCOLS / "exp-smallcnn"),
                 ("ResNet-18 (CIFAR-10, the 15-epoch recipe, 3 replicas)", STUDY / "exp-resnet18"),
                 ("Keras mnist_cnn (MNIST)", PROTOCOLS / "mnist"),
                 ("ResNet-18 (CelebA Blond_Hair)", PROTOCOLS / "celeba"),
                 ("unet-small (mnist-seg)", TASKS / "unet-small"), ("stn (mnist-rt)", TASKS / "stn"),
                 ("ctc-cnn (mnist-strings)", TASKS / "ctc-cnn"), ("embedding-bag (celeba-attrs)", TASKS / "embedding-bag"),
                 ("ResNet-18 (CIFAR-10, the 15-epoch recipe with Adam)", STUDY / "exp-resnet18-adam"),
                 ("SmallCNN (CIFAR-10, SGD momentum 0.9, 10 epochs, 5 replicas)", STUDY / "exp-optim" / "sgd")]
SETTINGS = ["ALGO+IMPL", "ALGO", "IMPL", "IMPL-ATOMIC", "CONTROL"]


def read_report(folder):
    """{(setting, metric): (value, low, high)} of a ditto-experiment report.csv (lows and highs may be None)."""
    return settings_compare.read(folder / "report.csv")


def points(v):
    """A fraction as percentage points, with its interval where it has one."""
    value, lo, hi = v
    text = f"{100 * value:.2f}"
    return text if lo is None or hi is None else text + f" [{100 * lo:.2f}, {100 * hi:.2f}]"


def reading(rep, measure):
    """What the interaction says: sub-additive, super-additive, consistent with additive, or why it cannot."""
    impl = rep.get((f"decomposition:{measure}", "IMPL"))
    inter = rep.get((f"decomposition:{measure}", "interaction"))
    if inter is None:
        return "–"
    if impl is not None and impl[0] == 0:
        return "nothing to decompose (IMPL is 0)"
    if inter[2] < 0:
        return "sub-additive"
    if inter[1] > 0:
        return "super-additive"
    return "consistent with additive"


def churn_cell(rep, setting):
    v = rep.get((setting, "churn"))
    if v is None:
        return "–"
    text = pct(v[0], 2)
    if setting == "IMPL" and v[1] is not None:
        text += f" [{100 * v[1]:.2f}, {100 * v[2]:.2f}]"
    fp = rep.get((setting, "distinct_fingerprints"))
    if setting in ("IMPL", "CONTROL") and fp is not None:
        text += f" ({int(fp[0])})"
    return text


def interaction_cells(rep):
    inter = rep.get(("decomposition:churn", "interaction"))
    excess = rep.get(("decomposition:churn", "excess"))
    if inter is not None:
        return [points(inter), points(excess), reading(rep, "churn"), reading(rep, "accuracy_variance")]
    churn = [rep.get((s, "churn")) for s in ("ALGO+IMPL", "ALGO", "IMPL", "CONTROL")]
    if any(c is None for c in churn):
        return ["–", "–", "not all four settings ran", "–"]
    point = churn[0][0] - churn[1][0] - churn[2][0] + churn[3][0]
    return [f"{100 * point:.2f} (no interval)", f"{100 * (churn[0][0] - churn[1][0]):.2f} (no interval)",
            "sub-additive (point value)" if point < 0 else "super-additive (point value)", "–"]


def score_cell(rep):
    scores = [rep[(s, "accuracy_mean")][0] for s in SETTINGS if (s, "accuracy_mean") in rep]
    return span(scores, lambda v: f"{100 * v:.1f}%")


def impl_share(rep):
    impl, algo = rep.get(("IMPL", "churn")), rep.get(("ALGO", "churn"))
    return "–" if impl is None or algo is None or not algo[0] else f"{100 * impl[0] / algo[0]:.0f}%"


def render_settings_churn():
    rows, sources = [], []
    for title, folder in SETTINGS_RUNS:
        rep = read_report(folder)
        rows.append([title] + [churn_cell(rep, s) for s in SETTINGS] + [impl_share(rep), score_cell(rep)]
                    + interaction_cells(rep))
        sources.append(folder / "report.csv")
    header = ["network (data)", "ALGO+IMPL churn", "ALGO", "IMPL [95% CI]", "IMPL-ATOMIC", "CONTROL", "IMPL ÷ ALGO",
              "score (mean per setting)", "churn interaction, points [95% CI]", "excess, points [95% CI]",
              "churn reading", "accuracy-variance reading"]
    return table(header, rows) + ["", "Churn in % of test units; (n): the number of distinct weight fingerprints "
                                  "the setting's replicas ended with; score: top-1, pixel accuracy or sequence accuracy.",
                                  "", sources_line(*sources)]


FIG_S4_RUNS = [("SmallCNN, 20 epochs, momentum 0", PROTOCOLS_FULL / "fig-s4-m0"),
               ("SmallCNN, 20 epochs, momentum 0.9", PROTOCOLS_FULL / "fig-s4-m0.9"),
               ("ResNet-18, 4 epochs, momentum 0", STUDY / "fig-s4-resnet18-m0")]
FIG_S4_CELLS = ["fixedinit-fixedorder", "fixedinit-randomorder", "randominit-fixedorder", "randominit-randomorder",
                "CONTROL"]


def render_fig_s4():
    rows, sources = [], []
    for title, folder in FIG_S4_RUNS:
        rep = read_report(folder)
        lrs = sorted({s.split("-")[0][2:] for s, _ in rep if s.startswith("lr")}, key=float)
        for lr in lrs:
            rows.append([title, lr] + [pct(rep[(f"lr{lr}-{c}", "disagreement")][0], 2) for c in FIG_S4_CELLS])
        sources.append(folder / "report.csv")
    header = ["run", "lr", "fixed init, fixed order (GPU noise alone)", "fixed, random", "random, fixed",
              "random, random", "CONTROL"]
    return table(header, rows) + ["", "Each cell: the fraction of test examples on which the replicas do not all "
                                  "predict the same label.", "", sources_line(*sources)]


# ---- the ops of the other task kinds: fixed-order variant against atomic, beside PyTorch ----

FIXED_ORDER = ["sorted", "gather", "deterministic", "deterministic+plan", "ditto", "cudnn-deterministic", "cusparse-alg3"]
NONDETERMINISTIC = ["atomic", "cudnn-nondeterministic", "cusparse-default"]
SCATTER_UPSAMPLE_OPS = ["embedding", "embedding_bag", "scatter_add", "upsample", "pixel_xent", "reduce_sum"]
SAMPLER_CTC_SPARSE_OPS = ["grid_sample", "affine_grid", "roi_align", "ctc_loss", "spmm"]
TENSORS = ("dx", "dgrid", "dtheta", "dB", "C", "dlogits")


def op_noise_rows():
    with open(TASK_OPS_CSV) as f:
        return list(csv.DictReader(f))


def split_shape(shape):
    """(size, tensor): the trailing tensor name op_noise appends, and the entry count of a sparse matrix, apart."""
    size = re.sub(r" \(\d+ entries\)", "", shape)
    words = size.split()
    if words and words[-1] in TENSORS:
        return " ".join(words[:-1]), words[-1]
    return size, None


def torch_rows():
    return [rec for _, _, rec in iter_records_loose(TASK_OPS_TORCH)]


def iter_records_loose(paths):
    """The peers' lines carry op and mode, not model: read them as JSON lines directly."""
    for path in paths:
        with open(path) as f:
            for lineno, text in enumerate(f, 1):
                if text.strip():
                    yield path, lineno, json.loads(text)


def torch_cell(torch, op, size, tensor, mode):
    parts = []
    for r in torch:
        if r.get("op") != op or r.get("mode") != mode or split_shape(r.get("shape", ""))[0] != size:
            continue
        if r.get("tensor") and tensor and r["tensor"] != tensor:
            continue
        path = r.get("path") or r.get("variant") or ""
        if r.get("us_median") is None:
            parts.append(f"{path}: {overhead_table.shorten(r.get('strict_error') or r.get('error') or 'failed', 80)}")
            continue
        raises = ", raises (timed with warn_only)" if r.get("strict_error") else ""
        parts.append(f"{path}: {r['distinct']} / {r['runs']}, {r['us_median']:.0f} µs{raises}")
    return overhead_table.escape_md("; ".join(parts)) or "–"


def fixed_vs_atomic(ops):
    """[(row, reference row)] for every fixed-order variant of the ops, paired with the atomic (or the library's
    nondeterministic) variant at the same op, knob and shape."""
    rows = op_noise_rows()
    pairs = []
    for r in rows:
        if r["op"] not in ops or r["variant"] not in FIXED_ORDER:
            continue
        same = {x["variant"]: x for x in rows if (x["op"], x["knob"], x["shape"]) == (r["op"], r["knob"], r["shape"])}
        ref = next((same[v] for v in NONDETERMINISTIC if v in same), None)
        if ref is not None:
            pairs.append((r, ref))
    return pairs


def render_fixed_vs_atomic(ops):
    pairs, torch = fixed_vs_atomic(ops), torch_rows()
    rows, missed = [], []
    for r, ref in pairs:
        x = float(r["us_per_call"]) / float(ref["us_per_call"])
        size, tensor = split_shape(r["shape"])
        if x > GOAL:
            missed.append(f"{r['op']} {r['variant']} {size}{' ' + tensor if tensor else ''} ({x:.2f}×)")
        rows.append([f"{r['op']}.{r['knob']}", r["shape"], r["variant"], f"{r['distinct']} / {r['runs']}",
                     f"{float(r['us_per_call']):.1f}", ref["variant"], f"{ref['distinct']} / {ref['runs']}",
                     f"{float(ref['us_per_call']):.1f}", f"{x:.2f}×", "yes" if x <= GOAL else "**no**",
                     torch_cell(torch, r["op"], size, tensor, "default"),
                     torch_cell(torch, r["op"], size, tensor, "deterministic")])
    header = ["op", "size", "fixed-order variant", "distinct / calls", "µs", "nondeterministic variant",
              "distinct / calls", "µs", "fixed ÷ nondet", f"within {GOAL}×", "PyTorch default", "PyTorch deterministic mode"]
    summary = (f"The fixed-order variant is within {GOAL}× of the nondeterministic one on "
               f"{len(pairs) - len(missed)} of {len(pairs)} rows" + (f"; the goal is missed on {', '.join(missed)}."
                                                                     if missed else "."))
    return table(header, rows) + ["", summary, "", sources_line(TASK_OPS_CSV, *TASK_OPS_TORCH)]


def render_scatter_upsample_ops():
    return render_fixed_vs_atomic(SCATTER_UPSAMPLE_OPS)


def render_sampler_ctc_sparse_ops():
    return render_fixed_vs_atomic(SAMPLER_CTC_SPARSE_OPS)


def render_affine_grid_cudnn():
    row = next(r for r in op_noise_rows() if (r["op"], r["variant"]) == ("affine_grid", "cudnn"))
    return [f"`cudnnSpatialTfGridGeneratorBackward` is not on cuDNN's list of non-reproducible routines, yet it gave "
            f"{row['distinct']} different dtheta in {row['runs']} calls ({row['shape']}; `bench/op_noise`).",
            "", sources_line(TASK_OPS_CSV)]


# ---- docs/guidance.md: what a practitioner should do ----

GUIDANCE_ATTRIBUTION = [("SmallCNN (CIFAR-10, 10 epochs)", NOISE_LAB / "smallcnn-add-one"),
                        ("ResNet-18 (CIFAR-10, 3 epochs)", NOISE_LAB / "resnet18-confirm")]
ZOO_AMP = RESULTS / "2026-11-27-h100x4-zoo-amp"
TUNING_BUDGET = RESULTS / "2026-11-27-h100-tuning-budget"


def render_guidance_knobs():
    """Per network: the churn of every atomic kernel at once, then of each kernel (or kernel group) added alone
    to an otherwise deterministic run, largest first."""
    rows, sources = [], []
    for title, folder in GUIDANCE_ATTRIBUTION:
        path = folder / "attribution.csv"
        found = attribution_rows(path)
        base = {r["configuration"]: r for r in found if r["kind"] == "baseline"}
        every = base["all-nondeterministic"]
        rows.append([title, "every atomic kernel at once", pct(float(every["churn"]))])
        alone = sorted((r for r in found if r["kind"] in ("candidate", "group") and r["status"] == "ok"),
                       key=lambda r: -float(r["churn"]))
        for r in alone[:5]:
            rows.append(["", f"`{r['configuration']}` alone", pct(float(r["churn"]))])
        sources.append(path)
    return table(["network", "what is left nondeterministic", "churn between replicas (CIFAR-10 test)"], rows) + [
        "", sources_line(*sources)]


def render_guidance_harmless():
    """Per network: how many test predictions flip between runs against how much top-1 moves."""
    rows, sources = [], []
    for title, folder in SETTINGS_RUNS[:4]:
        rep = read_report(folder)
        def value(setting, metric):
            v = rep.get((setting, metric))
            return None if v is None else v[0]
        row = [title]
        for setting in ("IMPL", "ALGO+IMPL"):
            row += [pct(value(setting, "churn"), 2), pct(value(setting, "accuracy_std"), 2)]
        row += [pct(value("ALGO+IMPL", "ensemble_acc_unstable"), 1), pct(value("ALGO+IMPL", "ensemble_acc_stable"), 1)]
        rows.append(row)
        sources.append(folder / "report.csv")
    return table(["network", "IMPL churn", "IMPL top-1 std", "ALGO+IMPL churn", "ALGO+IMPL top-1 std",
                  "ensemble top-1 on examples that move", "on the rest"], rows) + ["", sources_line(*sources)]


def render_guidance_cost():
    """What determinism costs: the fp32 zoo summary (tuned) and every zoo model in bf16 / fp16 against
    PyTorch's AMP (one call, ditto's and PyTorch's configurations on the same GPUs in turn)."""
    records, data = zoo_now(), step_data(ZOO)
    models = zoo_model_rows(records)
    zoo_rows = step_time_zoo_rows(data) + models
    paths = sorted(ZOO_AMP.glob("overhead-g*.jsonl")) + sorted(ZOO_AMP.glob("torch_overhead-g*.jsonl"))
    ditto, torch, order = {}, {}, []
    for path in paths:
        for line in open(path):
            r = json.loads(line)
            if r.get("ms_median") is None or r.get("precision") not in ("bf16", "fp16"):
                continue
            key = (r["model"], r["precision"])
            if r.get("tool") == "ditto" and r.get("mode") == "deterministic":
                ditto[key] = r["ms_median"]
                if r["model"] not in order:
                    order.append(r["model"])
            elif r.get("tool") != "ditto" and r.get("mode") == "default":
                torch[key] = r["ms_median"]
    amp, at_or_under, rows_n = [], 0, 0
    zoo_order = overhead_table.MODEL_ORDER
    for model in sorted(order, key=lambda m: zoo_order.index(m) if m in zoo_order else len(zoo_order)):
        row = [model]
        for precision in ("bf16", "fp16"):
            d, t = ditto.get((model, precision)), torch.get((model, precision))
            row += [fmt_ms(d), fmt_ms(t), fmt_x(ratio(d, t))]
            if d is not None and t is not None:
                rows_n += 1
                at_or_under += d <= t
        amp.append(row)
    budget = []
    for line in open(TUNING_BUDGET / "overhead-vgg-b128.jsonl"):
        r = json.loads(line)
        if r.get("tuning_workspace_mb") == 4096:
            budget.append(f"{r['model']} {fmt_ms(r['ms_median'])} ms, peak {r['peak_mem_bytes'] / 2**30:.1f} GiB")
    return (["fp32, batch 128 (tuned deterministic against ditto's fastest and PyTorch): " + zoo_summary(zoo_rows, models),
             "",
             f"bf16 and fp16, batch 64, native channels-last activations against PyTorch's AMP (autocast, channels-last, "
             f"GradScaler for fp16): the deterministic step is at or under AMP's default step on {at_or_under} of "
             f"{rows_n} rows.", ""]
            + table(["model", "bf16 ditto deterministic ms", "bf16 PyTorch AMP ms", "bf16 ÷", "fp16 ditto deterministic ms",
                     "fp16 PyTorch AMP ms", "fp16 ÷"], amp)
            + ["", "With a 4 GiB tuning workspace budget (batch 128): " + "; ".join(budget) + ".", "",
               sources_line(ZOO / "overhead-10steps.jsonl", ZOO / "torch_overhead-10steps.jsonl", *paths,
                            TUNING_BUDGET / "overhead-vgg-b128.jsonl")])


# ---- the docs and their regions ----

DOCS = {
    "README.md": {"readme-speed": render_readme_speed},
    "docs/guidance.md": {
        "guidance-knobs": render_guidance_knobs,
        "guidance-harmless": render_guidance_harmless,
        "guidance-cost": render_guidance_cost,
    },
    "docs/determinism.md": {
        "scatter-upsample-ops": render_scatter_upsample_ops,
        "noise-lab-tables": render_noise_lab_tables,
        "noise-lab-quadrature": render_noise_lab_quadrature,
        "noise-lab-cost": render_noise_lab_cost,
        "settings-churn": render_settings_churn,
        "fig-s4": render_fig_s4,
        "step-time": render_step_time,
        "zoo-overhead": render_zoo_overhead,
        "zoo-not-free": render_zoo_not_free,
        "zoo-before": render_zoo_before,
        "affine-grid-cudnn": render_affine_grid_cudnn,
        "sampler-ctc-sparse-ops": render_sampler_ctc_sparse_ops,
    },
}
MARKER = re.compile(r"^<!-- generated:([a-z0-9-]+) (begin|end) -->$")


def render_doc(text, renderers, doc):
    """The doc's text with every region replaced by its renderer's lines."""
    out, inside, seen = [], None, []
    for line in text.split("\n"):
        m = MARKER.match(line)
        if inside is None:
            out.append(line)
            if m and m.group(2) == "begin":
                if m.group(1) not in renderers:
                    raise ValueError(f"{doc}: region {m.group(1)!r} has no renderer")
                inside = m.group(1)
                out += renderers[inside]()
            elif m:
                raise ValueError(f"{doc}: 'end' of {m.group(1)!r} without its 'begin'")
        elif m:
            if m.groups() != (inside, "end"):
                raise ValueError(f"{doc}: region {inside!r} is not closed before {line!r}")
            out.append(line)
            seen.append(inside)
            inside = None
    if inside is not None:
        raise ValueError(f"{doc}: region {inside!r} is never closed")
    missing = sorted(set(renderers) - set(seen))
    if missing:
        raise ValueError(f"{doc}: no region for {', '.join(missing)}")
    return "\n".join(out)


def write_atomically(path, text):
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, path.stat().st_mode & 0o777)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="rewrite the regions in place")
    mode.add_argument("--check", action="store_true", help="exit 1 with a diff where a doc differs from its rendering")
    args = ap.parse_args()
    stale = []
    for doc, renderers in DOCS.items():
        path = ROOT / doc
        text = path.read_text()
        try:
            rendered = render_doc(text, renderers, doc)
        except ValueError as e:
            sys.exit(f"render_docs: {e}")
        if rendered == text:
            continue
        if args.write:
            write_atomically(path, rendered)
            print(f"rewrote {doc}")
        else:
            stale.append(doc)
            sys.stdout.writelines(difflib.unified_diff(text.splitlines(True), rendered.splitlines(True),
                                                       f"{doc} (committed)", f"{doc} (rendered)"))
    if stale:
        print(f"\nrender_docs: differ from bench/results/: {', '.join(stale)}; run scripts/render_docs.py --write",
              file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
