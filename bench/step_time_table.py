#!/usr/bin/env python3
r"""Markdown report of training-step times: ditto's bench/step_time against the PyTorch peer.

Reads JSON-lines files (lines of bench/step_time, "tool": "ditto", and of
bench/peers/torch_step_time.py, "tool": "pytorch"; other lines are skipped with a note on stderr)
and writes, in markdown:
  1. a header with the GPU, date, ditto commit, torch and cuDNN versions found in the lines;
  2. one table per model: rows (precision, tool, mode), columns eager ms, graphed ms (medians), the
     graph speedup eager / graphed and the eager step's peak memory; a failed measurement shows its
     error, shortened;
  3. the performance targets (fp32), each PASS or MISS with its numbers (n/a where data are missing);
  4. per model and precision, eager and graphed: ditto deterministic / ditto fastest, ditto
     deterministic / PyTorch default in that precision (AMP for bf16 and fp16), and peak memory
     ditto deterministic / PyTorch default (eager steps: a graphed step's temporaries are the
     graph's own memory, which neither tool's counter sees); bench/precision_compare.py;
  5. a roofline table: achieved TFLOP/s = flops_per_step / step time, and its fraction of the GPU's
     dense peak in the line's precision (fp32 FMA; TF32, BF16 or FP16 tensor cores). PyTorch rows
     borrow ditto's flops_per_step for the same model (the networks are the same).
A line without a precision reads as fp32 (the former "tf32" modes as tf32: precision_compare.py).
When the same (tool, model, mode, graph, precision) appears more than once, the last line read wins.

  python3 bench/step_time_table.py /tmp/step_time_ditto.jsonl /tmp/step_time_torch.jsonl \
      --out bench/results/step_time.md --csv bench/results/step_time.csv

Standard library only.
"""
import argparse
import csv
import sys

from jsonl_records import iter_records
from precision_compare import Row, note_lines, precision_of, precision_rank, table_lines

TOOL_ORDER = ["ditto", "pytorch"]
MODE_ORDER = {
    "ditto": ["heuristic", "deterministic", "deterministic-tuned", "fastest", "nondeterministic", "tf32",
              "tf32-deterministic"],  # the last two: modes of files written before precisions
    "pytorch": ["default", "benchmark", "deterministic", "deterministic-benchmark", "tf32", "tf32-deterministic"],
}
MODEL_ORDER = ["smallcnn", "smallcnn-bn", "two-conv", "resnet18", "resnet18-imagenet"]
MODEL_TITLES = {"smallcnn": "SmallCNN", "smallcnn-bn": "SmallCNN-BN", "two-conv": "two-conv",
                "resnet18": "ResNet-18 (CIFAR)", "resnet18-imagenet": "ResNet-18 (ImageNet stem)"}

# Dense peaks in TFLOP/s by precision (NVIDIA's H100 SXM figures; the H200 has the same SMs and
# clocks). Matched by substring of the GPU name, first match wins.
H100_PEAKS = {"fp32": 66.9, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4}
PEAKS = [("H100", H100_PEAKS), ("H200", H100_PEAKS)]

ERROR_WIDTH = 60
MS_FIELDS = ("ms_median", "ms_p10", "ms_p90", "ms_wall", "peak_mem_bytes")


def _float_or_none(v):
    if v is None:
        return None
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def load(paths):
    """Returns {(tool, model, mode, graph, precision): record}, last line wins, in reading order."""
    records = {}
    for path, lineno, raw in iter_records(paths):
        rec = dict(raw)
        rec["graph"] = bool(raw.get("graph", False))
        rec["precision"] = precision_of(raw)
        for k in MS_FIELDS + ("flops_per_step",):
            rec[k] = _float_or_none(raw.get(k))
        rec["error"] = str(raw["error"]) if raw.get("error") else None
        key = (str(raw["tool"]), str(raw["model"]), str(raw["mode"]), rec["graph"], rec["precision"])
        if key in records:
            print(f"{path}:{lineno}: repeats {key}, this line replaces the earlier one", file=sys.stderr)
            del records[key]
        records[key] = rec
    return records


