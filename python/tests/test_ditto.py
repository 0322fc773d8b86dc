"""The Python package on the CPU: knobs, policies, tensors shared with NumPy without copies,
training runs with ditto-train's flags, and errors as Python exceptions with ditto's messages."""
import json
import os
import sys

import numpy as np
import pytest

import ditto

SYNTHETIC = dict(device="cpu", synthetic_train=256, synthetic_test=128, synthetic_size=16, batch_size=32,
                 seed_init=1, seed_order=2, seed_augment=3)


def test_knobs_list_every_family_with_guarantees():
    by_name = {(k["op"], k["knob"]): k for k in ditto.knobs()}
    gemm = by_name[("linear", "gemm")]
    assert [v["name"] for v in gemm["variants"]] == ["cublas", "cublaslt", "ditto"]
    assert [v["by_name_only"] for v in gemm["variants"]] == [False, False, True]
    assert gemm["framework_default"] == "cublas"
    pool = by_name[("maxpool2d", "bwd")]
    assert pool["framework_default"] == "cudnn" and pool["pytorch_default"] == "gather"
    assert {v["guarantee"] for v in pool["variants"]} >= {"not_guaranteed", "gpu_to_gpu"}


def test_policy_parses_rules_and_refuses_a_bad_one_by_name():
    p = ditto.Policy(["*=deterministic", "conv1.bwd_filter=algo1"])
    assert p.rules == ["*=deterministic", "conv1.bwd_filter=algo1"]
    with pytest.raises(ditto.PolicyError, match="no-equals-sign"):
        ditto.Policy(["no-equals-sign"])
    assert issubclass(ditto.PolicyError, ditto.Error)


def test_numpy_arrays_cross_without_copies_both_ways():
    ctx = ditto.Context("cpu")
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = ctx.from_dlpack(a)
    assert t.shape == [3, 4] and t.dtype == "f32" and t.device == "cpu"
    back = np.from_dlpack(t)
    a[1, 2] = 42.0  # one memory: the write shows through ditto's tensor and the array made from it
    assert back[1, 2] == 42.0
    assert np.shares_memory(a, back)
    labels = ctx.from_dlpack(np.array([1, 2, 3], dtype=np.int32))
    assert labels.dtype == "i32"


def test_fingerprints_follow_the_bits():
    ctx = ditto.Context("cpu")
    a = np.linspace(-1, 1, 64, dtype=np.float32)
    b = a.copy()
    ta, tb = ctx.from_dlpack(a), ctx.from_dlpack(b)
    assert ta.fingerprint() == tb.fingerprint()
    b[7] = -b[7]  # one sign bit
    assert ta.fingerprint() != tb.fingerprint()


def test_runtime_info_names_the_build_and_the_machine_as_manifests_do():
    info = ditto.Context("cpu").runtime_info()
    assert set(info) == {"device", "gpu_name", "driver", "cuda_runtime", "cudnn", "cudnn_build", "cublas",
                         "git_commit"}
    assert info["device"] == "cpu" and info["gpu_name"] == ""
    assert isinstance(info["git_commit"], str) and info["git_commit"]  # "unknown" only outside a checkout


def test_arrays_ditto_cannot_share_are_refused_not_copied():
    ctx = ditto.Context("cpu")
    with pytest.raises(ditto.ShapeError, match="C-contiguous"):
        ctx.from_dlpack(np.zeros((4, 4), dtype=np.float32)[:, ::2])
    with pytest.raises(ditto.ShapeError, match="float32, int32, bfloat16 and float16"):
        ctx.from_dlpack(np.zeros(3, dtype=np.float64))


def test_a_tensor_outlives_the_array_it_came_from():
    ctx = ditto.Context("cpu")
    t = ctx.from_dlpack(np.full(1000, 3.0, dtype=np.float32))  # the array has no other reference
    assert np.from_dlpack(t)[999] == 3.0


def test_training_runs_with_fixed_seeds_are_bit_identical_and_report_their_results():
    steps = []
    r1 = ditto.train(epochs=1, kernels="deterministic", progress=lambda step, epoch: steps.append((step, epoch)),
                     **SYNTHETIC)
    r2 = ditto.train(epochs=1, kernels="deterministic", **SYNTHETIC)
    assert r1.weights_fingerprint == r2.weights_fingerprint
    assert np.array_equal(r1.predictions, r2.predictions)
    assert r1.predictions.dtype == np.int32 and r1.predictions.shape == (128,)
    assert r1.test_labels.shape == (128,)
    assert 0.0 <= r1.test_top1 <= 1.0
    assert r1.steps == 8 and steps == [(s, 1) for s in range(1, 9)]
    assert len(r1.log) == 1 and r1.log[0]["epoch"] == 1
    assert any(op["knob"] == "bias_bwd" for op in r1.ops)
    assert r1.weights.dtype == np.float32 and r1.weights.size > 0


