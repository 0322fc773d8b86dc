"""ditto.torch's ops against PyTorch's own, at bench/op_noise's sizes, on one GPU: per op one forward
and backward timed (CUDA events, after warm-up; each call alone, and calls queued back to back) for
PyTorch's default mode, PyTorch's deterministic
mode (or the error it raises), ditto deterministic and ditto nondeterministic; and, over 20 calls,
how many distinct results (output and gradients hashed) each gives. The modes' timed calls are
interleaved (--rounds rounds, mode after mode): these calls are mostly host time, and the host's
speed drifts over seconds, which timing one mode after the other would book to whichever came last.

    python bench/torch_ops.py --out bench/results/DATE-torch-ops [--runs 20] [--only grid_sample] [--profile]
    python bench/torch_ops.py --merge LOG... --out DIR    # the table from earlier runs' printed records

Each record is printed as a JSON line as it is measured (the first line is the run's meta), so runs
split over several device calls on one GPU can be assembled with --merge (a later record of an op
and mode replaces an earlier one). --profile adds, per op, each way's GPU kernel time per call and
its largest kernels (torch.profiler, CUDA activity), which says where a slower way spends the time,
and its host side (wall time per call and the host events with the most self time: PyTorch's ops and
every library's CUDA runtime calls, where a synchronization or an allocation in the call shows);
--profile-only records just that. Writes torch_ops.json (one record per op and mode, with the GPU, PyTorch and ditto versions) and
torch_ops.md (the table). PyTorch's deterministic mode runs with fill_uninitialized_memory off (its
cost is not the algorithms') and CUBLAS_WORKSPACE_CONFIG=:4096:8 (which it requires); PyTorch's
TF32 is off (ditto's ops here are float32).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import shutil
import statistics
import sys

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import ditto  # noqa: E402
import ditto.torch as dt  # noqa: E402
import torch_op_cases as tc  # noqa: E402


_gpu = None


def digest(tensors) -> str:
    """The tensors' bits, hashed on the GPU (ditto's XXH3-128 fingerprint of each, zero-copy)."""
    global _gpu
    if _gpu is None:
        _gpu = ditto.Context("cuda")
    return ",".join(_gpu.from_dlpack(t.detach().contiguous()).fingerprint() for t in tensors)


def timed(fn, repeats: int) -> list:
    """Microseconds of each of `repeats` calls of fn (after warm-up), each bracketed by CUDA events."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0)
    return times


def timed_back_to_back(fn, repeats: int) -> float:
    """Microseconds per call of fn over `repeats` calls queued one after another between two CUDA events
    (after warm-up): the host's work of a call overlaps the GPU's work of the one before, as in a
    training loop. Each call alone (timed) leaves the GPU idle while the host prepares the call."""
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1000.0 / repeats


def time_modes(fns: dict, repeats: int, rounds: int) -> dict:
    """Each mode's calls timed in `rounds` interleaved rounds (mode after mode, the order rotating from
    round to round), so that a slow spell of the host (another process, a clock change) falls on every
    mode alike rather than on whichever was measuring then: per mode the median of all its single
    calls, and the median over rounds of its back-to-back time per call."""
    names = list(fns)
    alone = {m: [] for m in names}
    queued = {m: [] for m in names}
    per_round = max(1, repeats // rounds)
    for r in range(rounds):
        for m in names[r % len(names):] + names[:r % len(names)]:
            fn, det = fns[m]
            torch.use_deterministic_algorithms(det)
            try:
                alone[m] += timed(fn, per_round)
                queued[m].append(timed_back_to_back(fn, per_round))
            finally:
                torch.use_deterministic_algorithms(False)
    return {m: (statistics.median(alone[m]), statistics.median(queued[m])) for m in names}


def kernel_profile(fn, steps: int = 3) -> dict:
    """GPU kernel time per call of fn (summed over its kernels, memsets and copies) and the largest."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(steps):
            fn()
        torch.cuda.synchronize()
    rows = []
    for e in p.key_averages():
        t = getattr(e, "device_time_total", None)
        t = t if t is not None else getattr(e, "cuda_time_total", 0)
        if t > 0:
            rows.append({"kernel": e.key[:120], "us": t / steps, "calls": e.count / steps})
    rows.sort(key=lambda r: -r["us"])
    return {"gpu_us": sum(r["us"] for r in rows), "kernels": rows[:6]}


def host_profile(fn, steps: int = 10, top: int = 6) -> dict:
    """Where fn's host time goes: its wall time per call, and the host-side events (PyTorch's ops, the
    CUDA runtime calls of every library in the process, ditto's included: a cudaStreamSynchronize or
    cudaMalloc in a call shows here) with the most self time per call (torch.profiler, CPU view)."""
    import time
    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    fn()
    t0 = time.perf_counter()
    for _ in range(steps):
        fn()
    wall = (time.perf_counter() - t0) / steps * 1e6
    with profile(activities=activities) as p:
        for _ in range(steps):
            fn()
    rows = [{"event": e.key[:120], "self_us": e.self_cpu_time_total / steps, "calls": e.count / steps}
            for e in p.key_averages() if e.self_cpu_time_total > 0]
    rows.sort(key=lambda r: -r["self_us"])
    return {"wall_us": wall, "events": rows[:top]}


def mode_fn(case, inputs, dy, mode: str):
    """One forward and backward of the case in a mode, and whether PyTorch's deterministic mode is on for it."""
    if mode.startswith("pytorch"):
        return (lambda: tc.step(case, inputs, "torch", dy)), mode == "pytorch-deterministic"  # noqa: E731
    return (lambda: tc.step(case, inputs, "ditto", dy, mode == "ditto-deterministic")), False  # noqa: E731


