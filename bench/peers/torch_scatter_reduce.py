#!/usr/bin/env python3
r"""PyTorch peer of bench/op_noise's scatter and reduction rows (--families scatter,upsample,pixel_xent,reduce):
PyTorch's own paths for the same ops at the same sizes, in its default mode and with
torch.use_deterministic_algorithms(True), recording where deterministic mode raises.

Ops (sizes as op_noise's, inputs uniform in [-1, 1) from --seed; fp32; TF32 off):
  embedding      F.embedding backward (the weight gradient) of a 1000000 x 64 table for 4096 x 20
                 lookups, uniform over the table ("uniform") and from 1000 rows ("of 1000 rows")
  embedding_bag  F.embedding_bag backward, 4096 bags of 20, mode sum and mean
  scatter_add    TensorFlow's unsorted_segment_sum of 262144 x 64 rows into 4096 segments, two ways:
                 zeros(4096, 64).index_add_(0, ids, src) and .scatter_add_(0, ids expanded, src)
  upsample       F.interpolate backward of 128x64x64x64 to 128x128 (nearest; bilinear with
                 align_corners False and True) and to 96x96 (bilinear)
  pixel_xent     F.cross_entropy forward (log_softmax + nll_loss2d, mean) of 16x21x256x256 logits,
                 one pixel in ten ignored (255)
  reduce_sum     x.sum() of 16777216 values
A backward row times torch.autograd.grad(y, x, dy, retain_graph=True) alone (the forward runs once,
untimed), so it matches op_noise's backward-only calls.

Per (op, shape, mode): --runs calls after --warmup: distinct results (SHA-1 of the output's bytes),
the largest |difference| from the first result, and microseconds per call (CUDA events around each
call: median, 10th and 90th percentile). Deterministic mode: where PyTorch raises (an op without a
deterministic implementation), the error is recorded as strict_error and the op is run again with
warn_only=True, whose warning is recorded; that row's timings are then PyTorch's nondeterministic
path under deterministic mode. One JSON line per row, printed and appended to --out: tool, op, path,
shape, mode, distinct, runs, max_abs_diff, us_median, us_p10, us_p90, strict_error, warnings, gpu,
torch, cuda, date; a failed row has error instead.

CUBLAS_WORKSPACE_CONFIG=:4096:8 is set (unless already set) before torch is imported.

  python3 bench/peers/torch_scatter_reduce.py --out /tmp/torch_scatter_reduce.jsonl
  python3 bench/peers/torch_scatter_reduce.py --ops upsample,pixel_xent --modes deterministic --runs 10
"""
import os

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import argparse  # noqa: E402
import datetime  # noqa: E402
import gc  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import warnings  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # peer_common beside this file
from peer_common import percentile, short_error  # noqa: E402

OPS = ["embedding", "embedding_bag", "scatter_add", "upsample", "pixel_xent", "reduce_sum"]
MODES = ["default", "deterministic"]


def apply_mode(mode, warn_only=False):
    torch.use_deterministic_algorithms(mode == "deterministic", warn_only=warn_only)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def uniform(gen, *shape):
    return torch.rand(*shape, generator=gen, device="cuda") * 2 - 1


def backward_call(y, x, dy):
    """The gradient of y with respect to x for upstream dy, the forward graph kept for the next call."""
    return lambda: torch.autograd.grad(y, x, dy, retain_graph=True)[0]


