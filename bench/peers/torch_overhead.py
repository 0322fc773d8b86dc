#!/usr/bin/env python3
r"""PyTorch peer of ditto's bench/overhead: the cost of determinism per model (the paper's figure 6).

For each model, precision and mode: the median milliseconds of one training step (forward,
cross-entropy, backward, SGD lr 0.01 momentum 0.9, zero_grad(set_to_none=True)) on one fixed
synthetic batch that stays on the GPU (fp32 storage, --batch images of 3x224x224, 3x299x299 for
inception-v3, 1000 classes), eager; torch.cuda.max_memory_allocated over the timed steps (the peak
is reset after warm-up), and over warm-up too. Every (model, precision, mode) starts from a fresh
model built from the same seed.

Models: torchvision's vgg16, vgg19, resnet34, resnet50, resnet101, resnet152, densenet121,
densenet169, densenet201, mobilenet_v2, efficientnet_b0 and inception_v3 (aux_logits=False, init_weights=True;
no weights are downloaded), and three torchvision lacks, defined here as ditto builds them:
MediumCNN(k) (the paper's: six blocks conv kxk padding k//2 with bias -> batch norm -> ReLU -> max
pool 2, widths 16 to 512 doubling, global average pool, linear 512 -> classes), Keras's Xception
(separable convolutions = depthwise 3x3 + pointwise 1x1, no bias) and Keras's MobileNet v1
("mobilenet": depthwise-separable blocks, ReLU6, a 1x1-conv classifier). Names as ditto writes
them ("mobilenet-v2", "mediumcnn-k3").

Precisions (--precisions, default fp32; peer_common.Precision): fp32 with TF32 off for cuBLAS and
cuDNN, as ditto's fp32; tf32 with both on; bf16 and fp16 as the PyTorch AMP examples train:
forward and loss under torch.autocast(device_type="cuda", dtype=...), model and input
channels-last, fp16 with a torch.amp.GradScaler("cuda").

Modes (each sets every switch explicitly; --modes, default default,deterministic):
  default        cudnn.benchmark off, not deterministic
  benchmark      cudnn.benchmark on, not deterministic (PyTorch's fastest)
  deterministic  torch.use_deterministic_algorithms(True), cudnn.deterministic on, benchmark off.
                 Where strict mode raises (an op without a deterministic implementation, e.g. the
                 backward of VGG's AdaptiveAvgPool2d((7, 7))), the error is recorded as
                 strict_error and the mode is run again with warn_only=True, whose warnings (the
                 ops that stayed nondeterministic) are recorded as nondeterministic_ops.
CUBLAS_WORKSPACE_CONFIG=:4096:8 is set (unless already set) before torch is imported, i.e. before
CUDA is initialised: deterministic cuBLAS requires it and it is read once per process.

Per step, a pair of CUDA events on the current stream; the host synchronizes once, after the last
timed step. One JSON line per (model, precision, mode), printed and appended to --out: tool, model,
mode, precision, autocast, memory_format, tf32, loss_scale (fp16), batch, image_size, classes,
dtype, optimizer, warmup, steps, ms_median, ms_p10, ms_p90, ms_min, ms_wall, ratio_vs_default (the
other modes, in the same precision), peak_mem_bytes, peak_mem_warmup_bytes, mem_source,
deterministic, warn_only, strict_error, nondeterministic_ops, params, gpu, torch, torchvision,
cudnn, cublas_workspace_config, date; a failed one has error and oom (out of memory) instead of
the timings, and configurations past --budget-s are recorded as skipped; with --resume, configurations --out
already holds a measurement or an out-of-memory failure of are not run again (a line without a
precision is fp32).

  python3 bench/peers/torch_overhead.py --models resnet50,vgg16 --precisions fp32,bf16 --out /tmp/torch_overhead.jsonl
"""
import os

# Must precede `import torch`: read once, when the first cuBLAS workspace is sized.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import argparse  # noqa: E402
import datetime  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # peer_common beside this file
from peer_common import PRECISIONS, Precision, parse_precisions, percentile, short_error, train_step  # noqa: E402

try:
    import torchvision  # noqa: E402
