#!/usr/bin/env python3
"""PyTorch peer of ditto-train, for timing on the same GPU in the same device call.

Builds the same networks as nets/small.cpp and nets/resnet.cpp (SmallCNN: 3x(conv3x3 pad1 -> relu -> maxpool2),
global average pool, dense 32 relu, dense classes; ResNet-18 for CIFAR: 3x3 stem, no stem
pool), trains on the CIFAR-10 JPEG folders with the same optimizer settings, the data held on
the GPU (as ditto's loader stages them), per-channel mean/std normalization, and the same
augmentation (pad-4 random crop + horizontal flip) when asked. Prints one JSON line per epoch
and a summary line with the median epoch time.

--order ditto --seed-order S reads the training set in the order ditto-train --seed-order S reads
it (ditto.epoch_permutation, from the Python package: put its build folder on PYTHONPATH), so the
two code bases see the same batches; --order torch (the default) draws torch.randperm.

  python3 bench/peers/torch_train.py --data /tmp/cifar10 --model smallcnn --epochs 3 \
      --optimizer adam --lr 4e-4
"""
import argparse
import json
import os
import time
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from PIL import Image


def load_split(root, split):
    classes = sorted(d for d in os.listdir(os.path.join(root, split)))
    files, labels = [], []
    for k, c in enumerate(classes):
        names = sorted(os.listdir(os.path.join(root, split, c)))
        files += [os.path.join(root, split, c, n) for n in names]
        labels += [k] * len(names)
    with ProcessPoolExecutor() as ex:
        imgs = list(ex.map(_decode, files, chunksize=512))
    x = np.stack(imgs).transpose(0, 3, 1, 2)  # NCHW uint8
    return torch.from_numpy(x), torch.tensor(labels, dtype=torch.int64)


def _decode(path):
    return np.asarray(Image.open(path).convert("RGB"))


class SmallCNN(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.conv3 = nn.Conv2d(32, 32, 3, padding=1)
        self.fc1 = nn.Linear(32, 32)
        self.fc2 = nn.Linear(32, classes)
        for m in self.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                nn.init.xavier_uniform_(m.weight)
                nn.init.zeros_(m.bias)

    def forward(self, x):
        for conv in (self.conv1, self.conv2, self.conv3):
            x = F.max_pool2d(F.relu(conv(x)), 2)
        x = x.mean(dim=(2, 3))
        return self.fc2(F.relu(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        h = F.relu(self.bn1(self.conv1(x)))
        h = self.bn2(self.conv2(h))
        return F.relu(h + (self.down(x) if self.down is not None else x))


class ResNet18(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        layers, cin = [], 64
        for i, w in enumerate((64, 128, 256, 512)):
            for b in range(2):
                layers.append(Block(cin, w, 2 if (i > 0 and b == 0) else 1))
                cin = w
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(512, classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_in", nonlinearity="relu")

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = self.layers(x)
        return self.fc(x.mean(dim=(2, 3)))


def augment(x, gen):
    n = x.shape[0]
    padded = F.pad(x, (4, 4, 4, 4))
    dx = torch.randint(0, 9, (n,), device=x.device, generator=gen)
    dy = torch.randint(0, 9, (n,), device=x.device, generator=gen)
    idx = torch.arange(32, device=x.device)
    rows = (dy[:, None] + idx[None, :])[:, None, :, None].expand(n, 3, 32, 40)
    out = padded.gather(2, rows)
    cols = (dx[:, None] + idx[None, :])[:, None, None, :].expand(n, 3, 32, 32)
    out = out.gather(3, cols)
    flip = torch.rand(n, device=x.device, generator=gen) < 0.5
    return torch.where(flip[:, None, None, None], out.flip(3), out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--model", default="smallcnn", choices=["smallcnn", "resnet18"])
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--optimizer", default="adam", choices=["adam", "sgd"])
    ap.add_argument("--lr", type=float, default=4e-4)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--weight-decay", type=float, default=0.0)
    ap.add_argument("--cosine", action="store_true")
    ap.add_argument("--augment", action="store_true")
    ap.add_argument("--deterministic", action="store_true", help="torch.use_deterministic_algorithms(True)")
    ap.add_argument("--order", default="torch", choices=["torch", "ditto"],
                    help="batch order: torch.randperm, or ditto's loader's (ditto.epoch_permutation)")
    ap.add_argument("--seed-order", type=int, default=0, help="--order ditto: ditto-train's --seed-order")
    args = ap.parse_args()

    torch.backends.cudnn.allow_tf32 = False  # ditto's default math is FMA (no TF32)
    torch.backends.cuda.matmul.allow_tf32 = False
    if args.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False
    dev = torch.device("cuda")
    xtr, ytr = load_split(args.data, "train")
    xte, yte = load_split(args.data, "test")
    mean = (xtr.float() / 255).mean(dim=(0, 2, 3)).view(1, 3, 1, 1)
    std = (xtr.float() / 255).std(dim=(0, 2, 3), unbiased=False).view(1, 3, 1, 1)
    xtr = ((xtr.float() / 255 - mean) / std).to(dev)
    xte = ((xte.float() / 255 - mean) / std).to(dev)
    ytr, yte = ytr.to(dev), yte.to(dev)

    torch.manual_seed(0)
    model = (SmallCNN() if args.model == "smallcnn" else ResNet18()).to(dev)
    if args.optimizer == "adam":
        opt = torch.optim.Adam(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum, weight_decay=args.weight_decay)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, args.epochs) if args.cosine else None
    gen = torch.Generator(device=dev)
    gen.manual_seed(0)
    times = []
    for epoch in range(1, args.epochs + 1):
        model.train()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        if args.order == "ditto":
            import ditto  # the Python package (PYTHONPATH): the order ditto-train's loader draws
            perm = torch.tensor(ditto.epoch_permutation(xtr.shape[0], args.seed_order, epoch - 1), device=dev)
        else:
            perm = torch.randperm(xtr.shape[0], device=dev, generator=gen)
        for i in range(0, xtr.shape[0], args.batch_size):
            idx = perm[i:i + args.batch_size]
            x = xtr[idx]
            if args.augment:
                x = augment(x, gen)
            loss = F.cross_entropy(model(x), ytr[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        if sched:
            sched.step()
        torch.cuda.synchronize()
        train_s = time.perf_counter() - t0
        model.eval()
        correct = 0
        with torch.no_grad():
            for i in range(0, xte.shape[0], 1000):
                correct += (model(xte[i:i + 1000]).argmax(1) == yte[i:i + 1000]).sum().item()
        torch.cuda.synchronize()
        total_s = time.perf_counter() - t0
        times.append(total_s)
        print(json.dumps({"peer": "pytorch", "model": args.model, "epoch": epoch, "train_seconds": round(train_s, 3),
                          "epoch_seconds": round(total_s, 3), "test_top1": correct / xte.shape[0]}), flush=True)
    print(json.dumps({"peer": "pytorch", "model": args.model, "torch": torch.__version__,
                      "gpu": torch.cuda.get_device_name(), "median_epoch_seconds": float(np.median(times)),
                      "deterministic": args.deterministic, "order": args.order,
                      "seed_order": args.seed_order if args.order == "ditto" else None}), flush=True)


if __name__ == "__main__":
    main()
