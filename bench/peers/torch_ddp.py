#!/usr/bin/env python3
r"""PyTorch DDP peer of ditto's data-parallel training: training throughput of ResNet-18
(CIFAR: 3x32x32, 10 classes; bench/peers/torch_train.py's definition, the same net as ditto's
resnet18) over K GPUs with DistributedDataParallel on NCCL, and whether two runs end with the same
weights.

One process per GPU (torch.multiprocessing), NCCL process group over 127.0.0.1, NVLink multicast
off (NCCL_NVLS_ENABLE=0 unless set). The global batch (--batch, split evenly) is synthetic and stays
on the GPUs; every rank draws its rows from one generator seeded with --seed, so the K-GPU run sees
the examples of the 1-GPU run. Per step: forward, cross-entropy, backward (DDP's bucketed
all-reduce), SGD with momentum, zero_grad. After --warmup steps, --steps steps are timed on rank 0
with CUDA events (the ranks run in lockstep: each all-reduce waits for all). Per (mode, K): one JSON
line, printed and appended to --out: tool, model, mode, gpus, global_batch, steps, ms_median, ms_p10,
ms_p90, images_per_s, images_per_s_per_gpu, weights_sha1 (SHA-1 of rank 0's parameters after the
last step; DDP keeps the ranks' weights equal), gpu, torch, nccl, date. --repeat 2 trains twice per
configuration: equal weights_sha1 say that configuration reproduced.

Modes: default (cudnn.benchmark off, not deterministic), deterministic
(torch.use_deterministic_algorithms(True), cudnn.deterministic). TF32 off in both. Neither mode makes
NCCL's all-reduce order fixed: DDP has no such switch.

  python3 bench/peers/torch_ddp.py --gpus 1,2,4 --steps 100 --out /tmp/torch_ddp.jsonl
"""
import os

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")

import argparse  # noqa: E402
import datetime  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import socket  # noqa: E402
import sys  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peer_common import percentile, short_error  # noqa: E402
from torch_train import ResNet18  # noqa: E402

MODES = ("default", "deterministic")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(rank, world, port, mode, args, queue):
    try:
        torch.cuda.set_device(rank)
        dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
        det = mode == "deterministic"
        torch.use_deterministic_algorithms(det)
        torch.backends.cudnn.deterministic = det
        torch.backends.cudnn.benchmark = False
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        dev = torch.device("cuda", rank)
        torch.manual_seed(args.seed)
        model = ResNet18(10).to(dev)
        ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[rank])
        opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)
        per = args.batch // world
        gen = torch.Generator(device="cpu").manual_seed(args.seed)
        x_all = torch.randn(args.batch, 3, 32, 32, generator=gen)
        y_all = torch.randint(0, 10, (args.batch,), generator=gen)
        x = x_all[rank * per:(rank + 1) * per].to(dev)
        y = y_all[rank * per:(rank + 1) * per].to(dev)

        def step():
            loss = F.cross_entropy(ddp(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        for _ in range(args.warmup):
            step()
        torch.cuda.synchronize()
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(args.steps)]
        for a, b in events:
            a.record()
            step()
            b.record()
        torch.cuda.synchronize()
        if rank == 0:
            ms = sorted(a.elapsed_time(b) for a, b in events)
            h = hashlib.sha1()
            for p in model.parameters():
                h.update(p.detach().cpu().contiguous().numpy().tobytes())
            med = percentile(ms, 0.5)
            queue.put({"ms_median": med, "ms_p10": percentile(ms, 0.1), "ms_p90": percentile(ms, 0.9),
                       "images_per_s": args.batch / (med / 1000.0),
                       "images_per_s_per_gpu": args.batch / (med / 1000.0) / world,
                       "weights_sha1": h.hexdigest()})
        dist.barrier()
        dist.destroy_process_group()
    except Exception as e:  # reported by the parent, which names the configuration
        queue.put({"error": short_error(e)})


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpus", default="", help="comma list of GPU counts (default: every count up to the visible GPUs)")
    ap.add_argument("--modes", default=",".join(MODES), help="comma list of " + ", ".join(MODES))
    ap.add_argument("--batch", type=int, default=128, help="global batch, split evenly over the GPUs")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=1, help="runs per configuration (2: do the weights reproduce?)")
    ap.add_argument("--timeout", type=float, default=600, help="seconds to wait for one configuration")
    ap.add_argument("--out", help="append the JSON lines to this file as well")
    args = ap.parse_args()
    visible = torch.cuda.device_count()
    if visible < 1:
        sys.exit("torch_ddp: no CUDA device")
    counts = [int(k) for k in args.gpus.split(",") if k] or list(range(1, visible + 1))
    modes = [m for m in args.modes.split(",") if m]
    for k in counts:
        if k < 1 or k > visible:
            sys.exit(f"torch_ddp: --gpus {k}: {visible} GPU(s) visible")
        if args.batch % k:
            sys.exit(f"torch_ddp: --batch {args.batch} does not split evenly over {k} GPUs")
    for m in modes:
        if m not in MODES:
            sys.exit(f"torch_ddp: --modes: unknown mode '{m}'; known: {', '.join(MODES)}")
    ctx = mp.get_context("spawn")
    for mode in modes:
        for k in counts:
            for run in range(args.repeat):
                queue = ctx.Queue()
                port = free_port()
                procs = [ctx.Process(target=worker, args=(r, k, port, mode, args, queue)) for r in range(k)]
                for p in procs:
                    p.start()
                # Rank 0's result, or the first rank's error; a rank that fails leaves the others
                # waiting in a collective, so they are stopped after --timeout seconds.
                try:
                    results = [queue.get(timeout=args.timeout)]
                except Exception:
                    results = [{"error": f"no result in {args.timeout} s"}]
                for p in procs:
                    p.join(timeout=30 if "error" not in results[0] else 5)
                    if p.is_alive():
                        p.terminate()
                        p.join()
                errors = [r["error"] for r in results if "error" in r]
                row = {"tool": "pytorch-ddp", "model": "resnet18", "mode": mode, "gpus": k, "global_batch": args.batch,
                       "steps": args.steps, "run": run, "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
                       "nccl": ".".join(str(v) for v in torch.cuda.nccl.version()),
                       "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
                if errors or any(p.exitcode for p in procs):
                    row["error"] = errors[0] if errors else f"a rank exited with {[p.exitcode for p in procs]}"
                else:
                    row.update(results[0])
                line = json.dumps(row)
                print(line, flush=True)
                if args.out:
                    with open(args.out, "a") as f:
                        f.write(line + "\n")


if __name__ == "__main__":
    main()