except ImportError:  # the models defined here still run
    torchvision = None

warnings.filterwarnings("ignore", message=".*new API settings to control TF32.*")

ZOO = ["vgg16", "vgg19", "resnet34", "resnet50", "resnet101", "resnet152", "densenet121", "densenet169",
       "densenet201", "mobilenet", "mobilenet-v2", "efficientnet-b0", "inception-v3", "xception", "mediumcnn-k1",
       "mediumcnn-k3", "mediumcnn-k5", "mediumcnn-k7"]
MODES = ["default", "benchmark", "deterministic"]
DEFAULT_MODES = ["default", "deterministic"]
LR, MOMENTUM = 0.01, 0.9


class MediumCNN(nn.Module):
    """The paper's MediumCNN(k), as nets/small.cpp builds it: conv kxk (padding k//2, bias) -> BN ->
    ReLU -> max pool 2 for widths 16, 32, 64, 128, 256, 512; global average pool; linear 512 ->
    classes."""

    def __init__(self, k, classes):
        super().__init__()
        layers, c = [], 3
        for width in (16, 32, 64, 128, 256, 512):
            layers += [nn.Conv2d(c, width, k, padding=k // 2, bias=True), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
                       nn.MaxPool2d(2)]
            c = width
        self.features = nn.Sequential(*layers)
        self.fc = nn.Linear(512, classes)

    def forward(self, x):
        return self.fc(self.features(x).mean(dim=(2, 3)))


class SeparableConv2d(nn.Sequential):
    """Keras's SeparableConv2D(padding="same", use_bias=False): depthwise 3x3 then pointwise 1x1."""

    def __init__(self, cin, cout):
        super().__init__(nn.Conv2d(cin, cin, 3, padding=1, groups=cin, bias=False), nn.Conv2d(cin, cout, 1, bias=False))


def _sep_bn(cin, cout, relu_first):
    return ([nn.ReLU(inplace=False)] if relu_first else []) + [SeparableConv2d(cin, cout), nn.BatchNorm2d(cout)]


class XceptionBlock(nn.Module):
    """An entry/exit-flow block: [ReLU] sep -> BN -> ReLU -> sep -> BN -> max pool 3/2 'same', plus
    a strided 1x1 conv + BN shortcut."""

    def __init__(self, cin, c1, c2, relu_first):
        super().__init__()
        self.body = nn.Sequential(*_sep_bn(cin, c1, relu_first), *_sep_bn(c1, c2, True), nn.MaxPool2d(3, 2, padding=1))
        self.shortcut = nn.Sequential(nn.Conv2d(cin, c2, 1, stride=2, bias=False), nn.BatchNorm2d(c2))

    def forward(self, x):
        return self.body(x) + self.shortcut(x)


class MiddleBlock(nn.Module):
    def __init__(self, c=728):
        super().__init__()
        self.body = nn.Sequential(*_sep_bn(c, c, True), *_sep_bn(c, c, True), *_sep_bn(c, c, True))

    def forward(self, x):
        return self.body(x) + x


class Xception(nn.Module):
    """keras.applications.Xception (include_top): conv 3x3/2 32 'valid' -> BN -> ReLU -> conv 3x3 64
    'valid' -> BN -> ReLU; entry blocks 128, 256, 728; 8 middle blocks of 728; exit block 728/1024;
    sep 1536 -> BN -> ReLU -> sep 2048 -> BN -> ReLU; global average pool; dense classes. 22,910,480
    parameters for 1000 classes (Keras counts BN's moving statistics too; PyTorch's buffers)."""

    def __init__(self, classes):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 32, 3, stride=2, bias=False), nn.BatchNorm2d(32), nn.ReLU(inplace=True),
                                  nn.Conv2d(32, 64, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True))
        self.entry = nn.Sequential(XceptionBlock(64, 128, 128, False), XceptionBlock(128, 256, 256, True),
                                   XceptionBlock(256, 728, 728, True))
        self.middle = nn.Sequential(*[MiddleBlock() for _ in range(8)])
        self.exit = XceptionBlock(728, 728, 1024, True)
        self.tail = nn.Sequential(SeparableConv2d(1024, 1536), nn.BatchNorm2d(1536), nn.ReLU(inplace=True),
                                  SeparableConv2d(1536, 2048), nn.BatchNorm2d(2048), nn.ReLU(inplace=True))
        self.fc = nn.Linear(2048, classes)

    def forward(self, x):
        x = self.tail(self.exit(self.middle(self.entry(self.stem(x)))))
        return self.fc(x.mean(dim=(2, 3)))


