#!/usr/bin/env python3
r"""PyTorch peer of ditto's bench/step_time: milliseconds per training step on one fixed batch.

Runs the same networks as nets/small.cpp and resnet.cpp (SmallCNN, SmallCNN-BN, ResNet-18 for CIFAR; 10 classes,
3x32x32 inputs) through one training step (forward, cross-entropy, backward, optimizer step,
zero_grad(set_to_none=True)) on a synthetic batch that stays on the GPU, under several settings of
PyTorch's global switches ("modes") and precisions, each eagerly and, unless --no-graph, as one
captured CUDA graph replayed per step. Every (model, precision, mode, graph) starts from a fresh
model built from the same seed.

Per step, a pair of CUDA events recorded on the current stream brackets the step; the host
synchronizes only once, after the last timed step. Prints one JSON line per (model, precision,
mode, graph), also appended to --out, with the median / p10 / p90 of the per-step event times, the
wall-clock time of the whole timed loop (final synchronize included) divided by the number of
steps, and torch.cuda.max_memory_allocated from the model's creation through the warm-up (and the
capture) and, after a reset, over the timed steps (a graphed step's activations live in the graph's
private pool and are not allocated then: compare eager lines).

Modes (each sets every switch below explicitly, so no mode inherits from the one before it):
  default                  cudnn.benchmark off, not deterministic
  benchmark                default + cudnn.benchmark on
  deterministic            torch.use_deterministic_algorithms(True), cudnn.deterministic on
  deterministic-benchmark  deterministic + cudnn.benchmark on
Precisions (--precisions, default fp32; peer_common.Precision): fp32 TF32 off for cuBLAS matmul
and cuDNN; tf32 both on (the modes "tf32" and "tf32-deterministic" of older files are default and
deterministic at tf32); bf16 and fp16 automatic mixed precision as the PyTorch AMP examples train:
forward and loss under torch.autocast(device_type="cuda", dtype=torch.bfloat16 / torch.float16),
model and input channels-last, and for fp16 a torch.amp.GradScaler("cuda"). A graphed fp16 step
captures forward, loss, scaled backward and replays them; GradScaler.step syncs with the host, which
a capture forbids, so scaler.step(optimizer) and scaler.update() run eagerly after each replay and
are timed with it (the PyTorch CUDA Graphs notes, "Usage with torch.cuda.amp").
CUBLAS_WORKSPACE_CONFIG=:4096:8 is set (unless already set) before torch is imported: deterministic
mode requires it and it is read once per process, when the first cuBLAS workspace is sized, so every
mode runs with it.

  /opt/torch/.venv/bin/python3 bench/peers/torch_step_time.py --models smallcnn,resnet18 \
      --modes default,deterministic --precisions fp32,bf16,fp16 --steps 100 --out /tmp/step_time_torch.jsonl
"""
import os

# Must precede `import torch`: read once, when the first cuBLAS workspace is sized.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import argparse  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peer_common import (PRECISIONS, Precision, forward_backward, parse_precisions, percentile, short_error,  # noqa: E402
                         train_step)
from torch_train import ResNet18, SmallCNN  # noqa: E402

# PyTorch >= 2.9 warns that allow_tf32 will give way to fp32_precision. We set only the legacy
# flags, which keep cuDNN conv/RNN and cuBLAS consistent; mixing the two APIs is what raises.
warnings.filterwarnings("ignore", message=".*new API settings to control TF32.*")


class SmallCNNBN(SmallCNN):
    """ditto's "smallcnn-bn": SmallCNN with conv -> batchnorm -> relu -> maxpool. The convs keep
    their bias (nets/small.cpp builds them with bias), zero-initialised; BN gamma 1,
    beta 0, momentum 0.1, eps 1e-5 (nets/module.h defaults, the same as PyTorch's)."""

    def __init__(self, classes=10):
        super().__init__(classes)
        self.bn1 = nn.BatchNorm2d(16)
        self.bn2 = nn.BatchNorm2d(32)
        self.bn3 = nn.BatchNorm2d(32)

    def forward(self, x):
        for conv, bn in ((self.conv1, self.bn1), (self.conv2, self.bn2), (self.conv3, self.bn3)):
            x = F.max_pool2d(F.relu(bn(conv(x))), 2)
        x = x.mean(dim=(2, 3))
        return self.fc2(F.relu(self.fc1(x)))


MODELS = {"smallcnn": SmallCNN, "smallcnn-bn": SmallCNNBN, "resnet18": ResNet18}

