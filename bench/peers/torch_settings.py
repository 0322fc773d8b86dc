#!/usr/bin/env python3
"""The paper's four settings in PyTorch: the second code base beside ditto-experiment.

Replicas of one training run per setting, as ditto-experiment's settings protocol makes them
(experiments/ensemble.cpp, replica_config):

  ALGO+IMPL  init and order seeds per replica, PyTorch's default kernels
  ALGO       init and order seeds per replica, torch.use_deterministic_algorithms(True)
  IMPL       fixed seeds, PyTorch's default kernels
  CONTROL    fixed seeds, deterministic kernels

Replica k of a varying setting draws its weights with torch.manual_seed(1000 + k) and reads the
training set in ditto's order for --seed-order 2000 + k (ditto.epoch_permutation: the batches
ditto-train's replica k reads); fixed settings use seed 0 and ditto's order for seed 0. The
networks are torch_train.py's (SmallCNN, ResNet-18 for CIFAR), TF32 off; the recipe is ditto-train's
flags of the same names (Adam or SGD with momentum and Nesterov, weight decay as L2, the learning rate
per step by ditto's schedule and warm-up, pad-4 crop and flip), so the ResNet-18 recipe runs in both.

Writes OUT/report.csv in ditto's tidy form (setting, metric, value, ci_low, ci_high) with the
metrics both reports share: churn (mean pairwise prediction disagreement, bootstrap 95% interval
over test examples, as experiments/stats.h), churn_pair_min / churn_pair_max (the lowest and highest
churn of one replica pair), churn_replicas (from three replicas on: the churn with its interval for
another draw of replicas, the jackknife over replicas, as churn_replica_interval), disagreement (the
fraction of test examples on which
the replicas do not all agree), accuracy_mean, accuracy_std (sample standard deviation over
replicas), weight_l2 (mean pairwise L2 distance of the final weights) and distinct_fingerprints;
and OUT/replicas.jsonl (one line per replica: setting, seeds, accuracy, weights hash).

    PYTHONPATH=build/python python3 bench/peers/torch_settings.py --data /tmp/cifar10 --model smallcnn \\
        --epochs 10 --replicas 5 --optimizer adam --lr 4e-4 --out runs/torch-settings
    ... --devices cuda:0,cuda:1,cuda:2,cuda:3    (replicas at once, one per GPU; the same report)
    python3 bench/peers/torch_settings.py --synthetic 512 --device cpu --epochs 1 --replicas 2 --out /tmp/t
"""
import argparse
import csv
import hashlib
import itertools
import json
import math
import os
import pathlib
import sys

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS, when asked for

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from torch_train import ResNet18, SmallCNN, augment, load_split  # noqa: E402

SETTINGS = {"ALGO+IMPL": (True, False), "ALGO": (True, True), "IMPL": (False, False), "CONTROL": (False, True)}


