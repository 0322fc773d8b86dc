#!/usr/bin/env python3
r"""PyTorch peer of ditto's op_noise rows for the sampling ops, CTC and sparse matmul
(bench/op_noise_sampler_ctc_spmm.h, op_noise --group sampler-ctc-spmm): the same ops
at the same sizes, in PyTorch's default mode and under torch.use_deterministic_algorithms(True).

Ops and what is compared (the tensor whose bits are fingerprinted), one forward + backward per call:
  grid_sample   x 128x64x64x64, a 64x64 affine grid of random rotations (+-30 deg), scales
                (0.8-1.2) and shifts (+-0.2): dx and dgrid. Two variants: align_corners=True (the
                case PyTorch hands to cuDNN's spatial-transformer sampler) and align_corners=False
                (PyTorch's native grid_sampler_2d kernel).
  affine_grid   theta 128x2x3 -> 64x64 grids: dtheta (align_corners=True).
  roi_align     torchvision.ops.roi_align, 512 rois of 7x7 crowded around 4 objects per image on
                8x256x64x64, spatial_scale 1/16, adaptive sampling, aligned=True: dx.
  ctc_loss      log_softmax + F.ctc_loss(reduction="none"), batch 64, T 100, alphabet 11, labels of
                10, backward of the sum: d/d logits. Two variants: "cudnn-path" (int32 targets on
                the CPU, concatenated, every input length T: PyTorch's conditions for cuDNN's CTC)
                and "native" (int64 padded targets on the GPU: PyTorch's own kernels).
  spmm          a 100k x 100k CSR matrix with ~1M entries times a 100k x 64 dense matrix
                (torch.sparse.mm): C (forward only, CSR), and dB of the backward with the matrix as
                CSR and as COO.
Modes: default (cudnn.deterministic off) and deterministic (torch.use_deterministic_algorithms(True),
cudnn.deterministic on). Where strict mode raises (an op without a deterministic implementation), the
error is recorded as strict_error and the configuration is run again with warn_only=True; the
warnings that name nondeterministic ops are recorded as nondeterministic_ops. TF32 is off.
CUBLAS_WORKSPACE_CONFIG=:4096:8 is set (unless already set) before torch is imported.

Per (op, variant, mode, tensor): warm-up calls, then --runs calls timed with CUDA events; distinct
results over the runs (a BLAKE2 hash of the bytes), the largest |difference| from the first result,
and the median / p10 / p90 microseconds per call. One JSON line each, printed and appended to --out.

  python3 bench/peers/torch_sampler_ctc_spmm.py --out /tmp/torch_sampler_ctc_spmm.jsonl
  python3 bench/peers/torch_sampler_ctc_spmm.py --ops ctc_loss,spmm --modes deterministic --runs 20
"""
import os

# Must precede `import torch`: read once, when the first cuBLAS workspace is sized.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import argparse  # noqa: E402
import datetime  # noqa: E402
import gc  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import random  # noqa: E402
import warnings  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from peer_common import percentile, short_error  # noqa: E402

try:
    import torchvision  # noqa: E402
except ImportError:
    torchvision = None

warnings.filterwarnings("ignore", message=".*new API settings to control TF32.*")

OPS = ["grid_sample", "affine_grid", "roi_align", "ctc_loss", "spmm"]
MODES = ["default", "deterministic"]


def apply_mode(mode, warn_only=False):
    det = mode == "deterministic"
    torch.use_deterministic_algorithms(det, warn_only=warn_only)
    torch.backends.cudnn.deterministic = det
    torch.backends.cudnn.benchmark = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def fingerprint(t):
    return hashlib.blake2b(t.detach().contiguous().cpu().numpy().tobytes(), digest_size=16).hexdigest()


def uniform(shape, gen, lo=-1.0, hi=1.0, device="cuda"):
    return (torch.rand(shape, generator=gen, dtype=torch.float32) * (hi - lo) + lo).to(device)


# ---- the ops: each returns (shape text, {variant: step}) where step() runs one forward + backward
# ---- and returns {tensor name: tensor} ----------------------------------------------------------

def stn_theta(n, gen):
    rng = random.Random(int(torch.randint(0, 2**31, (1,), generator=gen)))
    rows = []
    for _ in range(n):
        a, s = rng.uniform(-0.52, 0.52), rng.uniform(0.8, 1.2)
        rows.append([[s * math.cos(a), -s * math.sin(a), rng.uniform(-0.2, 0.2)],
                     [s * math.sin(a), s * math.cos(a), rng.uniform(-0.2, 0.2)]])
    return torch.tensor(rows, dtype=torch.float32, device="cuda")