def measure(case, inputs, dy, mode: str, runs: int, profile: bool, timing: bool = True) -> dict:
    """A mode's result, distinct results over `runs` calls and profiles; its times come from time_modes."""
    row = {"op": case.name, "mode": mode, "shape": case.shape(inputs)}
    fn, det_mode = mode_fn(case, inputs, dy, mode)
    torch.use_deterministic_algorithms(det_mode)
    try:
        out = fn()
        if timing:
            row["distinct"] = len({digest(fn()) for _ in range(runs)})
            row["runs"] = runs
        if profile:
            row["profile"] = kernel_profile(fn)
            row["host"] = host_profile(fn)
        if mode.startswith("ditto"):
            row["variants"] = dt.variants().get(case.op, [])
        row["outputs"] = out
    except RuntimeError as e:
        row["error"] = str(e).splitlines()[0][:300]
    finally:
        torch.use_deterministic_algorithms(False)
    return row


def write(out: pathlib.Path, meta: dict, records: list) -> None:
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)  # a stale one is never a finished result
    tmp.mkdir(parents=True)
    try:
        _write_files(tmp, meta, records)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    tmp.rename(out)
    print(f"wrote {out}/torch_ops.json and torch_ops.md")


def _write_files(tmp: pathlib.Path, meta: dict, records: list) -> None:
    (tmp / "torch_ops.json").write_text(json.dumps({"meta": meta, "rows": records}, indent=1) + "\n")
    lines = [f"# ditto.torch against PyTorch ({meta['gpu']}, PyTorch {meta['torch']}, ditto {meta['ditto_commit']}, "
             f"{meta['date']})", "",
             "One forward and backward per call; µs = median of the calls timed alone (CUDA events around each: "
             "the GPU waits for the call's host work); back to back = the calls queued one after another between two "
             "events, per call (the host's work overlaps the GPU's, as in a training loop), the median over "
             f"{meta.get('rounds', 1)} rounds in which the modes take turns; "
             f"distinct = different results (output and gradients hashed) over {meta['runs']} calls; GPU µs = kernel "
             "time per call (torch.profiler), where profiled. Ops through ditto's C++ operators (autograd in C++): "
             f"{', '.join(meta.get('native_ops', [])) or 'none'}; the others through their Python autograd function.", "",
             "| op | shape | mode | µs | × PyTorch default | back to back µs | × PyTorch default | GPU µs | distinct "
             "| max abs diff vs PyTorch | note |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in records:
        note = r.get("error", "") or ", ".join(f"{v['knob']}={v['variant']}" for v in r.get("variants", []))
        lines.append("| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |".format(
            r["op"], r["shape"], r["mode"], f"{r['us']:.0f}" if "us" in r else "—",
            f"{r['vs_pytorch_default']:.2f}" if "vs_pytorch_default" in r else "—",
            f"{r['us_back_to_back']:.0f}" if "us_back_to_back" in r else "—",
            f"{r['back_to_back_vs_pytorch_default']:.2f}" if "back_to_back_vs_pytorch_default" in r else "—",
            f"{r['profile']['gpu_us']:.0f}" if "profile" in r else "—",
            f"{r['distinct']}/{r['runs']}" if "distinct" in r else "—",
            f"{r['max_abs_diff_vs_pytorch']:.2e}" if "max_abs_diff_vs_pytorch" in r else "—", note.replace("|", "/")))
    hosts = [r for r in records if "host" in r]
    if hosts:
        lines += ["", "## Host side per call (torch.profiler's CPU view; wall time without the profiler)", "",
                  "| op | mode | host wall µs | events with the most self time (µs per call) |", "|---|---|---|---|"]
        for r in hosts:
            events = ", ".join(f"{e['event']} {e['self_us']:.0f}" for e in r["host"]["events"])
            lines.append(f"| {r['op']} | {r['mode']} | {r['host']['wall_us']:.0f} | {events.replace('|', '/')} |")
    (tmp / "torch_ops.md").write_text("\n".join(lines) + "\n")


def merge(logs: list, out: pathlib.Path) -> int:
    """Records printed by earlier runs, in case order; a later record of an op and mode wins, and a
    profile-only record adds its profile to the timed one."""
    meta, by_key = None, {}
    for log in logs:
        for line in pathlib.Path(log).read_text().splitlines():
            if not line.startswith("{"):
                continue
            r = json.loads(line)
            if "meta" in r:
                if meta and (meta["gpu"], meta["torch"]) != (r["meta"]["gpu"], r["meta"]["torch"]):
                    raise SystemExit(f"--merge: {log} was measured on {r['meta']['gpu']} with PyTorch "
                                     f"{r['meta']['torch']}, an earlier log on {meta['gpu']} with {meta['torch']}")
                meta = r["meta"]
                continue
            key = (r["op"], r["mode"])
            if "us" not in r and "error" not in r and key in by_key:  # a profile-only record
                by_key[key]["profile"] = r["profile"]
                if "host" in r:
                    by_key[key]["host"] = r["host"]
            else:
                by_key[key] = {**by_key.get(key, {}), **r}
    if meta is None:
        raise SystemExit("--merge: no log carries a meta line (the run's GPU and versions)")
    order = {c.name: i for i, c in enumerate(tc.CASES)}
    modes = ["pytorch-default", "pytorch-deterministic", "ditto-deterministic", "ditto-nondeterministic"]
    records = sorted(by_key.values(), key=lambda r: (order.get(r["op"], 99), modes.index(r["mode"])))
    write(out, meta, records)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="folder for torch_ops.json and torch_ops.md (must not exist)")
    ap.add_argument("--runs", type=int, default=20, help="calls hashed per op and mode (default 20)")
    ap.add_argument("--repeats", type=int, default=40, help="timed calls per op and mode (default 40)")
    ap.add_argument("--rounds", type=int, default=4,
                    help="interleaved rounds the timed calls are split into, mode after mode (default 4)")
    ap.add_argument("--only", default="", help="comma-separated case names (default: all)")
    ap.add_argument("--profile", action="store_true", help="also each way's GPU kernel time (torch.profiler)")
    ap.add_argument("--profile-only", action="store_true", help="only the kernel profiles, no timing or hashing")
    ap.add_argument("--merge", nargs="+", default=None, help="assemble --out from these runs' printed records")
    a = ap.parse_args()
    out = pathlib.Path(a.out)
    if out.exists():
        ap.error(f"--out {out}: exists; a finished benchmark is never overwritten")
    if a.merge:
        return merge(a.merge, out)
    if not torch.cuda.is_available():
        ap.error("needs a CUDA device")
    torch.utils.deterministic.fill_uninitialized_memory = False
    # ditto's ops here are float32; PyTorch's default lets cuDNN convolutions round to TF32, which is
    # another precision (and faster tensor-core kernels), so the peer runs in float32 too.
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    commit = os.environ.get("DITTO_COMMIT") or ditto.Context().runtime_info()["git_commit"]
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cudnn": torch.backends.cudnn.version(),
            "ditto_commit": commit, "date": datetime.date.today().isoformat(),
            "runs": a.runs, "repeats": a.repeats, "rounds": a.rounds, "pytorch_tf32": False,
            "native_ops": dt.native_ops()}
    print(json.dumps({"meta": meta}), flush=True)
    wanted = set(filter(None, a.only.split(",")))
    unknown = wanted - {c.name for c in tc.CASES}
    if unknown:
        ap.error(f"--only: no case {sorted(unknown)}; the cases: {', '.join(c.name for c in tc.CASES)}")
    records = []
    for case in tc.CASES:
        if wanted and case.name not in wanted:
            continue
        inputs = case.make("cuda", "bench")
        dy = tc.upstream(tc.step(case, inputs, "torch")[0])
        modes = ["pytorch-default", "pytorch-deterministic", "ditto-deterministic", "ditto-nondeterministic"]
        if a.profile_only:
            modes = ["pytorch-default", "ditto-deterministic"]
        rows = [measure(case, inputs, dy, m, a.runs, a.profile or a.profile_only, not a.profile_only) for m in modes]
        if not a.profile_only:
            runnable = {r["mode"]: mode_fn(case, inputs, dy, r["mode"]) for r in rows if "error" not in r}
            times = time_modes(runnable, a.repeats, a.rounds)
            for r in rows:
                if r["mode"] in times:
                    r["us"], r["us_back_to_back"] = times[r["mode"]]
        ref = rows[0].get("outputs")
        for r in rows:
            got = r.pop("outputs", None)
            if ref is not None and got is not None and r is not rows[0]:
                r["max_abs_diff_vs_pytorch"] = max(float((u - v).abs().max()) for u, v in zip(got, ref))
            if "us" in r and "us" in rows[0]:
                r["vs_pytorch_default"] = r["us"] / rows[0]["us"]
            if "us_back_to_back" in r and "us_back_to_back" in rows[0]:
                r["back_to_back_vs_pytorch_default"] = r["us_back_to_back"] / rows[0]["us_back_to_back"]
            records.append(r)
            print(json.dumps(r), flush=True)
        del inputs
        torch.cuda.empty_cache()
    write(out, meta, records)
    return 0


if __name__ == "__main__":
    sys.exit(main())