def cases(args, only):
    """(op, path, shape, make) per row; make() builds the inputs and returns the call to time."""
    out = []
    rows, d, bags, per_bag = 1000000, 64, 4096, 20

    def gen(k):
        return torch.Generator(device="cuda").manual_seed(args.seed * 1000 + k)

    if "embedding" in only:
        for name, hi in (("uniform", rows), ("of 1000 rows", 1000)):
            def make(hi=hi):
                g = gen(1)
                w = uniform(g, rows, d).requires_grad_(True)
                idx = torch.randint(0, hi, (bags, per_bag), generator=g, device="cuda")
                y = F.embedding(idx, w)
                return backward_call(y, w, uniform(g, bags, per_bag, d))
            out.append(("embedding", "F.embedding backward", f"table[{rows}, {d}] idx[{bags}, {per_bag}] {name}", make))
    if "embedding_bag" in only:
        for mode in ("sum", "mean"):
            def make(mode=mode):
                g = gen(2)
                w = uniform(g, rows, d).requires_grad_(True)
                idx = torch.randint(0, rows, (bags, per_bag), generator=g, device="cuda")
                y = F.embedding_bag(idx, w, mode=mode)
                return backward_call(y, w, uniform(g, bags, d))
            out.append(("embedding_bag", "F.embedding_bag backward",
                        f"table[{rows}, {d}] {bags} bags of {per_bag} ({mode})", make))
    if "scatter_add" in only:
        m, segments = 262144, 4096
        for path in ("index_add_", "scatter_add_"):
            def make(path=path):
                g = gen(3)
                src = uniform(g, m, d)
                ids = torch.randint(0, segments, (m,), generator=g, device="cuda")
                if path == "index_add_":
                    return lambda: torch.zeros(segments, d, device="cuda").index_add_(0, ids, src)
                wide = ids[:, None].expand(-1, d)
                return lambda: torch.zeros(segments, d, device="cuda").scatter_add_(0, wide, src)
            out.append(("scatter_add", path, f"src[{m}, {d}] into {segments} rows", make))
    if "upsample" in only:
        for mode, align, size in (("nearest", None, 128), ("bilinear", False, 128), ("bilinear", True, 128),
                                  ("bilinear", False, 96)):
            def make(mode=mode, align=align, size=size):
                g = gen(4)
                x = uniform(g, 128, 64, 64, 64).requires_grad_(True)
                y = F.interpolate(x, size=(size, size), mode=mode, align_corners=align)
                return backward_call(y, x, uniform(g, 128, 64, size, size))
            out.append(("upsample", "F.interpolate backward",
                        f"x[128, 64, 64, 64] to {size}x{size} {mode}{' align_corners' if align else ''}", make))
    if "pixel_xent" in only:
        def make():
            g = gen(5)
            logits = uniform(g, 16, 21, 256, 256)
            labels = torch.randint(0, 21, (16, 256, 256), generator=g, device="cuda")
            labels.view(-1)[::10] = 255
            return lambda: F.cross_entropy(logits, labels, ignore_index=255, reduction="mean")
        out.append(("pixel_xent", "F.cross_entropy forward", "logits[16, 21, 256, 256]", make))
    if "reduce_sum" in only:
        def make():
            x = uniform(gen(6), 1 << 24)
            return lambda: x.sum()
        out.append(("reduce_sum", "Tensor.sum", f"x[{1 << 24}]", make))
    return out


def measure(call, args):
    for _ in range(args.warmup):
        call()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(args.runs)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(args.runs)]
    stream = torch.cuda.current_stream()
    prints, first, max_diff = set(), None, 0.0
    for i in range(args.runs):
        starts[i].record(stream)
        out = call()
        ends[i].record(stream)
        out = out.detach()
        prints.add(hashlib.sha1(out.contiguous().cpu().numpy().tobytes()).hexdigest())
        if first is None:
            first = out.clone()
        else:
            max_diff = max(max_diff, (out - first).abs().max().item() if out.numel() else 0.0)
    torch.cuda.synchronize()
    us = sorted(s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends))
    return {"distinct": len(prints), "runs": args.runs, "max_abs_diff": max_diff,
            "us_median": round(percentile(us, 0.5), 2), "us_p10": round(percentile(us, 0.1), 2),
            "us_p90": round(percentile(us, 0.9), 2)}


def run_row(make, mode, args):
    """Measures one row; in deterministic mode an op that raises is recorded and measured again with
    warn_only=True."""
    rec = {"strict_error": None, "warnings": []}
    for warn_only in ((False, True) if mode == "deterministic" else (False,)):
        apply_mode(mode, warn_only)
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                call = make()
                rec.update(measure(call, args))
            rec["warnings"] = sorted({str(w.message).splitlines()[0][:300] for w in caught
                                      if "deterministic" in str(w.message)})
            return rec
        except RuntimeError as exc:
            if mode == "deterministic" and not warn_only and "deterministic" in str(exc):
                rec["strict_error"] = short_error(exc)
                continue
            raise
        finally:
            gc.collect()
            torch.cuda.empty_cache()
    return rec


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ops", default=",".join(OPS), help="comma list of " + ", ".join(OPS))
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default="torch_scatter_reduce.jsonl")
    args = ap.parse_args()
    only = [o for o in args.ops.split(",") if o]
    modes = [m for m in args.modes.split(",") if m]
    for o in only:
        if o not in OPS:
            sys.exit(f"--ops: unknown op '{o}'; known: {', '.join(OPS)}")
    for m in modes:
        if m not in MODES:
            sys.exit(f"--modes: unknown mode '{m}'; known: {', '.join(MODES)}")
    if args.runs < 2:
        sys.exit("--runs must be at least 2")
    if not torch.cuda.is_available():
        sys.exit("torch_scatter_reduce: no CUDA device")
    base = {"tool": "torch", "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
            "cuda": torch.version.cuda, "date": datetime.datetime.now().isoformat(timespec="seconds")}
    with open(args.out, "a") as f:
        for op, path, shape, make in cases(args, only):
            for mode in modes:
                rec = dict(base, op=op, path=path, shape=shape, mode=mode)
                try:
                    rec.update(run_row(make, mode, args))
                except Exception as exc:  # noqa: BLE001 - every failure is recorded, the others still run
                    rec["error"] = short_error(exc)
                line = json.dumps(rec)
                print(line, flush=True)
                f.write(line + "\n")
                f.flush()


if __name__ == "__main__":
    main()
