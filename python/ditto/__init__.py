"""ditto from Python: the knob registry, policies, tensors shared by DLPack, and training runs.

    import ditto
    r = ditto.train(device="cpu", synthetic_train=256, synthetic_test=128, synthetic_size=16,
                    batch_size=32, epochs=1, kernels="deterministic")
    r.test_top1, r.weights_fingerprint, r.predictions     # numpy int32 array per test example

`train` takes ditto-train's flags as keywords (``batch_size=32`` is ``--batch-size 32``; ``True``
gives a switch, a list repeats the flag); `ditto.train_help()` prints them. `experiment` runs the
paper's protocols with ditto-experiment's flags (`ditto.experiment_help()`). Errors are raised as
``ditto.Error`` subclasses carrying ditto's messages: ``FlagError`` for a flag ditto-train refuses,
``PolicyError``, ``ShapeError``, ``DataError``, ``IoError``, ``CudaError``.
"""
from __future__ import annotations

import csv
import importlib.util
import io
import json
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Union

# PyTorch ships its own CUDA libraries (cuDNN, NCCL, cuBLAS) under the same sonames as the
# toolkit's that ditto links. A process holds one library per soname: whichever loads first serves
# both, and PyTorch refuses (or crashes on) the toolkit's older ones, while ditto runs on PyTorch's.
# So where PyTorch is installed it is loaded before the extension (DITTO_NO_TORCH_PRELOAD=1 skips
# that, as the build's stub generation does).
if ("torch" not in sys.modules and not os.environ.get("DITTO_NO_TORCH_PRELOAD")
        and importlib.util.find_spec("torch") is not None):
    import torch  # noqa: F401

from ._ditto import (  # noqa: F401  (re-exported)
    Context,
    CublasError,
    CudaError,
    CudnnError,
    DataError,
    Error,
    FlagError,
    IoError,
    Policy,
    PolicyError,
    ShapeError,
    Tensor,
    attribute_help,
    compare_kernels,
    compare_traces,
    diverge_help,
    epoch_permutation,
    experiment_help,
    knobs,
    train_help,
)
from . import _ditto

__all__ = [
    "AttributionResult", "Context", "Error", "FlagError", "CudaError", "CudnnError", "CublasError", "DataError", "IoError",
    "ExperimentResult", "Policy", "PolicyError", "ShapeError", "Tensor", "TrainResult", "attribute",
    "attribute_help", "compare_kernels", "compare_traces", "diverge", "diverge_help", "epoch_permutation", "experiment", "experiment_help", "flags_to_argv", "knobs", "train", "train_help",
]

FlagValue = Union[str, int, float, bool, List[Any], tuple]


def flags_to_argv(flags: Dict[str, FlagValue]) -> List[str]:
    """Keyword flags as ditto-train's command line: ``batch_size=32`` -> ``--batch-size 32``.

    ``True`` gives the bare switch and ``False`` leaves it out; a list or tuple repeats the flag
    once per item (``pin=["conv1.bwd_data=algo0", "fc.gemm=cublaslt"]``). Anything else is
    passed as text, so ditto-train's own parser checks it and names the flag when it refuses it.
    """
    argv: List[str] = []
    for key, value in flags.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            argv.append(flag)
        elif value is False or value is None:
            continue
        elif isinstance(value, (list, tuple)):
            for item in value:
                argv += [flag, str(item)]
        else:
            argv += [flag, str(value)]
    return argv


@dataclass
class TrainResult:
    """One training run: what ditto-train prints and writes, as Python values and numpy arrays."""

    log: List[Dict[str, float]]  # per epoch, log.csv's columns (epoch, lr, loss, train_acc, test_top1, ...)
    seed_init: int
    seed_order: int
    seed_augment: int
    weights_fingerprint: str
    task: str
    predictions: Any  # numpy int32: the final prediction per test unit
    test_labels: Any  # numpy int32: the test units' labels, same order
    test_subgroups: Any  # numpy int32 per test example; empty without subgroups
    units_per_example: int
    class_names: List[str]
    subgroup_names: List[str]
    test_top1: float
    steps: int
    train_seconds: float
    weights: Any  # numpy float32: every parameter and buffer, in name order
    ops: List[Dict[str, Any]]  # what every op ran (the manifest's "ops")
    warnings: List[str]
    out: str  # the run folder ("" when none was written)
    replay: str  # the ditto-train command line that reproduces the run ("" without a folder)
    argv: List[str] = field(default_factory=list)  # the flags the run was given