def _rank(order, value):
    return (order.index(value), "") if value in order else (len(order), value)


def sort_key(key):
    tool, model, mode, graph, precision = key
    return (_rank(MODEL_ORDER, model), precision_rank(precision), _rank(TOOL_ORDER, tool),
            _rank(MODE_ORDER.get(tool, []), mode), graph)


def distinct(records, field, tool=None):
    seen = []
    for (t, *_), rec in records.items():
        if tool is not None and t != tool:
            continue
        v = rec.get(field)
        if v is not None and v != "" and v not in seen:
            seen.append(v)
    return seen


def cudnn_text(v):
    """cuDNN 9 encodes its version as major*10000 + minor*100 + patch."""
    if isinstance(v, int) and v >= 10000:
        return f"{v // 10000}.{v // 100 % 100}.{v % 100}"
    return str(v)


def joined(values, fmt=str):
    return ", ".join(fmt(v) for v in values) if values else "unknown"


def md_escape(text):
    return text.replace("|", "\\|").replace("\n", " ")


def shorten(text, width=ERROR_WIDTH):
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


class Data:
    def __init__(self, records):
        self.records = records

    def get(self, tool, model, mode, graph, precision="fp32"):
        return self.records.get((tool, model, mode, graph, precision))

    def ms(self, tool, model, mode, graph, precision="fp32"):
        """Median ms of a successful measurement, else None."""
        rec = self.get(tool, model, mode, graph, precision)
        if rec is None or rec["error"] or rec["ms_median"] is None:
            return None
        return rec["ms_median"]

    def peak(self, tool, model, mode, graph, precision="fp32"):
        """Peak memory in bytes of a successful measurement that recorded one (and not 0), else None."""
        rec = self.get(tool, model, mode, graph, precision)
        if rec is None or rec["error"] or not rec["peak_mem_bytes"]:
            return None
        return rec["peak_mem_bytes"]

    def best(self, tool, model, mode, precision="fp32"):
        """(ms, graph) of the faster of eager and graphed, or (None, None)."""
        found = [(ms, g) for g in (False, True) if (ms := self.ms(tool, model, mode, g, precision)) is not None]
        return min(found) if found else (None, None)

    def models(self):
        return sorted({k[1] for k in self.records}, key=lambda m: _rank(MODEL_ORDER, m))

    def precisions(self, model=None):
        return sorted({k[4] for k in self.records if model is None or k[1] == model}, key=precision_rank)


def setting(graph):
    return "graphed" if graph else "eager"


def cell(data, tool, model, mode, graph, precision):
    rec = data.get(tool, model, mode, graph, precision)
    if rec is None:
        return "—"
    if rec["error"]:
        return "error: " + md_escape(shorten(rec["error"]))
    if rec["ms_median"] is None:
        return "no time"
    return f"{rec['ms_median']:.3f}"


def mib(v):
    return "—" if v is None else f"{v / 2**20:.1f}"


def model_tables(data, out):
    for model in data.models():
        out.append(f"## {MODEL_TITLES.get(model, model)}")
        out.append("")
        out.append("| precision | tool | mode | eager ms (median) | graphed ms (median) | graph speedup | "
                   "peak MiB (eager) |")
        out.append("|---|---|---|---:|---:|---:|---:|")
        rows = sorted({(k[4], k[0], k[2]) for k in data.records if k[1] == model},
                      key=lambda ptm: (precision_rank(ptm[0]), _rank(TOOL_ORDER, ptm[1]),
                                       _rank(MODE_ORDER.get(ptm[1], []), ptm[2])))
        for precision, tool, mode in rows:
            eager, graphed = data.ms(tool, model, mode, False, precision), data.ms(tool, model, mode, True, precision)
            speedup = f"{eager / graphed:.2f}×" if eager and graphed else "—"
            out.append(f"| {precision} | {tool} | {mode} | {cell(data, tool, model, mode, False, precision)} | "
                       f"{cell(data, tool, model, mode, True, precision)} | {speedup} | "
                       f"{mib(data.peak(tool, model, mode, False, precision))} |")
        out.append("")


