"""Where a ditto.torch call's host time goes: per op (a case of bench/torch_op_cases.py), one forward and
backward timed on the host in a loop, split into the time inside ditto's C++ functions (the binding:
argument conversion, the op's host code, kernel launches), the rest of ditto.torch's `_run` (packing the
tensors, handing the outputs to PyTorch by DLPack), the forward of an op that runs as one of ditto's C++
operators (ditto.torch.native_ops(): its autograd node made in C++, its backward inside PyTorch's engine)
and everything else (the autograd function, argument preparation such as label conversions, PyTorch's
autograd engine and the backward work it runs). PyTorch's own op is timed the same way beside it.

Host time per call: `--calls` calls back to back, the clock read before the first and after a device
synchronization following the last, divided by the calls. Where the GPU work of a call is shorter than
its host work (the case for these ops on the H100: compare bench/torch_ops.py --profile's kernel
time), that is the host cost.

  python bench/torch_host_split.py --only nll_loss-2d,cross_entropy-2d --device cuda --out split.json
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import ditto.torch as dt  # noqa: E402
import torch_op_cases as tc  # noqa: E402


class _Clock:
    """Seconds spent inside wrapped callables, per label."""

    def __init__(self):
        self.spent = collections.Counter()

    def wrap(self, label, fn):
        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.spent[label] += time.perf_counter() - t0
        return timed


class _TimedModule:
    """ditto's extension module with every function timed under one label."""

    def __init__(self, module, clock):
        self._module, self._clock = module, clock

    def __getattr__(self, name):
        return self._clock.wrap("binding", getattr(self._module, name))


def _sync(device):
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _step(case, inputs, way):
    out = case.torch(inputs) if way == "pytorch" else case.ditto(inputs, True)
    out.sum().backward() if out.dim() else out.backward()


def _time(case, inputs, way, calls, device):
    for _ in range(5):
        _step(case, inputs, way)
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(calls):
        _step(case, inputs, way)
    _sync(device)
    return (time.perf_counter() - t0) / calls * 1e6


def split(case, device, calls, scale):
    inputs = case.make(device, scale)
    row = {"op": case.name, "device": device, "calls": calls, "scale": scale, "shape": case.shape(inputs)}
    row["pytorch_us"] = _time(case, inputs, "pytorch", calls, device)
    row["ditto_us"] = _time(case, inputs, "ditto", calls, device)
    clock = _Clock()
    real_module, real_run = dt._ditto, dt._run
    real_native = [(op, op.native) for op in dt._OPS if op.native is not None]
    dt._ditto = _TimedModule(real_module, clock)
    dt._run = clock.wrap("run", real_run)
    for op, fn in real_native:
        op.native = clock.wrap("native", fn)
    try:
        timed_us = _time(case, inputs, "ditto", calls, device)
    finally:
        dt._ditto, dt._run = real_module, real_run
        for op, fn in real_native:
            op.native = fn
    per_call = {k: v / (calls + 5) * 1e6 for k, v in clock.spent.items()}
    row["ditto_instrumented_us"] = timed_us
    row["binding_us"] = per_call.get("binding", 0.0)
    row["run_packing_and_outputs_us"] = per_call.get("run", 0.0) - row["binding_us"]
    # A C++ operator's forward, with its autograd node; its backward runs inside PyTorch's engine (in
    # "rest" below, as PyTorch's own backward nodes do).
    row["native_forward_us"] = per_call.get("native", 0.0)
    row["python_rest_us"] = timed_us - per_call.get("run", 0.0) - row["native_forward_us"]
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="nll_loss-2d,cross_entropy-2d,index_add,embedding_bag-mean",
                    help="comma-separated case names of bench/torch_op_cases.py")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--calls", type=int, default=200, help="timed calls per way (default 200)")
    ap.add_argument("--scale", choices=["bench", "test"], default="bench",
                    help="the cases' sizes: bench/op_noise's (bench), or tiny ones (test) where even a CPU run "
                         "is host-bound, to see the host path without a GPU")
    ap.add_argument("--out", help="write the rows as JSON lines here as well")
    args = ap.parse_args()
    if args.calls < 1:
        ap.error("--calls: at least 1")
    cases = {c.name: c for c in tc.CASES}
    names = [n for n in args.only.split(",") if n]
    unknown = [n for n in names if n not in cases]
    if unknown:
        ap.error(f"--only: no case {unknown}; the cases: {', '.join(cases)}")
    rows = [split(cases[n], args.device, args.calls, args.scale) for n in names]
    print("| op | PyTorch µs | ditto µs | in ditto's C++ | _run's packing + outputs | C++ operator's forward | rest |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['op']} | {r['pytorch_us']:.0f} | {r['ditto_us']:.0f} | {r['binding_us']:.0f} | "
              f"{r['run_packing_and_outputs_us']:.0f} | {r['native_forward_us']:.0f} | {r['python_rest_us']:.0f} |")
    if args.out:
        with open(args.out + ".tmp", "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
        os.replace(args.out + ".tmp", args.out)


if __name__ == "__main__":
    main()