def _progress(progress: Any, desc: str, unit: str, where: Callable[..., tuple]):
    """(callback, close) for a run's ``progress`` argument: a user's callable as is; True: a tqdm
    bar when tqdm is installed, else a line on stdout (what a notebook shows) whenever ``where``
    gives one; None or False: none. ``where(*args)`` -> (count so far, total or None, the bar's
    postfix, a line or None)."""
    if progress is None or progress is False:
        return None, lambda: None
    if callable(progress):
        return progress, lambda: None
    try:
        from tqdm.auto import tqdm  # type: ignore
    except ImportError:
        def line(*args: Any) -> None:
            text = where(*args)[3]
            if text:
                print(text, flush=True)

        return line, lambda: None
    bar = tqdm(desc=desc, unit=unit)

    def tick(*args: Any) -> None:
        count, total, postfix, _ = where(*args)
        if total:
            bar.total = total
        bar.set_postfix(refresh=False, **postfix)
        bar.update(count - bar.n)

    return tick, bar.close


def _step_position(epochs: Optional[int]) -> Callable[[int, int], tuple]:
    """train()'s progress: steps on the bar, a line when an epoch begins."""
    seen = {"epoch": 0}

    def where(step: int, epoch: int) -> tuple:
        text = None
        if epoch != seen["epoch"]:
            seen["epoch"] = epoch
            text = f"ditto: epoch {epoch}{f'/{epochs}' if epochs else ''} (step {step})"
        return step, None, {"epoch": epoch}, text

    return where


def _replica_position(setting: str, replica: int, done: int, total: int) -> tuple:
    """experiment()'s progress: replicas ended on the bar, a line per replica."""
    return done, total, {"setting": setting}, f"ditto: {done}/{total} replicas ended ({setting} replica {replica + 1})"


def train(progress: Union[bool, Callable[[int, int], None], None] = None, **flags: FlagValue) -> TrainResult:
    """Trains one network with ditto-train's flags as keywords; see ``ditto.train_help()``.

    ``progress``: a callable ``(step, epoch)`` run after every optimizer step, ``True`` for a
    tqdm bar (or a line per epoch without tqdm), ``None`` for silence. ditto's own progress line
    on stderr is off unless ``quiet=False`` is given.
    """
    flags = dict(flags)
    flags.setdefault("quiet", True)
    argv = flags_to_argv(flags)
    epochs = flags.get("epochs")
    known = int(epochs) if isinstance(epochs, (int, str)) and str(epochs).isdigit() else None
    on_step, close = _progress(progress, "ditto.train", "step", _step_position(known))
    try:
        result = _ditto._run_training(argv, on_step)
    finally:
        close()
    result["ops"] = json.loads(result.pop("ops_json"))["ops"]
    result["log"] = [{k: (int(v) if k == "epoch" else float(v)) for k, v in row.items()}
                     for row in csv.DictReader(io.StringIO(result.pop("log_csv")))]
    return TrainResult(argv=argv, **result)


train.__doc__ = (train.__doc__ or "") + "\n\nditto-train's flags:\n\n" + train_help()


@dataclass
class ExperimentResult:
    """One protocol run (settings, fig-s4 or overhead): its folder, its report and its verdict."""

    out: str  # the experiment folder: report.{json,csv,html} and one run folder per replica
    protocol: str
    wall_seconds: float  # the settings protocol's wall time (0 for the others)
    control_mismatch: str  # "" when every CONTROL cell ended bit-identical, else what did not
    report: Dict[str, Any]  # report.json, parsed
    argv: List[str] = field(default_factory=list)

    @property
    def report_html(self) -> str:
        return os.path.join(self.out, "report.html")

    def metric(self, setting: str, name: str) -> Dict[str, Any]:
        """One metric of one setting from the report ({"value", "low", "high", ...}); KeyError when
        the report has none."""
        for m in self.report.get("metrics", []):
            if m.get("setting") == setting and m.get("metric") == name:
                return m
        raise KeyError(f"the report has no metric {name!r} for setting {setting!r}")