def test_epoch_permutation_is_the_loaders_order_a_pure_function_of_seed_and_epoch():
    a = ditto.epoch_permutation(1000, 2000, 0)
    assert sorted(a) == list(range(1000))
    assert a == ditto.epoch_permutation(1000, 2000, 0)
    assert a != ditto.epoch_permutation(1000, 2000, 1) and a != ditto.epoch_permutation(1000, 2001, 0)
    assert ditto.epoch_permutation(0, 5, 3) == []
    with pytest.raises(ditto.ShapeError, match="epochs count from 0"):
        ditto.epoch_permutation(10, 0, -1)


def test_native_bf16_activations_train_and_are_recorded(tmp_path):
    r1 = ditto.train(epochs=1, kernels="deterministic", precision="bf16", native_activations=True,
                     out=str(tmp_path / "native"), **SYNTHETIC)
    r2 = ditto.train(epochs=1, kernels="deterministic", precision="bf16", native_activations=True, **SYNTHETIC)
    widened = ditto.train(epochs=1, kernels="deterministic", precision="bf16", **SYNTHETIC)
    assert r1.weights_fingerprint == r2.weights_fingerprint
    assert r1.weights_fingerprint != widened.weights_fingerprint  # the ops after each convolution round to bf16 now
    assert "--native-activations" in r1.replay
    assert any(op["knob"] == "output" and op["variant"] == "native" for op in r1.ops)


def test_batch_invariant_evaluation_is_recorded_apart_from_training(tmp_path):
    r = ditto.train(epochs=1, kernels="deterministic", eval_kernels="batch-invariant", out=str(tmp_path / "inv"),
                    **SYNTHETIC)
    same = ditto.train(epochs=1, kernels="deterministic", **SYNTHETIC)
    assert r.weights_fingerprint == same.weights_fingerprint  # evaluation touches no training state
    assert "--eval-kernels batch-invariant" in r.replay
    manifest = json.loads((tmp_path / "inv" / "manifest.json").read_text())
    assert manifest["evaluation"]["kernels"] == "batch-invariant"
    assert any(op["op"] == "conv2d" and op["knob"] == "fwd" and op["requested"] == "pinned"
               for op in manifest["evaluation"]["ops"])
    with pytest.raises(ditto.Error, match="--eval-kernels batch-invariant"):
        ditto.train(epochs=1, precision="bf16", eval_kernels="batch-invariant", **SYNTHETIC)


def test_flags_are_refused_as_ditto_train_refuses_them():
    with pytest.raises(ditto.FlagError, match="--lr"):
        ditto.train(lr=-1, epochs=1, **SYNTHETIC)
    with pytest.raises(ditto.FlagError, match="--no-such-flag"):
        ditto.train(no_such_flag=1, **SYNTHETIC)
    with pytest.raises(ditto.Error, match="--out"):
        ditto.train(out="", epochs=1, **SYNTHETIC)


def test_a_run_folder_is_written_and_never_overwritten(tmp_path):
    out = tmp_path / "run"
    r = ditto.train(epochs=1, out=str(out), **SYNTHETIC)
    assert r.out == str(out) and (out / "manifest.json").exists()
    assert r.replay.startswith("ditto-train") and "--seed-init 1" in r.replay
    with pytest.raises(ditto.Error, match="--overwrite"):
        ditto.train(epochs=1, out=str(out), **SYNTHETIC)


def test_flags_to_argv_spells_ditto_trains_flags():
    assert ditto.flags_to_argv({"batch_size": 32, "graph": True, "resume": False, "pin": ["a.b=c", "d.e=f"]}) == [
        "--batch-size", "32", "--graph", "--pin", "a.b=c", "--pin", "d.e=f"]


def test_train_help_is_ditto_trains_help():
    text = ditto.train_help()
    for flag in ("--model", "--batch-size", "--kernels", "--pin", "--precision"):
        assert flag in text
    assert "--batch-size" in ditto.train.__doc__


