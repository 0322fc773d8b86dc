#!/usr/bin/env python3
"""The paper's four settings on SmallCNN from Python, and their churn as a picture.

    PYTHONPATH=build/python python3 examples/python/four_settings.py                 # synthetic data
    PYTHONPATH=build/python python3 examples/python/four_settings.py --dataset cifar10 --data DIR --epochs 10

Runs ALGO+IMPL, ALGO, IMPL and CONTROL (ditto.experiment, the settings protocol), prints churn
with its 95% interval, weight L2 and distinct final weights per setting, and draws churn with its
interval per setting with matplotlib (--png; "" skips the picture). On the CPU there is one code
path per op, so IMPL shows no noise there: run it on a GPU (--device cuda) to see kernel noise.
"""
import argparse
import sys

import ditto

SETTINGS = ["ALGO+IMPL", "ALGO", "IMPL", "CONTROL"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dataset", default="synthetic")
    ap.add_argument("--data", default=None, help="the dataset's folder (CIFAR-10 JPEG folders, ...)")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--replicas", type=int, default=3)
    ap.add_argument("--synthetic-train", type=int, default=None)
    ap.add_argument("--synthetic-test", type=int, default=None)
    ap.add_argument("--out", default="runs/four-settings-py")
    ap.add_argument("--png", default="four_settings.png", help='the churn picture ("" for none)')
    args = ap.parse_args()

    plt = None
    if args.png:
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            print("four_settings: the picture needs matplotlib (pip install matplotlib), or pass --png ''",
                  file=sys.stderr)
            return 2

    flags = dict(model="smallcnn", device=args.device, dataset=args.dataset, epochs=args.epochs,
                 replicas=args.replicas, settings=",".join(SETTINGS), out=args.out, data=args.data,
                 synthetic_train=args.synthetic_train, synthetic_test=args.synthetic_test)
    try:
        r = ditto.experiment(**flags)
    except ditto.Error as e:
        print(f"four_settings: {e}", file=sys.stderr)
        return 2

    print(f"{'setting':<10} {'churn [95% CI]':>24} {'weight L2':>10} {'distinct':>9}")
    churn = []
    for s in SETTINGS:
        c = r.metric(s, "churn")
        churn.append(c)
        print(f"{s:<10} {100 * c['value']:8.2f}% [{100 * c['low']:5.2f}, {100 * c['high']:5.2f}] "
              f"{r.metric(s, 'weight_l2')['value']:10.4g} {r.metric(s, 'distinct_fingerprints')['value']:9.0f}")
    print(f"report: {r.report_html}")
    if r.control_mismatch:
        print(f"four_settings: {r.control_mismatch}", file=sys.stderr)
        return 1

    if plt is not None:
        values = [100 * c["value"] for c in churn]
        errors = [[100 * (c["value"] - c["low"]) for c in churn], [100 * (c["high"] - c["value"]) for c in churn]]
        fig, ax = plt.subplots(figsize=(5, 3.2))
        ax.bar(SETTINGS, values, yerr=errors, capsize=4, color=["#4c72b0", "#55a868", "#c44e52", "#8172b2"])
        ax.set_ylabel("churn (% of test predictions)")
        ax.set_title(f"SmallCNN on {args.dataset}, {args.replicas} replicas per setting")
        fig.tight_layout()
        fig.savefig(args.png, dpi=150)
        print(f"wrote {args.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