def verdict(ok):
    return "**PASS**" if ok else "**MISS**"


def target_lines(data):
    lines = []

    def missing(what, parts):
        lines.append(f"- n/a — {what}: missing {', '.join(parts)}")

    # 1. ResNet-18: deterministic-tuned within 5% of fastest, and at most 0.75 x PyTorch default eager.
    what = "ResNet-18 ditto deterministic-tuned ≤ 1.05 × ditto fastest"
    dt, dt_g = data.best("ditto", "resnet18", "deterministic-tuned")
    fa, fa_g = data.best("ditto", "resnet18", "fastest")
    if dt is None or fa is None:
        missing(what, [n for n, v in (("ditto deterministic-tuned", dt), ("ditto fastest", fa)) if v is None])
    else:
        same = []
        for g in (False, True):
            a, b = data.ms("ditto", "resnet18", "deterministic-tuned", g), data.ms("ditto", "resnet18", "fastest", g)
            if a is not None and b is not None:
                same.append(f"{setting(g)} {a:.3f}/{b:.3f} = {a / b:.3f}")
        lines.append(f"- {verdict(dt <= 1.05 * fa)} {what}: best {dt:.3f} ms ({setting(dt_g)}) vs best {fa:.3f} ms "
                     f"({setting(fa_g)}), ratio {dt / fa:.3f} (limit 1.05)"
                     + (f"; per setting {'; '.join(same)}" if same else ""))
    what = "ResNet-18 ditto deterministic-tuned ≤ 0.75 × PyTorch default eager"
    pt = data.ms("pytorch", "resnet18", "default", False)
    if dt is None or pt is None:
        missing(what, [n for n, v in (("ditto deterministic-tuned", dt), ("PyTorch default eager", pt)) if v is None])
    else:
        lines.append(f"- {verdict(dt <= 0.75 * pt)} {what}: {dt:.3f} ms ({setting(dt_g)}) vs {pt:.3f} ms, "
                     f"ratio {dt / pt:.3f} (limit 0.75)")

    # 2. SmallCNN: graphed ditto step at most 0.5 ms and at least 6x faster than PyTorch default eager.
    mode = "deterministic-tuned" if data.ms("ditto", "smallcnn", "deterministic-tuned", True) is not None \
        else "deterministic"
    sc = data.ms("ditto", "smallcnn", mode, True)
    pt = data.ms("pytorch", "smallcnn", "default", False)
    what = "SmallCNN ditto graphed ≤ 0.5 ms"
    if sc is None:
        missing(what, ["ditto graphed deterministic-tuned or deterministic"])
    else:
        lines.append(f"- {verdict(sc <= 0.5)} {what}: {sc:.3f} ms ({mode}, graphed)")
    what = "SmallCNN ditto graphed ≥ 6× faster than PyTorch default eager"
    if sc is None or pt is None:
        missing(what, [n for n, v in (("ditto graphed deterministic-tuned or deterministic", sc),
                                      ("PyTorch default eager", pt)) if v is None])
    else:
        lines.append(f"- {verdict(pt / sc >= 6.0)} {what}: {pt:.3f} / {sc:.3f} ms = {pt / sc:.2f}× "
                     f"({mode}; need ≥ 6)")

    # 3. ResNet-18: the graph takes at least 5% off the eager step time (deterministic-tuned).
    what = "ResNet-18 ditto graphed ≥ 5% faster than eager (deterministic-tuned)"
    eager = data.ms("ditto", "resnet18", "deterministic-tuned", False)
    graphed = data.ms("ditto", "resnet18", "deterministic-tuned", True)
    if eager is None or graphed is None:
        missing(what, [f"ditto deterministic-tuned {n}" for n, v in (("eager", eager), ("graphed", graphed))
                       if v is None])
    else:
        lines.append(f"- {verdict(graphed <= 0.95 * eager)} {what}: {graphed:.3f} ms graphed vs {eager:.3f} ms eager, "
                     f"{(1 - graphed / eager) * 100:.1f}% less time (need ≥ 5%, i.e. ratio ≤ 0.95; "
                     f"speedup {eager / graphed:.3f}×)")
    return lines