def build_grid_sample(gen):
    n, c, hw = 128, 64, 64
    theta = stn_theta(n, gen)
    x0 = uniform((n, c, hw, hw), gen)
    dy = uniform((n, c, hw, hw), gen)
    steps = {}
    for name, ac in (("align_corners=True (cuDNN path)", True), ("align_corners=False (native)", False)):
        grid0 = F.affine_grid(theta, (n, c, hw, hw), align_corners=ac)

        def step(ac=ac, grid0=grid0):
            x = x0.detach().requires_grad_(True)
            grid = grid0.detach().requires_grad_(True)
            y = F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=ac)
            y.backward(dy)
            return {"dx": x.grad, "dgrid": grid.grad}

        steps[name] = step
    return f"x[{n}, {c}, {hw}, {hw}] grid {hw}x{hw}", steps


def build_affine_grid(gen):
    n, hw = 128, 64
    theta0 = stn_theta(n, gen)
    dgrid = uniform((n, hw, hw, 2), gen)

    def step():
        theta = theta0.detach().requires_grad_(True)
        F.affine_grid(theta, (n, 1, hw, hw), align_corners=True).backward(dgrid)
        return {"dtheta": theta.grad}

    return f"theta[{n}, 2, 3] -> {hw}x{hw}", {"align_corners=True": step}