# benchmark: cudnn.benchmark; deterministic: use_deterministic_algorithms + cudnn.deterministic.
# TF32 is the precision's to set (peer_common.Precision).
MODES = {
    "default": dict(benchmark=False, deterministic=False),
    "benchmark": dict(benchmark=True, deterministic=False),
    "deterministic": dict(benchmark=False, deterministic=True),
    "deterministic-benchmark": dict(benchmark=True, deterministic=True),
}

NUM_CLASSES = 10
CAPTURE_WARMUP_ITERS = 3  # eager iterations on a side stream before capture, as the PyTorch docs do


def apply_mode(mode, precision):
    m = MODES[mode]
    torch.use_deterministic_algorithms(m["deterministic"])
    torch.backends.cudnn.deterministic = m["deterministic"]
    torch.backends.cudnn.benchmark = m["benchmark"]
    precision.apply_switches()


def build_model(name, seed, device):
    torch.manual_seed(seed)
    model = MODELS[name](NUM_CLASSES).to(device)
    model.train()
    return model


def build_optimizer(model, args, capturable):
    if args.optimizer == "adam":
        # capturable=True keeps Adam's step count on the GPU, so the step can live inside a graph.
        return torch.optim.Adam(model.parameters(), lr=args.lr, capturable=capturable)
    return torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)


