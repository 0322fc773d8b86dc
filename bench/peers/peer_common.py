"""Helpers the PyTorch peer scripts share (they run as `python3 bench/peers/<script>.py`, so this
folder is on their import path)."""


def percentile(sorted_values, q):
    """Linear interpolation between closest ranks (numpy's default; ditto's stats.h too)."""
    if len(sorted_values) == 1:
        return sorted_values[0]
    pos = (len(sorted_values) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def short_error(exc):
    """The first line of an exception, with its type, at most 400 characters."""
    text = f"{type(exc).__name__}: {exc}".strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:400]


# ---- precisions: how the step_time and overhead peers run fp32, tf32, bf16 and fp16 ----

PRECISIONS = ("fp32", "tf32", "bf16", "fp16")
# torch.amp.GradScaler's defaults, written out so that a line names the settings that ran.
GRAD_SCALER = {"init_scale": 2.0 ** 16, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 2000}


def parse_precisions(text):
    """The comma list of --precisions, in its order; ValueError naming what is not a precision."""
    names = [p for p in text.split(",") if p]
    bad = [p for p in names if p not in PRECISIONS]
    if bad or not names:
        raise ValueError(f"unknown precision(s) {', '.join(bad) or '(none given)'}; known: {', '.join(PRECISIONS)}")
    return names


class Precision:
    """One precision as PyTorch users train in it today.

    fp32: TF32 off for cuBLAS matmuls and cuDNN (allow_tf32 False, both); tf32: both on. bf16 and
    fp16: automatic mixed precision, torch.autocast(device_type="cuda", dtype=...) around forward and
    loss (backward outside it, as the AMP examples do), model and input in channels-last; fp16 adds a
    torch.amp.GradScaler("cuda") (dynamic loss scale: scale(loss).backward(), step, update). Under
    autocast the ops it leaves in float32 run with TF32 off, as in fp32. The model and input of fp32
    and tf32 stay as the peers always built them (contiguous NCHW).
    """

    def __init__(self, name):
        import torch  # the caller imported it already, after setting CUBLAS_WORKSPACE_CONFIG

        if name not in PRECISIONS:
            raise ValueError(f"unknown precision {name!r}; known: {', '.join(PRECISIONS)}")
        self.torch = torch
        self.name = name
        self.amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(name)

    def apply_switches(self):
        """The global TF32 switches this precision runs with (set explicitly every time)."""
        tf32 = self.name == "tf32"
        self.torch.backends.cuda.matmul.allow_tf32 = tf32
        self.torch.backends.cudnn.allow_tf32 = tf32

    def prepare(self, model, x):
        """(model, x) as this precision runs them: for bf16 / fp16 the model converted to channels-last
        in place and a channels-last copy of x; for fp32 / tf32 both as they are."""
        if self.amp_dtype is None:
            return model, x
        cl = self.torch.channels_last
        return model.to(memory_format=cl), x.contiguous(memory_format=cl)

    def autocast(self):
        """The context forward and loss run in: autocast for bf16 / fp16, nothing otherwise."""
        if self.amp_dtype is None:
            import contextlib
            return contextlib.nullcontext()
        return self.torch.autocast(device_type="cuda", dtype=self.amp_dtype)

    def grad_scaler(self):
        """A fresh GradScaler for fp16 (one per configuration), None for the others."""
        return self.torch.amp.GradScaler("cuda", **GRAD_SCALER) if self.name == "fp16" else None

    def fields(self):
        """What a JSON line records: precision, autocast dtype, memory format, and loss_scale for fp16."""
        out = {"precision": self.name,
               "autocast": None if self.amp_dtype is None else str(self.amp_dtype).replace("torch.", ""),
               "memory_format": "channels_last" if self.amp_dtype is not None else "contiguous",
               "tf32": self.name == "tf32"}
        if self.name == "fp16":
            out["loss_scale"] = ("dynamic: torch.amp.GradScaler('cuda', init_scale {init_scale:g}, growth_factor "
                                 "{growth_factor:g}, backoff_factor {backoff_factor:g}, growth_interval "
                                 "{growth_interval})").format(**GRAD_SCALER)
        return out


def forward_backward(model, x, y, precision, scaler):
    """Forward and cross-entropy under the precision's autocast, then backward outside it (on the
    scaled loss with a GradScaler). Returns the loss."""
    import torch.nn.functional as F

    with precision.autocast():
        loss = F.cross_entropy(model(x), y)
    (loss if scaler is None else scaler.scale(loss)).backward()
    return loss


def train_step(model, opt, x, y, precision, scaler):
    """One eager training step: forward_backward, the optimizer step (through the GradScaler, then
    its update, with one), zero_grad(set_to_none=True). Returns the loss."""
    loss = forward_backward(model, x, y, precision, scaler)
    if scaler is None:
        opt.step()
    else:
        scaler.step(opt)
        scaler.update()
    opt.zero_grad(set_to_none=True)
    return loss