def peak_for(gpu, precision, args):
    override = {"fp32": args.peak_fp32, "tf32": args.peak_tf32, "bf16": args.peak_half, "fp16": args.peak_half}
    if override.get(precision) is not None:
        return override[precision], precision
    for tag, peaks in PEAKS:
        if gpu and tag in gpu:
            return peaks.get(precision), precision
    return None, precision


def roofline_lines(data, args):
    flops_by_model = {}
    for (tool, model, _, _, _), rec in data.records.items():
        if tool == "ditto" and rec["flops_per_step"]:
            flops_by_model.setdefault(model, rec["flops_per_step"])
    if not flops_by_model:
        return ["No ditto line carries flops_per_step."]
    header_gpu = (distinct(data.records, "gpu") or [None])[0]
    lines = ["| tool | model | precision | mode | graph | GFLOP/step | ms | TFLOP/s | peak TFLOP/s | % of peak |",
             "|---|---|---|---|---|---:|---:|---:|---:|---:|"]
    for key in sorted(data.records, key=sort_key):
        tool, model, mode, graph, precision = key
        rec = data.records[key]
        flops = rec["flops_per_step"] if tool == "ditto" and rec["flops_per_step"] else flops_by_model.get(model)
        ms = data.ms(tool, model, mode, graph, precision)
        if flops is None or ms is None or ms <= 0:
            continue
        achieved = flops / (ms / 1e3) / 1e12
        peak, kind = peak_for(rec.get("gpu") or header_gpu, precision, args)
        borrowed = "" if tool == "ditto" else " ¹"
        peak_txt = f"{peak:g} ({kind})" if peak else f"unknown ({kind})"
        frac = f"{achieved / peak * 100:.1f}%" if peak else "—"
        if peak and achieved > peak:
            frac += " (above peak: check FLOPs or peak)"
        lines.append(f"| {tool} | {model} | {precision} | {mode} | {setting(graph)} | {flops / 1e9:.3f}{borrowed} | "
                     f"{ms:.3f} | {achieved:.2f} | {peak_txt} | {frac} |")
    if len(lines) == 2:  # a header and nothing under it says nothing: say why instead
        missing_ms = sorted({f"{t}/{m}/{mo}/{setting(g)}/{p}" for (t, m, mo, g, p) in data.records
                             if data.ms(t, m, mo, g, p) is None})
        return [f"No row: flops_per_step is known for {sorted(flops_by_model)}, but no record of those models has a "
                f"step time (records without one: {', '.join(missing_ms) or 'none'})."]
    lines.append("")
    lines.append("¹ ditto's flops_per_step for the same model (forward + backward of convs and linears).")
    sources = [f"{name} {'--peak-' + flag if value is not None else 'by GPU name'}"
               for name, flag, value in (("fp32", "fp32", args.peak_fp32), ("TF32 tensor", "tf32", args.peak_tf32),
                                         ("BF16/FP16 tensor", "half", args.peak_half))]
    lines.append(f"Peaks (dense): {', '.join(sources)}; built in: "
                 + "; ".join(f"{tag} " + " / ".join(f"{k} {v:g}" for k, v in p.items()) for tag, p in PEAKS)
                 + ". Each row uses its precision's peak.")
    return lines