class MobileNetV1(nn.Module):
    """keras.applications.MobileNet (v1, alpha 1.0, include_top), as nets/mobilenet.cpp builds it:
    conv 3x3/2 32 -> BN -> ReLU6; 13 blocks of depthwise 3x3 (stride 2 in blocks 2, 4, 6, 12) -> BN
    -> ReLU6 -> pointwise 1x1 -> BN -> ReLU6 to 64, 128, 128, 256, 256, 512 x6, 1024, 1024; global
    average pool -> dropout 1e-3 -> 1x1 conv with bias -> [N, classes]. No other bias. Batch norm
    eps 1e-3, momentum 0.01 (Keras's 0.99). 4,231,976 parameters for 1000 classes (Keras's summary
    says 4,253,864: it counts BN's moving statistics, PyTorch's buffers). Padding 1 on every 3x3
    conv, as ditto's symmetric padding (Keras pads its stride-2 convs 0 before, 1 after: the same
    sizes at 224x224, windows one pixel apart)."""

    BLOCKS = [(64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2)] + [(512, 1)] * 5 + [(1024, 2), (1024, 1)]

    def __init__(self, classes):
        super().__init__()

        def conv_bn(cin, cout, kernel, stride, groups):
            return [nn.Conv2d(cin, cout, kernel, stride=stride, padding=kernel // 2, groups=groups, bias=False),
                    nn.BatchNorm2d(cout, eps=1e-3, momentum=0.01), nn.ReLU6(inplace=True)]

        layers, c = conv_bn(3, 32, 3, 2, 1), 32
        for cout, stride in self.BLOCKS:
            layers += conv_bn(c, c, 3, stride, c) + conv_bn(c, cout, 1, 1, 1)
            c = cout
        self.features = nn.Sequential(*layers)
        self.dropout = nn.Dropout(1e-3)
        self.conv_preds = nn.Conv2d(c, classes, 1, bias=True)

    def forward(self, x):
        x = self.dropout(F.adaptive_avg_pool2d(self.features(x), 1))
        return torch.flatten(self.conv_preds(x), 1)


def build_model(name, classes):
    if name.startswith("mediumcnn-k"):
        return MediumCNN(int(name[len("mediumcnn-k"):]), classes)
    if name == "xception":
        return Xception(classes)
    if name == "mobilenet":
        return MobileNetV1(classes)
    if torchvision is None:
        raise RuntimeError("torchvision is not installed")
    tv = torchvision.models
    if name == "inception-v3":
        return tv.inception_v3(weights=None, aux_logits=False, init_weights=True, num_classes=classes)
    return getattr(tv, name.replace("-", "_"))(weights=None, num_classes=classes)


def image_size(args, name):
    if args.image_size:
        return args.image_size
    return 299 if name == "inception-v3" else 224


def apply_mode(mode, precision, warn_only=False):
    det = mode == "deterministic"
    torch.use_deterministic_algorithms(det, warn_only=warn_only)
    torch.backends.cudnn.deterministic = det
    torch.backends.cudnn.benchmark = mode == "benchmark"
    precision.apply_switches()


def measure(name, mode, precision, warn_only, x, y, args):
    apply_mode(mode, precision, warn_only)
    torch.manual_seed(args.seed)
    model, x = precision.prepare(build_model(name, args.classes).to(x.device).train(), x)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    scaler = precision.grad_scaler()

    def step():
        train_step(model, opt, x, y, precision, scaler)

    try:
        torch.cuda.reset_peak_memory_stats()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(args.warmup):
                step()
            torch.cuda.synchronize()
        peak_warmup = torch.cuda.max_memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(args.steps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(args.steps)]
        stream = torch.cuda.current_stream()
        t0 = time.perf_counter()
        for i in range(args.steps):
            starts[i].record(stream)
            step()
            ends[i].record(stream)
        torch.cuda.synchronize()
        wall_ms = (time.perf_counter() - t0) * 1e3 / args.steps
        per_step = sorted(s.elapsed_time(e) for s, e in zip(starts, ends))
        ops = []
        for w in caught:
            text = str(w.message).splitlines()[0][:300]
            if "deterministic" in text and text not in ops:
                ops.append(text)
        return {
            "ms_median": round(percentile(per_step, 0.5), 5),
            "ms_p10": round(percentile(per_step, 0.1), 5),
            "ms_p90": round(percentile(per_step, 0.9), 5),
            "ms_min": round(per_step[0], 5),
            "ms_wall": round(wall_ms, 5),
            "peak_mem_bytes": torch.cuda.max_memory_allocated(),
            "peak_mem_warmup_bytes": peak_warmup,
            "params": sum(p.numel() for p in model.parameters()),
            "nondeterministic_ops": ops,
        }
    finally:
        del opt, model, x, scaler


def is_oom(exc):
    return isinstance(exc, torch.cuda.OutOfMemoryError) or "out of memory" in str(exc).lower()


def cleanup():
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


def measured_in(path):
    """{(model, mode, precision): median ms} of the measurements in path; None for out-of-memory
    failures (the same batch would fail again). The last line wins; a line without a precision is fp32."""
    done = {}
    if not os.path.exists(path):
        return done
    with open(path) as f:
        for text in f:
            try:
                rec = json.loads(text)
            except json.JSONDecodeError:
                continue
            if not isinstance(rec, dict) or rec.get("tool") != "pytorch" or "model" not in rec or "mode" not in rec:
                continue
            key = (rec["model"], rec["mode"], rec.get("precision", "fp32"))
            if not rec.get("error") and isinstance(rec.get("ms_median"), (int, float)):
                done[key] = rec["ms_median"]
            elif rec.get("oom") and not rec.get("skipped"):
                done[key] = None
            else:
                done.pop(key, None)
    return done


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(ZOO), help="comma list of " + ", ".join(ZOO))
    ap.add_argument("--modes", default=",".join(DEFAULT_MODES), help="comma list of " + ", ".join(MODES))
    ap.add_argument("--precisions", default="fp32", help="comma list of " + ", ".join(PRECISIONS))
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--classes", type=int, default=1000)
    ap.add_argument("--image-size", type=int, default=0, help="image side (0: 224, 299 for inception-v3)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps before the timed ones")
    ap.add_argument("--steps", type=int, default=100,
                    help="timed steps (median; 100 as the paper profiled, ditto's bench/overhead default)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the weights and of the synthetic batch")
    ap.add_argument("--budget-s", type=float, default=0, help="start no configuration after this many seconds")
    ap.add_argument("--out", help="append the JSON lines to this file as well")
    ap.add_argument("--resume", action="store_true",
                    help="skip the (model, mode, precision) configurations --out already holds a measurement (or an "
                         "out-of-memory failure) of")
    args = ap.parse_args()

    models = [m for m in args.models.split(",") if m]
    asked = [m for m in args.modes.split(",") if m]
    bad = [m for m in models if m not in ZOO] + [m for m in asked if m not in MODES]
    modes = [m for m in MODES if m in asked]  # default first: the others carry their ratio to it
    if bad:
        ap.error(f"unknown model(s) or mode(s) {', '.join(bad)}; models: {', '.join(ZOO)}; modes: {', '.join(MODES)}")
    try:
        precisions = parse_precisions(args.precisions)
    except ValueError as exc:
        ap.error(str(exc))
    if args.steps < 1 or args.warmup < 1 or args.batch < 1:
        ap.error("need --steps >= 1, --warmup >= 1, --batch >= 1")
    if args.resume and not args.out:
        ap.error("--resume needs --out")
    if not torch.cuda.is_available():
        sys.exit("torch_overhead.py: no CUDA device")
    done = measured_in(args.out) if args.resume else {}

    dev = torch.device("cuda")
    common = {
        "tool": "pytorch", "batch": args.batch, "classes": args.classes, "dtype": "fp32",
        "optimizer": f"sgd lr {LR} momentum {MOMENTUM}", "warmup": args.warmup, "steps": args.steps,
        "mem_source": "torch.cuda.max_memory_allocated: timed steps after reset_peak_memory_stats; warmup: the "
                      "warm-up steps",
        "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
        "torchvision": getattr(torchvision, "__version__", None), "cudnn": torch.backends.cudnn.version(),
        "cublas_workspace_config": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
    }
    t_start = time.perf_counter()
    out = open(args.out, "a") if args.out else None
    failures = 0
    try:
        for name in models:
            size = image_size(args, name)
            gen = torch.Generator(device=dev)
            gen.manual_seed(args.seed)
            x = torch.randn(args.batch, 3, size, size, generator=gen, device=dev)
            y = torch.randint(0, args.classes, (args.batch,), generator=gen, device=dev)
            for precision in map(Precision, precisions):
                median = {mode: ms for (m, mode, p), ms in done.items()
                          if m == name and p == precision.name and ms is not None}
                for mode in modes:
                    key = (name, mode, precision.name)
                    if key in done:
                        what = "measured" if done[key] is not None else "out of memory"
                        print(f"{name:16s} {mode:14s} {precision.name:5s} {what} in {args.out} already (--resume)",
                              file=sys.stderr)
                        continue
                    line = {"tool": "pytorch", "model": name, "mode": mode, "image_size": size}
                    line.update(precision.fields())
                    line.update(common)
                    line.update({"deterministic": mode == "deterministic", "warn_only": False})
                    if args.budget_s and time.perf_counter() - t_start > args.budget_s:
                        line.update({"skipped": True, "oom": False,
                                     "error": f"skipped: --budget-s {args.budget_s:g} spent"})
                    elif not measure_into(line, name, mode, precision, x, y, args, median, out):
                        failures += 1
                    write_line(line, out)
                    status = line.get("error") or (f"{line['ms_median']:.2f} ms/step, peak "
                                                   f"{line['peak_mem_bytes'] / 2**30:.2f} GiB"
                                                   + (" (warn_only)" if line["warn_only"] else ""))
                    print(f"{name:16s} {mode:14s} {precision.name:5s} {status}  [{time.perf_counter() - t_start:.0f} s]",
                          file=sys.stderr, flush=True)
            del x, y
    finally:
        apply_mode("default", Precision("fp32"))
        if out:
            out.close()
    return 1 if failures else 0