def build_roi_align(gen):
    if torchvision is None:
        raise RuntimeError("torchvision is not installed")
    n, c, hw, k = 8, 256, 64, 512
    rng = random.Random(int(torch.randint(0, 2**31, (1,), generator=gen)))
    objects = [(rng.uniform(200, 824), rng.uniform(200, 824), rng.uniform(120, 400), rng.uniform(120, 400))
               for _ in range(n * 4)]
    boxes = []
    for _ in range(k):
        o = rng.randrange(n * 4)
        cx, cy = objects[o][0] + rng.uniform(-40, 40), objects[o][1] + rng.uniform(-40, 40)
        w, h = objects[o][2] + rng.uniform(-40, 40), objects[o][3] + rng.uniform(-40, 40)
        boxes.append([float(o // 4), cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2])
    rois = torch.tensor(boxes, dtype=torch.float32, device="cuda")
    x0 = uniform((n, c, hw, hw), gen)
    dy = uniform((k, c, 7, 7), gen)

    def step():
        x = x0.detach().requires_grad_(True)
        y = torchvision.ops.roi_align(x, rois, output_size=(7, 7), spatial_scale=1.0 / 16, sampling_ratio=-1,
                                      aligned=True)
        y.backward(dy)
        return {"dx": x.grad}

    return f"x[{n}, {c}, {hw}, {hw}] {k} rois 7x7", {"torchvision": step}


def build_ctc_loss(gen):
    t, n, a, s = 100, 64, 11, 10
    logits0 = uniform((t, n, a), gen, -3.0, 3.0)
    targets = torch.randint(1, a, (n, s), generator=gen, dtype=torch.int64)
    lengths = tuple([s] * n)
    inputs = tuple([t] * n)
    cudnn_targets = targets.to(torch.int32).reshape(-1)  # CPU, int32, concatenated
    native_targets = targets.cuda()

    def make(tgt, in_len, tgt_len):
        def step():
            logits = logits0.detach().requires_grad_(True)
            cost = F.ctc_loss(F.log_softmax(logits, dim=2), tgt, in_len, tgt_len, blank=0, reduction="none")
            cost.sum().backward()
            return {"dlogits": logits.grad}
        return step

    return f"logits[{t}, {n}, {a}] labels {s}", {
        "cudnn-path": make(cudnn_targets, inputs, lengths),
        "native": make(native_targets, torch.tensor(inputs, device="cuda"), torch.tensor(lengths, device="cuda")),
    }


def build_spmm(gen):
    rows = cols = 100000
    k = 64
    rng = random.Random(int(torch.randint(0, 2**31, (1,), generator=gen)))
    crow, col = [0], []
    for _ in range(rows):
        cs = sorted({rng.randrange(cols) for _ in range(rng.randrange(21))})
        col.extend(cs)
        crow.append(len(col))
    vals = uniform((len(col),), gen)
    a = torch.sparse_csr_tensor(torch.tensor(crow, dtype=torch.int64), torch.tensor(col, dtype=torch.int64),
                                vals.cpu(), size=(rows, cols)).cuda()
    b0 = uniform((cols, k), gen)
    dc = uniform((rows, k), gen)

    def fwd():
        with torch.no_grad():
            return {"C": torch.sparse.mm(a, b0)}

    a_coo = a.to_sparse_coo().coalesce()

    def bwd(mat):
        def step():
            b = b0.detach().requires_grad_(True)
            torch.sparse.mm(mat, b).backward(dc)
            return {"dB": b.grad}
        return step

    return f"A {rows}x{cols} ({len(col)} entries) x [{cols}, {k}]", {
        "csr forward": fwd, "csr backward": bwd(a), "coo backward": bwd(a_coo)}


BUILDERS = {"grid_sample": build_grid_sample, "affine_grid": build_affine_grid, "roi_align": build_roi_align,
            "ctc_loss": build_ctc_loss, "spmm": build_spmm}


def run_variant(step, args):
    """{tensor name: measurements} for one step function under the current mode."""
    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()
    prints, first, diff, times = {}, {}, {}, []
    stream = torch.cuda.current_stream()
    for _ in range(args.runs):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(stream)
        out = step()
        end.record(stream)
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
        for name, t in out.items():
            prints.setdefault(name, set()).add(fingerprint(t))
            if name not in first:
                first[name] = t.detach().clone()
                diff[name] = 0.0
            else:
                diff[name] = max(diff[name], float((t.detach() - first[name]).abs().max()))
    times.sort()
    return {name: {"distinct": len(prints[name]), "max_abs_diff": diff[name]} for name in prints}, {
        "us_median": round(percentile(times, 0.5), 2), "us_p10": round(percentile(times, 0.1), 2),
        "us_p90": round(percentile(times, 0.9), 2)}


def emit(rec, args):
    line = json.dumps(rec)
    print(line, flush=True)
    if args.out:
        with open(args.out, "a") as f:
            f.write(line + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ops", default=",".join(OPS), help="comma list of " + ", ".join(OPS))
    ap.add_argument("--modes", default=",".join(MODES), help="comma list of " + ", ".join(MODES))
    ap.add_argument("--runs", type=int, default=20, help="timed and fingerprinted calls per configuration")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", help="append the JSON lines to this file as well")
    args = ap.parse_args()
    ops = [o for o in args.ops.split(",") if o]
    modes = [m for m in args.modes.split(",") if m]
    for o in ops:
        if o not in BUILDERS:
            ap.error(f"--ops: unknown op {o!r}; known: {', '.join(OPS)}")
    for m in modes:
        if m not in MODES:
            ap.error(f"--modes: unknown mode {m!r}; known: {', '.join(MODES)}")
    if not torch.cuda.is_available():
        ap.error("a CUDA device is needed")
    base = {"tool": "pytorch", "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
            "torchvision": getattr(torchvision, "__version__", None), "cudnn": torch.backends.cudnn.version(),
            "cuda": torch.version.cuda, "runs": args.runs, "warmup": args.warmup,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    for op in ops:
        gen = torch.Generator().manual_seed(args.seed)
        try:
            shape, steps = BUILDERS[op](gen)
        except Exception as exc:  # noqa: BLE001 - recorded, the other ops still run
            emit({**base, "op": op, "error": short_error(exc)}, args)
            continue
        for variant, step in steps.items():
            for mode in modes:
                rec = {**base, "op": op, "variant": variant, "mode": mode, "shape": shape}
                strict_error = None
                try:
                    apply_mode(mode)
                    results, timing = run_variant(step, args)
                except Exception as exc:  # noqa: BLE001
                    if mode != "deterministic":
                        emit({**rec, "error": short_error(exc)}, args)
                        continue
                    strict_error = short_error(exc)
                    torch.cuda.synchronize()
                    try:
                        with warnings.catch_warnings(record=True) as caught:
                            warnings.simplefilter("always")
                            apply_mode(mode, warn_only=True)
                            results, timing = run_variant(step, args)
                        ops_seen = []
                        for w in caught:
                            text = str(w.message).splitlines()[0][:300]
                            if "deterministic" in text and text not in ops_seen:
                                ops_seen.append(text)
                        rec["nondeterministic_ops"] = ops_seen
                    except Exception as exc2:  # noqa: BLE001
                        emit({**rec, "strict_error": strict_error, "error": short_error(exc2)}, args)
                        continue
                    rec["warn_only"] = True
                rec["strict_error"] = strict_error
                for name, r in results.items():
                    emit({**rec, "tensor": name, **r, **timing}, args)
                apply_mode("default")
                gc.collect()
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