def precision_rows(data):
    """The precision comparison's rows: per model and precision, eager then graphed."""
    rows = []
    for model in data.models():
        for precision in data.precisions(model):
            for graph in (False, True):
                def get(tool, mode):
                    return data.ms(tool, model, mode, graph, precision)
                peaks = ((None, None) if graph else
                         (data.peak("ditto", model, "deterministic", False, precision),
                          data.peak("pytorch", model, "default", False, precision)))
                row = Row(model, precision, get("ditto", "deterministic"), get("ditto", "fastest"),
                          get("pytorch", "default"), *peaks, setting=setting(graph))
                if any(v is not None for v in (row.det, row.fastest, row.torch_default)):
                    rows.append(row)
    return rows


def precision_lines(data):
    rows = precision_rows(data)
    if not rows:
        return ["No model has a ditto deterministic, ditto fastest or PyTorch default step."]
    memory = ("Peak memory of the eager steps (a graphed step's temporaries are the graph's own memory, which "
              "neither tool's counter sees).")
    return (table_lines(rows, lambda v: "—" if v is None else f"{v:.3f}")
            + note_lines(((k[0], rec) for k, rec in data.records.items()), memory))


def report(data, args, sources):
    recs = data.records
    out = ["# Training step time: ditto vs PyTorch", ""]
    cudnn_parts = [f"{tool} {joined(distinct(recs, 'cudnn', tool), cudnn_text)}"
                   for tool in TOOL_ORDER if distinct(recs, "cudnn", tool)]
    out += [
        f"- GPU: {joined(distinct(recs, 'gpu'))}",
        f"- date: {joined(distinct(recs, 'date'))}",
        f"- ditto commit: {joined(distinct(recs, 'commit', 'ditto'))}",
        f"- torch: {joined(distinct(recs, 'torch', 'pytorch'))}",
        f"- cuDNN: {'; '.join(cudnn_parts) if cudnn_parts else 'unknown'}",
        f"- batch: {joined(distinct(recs, 'batch'))}; timed steps: {joined(distinct(recs, 'steps'))}",
        f"- from: {', '.join(sources)}",
        "",
        "Times are each line's ms_median, in ms. Graph speedup = eager / graphed.",
        "",
    ]
    model_tables(data, out)
    out += ["## Targets", ""] + target_lines(data) + [""]
    out += ["## Precisions: ditto deterministic against ditto fastest and PyTorch default", ""]
    out += precision_lines(data) + [""]
    out += ["## Roofline", ""] + roofline_lines(data, args) + [""]
    return "\n".join(out).rstrip("\n") + "\n"


def write_csv(data, path):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["tool", "model", "mode", "precision", "graph", "ms_median", "ms_p10", "ms_p90", "peak_mem_bytes",
                    "error"])
        for key in sorted(data.records, key=sort_key):
            rec = data.records[key]
            tool, model, mode, graph, precision = key
            w.writerow([tool, model, mode, precision, str(graph).lower()]
                       + ["" if rec[k] is None else repr(rec[k])
                          for k in ("ms_median", "ms_p10", "ms_p90", "peak_mem_bytes")]
                       + [rec["error"] or ""])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("inputs", nargs="+", help="JSON-lines files from bench/step_time and torch_step_time.py")
    ap.add_argument("--out", help="markdown report here (default: stdout)")
    ap.add_argument("--csv", help="also write tidy rows (tool, model, mode, precision, graph, ms_*, peak_mem_bytes, "
                                  "error) here")
    ap.add_argument("--peak-fp32", type=float, help="fp32 peak TFLOP/s, instead of the one for the GPU name")
    ap.add_argument("--peak-tf32", type=float, help="TF32 tensor peak TFLOP/s, instead of the one for the GPU name")
    ap.add_argument("--peak-half", type=float,
                    help="BF16 and FP16 dense tensor peak TFLOP/s, instead of the one for the GPU name")
    args = ap.parse_args()

    data = Data(load(args.inputs))
    if not data.records:
        sys.exit("step_time_table.py: no usable lines in " + ", ".join(args.inputs))
    text = report(data, args, args.inputs)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    if args.csv:
        write_csv(data, args.csv)


if __name__ == "__main__":
    main()