def test_the_settings_protocol_runs_from_python_and_controls_stay_bit_identical(tmp_path):
    out = tmp_path / "exp"
    ended = []
    r = ditto.experiment(device="cpu", settings="ALGO,CONTROL", replicas=2, epochs=1, synthetic_train=128,
                         synthetic_test=64, synthetic_size=8, batch_size=32, bootstrap=100, out=str(out),
                         progress=lambda setting, replica, done, total: ended.append((setting, replica, done, total)))
    assert sorted((s, k) for s, k, _, _ in ended) == [("ALGO", 0), ("ALGO", 1), ("CONTROL", 0), ("CONTROL", 1)]
    assert [d for _, _, d, _ in ended] == [1, 2, 3, 4] and {t for _, _, _, t in ended} == {4}
    assert r.protocol == "settings" and r.control_mismatch == ""
    assert r.metric("CONTROL", "distinct_fingerprints")["value"] == 1
    assert r.metric("ALGO", "distinct_fingerprints")["value"] == 2  # seeds differ between its replicas
    assert (out / "report.html").exists() and r.report_html == str(out / "report.html")
    with pytest.raises(KeyError):
        r.metric("IMPL", "churn")


def test_a_protocols_own_flag_given_to_another_is_refused_by_name(tmp_path):
    with pytest.raises(ditto.Error, match="--lrs belongs to --protocol fig-s4"):
        ditto.experiment(device="cpu", protocol="overhead", lrs="0.1", out=str(tmp_path / "e"))


def test_progress_true_prints_a_line_per_epoch_without_tqdm(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)  # as where tqdm is not installed
    ditto.train(epochs=2, progress=True, **SYNTHETIC)
    assert capsys.readouterr().out.splitlines() == ["ditto: epoch 1/2 (step 1)", "ditto: epoch 2/2 (step 9)"]


def test_attribution_names_its_candidates_and_ranks_them(tmp_path):
    small = dict(device="cpu", model="smallcnn", synthetic_train=128, synthetic_test=64, synthetic_size=8,
                 batch_size=32)
    listed = ditto.attribute(list=True, **small)
    assert "conv1.bwd_filter=algo0" in listed.candidates and listed.folders == []
    r = ditto.attribute(steps=2, replicas=2, candidate="conv1.bias_bwd=atomic", l2_steps="1,2", fingerprint_steps=2,
                        bootstrap=100, no_checkpoint=True, out=str(tmp_path / "attr"), **small)
    assert r.baseline_mismatch == "" and r.folders == [str(tmp_path / "attr" / "add-one")]
    names = [row["configuration"] for row in r.rows("add-one")]
    assert "all-deterministic" in names and "conv1.bias_bwd=atomic" in names
    with pytest.raises(ditto.Error, match="--candidate"):
        ditto.attribute(candidate="no.such=knob", out=str(tmp_path / "bad"), **small)


def test_deterministic_runs_do_not_part_and_the_report_says_so(tmp_path):
    r = ditto.diverge(device="cpu", model="smallcnn", synthetic_train=128, synthetic_test=64, synthetic_size=8,
                      batch_size=32, steps=3, out=str(tmp_path / "d"))
    assert r["first"]["found"] is False and r["report"]
    assert (tmp_path / "d" / "diverge.json").exists()
    with pytest.raises(ditto.IoError, match="missing-a.trace: cannot open for reading"):
        ditto.compare_traces(str(tmp_path / "missing-a.trace"), str(tmp_path / "missing-b.trace"))


def test_two_runs_kernel_choices_compare_by_layer(tmp_path):
    small = dict(device="cpu", model="two-conv", synthetic_train=64, synthetic_test=32, synthetic_size=16,
                 batch_size=32, epochs=1, kernels="deterministic")
    a = ditto.train(out=str(tmp_path / "a"), **small)
    b = ditto.train(out=str(tmp_path / "b"), pin="conv1.precision=bf16", **small)
    same = ditto.compare_kernels(a.out, a.out)
    assert same["differing"] == [] and same["runtime"] == [] and same["same"] > 0
    c = ditto.compare_kernels(a.out, os.path.join(b.out, "manifest.json"))
    assert {d["layer"] for d in c["differing"]} == {"conv1"}
    assert all(d["a"]["precision"] == "" and d["b"]["precision"] == "bf16" for d in c["differing"])
    assert c["same"] + len(c["differing"]) == same["same"] and "conv1.fwd" in c["text"]
    with pytest.raises(ditto.IoError, match="cannot open"):
        ditto.compare_kernels(a.out, str(tmp_path / "missing.json"))