def experiment(progress: Union[bool, Callable[[str, int, int, int], None], None] = None,
               **flags: FlagValue) -> ExperimentResult:
    """Runs one of the paper's protocols with ditto-experiment's flags as keywords (see
    ``ditto.experiment_help()``): ``protocol="settings"`` (the default: replicas per setting),
    ``"fig-s4"`` or ``"overhead"``. The report is written to ``out`` as ditto-experiment writes it
    and read back; ``control_mismatch`` is non-empty when a CONTROL cell did not end bit-identical.

    ``progress``: a callable ``(setting, replica, done, total)`` run as each replica ends (one call
    at a time, from the thread that trained it), ``True`` for a tqdm bar (or a line per replica
    without tqdm), ``None`` for ditto-experiment's own lines on stdout.
    """
    argv = flags_to_argv(flags)
    on_replica, close = _progress(progress, "ditto.experiment", "replica", _replica_position)
    try:
        result = _ditto._run_experiment(argv, on_replica)
    finally:
        close()
    with open(os.path.join(result["out"], "report.json")) as f:
        report = json.load(f)
    return ExperimentResult(report=report, argv=argv, **result)


experiment.__doc__ = (experiment.__doc__ or "") + "\n\nditto-experiment's flags:\n\n" + experiment_help()



@dataclass
class AttributionResult:
    """An attribution (ditto-attribute): which kernel makes identical runs drift apart, per form."""

    candidates: List[str]  # the candidates that ran (or, with list=True, that would)
    folders: List[str]  # out/<form> per form that ran: attribution.{json,csv,svg}
    baseline_mismatch: str  # "" when the all-deterministic baseline ended bit-identical
    forms: Dict[str, Dict[str, Any]]  # form name -> its attribution.json, parsed
    argv: List[str] = field(default_factory=list)

    def rows(self, form: str = "add-one") -> List[Dict[str, Any]]:
        """One form's configurations as attribution.json writes them (baselines first, then the
        candidates ranked: "configuration", "churn", "rank", ...); KeyError for a form that did not
        run."""
        return self.forms[form]["configurations"]


def attribute(**flags: FlagValue) -> AttributionResult:
    """Attributes run-to-run churn to single kernels with ditto-attribute's flags as keywords (see
    ``ditto.attribute_help()``): ``form="add-one"`` (each nondeterministic kernel alone on top of
    deterministic ones), ``"leave-one-out"`` or ``"both"``; ``list=True`` names the candidates only.
    """
    argv = flags_to_argv(flags)
    result = _ditto._run_attribution(argv)
    forms = {}
    for folder in result["folders"]:
        with open(os.path.join(folder, "attribution.json")) as f:
            forms[os.path.basename(folder)] = json.load(f)
    return AttributionResult(forms=forms, argv=argv, **result)


attribute.__doc__ = (attribute.__doc__ or "") + "\n\nditto-attribute's flags:\n\n" + attribute_help()



def diverge(**flags: FlagValue) -> Dict[str, Any]:
    """ditto-diverge run with its flags as keywords (see ``ditto.diverge_help()``): the
    configuration trained twice in lockstep and compared op by op. Returns ``first`` (where the
    runs first parted: found, tensor, note), ``source`` (the first difference read on), ``text``
    (ditto-diverge's report), ``out`` and ``report`` (diverge.json, parsed).
    """
    result = _ditto._run_divergence(flags_to_argv(flags))
    with open(os.path.join(result["out"], "diverge.json")) as f:
        result["report"] = json.load(f)
    return result


diverge.__doc__ = (diverge.__doc__ or "") + "\n\nditto-diverge run's flags:\n\n" + diverge_help()