def measure_into(line, name, mode, precision, x, y, args, median, out):
    """Measures one configuration into line (its times, or its error); median holds this model's
    medians by mode in this precision and gains this one. Returns whether it was measured. A sticky
    CUDA error while cleaning up is written out and raised: later lines would be meaningless."""
    measured = True
    try:
        strict_error = None
        try:
            line.update(measure(name, mode, precision, False, x, y, args))
        except RuntimeError as exc:
            # Strict mode's refusal names the op; anything else is a real failure.
            if mode != "deterministic" or "deterministic" not in str(exc) or is_oom(exc):
                raise
            strict_error = short_error(exc)
        if strict_error:
            # Outside the except clause: its traceback held the failed step's tensors.
            line["strict_error"] = strict_error
            cleanup()
            line["warn_only"] = True
            line.update(measure(name, mode, precision, True, x, y, args))
        median[mode] = line["ms_median"]
        if mode != "default" and "default" in median:
            line["ratio_vs_default"] = round(line["ms_median"] / median["default"], 5)
    except Exception as exc:  # record it and go on
        measured = False
        line.update({"ms_median": None, "error": short_error(exc), "oom": is_oom(exc)})
    try:
        cleanup()
    except Exception as exc:
        line.setdefault("error", short_error(exc))
        write_line(line, out)
        raise
    return measured


def write_line(line, out):
    text = json.dumps(line)
    print(text, flush=True)
    if out:
        out.write(text + "\n")
        out.flush()


if __name__ == "__main__":
    sys.exit(main())
