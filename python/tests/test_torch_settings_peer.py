"""bench/peers/torch_settings.py, the PyTorch side of the four settings, on a small synthetic set on
the CPU (where PyTorch's kernels are deterministic, so only the seeds make replicas differ): the
report has ditto's metrics, CONTROL and IMPL repeat, ALGO's replicas differ, and a report is never
overwritten."""
import csv
import json
import pathlib
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("PIL")  # the peer decodes CIFAR-10's JPEG folders with Pillow
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "bench" / "peers"))
import torch_settings  # noqa: E402


def run(out, *extra):
    argv = ["torch_settings.py", "--synthetic", "256", "--device", "cpu", "--epochs", "1", "--replicas", "2",
            "--batch-size", "64", "--bootstrap", "100", "--out", str(out), *extra]
    old = sys.argv
    sys.argv = argv
    try:
        torch_settings.main()
    finally:
        sys.argv = old


def test_four_settings_in_pytorch_report_dittos_metrics(tmp_path):
    run(tmp_path / "r")
    with open(tmp_path / "r" / "report.csv") as f:
        got = {(r["setting"], r["metric"]): float(r["value"]) for r in csv.DictReader(f)}
    for s in ("ALGO+IMPL", "ALGO", "IMPL", "CONTROL"):
        for m in ("churn", "churn_pair_min", "churn_pair_max", "disagreement", "accuracy_mean", "accuracy_std",
                  "weight_l2", "distinct_fingerprints"):
            assert (s, m) in got, (s, m)
        assert got[(s, "churn_pair_min")] <= got[(s, "churn")] <= got[(s, "churn_pair_max")]
    for s in ("CONTROL", "IMPL"):  # fixed seeds, and the CPU's kernels repeat
        assert got[(s, "distinct_fingerprints")] == 1 and got[(s, "churn")] == 0 and got[(s, "weight_l2")] == 0
    assert got[("ALGO", "distinct_fingerprints")] == 2 and got[("ALGO", "weight_l2")] > 0
    lines = [json.loads(l) for l in open(tmp_path / "r" / "replicas.jsonl")]
    algo1 = next(l for l in lines if l["setting"] == "ALGO" and l["replica"] == 1)
    assert (algo1["seed_init"], algo1["seed_order"]) == (1001, 2001)  # ditto-experiment's replica seeds
    with pytest.raises(SystemExit):  # a finished report is never overwritten
        run(tmp_path / "r")


def test_churn_over_replicas_is_the_jackknife_ditto_computes():
    # The hand example of tests/cpu_stats.cpp: pair churns 0.2, 0.4, 0.4.
    value, low, high = torch_settings.churn_replica_interval({(0, 1): 0.2, (0, 2): 0.4, (1, 2): 0.4}, 3)
    assert value == pytest.approx(1 / 3)
    assert low == 0.0
    assert high == pytest.approx(1 / 3 + 4.302653 * 2 / 15, rel=1e-6)
    assert torch_settings.churn_replica_interval({(0, 1): 0.2}, 2) is None
    assert torch_settings.student_t_quantile(9, 0.975) == pytest.approx(2.262157, rel=1e-6)


def test_replicas_spread_over_worker_processes_give_the_same_report(tmp_path):
    run(tmp_path / "one", "--settings", "ALGO,CONTROL")
    run(tmp_path / "two", "--settings", "ALGO,CONTROL", "--devices", "cpu,cpu")
    assert (tmp_path / "one" / "report.csv").read_text() == (tmp_path / "two" / "report.csv").read_text()
    hashes = lambda d: [json.loads(l)["weights_sha256"] for l in open(d / "replicas.jsonl")]
    assert hashes(tmp_path / "one") == hashes(tmp_path / "two")


def test_each_replica_records_the_device_it_trained_on():
    spread = torch_settings.argparse.Namespace(devices="cuda:0, cuda:1,cuda:2", device="cpu")
    assert [torch_settings.job_device(spread, j) for j in range(7)] == \
        ["cuda:0", "cuda:1", "cuda:2", "cuda:0", "cuda:1", "cuda:2", "cuda:0"]
    one = torch_settings.argparse.Namespace(devices=None, device="cuda:3")
    assert torch_settings.job_device(one, 5) == "cuda:3"


def test_the_schedule_is_dittos():
    # ditto's lr_at (engine/optim.cpp): warm-up 2 of 10 epochs to 0.2, then linear to 0 (onecycle).
    a = torch_settings.argparse.Namespace(epochs=10, warmup_epochs=2.0, lr=0.2, lr_schedule="onecycle")
    assert torch_settings.lr_at(a, 0.0) == 0.0
    assert torch_settings.lr_at(a, 1.0) == pytest.approx(0.1)
    assert torch_settings.lr_at(a, 2.0) == pytest.approx(0.2)
    assert torch_settings.lr_at(a, 6.0) == pytest.approx(0.1)
    a.lr_schedule, a.warmup_epochs = "cosine", 0.0
    assert torch_settings.lr_at(a, 5.0) == pytest.approx(0.1)


def test_the_resnet18_recipe_flags_run(tmp_path):
    run(tmp_path / "r", "--settings", "CONTROL", "--optimizer", "sgd", "--nesterov", "--weight-decay", "5e-4",
        "--lr-schedule", "onecycle", "--epochs", "2", "--warmup-epochs", "1", "--lr", "0.05", "--augment")
    with open(tmp_path / "r" / "report.csv") as f:
        got = {(r["setting"], r["metric"]): float(r["value"]) for r in csv.DictReader(f)}
    assert got[("CONTROL", "churn")] == 0 and got[("CONTROL", "distinct_fingerprints")] == 1