def data(args, dev):
    """Normalized train and test sets on the device: CIFAR-10 JPEG folders, or a synthetic set."""
    if args.synthetic:
        g = np.random.default_rng(7)
        n, t = args.synthetic, max(args.synthetic // 4, 1)
        xtr = torch.from_numpy(g.integers(0, 256, (n, 3, 32, 32), dtype=np.uint8))
        xte = torch.from_numpy(g.integers(0, 256, (t, 3, 32, 32), dtype=np.uint8))
        ytr = torch.from_numpy(g.integers(0, 10, n)).long()
        yte = torch.from_numpy(g.integers(0, 10, t)).long()
    else:
        xtr, ytr = load_split(args.data, "train")
        xte, yte = load_split(args.data, "test")
    mean = (xtr.float() / 255).mean(dim=(0, 2, 3)).view(1, 3, 1, 1)
    std = (xtr.float() / 255).std(dim=(0, 2, 3), unbiased=False).view(1, 3, 1, 1)
    return (((xtr.float() / 255 - mean) / std).to(dev), ytr.to(dev), ((xte.float() / 255 - mean) / std).to(dev),
            yte.to(dev))


def lr_at(args, epoch):
    """The learning rate at a fractional epoch, as ditto's lr_at (engine/optim.cpp) computes it for
    --lr-schedule constant | cosine | onecycle with --warmup-epochs: a linear warm-up from 0, then
    the decay over the epochs after it; rounded to float32 as ditto's is."""
    total, warm = float(max(1, args.epochs)), args.warmup_epochs
    if epoch < warm:
        lr = args.lr * epoch / warm
    else:
        after, span = epoch - warm, total - warm
        if args.lr_schedule == "cosine":
            lr = args.lr * 0.5 * (1.0 + math.cos(math.pi * after / span))
        elif args.lr_schedule == "onecycle":
            lr = args.lr * max(0.0, (span - after) / span)
        else:
            lr = args.lr
    return float(np.float32(lr))


def train_replica(args, dev, sets, vary, deterministic, k):
    """One replica: its final test predictions, accuracy and flattened weights."""
    import ditto  # the Python package (PyTorch's peer reads ditto's batch order)
    xtr, ytr, xte, yte = sets
    torch.use_deterministic_algorithms(deterministic)
    torch.backends.cudnn.deterministic = deterministic
    torch.backends.cudnn.benchmark = False
    seed_init, seed_order = (1000 + k, 2000 + k) if vary else (0, 0)
    torch.manual_seed(seed_init)
    model = (SmallCNN() if args.model == "smallcnn" else ResNet18()).to(dev)
    if args.optimizer == "adam":
        opt = torch.optim.Adam(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum, nesterov=args.nesterov,
                              weight_decay=args.weight_decay)
    batches = -(-xtr.shape[0] // args.batch_size)  # the last batch may be partial, as ditto's loader's
    gen = torch.Generator(device=dev)
    gen.manual_seed(3000 + k if vary else 0)
    for epoch in range(1, args.epochs + 1):
        model.train()
        perm = torch.tensor(ditto.epoch_permutation(xtr.shape[0], seed_order, epoch - 1), device=dev)
        for b, i in enumerate(range(0, xtr.shape[0], args.batch_size)):
            for group in opt.param_groups:  # per step, as ditto-train's schedule
                group["lr"] = lr_at(args, epoch - 1 + b / batches)
            idx = perm[i:i + args.batch_size]
            x = augment(xtr[idx], gen) if args.augment else xtr[idx]
            loss = F.cross_entropy(model(x), ytr[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    model.eval()
    with torch.no_grad():
        pred = torch.cat([model(xte[i:i + 1000]).argmax(1) for i in range(0, xte.shape[0], 1000)])
    weights = torch.cat([p.detach().flatten().float().cpu() for p in model.parameters()]).numpy()
    return pred.cpu().numpy(), float((pred == yte).float().mean()), weights, seed_init, seed_order


_WORKER_SETS = {}  # a worker process's data, per device: loaded once, kept for its next replicas


def replica_job(args, device, vary, deterministic, k):
    """train_replica in a worker process of its own (--devices), the data loaded there once."""
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.device(device)
    if device not in _WORKER_SETS:
        _WORKER_SETS[device] = data(args, dev)
    return train_replica(args, dev, _WORKER_SETS[device], vary, deterministic, k)


def device_list(args):
    return [d.strip() for d in args.devices.split(",")] if args.devices else []


def job_device(args, j):
    """The device job j of train_all's list trains on."""
    devices = device_list(args)
    return devices[j % len(devices)] if devices else args.device


def train_all(args, names):
    """Every (setting, replica) trained, in that order of results: one after the other on --device,
    or spread over --devices with one worker process per device (job j of the list on device
    j mod D: job_device), so the results do not depend on which finished first."""
    jobs = [(name, k) for name in names for k in range(args.replicas)]
    devices = device_list(args)
    if not devices:
        dev = torch.device(args.device)
        sets = data(args, dev)
        return [train_replica(args, dev, sets, *SETTINGS[name], k) for name, k in jobs]
    import concurrent.futures
    import multiprocessing
    context = multiprocessing.get_context("spawn")  # CUDA cannot be used in a forked child
    pools = [concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=context) for _ in devices]
    try:
        futures = [pools[j % len(devices)].submit(replica_job, args, job_device(args, j), *SETTINGS[name], k)
                   for j, (name, k) in enumerate(jobs)]
        return [f.result() for f in futures]
    finally:
        for pool in pools:
            pool.shutdown(cancel_futures=True)


def churn_interval(preds, resamples, rng):
    """Mean pairwise disagreement and its bootstrap 95% interval over test examples."""
    pairs = list(itertools.combinations(range(len(preds)), 2))
    per = np.mean([preds[a] != preds[b] for a, b in pairs], axis=0)  # per example: share of disagreeing pairs
    boots = [per[rng.integers(0, per.size, per.size)].mean() for _ in range(resamples)]
    return float(per.mean()), float(np.percentile(boots, 2.5)), float(np.percentile(boots, 97.5))


def student_t_quantile(dof, q):
    """Student's t quantile as experiments/stats.cpp computes it (Simpson's rule over the density,
    inverted by bisection), so both code bases' intervals use the same numbers."""
    if q < 0.5:
        return -student_t_quantile(dof, 1 - q)
    norm = math.exp(math.lgamma((dof + 1) / 2) - math.lgamma(dof / 2)) / math.sqrt(dof * math.pi)
    density = lambda x: norm * (1 + x * x / dof) ** (-(dof + 1) / 2)

    def half_mass(t, steps=4096):
        h = t / steps
        total = density(0) + density(t) + sum((4 if k % 2 else 2) * density(k * h) for k in range(1, steps))
        return total * h / 3

    lo, hi = 0.0, 1.0
    while half_mass(hi) < q - 0.5:
        hi *= 2
    for _ in range(100):
        if hi - lo <= 1e-10 * max(1.0, hi):
            break
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if half_mass(mid) < q - 0.5 else (lo, mid)
    return (lo + hi) / 2


def churn_replica_interval(pairs, replicas):
    """The 95% interval of mean pairwise churn for another draw of replicas (the jackknife over
    replicas with a t interval of R-1 degrees of freedom, clipped to [0, 1], as
    experiments/stats.h's churn_replica_interval); None with fewer than 3 replicas. pairs maps each
    replica pair (a, b), a < b, to its churn."""
    if replicas < 3:
        return None
    value = sum(pairs.values()) / len(pairs)
    left_out = [np.mean([c for (a, b), c in pairs.items() if i not in (a, b)]) for i in range(replicas)]
    centre = float(np.mean(left_out))
    se = math.sqrt((replicas - 1) / replicas * sum((t - centre) ** 2 for t in left_out))
    half = student_t_quantile(replicas - 1, 0.975) * se
    return value, max(0.0, value - half), min(1.0, value + half)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", help="CIFAR-10 JPEG folders (train/, test/)")
    ap.add_argument("--synthetic", type=int, default=0, help="a synthetic set of this many training images instead")
    ap.add_argument("--model", default="smallcnn", choices=["smallcnn", "resnet18"])
    ap.add_argument("--settings", default="ALGO+IMPL,ALGO,IMPL,CONTROL")
    ap.add_argument("--replicas", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--optimizer", default="adam", choices=["adam", "sgd"])
    ap.add_argument("--lr", type=float, default=4e-4)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--nesterov", action="store_true", help="sgd")
    ap.add_argument("--weight-decay", type=float, default=0.0, help="L2 added to the gradient (PyTorch's and ditto's)")
    ap.add_argument("--lr-schedule", default="constant", choices=["constant", "cosine", "onecycle"])
    ap.add_argument("--warmup-epochs", type=float, default=0.0)
    ap.add_argument("--augment", action="store_true")
    ap.add_argument("--bootstrap", type=int, default=1000)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--devices", help="train replicas at once, one worker process per device in this comma list "
                    "(cuda:0,cuda:1,...; the same results as one after the other)")
    ap.add_argument("--out", required=True, help="folder for report.csv and replicas.jsonl (must not hold a report)")
    args = ap.parse_args()
    if not args.synthetic and not args.data:
        ap.error("--data DIR or --synthetic N")
    if args.replicas < 2:
        ap.error("--replicas: at least 2 (churn compares replicas)")
    if not 0 <= args.warmup_epochs < args.epochs:
        ap.error(f"--warmup-epochs: {args.warmup_epochs} must be at least 0 and below --epochs {args.epochs}")
    names = [s.strip() for s in args.settings.split(",") if s.strip()]
    for s in names:
        if s not in SETTINGS:
            ap.error(f"--settings: unknown setting {s!r}; known: {', '.join(SETTINGS)}")
    out = pathlib.Path(args.out)
    if (out / "report.csv").exists():
        ap.error(f"--out: {out} already holds a report; choose another folder")
    out.mkdir(parents=True, exist_ok=True)
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    results = iter(train_all(args, names))
    rng = np.random.default_rng(0)
    rows, lines = [], []
    job = 0
    for name in names:
        preds, accs, weights, hashes = [], [], [], []
        for k in range(args.replicas):
            p, acc, w, si, so = next(results)
            preds.append(p)
            accs.append(acc)
            weights.append(w)
            hashes.append(hashlib.sha256(w.tobytes()).hexdigest()[:32])
            lines.append({"setting": name, "replica": k, "seed_init": si, "seed_order": so, "accuracy": acc,
                          "weights_sha256": hashes[-1], "torch": torch.__version__,
                          "device": job_device(args, job)})
            job += 1
            print(json.dumps(lines[-1]), flush=True)
        c, lo, hi = churn_interval(preds, args.bootstrap, rng)
        stacked = np.stack(preds)
        l2 = [float(np.linalg.norm(weights[a] - weights[b])) for a, b in itertools.combinations(range(len(weights)), 2)]
        pair_churn = {(a, b): float((preds[a] != preds[b]).mean())
                      for a, b in itertools.combinations(range(len(preds)), 2)}
        pairs = list(pair_churn.values())
        rows += [(name, "churn", c, lo, hi),
                 (name, "churn_pair_min", min(pairs), "", ""),
                 (name, "churn_pair_max", max(pairs), "", "")]
        over = churn_replica_interval(pair_churn, len(preds))
        if over is not None:
            rows.append((name, "churn_replicas", *over))
        rows += [(name, "disagreement", float((stacked != stacked[0]).any(axis=0).mean()), "", ""),
                 (name, "accuracy_mean", float(np.mean(accs)), "", ""),
                 (name, "accuracy_std", float(np.std(accs, ddof=1)), "", ""),
                 (name, "weight_l2", float(np.mean(l2)), "", ""),
                 (name, "distinct_fingerprints", float(len(set(hashes))), "", "")]
    with open(out / "replicas.jsonl", "w") as f:
        f.writelines(json.dumps(line) + "\n" for line in lines)
    tmp = out / "report.csv.tmp"
    with open(tmp, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["setting", "metric", "value", "ci_low", "ci_high"])
        w.writerows(rows)
    os.replace(tmp, out / "report.csv")
    for name in names:
        got = {m: v for s, m, v, _, _ in rows if s == name}
        print(f"{name:10s} churn {100 * got['churn']:6.2f}%  acc {got['accuracy_mean']:.4f} +- {got['accuracy_std']:.4f}"
              f"  L2 {got['weight_l2']:.4g}  distinct {int(got['distinct_fingerprints'])}")


if __name__ == "__main__":
    main()