def capture_step(model, opt, x, y, precision, scaler):
    """Whole-network capture as in the PyTorch "CUDA Graphs" notes: warm up eagerly on a side
    stream (lazy init, cuDNN/cuBLAS handles, optimizer state, the GradScaler's scale, cudnn.benchmark
    search), then capture forward and loss (under the precision's autocast) and backward, and the
    optimizer step unless a GradScaler runs it (its step syncs with the host: the caller runs
    scaler.step and scaler.update eagerly after each replay, as the notes' AMP section does).
    Gradients are None when capture starts, so backward allocates them from the graph's private pool
    and every replay overwrites them."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(CAPTURE_WARMUP_ITERS):
            train_step(model, opt, x, y, precision, scaler)
    torch.cuda.current_stream().wait_stream(side)

    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        static_loss = forward_backward(model, x, y, precision, scaler)
        if scaler is None:
            opt.step()
    return graph, static_loss


def replay_step(graph, opt, scaler):
    """One graphed step: the replay, then (with a GradScaler) its eager optimizer step and update."""
    if scaler is None:
        return graph.replay

    def step():
        graph.replay()
        scaler.step(opt)
        scaler.update()
    return step


def time_steps(run_one_step, warmup, steps):
    """Times the steps after warmup; peak memory (max_memory_allocated) up to the end of the warm-up
    (from the caller's reset) and, after a reset, over the timed steps."""
    for _ in range(warmup):
        run_one_step()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(steps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(steps)]
    torch.cuda.synchronize()
    peak_warmup = torch.cuda.max_memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    stream = torch.cuda.current_stream()
    t0 = time.perf_counter()
    for i in range(steps):
        starts[i].record(stream)
        run_one_step()
        ends[i].record(stream)
    torch.cuda.synchronize()
    wall_ms = (time.perf_counter() - t0) * 1e3 / steps
    per_step = sorted(s.elapsed_time(e) for s, e in zip(starts, ends))
    return {
        "ms_median": round(percentile(per_step, 0.5), 5),
        "ms_p10": round(percentile(per_step, 0.1), 5),
        "ms_p90": round(percentile(per_step, 0.9), 5),
        "ms_wall": round(wall_ms, 5),
        "peak_mem_bytes": torch.cuda.max_memory_allocated(),
        "peak_mem_warmup_bytes": peak_warmup,
    }


def measure(model_name, mode, precision, graphed, x, y, args):
    apply_mode(mode, precision)
    torch.cuda.reset_peak_memory_stats()
    model, x = precision.prepare(build_model(model_name, args.seed, x.device), x)
    scaler = precision.grad_scaler()
    # capturable=True keeps Adam's step count on the GPU for a step inside the graph; a GradScaler's
    # step runs eagerly, so the optimizer is the ordinary one then.
    opt = build_optimizer(model, args, capturable=graphed and scaler is None)
    graph = None
    stream = torch.cuda.current_stream()
    try:
        if graphed:
            graph, _ = capture_step(model, opt, x, y, precision, scaler)
            return time_steps(replay_step(graph, opt, scaler), args.warmup, args.steps)
        return time_steps(lambda: train_step(model, opt, x, y, precision, scaler), args.warmup, args.steps)
    finally:
        # torch.cuda.graph.__exit__ leaves its capture stream current if capture_end raises.
        torch.cuda.set_stream(stream)
        del graph, opt, model, x, scaler


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(MODELS), help="comma list of " + ", ".join(MODELS))
    ap.add_argument("--modes", default=",".join(MODES), help="comma list of " + ", ".join(MODES))
    ap.add_argument("--precisions", default="fp32", help="comma list of " + ", ".join(PRECISIONS))
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--warmup", type=int, default=20, help="untimed steps before the timed ones")
    ap.add_argument("--steps", type=int, default=100, help="timed steps")
    ap.add_argument("--optimizer", default="adam", choices=["adam", "sgd"])
    ap.add_argument("--lr", type=float, default=4e-4)
    ap.add_argument("--momentum", type=float, default=0.9, help="SGD only")
    ap.add_argument("--seed", type=int, default=0, help="seed of the weights and of the synthetic batch")
    ap.add_argument("--graph", dest="graph", action="store_true", default=True,
                    help="also time each mode as a captured CUDA graph (default)")
    ap.add_argument("--no-graph", dest="graph", action="store_false", help="eager only")
    ap.add_argument("--out", help="append the JSON lines to this file as well")
    args = ap.parse_args()

    models = [m for m in args.models.split(",") if m]
    modes = [m for m in args.modes.split(",") if m]
    for name, known in (("model", MODELS), ("mode", MODES)):
        bad = [v for v in (models if name == "model" else modes) if v not in known]
        if bad:
            ap.error(f"unknown {name}(s) {', '.join(bad)}; known: {', '.join(known)}")
    try:
        precisions = parse_precisions(args.precisions)
    except ValueError as exc:
        ap.error(str(exc))
    if args.steps < 1 or args.warmup < 0 or args.batch < 1:
        ap.error("need --steps >= 1, --warmup >= 0, --batch >= 1")
    if not torch.cuda.is_available():
        sys.exit("torch_step_time.py: no CUDA device")

    dev = torch.device("cuda")
    common = {
        "tool": "pytorch",
        "batch": args.batch,
        "steps": args.steps,
        "warmup": args.warmup,
        "optimizer": args.optimizer,
        "lr": args.lr,
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "cudnn": torch.backends.cudnn.version(),
        "cublas_workspace_config": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
        "mem_source": "torch.cuda.max_memory_allocated: timed steps after reset_peak_memory_stats; warmup: model "
                      "creation through the warm-up steps (and the capture); graphed: the graph's private pool "
                      "blocks freed during capture left out",
    }
    out = open(args.out, "a") if args.out else None
    try:
        for model_name in models:
            # One fixed batch per model, the same for every mode; it is the graph's static input too.
            gen = torch.Generator(device=dev)
            gen.manual_seed(args.seed)
            x = torch.randn(args.batch, 3, 32, 32, generator=gen, device=dev)
            y = torch.randint(0, NUM_CLASSES, (args.batch,), generator=gen, device=dev)
            for precision in map(Precision, precisions):
                for mode in modes:
                    for graphed in ([False, True] if args.graph else [False]):
                        line = {"tool": "pytorch", "model": model_name, "mode": mode, "graph": graphed}
                        line.update(precision.fields())
                        line.update(common)
                        try:
                            line.update(measure(model_name, mode, precision, graphed, x, y, args))
                        except Exception as exc:  # record it and go on to the next mode
                            line.update({"ms_median": None, "ms_p10": None, "ms_p90": None, "ms_wall": None,
                                         "error": short_error(exc)})
                        gc.collect()
                        try:
                            torch.cuda.synchronize()
                            torch.cuda.empty_cache()
                        except Exception as exc:  # a sticky CUDA error: later lines would be meaningless
                            line.setdefault("error", short_error(exc))
                            print(json.dumps(line), flush=True)
                            if out:
                                out.write(json.dumps(line) + "\n")
                            raise
                        text = json.dumps(line)
                        print(text, flush=True)
                        if out:
                            out.write(text + "\n")
                            out.flush()
                        status = line.get("error") or (f"{line['ms_median']:.3f} ms/step, peak "
                                                       f"{line['peak_mem_bytes'] / 2**20:.1f} MiB")
                        print(f"{model_name:12s} {mode:24s} {precision.name:5s} {'graph' if graphed else 'eager'} "
                              f"{status}", file=sys.stderr, flush=True)
    finally:
        apply_mode("default", Precision("fp32"))
        if out:
            out.close()


if __name__ == "__main__":
    main()
