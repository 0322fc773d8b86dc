"""ditto's deterministic kernels as PyTorch operators.

PyTorch 2.11's deterministic mode (``torch.use_deterministic_algorithms(True)``) raises on grid
sampling's backward (align_corners=False), pixel-wise NLL and CTC loss backward, ran out of memory in
ROI-align's backward, runs bilinear-upsampling backward 15-21x slower than its atomic kernel, and
leaves grid sampling with align_corners=True to cuDNN's nondeterministic sampler (measured on an H100:
bench/results/2026-11-27-h100-torch-ops/). These functions run ditto's kernels on PyTorch's tensors, on PyTorch's
current CUDA stream (or on the CPU, ditto's double-accumulating references), as ``torch.library``
custom operators with their gradients: they work in eager mode, under deterministic mode, and stay
opaque but traceable under ``torch.compile``.

    import ditto.torch as dt
    y = dt.grid_sample(x, grid, align_corners=False)     # deterministic=True by default
    dt.variants()["grid_sample"]                         # which ditto variant ran, and its guarantee

Every function takes ``deterministic=`` (default True): True runs ditto's deterministic variants
(gathers, stable sorts, fixed-order reductions; convolution backward by ditto's own kernels),
False what frameworks run (atomics, cuDNN's heuristics). ``variants()`` says, per op, which knob
variants the latest call ran and their guarantees. ``patch()`` routes the matching
``torch.nn.functional`` calls here.

Where ditto was built against this PyTorch (the configuring interpreter had it), the host-bound ops
(``nll_loss``, ``cross_entropy``, ``index_add``: their kernels take less time than the Python around
them) run eagerly as C++ operators with their autograd in C++: one dispatch per call, the same kernels
and bits as the Python path (``native_ops()`` lists them; ``DITTO_TORCH_NATIVE=0`` turns them off).

Float32 tensors (int32 or int64 indices) on one device; anything else is refused with a
``ditto.Error`` (or ``ValueError`` for an argument ditto does not implement), never run otherwise.
int64 indices past int32 are never wrapped onto a valid row: they are out of range like any other.
In ``scatter_add`` and ``index_add`` an index out of range raises a ``ditto.DataError`` on the CPU and
makes the result NaN on the GPU, where PyTorch's own ops stop the process with a device-side assert
(``index_add``'s gradient is PyTorch's ``index_select``, which then asserts as well).
"""
from __future__ import annotations

import contextlib
import math
import os
import re
import time
import warnings
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor

from . import _ditto
from ._ditto import CublasError, CudaError, CudnnError, DataError, Error, IoError, PolicyError, ShapeError

__all__ = [
    "affine_grid", "conv2d", "cross_entropy", "ctc_loss", "embedding", "embedding_bag", "grid_sample",
    "index_add", "interpolate", "native_ops", "nll_loss", "patch", "roi_align", "scatter_add", "sparse_mm", "variants",
]

# Per op: when its latest call on the Python path ran (time.monotonic_ns) and its (knob, variant,
# guarantee) list; the C++ operators keep their own record, stamped by the same clock.
_latest: Dict[str, Tuple[int, List[Tuple[str, str, str]]]] = {}


def variants() -> Dict[str, List[dict]]:
    """Per op, the variants its latest call ran: ``[{"knob", "variant", "guarantee"}, ...]``. A call that
    chooses no variant (the pixel-wise cross-entropy's backward: one fixed kernel) leaves the record of
    the call before it (its forward's)."""
    records = dict(_latest)
    if _native is not None:
        for row in _native.latest_variants():
            op, stamp, *flat = row.split("\t")
            if op not in records or int(stamp) > records[op][0]:
                records[op] = (int(stamp), [tuple(flat[i:i + 3]) for i in range(0, len(flat), 3)])
    return {op: [{"knob": k, "variant": v, "guarantee": g} for k, v, g in vs] for op, (_, vs) in records.items()}


def _load_native():
    """ditto's C++ operators (python/torch_native.cpp) where this package was built with them, for this
    PyTorch version; None otherwise (then every op runs its Python path: the same kernels and bits).
    DITTO_TORCH_NATIVE=0 keeps them unloaded."""
    if os.environ.get("DITTO_TORCH_NATIVE", "1") == "0":
        return None
    here = os.path.dirname(os.path.abspath(__file__))
    library, built_for = os.path.join(here, "_torch_native.so"), os.path.join(here, "_torch_native.txt")
    if not (os.path.exists(library) and os.path.exists(built_for)):
        return None
    with open(built_for) as f:
        version = f.read().strip()
    if version != torch.__version__:
        warnings.warn(f"ditto.torch: its C++ operators were built for PyTorch {version}, this is {torch.__version__}; "
                      "the ops run their Python path (same results, more host time per call). Rebuild ditto to "
                      "load them.", RuntimeWarning, stacklevel=3)
        return None
    try:
        torch.ops.load_library(library)
    except OSError as e:
        raise ImportError(f"ditto.torch: {library} (built for PyTorch {version}) does not load: {e}. Rebuild ditto "
                          "against this PyTorch, or set DITTO_TORCH_NATIVE=0 to run every op's Python path") from e
    return torch.ops.ditto_native


_native = _load_native()

# ditto's exceptions from the C++ operators arrive as RuntimeErrors tagged with their type.
_NATIVE_ERROR = re.compile(r"\[ditto\.(\w+)\] (.*)", re.S)
_ERROR_TYPES = {cls.__name__: cls for cls in (Error, DataError, ShapeError, PolicyError, IoError, CudaError,
                                               CudnnError, CublasError)}


def native_ops() -> List[str]:
    """The ops whose eager calls run as C++ operators (autograd in C++, one dispatch per call); empty
    where ditto was built without PyTorch or for another PyTorch version, or under DITTO_TORCH_NATIVE=0."""
    return sorted(op.name for op in _OPS if op.native is not None)


# PyTorch's current stream on a device as its raw handle. torch.cuda.current_stream() builds a Stream
# object per call; the raw getter (what torch.compile's generated code calls) does not.
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None) or (
    lambda index: torch.cuda.current_stream(index).cuda_stream)


_CUDA_NAMES: Dict[int, str] = {}


def _where(device: torch.device) -> Tuple[str, int]:
    if device.type == "cuda":
        index = device.index  # a tensor's CUDA device always carries its index
        name = _CUDA_NAMES.get(index)
        if name is None:
            name = _CUDA_NAMES[index] = f"cuda:{index}"
        return name, _raw_stream(index)
    if device.type == "cpu":
        return "cpu", 0
    raise ValueError(f"ditto.torch: tensors on {device}; ditto runs on the CPU and on CUDA devices")


_DTYPES = {torch.float32: "f32", torch.int32: "i32", torch.int64: "i64", torch.bfloat16: "bf16", torch.float16: "f16"}


def _pointer(t: Tensor, device: torch.device):
    """A tensor as ditto's ops take it from here: (data pointer, shape, dtype). The caller holds the
    tensor for the call; ditto queues its work on PyTorch's current stream (see _ditto's notes)."""
    if t.device != device:
        raise ValueError(f"ditto.torch: tensors on {t.device} and {device}; one device per op")
    name = _DTYPES.get(t.dtype)
    if name is None:
        raise ValueError(f"ditto.torch: a {t.dtype} tensor; ditto takes float32, int32, int64 (as indices), bfloat16 and float16")
    return (t.data_ptr(), tuple(t.shape), name)


def _run(op: str, fn: str, deterministic: bool, like: Tensor, *args) -> List[Optional[Tensor]]:
    device = like.device
    where, stream = _where(device)
    # `held` keeps every tensor (the callers' temporaries and contiguous copies among them) alive
    # until the call has queued its work. One plain loop: this runs on every call of every op.
    held, packed = [], []
    for a in args:
        if isinstance(a, Tensor):
            a = a.contiguous()
            held.append(a)
            a = _pointer(a, device)
        packed.append(a)
    *outs, ran = getattr(_ditto, fn)(where, stream, deterministic, *packed)
    del held
    if ran:
        _latest[op] = (time.monotonic_ns(), ran)
    return [None if o is None else torch.from_dlpack(o) for o in outs]


_OPS: List["_Op"] = []
_PLAIN = (Tensor, torch.nn.Parameter)  # a Parameter is a plain tensor to every op (no __torch_function__)


class _Op:
    """One of ditto's ops as a ``torch.library`` custom op (what ``torch.compile`` and other tracers
    see, opaque, with its fake implementation and autograd formula) and, in eager mode on plain
    tensors, the same implementation and formula through a ``torch.autograd.Function``: PyTorch's
    custom-op dispatch costs tens of microseconds per call in Python, which an op of a few hundred
    microseconds cannot hide."""

    def __init__(self, name: str, fn):
        self.name = name
        self.raw = fn
        self.op = torch.library.custom_op(name, mutates_args=())(fn)
        self.register_fake = self.op.register_fake
        self._function = None
        # The C++ operator of the same schema, where there is one: eager calls on plain tensors go there
        # (the raw builtin, not the OpOverload's Python __call__ around it).
        short = name.split("::")[1]
        self.native = getattr(_native, short).default._op if _native is not None and hasattr(_native, short) else None
        _OPS.append(self)

    def register_autograd(self, backward, setup_context):
        self.op.register_autograd(backward, setup_context=setup_context)
        raw = self.raw

        class Function(torch.autograd.Function):
            @staticmethod
            def forward(ctx, *args):
                out = raw(*args)
                setup_context(ctx, args, out)
                return out

            @staticmethod
            def backward(ctx, *grads):
                return backward(ctx, *grads)

        self._function = Function

    def __call__(self, *args):
        if torch.compiler.is_compiling():
            return self.op(*args)
        wants_grad = False
        for a in args:  # one pass over the arguments: this runs on every call of every op
            if isinstance(a, Tensor):
                if type(a) not in _PLAIN:
                    return self.op(*args)  # traced (fake, functional or other subclassed tensors): the custom op
                wants_grad = wants_grad or a.requires_grad
        if self.native is not None:
            try:
                return self.native(*args)
            except RuntimeError as e:
                tagged = _NATIVE_ERROR.match(str(e))
                if tagged is None:
                    raise
                raise _ERROR_TYPES.get(tagged.group(1), Error)(tagged.group(2)) from None
        if wants_grad and self._function is not None and torch.is_grad_enabled():
            return self._function.apply(*args)
        return self.raw(*args)


def _op(name: str):
    return lambda fn: _Op(name, fn)


def _f32(t: Tensor, what: str) -> Tensor:
    if t.dtype != torch.float32:
        raise ValueError(f"ditto.torch: {what} is {t.dtype}; ditto's ops here take float32")
    return t.contiguous()


def _idx(t: Tensor) -> Tensor:
    """Indices and labels as they cross into ditto: int32 as they are, int64 as they are too (its words
    cross and ditto's call narrows them on the device in one kernel, where a conversion here would cost
    two dispatches), any other integer dtype converted to int32 here. An int64 value outside int32 is
    never wrapped onto a valid row (2**32 + 3 is not 3): a ``ditto.DataError`` naming it on the CPU; on
    the GPU it saturates to int32's limits, out of range for every table and class count, so the
    kernels treat it as any other bad index."""
    if t.dtype == torch.int32 or t.dtype == torch.int64:
        return t if t.is_contiguous() else t.contiguous()
    return t.to(torch.int32).contiguous()


def _empty(like: Tensor) -> Tensor:
    return like.new_empty((0,))


# ---- scatter_add / index_add: rows added into a table --------------------------------------------

@_op("ditto::index_add")
def _index_add(input: Tensor, dim: int, index: Tensor, source: Tensor, alpha: float, deterministic: bool) -> Tensor:
    src = source.movedim(dim, 0) if dim else source  # rows along dim 0 need no moved view
    if alpha != 1:
        src = src * alpha
    rows = _run("scatter_add", "_torch_scatter_add", deterministic, src, _f32(src, "source"), index,
                input.shape[dim])[0]
    return input + (rows.movedim(0, dim) if dim else rows)


@_index_add.register_fake
def _(input, dim, index, source, alpha, deterministic):
    return input.new_empty(input.shape)


def _index_add_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[2])
    ctx.dim, ctx.alpha = inputs[1], inputs[4]


def _index_add_backward(ctx, grad):
    (index,) = ctx.saved_tensors
    dsource = grad.index_select(ctx.dim, index)  # a gather: no collisions
    return grad, None, None, dsource * ctx.alpha if ctx.alpha != 1 else dsource, None, None


_index_add.register_autograd(_index_add_backward, setup_context=_index_add_setup)


def index_add(input: Tensor, dim: int, index: Tensor, source: Tensor, *, alpha: float = 1,
              deterministic: bool = True) -> Tensor:
    """``torch.index_add``: ``input`` plus ``source``'s slices added at ``index`` along ``dim``; the sum into
    each destination in increasing source order (``deterministic``), or by atomics."""
    return _index_add(input, dim % max(input.dim(), 1), _idx(index), source, float(alpha), deterministic)


def _dim_words(index: Tensor) -> Tuple[Tensor, bool]:
    # int64 indices cross as their two int32 words (a view, no conversion); ditto's kernels widen them and
    # treat a value outside int32 as out of range.
    if index.dtype == torch.int64:
        return index.contiguous().reshape(-1).view(torch.int32), True
    return _idx(index), False


@_op("ditto::scatter_add")
def _scatter_add(input: Tensor, dim: int, index: Tensor, src: Tensor, deterministic: bool) -> Tensor:
    words, wide = _dim_words(index)
    summed = _run("scatter_add", "_torch_scatter_dim_add", deterministic, src, _f32(src, "source"), words, wide,
                  list(index.shape), dim, list(input.shape))[0]
    return input + summed


@_scatter_add.register_fake
def _(input, dim, index, src, deterministic):
    return input.new_empty(input.shape)


def _scatter_add_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[2])
    ctx.dim = inputs[1]


def _scatter_add_backward(ctx, grad):
    (index,) = ctx.saved_tensors
    dsrc = None
    if ctx.needs_input_grad[3]:
        # ditto's gather along dim by the same index: NaN where a value is out of range, as the forward's
        # output already is (PyTorch's gather would stop the process with a device-side assert).
        words, wide = _dim_words(index)
        dsrc = _run("scatter_add", "_torch_gather_dim", True, grad, _f32(grad, "grad"), words, wide,
                    list(index.shape), ctx.dim)[0]
    return grad, None, None, dsrc, None


_scatter_add.register_autograd(_scatter_add_backward, setup_context=_scatter_add_setup)


def scatter_add(input: Tensor, dim: int, index: Tensor, src: Tensor, *, deterministic: bool = True) -> Tensor:
    """``torch.scatter_add``: ``input`` plus each ``src[p]`` added at position p with its ``dim`` coordinate
    replaced by ``index[p]`` (over ``index``'s extent). A coordinate outside ``input``'s extent along ``dim``
    makes the output NaN on the GPU (PyTorch's own op stops the process with a device-side assert there)
    and raises on the CPU."""
    dim = dim % max(input.dim(), 1)
    src = src[tuple(slice(0, s) for s in index.shape)]
    return _scatter_add(input, dim, _idx(index), src, deterministic)

# ---- embedding and embedding_bag ------------------------------------------------------------------

@_op("ditto::embedding")
def _embedding(weight: Tensor, index: Tensor, padding_idx: int, deterministic: bool) -> Tensor:
    # A gather, one source per output, deterministic everywhere: PyTorch's own kernel (the ATen op,
    # which patch() does not reroute).
    return torch.embedding(weight, index)


@_embedding.register_fake
def _(weight, index, padding_idx, deterministic):
    return weight.new_empty(tuple(index.shape) + (weight.shape[1],))


@_op("ditto::embedding_backward")
def _embedding_backward(grad: Tensor, index: Tensor, num_rows: int, padding_idx: int, deterministic: bool) -> Tensor:
    if padding_idx >= 0:
        grad = grad.masked_fill((index == padding_idx).unsqueeze(-1), 0)
    return _run("embedding", "_torch_embedding_backward", deterministic, grad, _f32(grad, "grad"), _idx(index),
                num_rows)[0]


@_embedding_backward.register_fake
def _(grad, index, num_rows, padding_idx, deterministic):
    return grad.new_empty((num_rows, grad.shape[-1]))


def _embedding_setup(ctx, inputs, output):
    weight, index, padding_idx, deterministic = inputs
    ctx.save_for_backward(index)
    ctx.rows, ctx.padding_idx, ctx.deterministic = weight.shape[0], padding_idx, deterministic


def _embedding_bwd(ctx, grad):
    (index,) = ctx.saved_tensors
    return _embedding_backward(grad.contiguous(), index, ctx.rows, ctx.padding_idx, ctx.deterministic), None, None, None


_embedding.register_autograd(_embedding_bwd, setup_context=_embedding_setup)


def embedding(input: Tensor, weight: Tensor, padding_idx: Optional[int] = None, *,
              deterministic: bool = True) -> Tensor:
    """``F.embedding``: rows of ``weight``; its gradient a scatter-add of the output gradient by the
    indices (stable-sorted segment sums, or atomics)."""
    if padding_idx is not None and padding_idx < 0:
        padding_idx += weight.shape[0]
    return _embedding(weight, input, -1 if padding_idx is None else padding_idx, deterministic)


@_op("ditto::embedding_bag")
def _embedding_bag(weight: Tensor, index: Tensor, offsets: Optional[Tensor], mode: str,
                   deterministic: bool) -> Tensor:
    return _run("embedding_bag", "_torch_embedding_bag", deterministic, weight, _f32(weight, "weight"), _idx(index),
                None if offsets is None else _idx(offsets), mode)[0]


@_embedding_bag.register_fake
def _(weight, index, offsets, mode, deterministic):
    bags = index.shape[0] if offsets is None else offsets.shape[0]
    return weight.new_empty((bags, weight.shape[1]))


@_op("ditto::embedding_bag_backward")
def _embedding_bag_backward(grad: Tensor, index: Tensor, offsets: Optional[Tensor], mode: str, num_rows: int,
                            deterministic: bool) -> Tensor:
    return _run("embedding_bag", "_torch_embedding_bag_backward", deterministic, grad, _f32(grad, "grad"),
                _idx(index), None if offsets is None else _idx(offsets), mode, num_rows)[0]


@_embedding_bag_backward.register_fake
def _(grad, index, offsets, mode, num_rows, deterministic):
    return grad.new_empty((num_rows, grad.shape[1]))


def _embedding_bag_setup(ctx, inputs, output):
    weight, index, offsets, mode, deterministic = inputs
    ctx.save_for_backward(index, offsets)
    ctx.rows, ctx.mode, ctx.deterministic = weight.shape[0], mode, deterministic


def _embedding_bag_bwd(ctx, grad):
    index, offsets = ctx.saved_tensors
    return (_embedding_bag_backward(grad.contiguous(), index, offsets, ctx.mode, ctx.rows, ctx.deterministic),
            None, None, None, None)


_embedding_bag.register_autograd(_embedding_bag_bwd, setup_context=_embedding_bag_setup)


def embedding_bag(input: Tensor, weight: Tensor, offsets: Optional[Tensor] = None, mode: str = "mean", *,
                  deterministic: bool = True) -> Tensor:
    """``F.embedding_bag`` (modes sum and mean, no per-sample weights, include_last_offset=False):
    per bag the rows' sum or mean in position order; the gradient a scatter-add as ``embedding``'s."""
    if mode not in ("sum", "mean"):
        raise ValueError(f"ditto.torch.embedding_bag: mode '{mode}'; ditto has sum and mean")
    return _embedding_bag(weight, _idx(input), None if offsets is None else _idx(offsets), mode, deterministic)


# ---- interpolate (nearest, bilinear) --------------------------------------------------------------

@_op("ditto::upsample")
def _upsample(x: Tensor, out_h: int, out_w: int, mode: str, align_corners: bool, deterministic: bool) -> Tensor:
    if mode == "nearest" and x.is_cuda and not _ditto._torch_upsample_nearest_whole(x.shape[2], x.shape[3], out_h,
                                                                                       out_w):
        # No reduction in the forward: PyTorch's kernel (ATen's, not rerouted by patch()) is
        # deterministic, and where the scale is not whole faster than ditto's (which divides per
        # output); with whole scales ditto's copies each input to its block, faster than PyTorch's.
        # The backward is ditto's.
        _f32(x, "input")
        return torch._C._nn.upsample_nearest2d(x.contiguous(), [out_h, out_w])
    return _run("upsample", "_torch_upsample", deterministic, x, _f32(x, "input"), mode, out_h, out_w,
                align_corners)[0]


@_upsample.register_fake
def _(x, out_h, out_w, mode, align_corners, deterministic):
    return x.new_empty((x.shape[0], x.shape[1], out_h, out_w))


@_op("ditto::upsample_backward")
def _upsample_backward(grad: Tensor, x_shape: List[int], mode: str, align_corners: bool,
                       deterministic: bool) -> Tensor:
    return _run("upsample", "_torch_upsample_backward", deterministic, grad, _f32(grad, "grad"), list(x_shape), mode,
                align_corners)[0]


@_upsample_backward.register_fake
def _(grad, x_shape, mode, align_corners, deterministic):
    return grad.new_empty(tuple(x_shape))


def _upsample_setup(ctx, inputs, output):
    x, out_h, out_w, mode, align_corners, deterministic = inputs
    ctx.x_shape, ctx.mode, ctx.align_corners, ctx.deterministic = list(x.shape), mode, align_corners, deterministic


def _upsample_bwd(ctx, grad):
    dx = _upsample_backward(grad.contiguous(), ctx.x_shape, ctx.mode, ctx.align_corners, ctx.deterministic)
    return dx, None, None, None, None, None


_upsample.register_autograd(_upsample_bwd, setup_context=_upsample_setup)


def _out_size(n: int, scale: float, what: str) -> int:
    out = math.floor(n * scale)
    # ditto places taps by in/out; PyTorch by 1/scale_factor. They agree where out/in is the scale.
    if out < 1 or out / n != scale:
        raise ValueError(f"ditto.torch.interpolate: scale_factor {scale} on {what} {n} gives {out}, not an exact "
                         f"ratio; pass size= (ditto places taps by the input/output ratio)")
    return out


def interpolate(input: Tensor, size=None, scale_factor=None, mode: str = "nearest",
                align_corners: Optional[bool] = None, *, deterministic: bool = True) -> Tensor:
    """``F.interpolate`` of an N,C,H,W tensor, modes nearest and bilinear: its backward a gather per input
    pixel in a fixed order (``deterministic``), or atomics from every output."""
    if input.dim() != 4:
        raise ValueError(f"ditto.torch.interpolate: a 4-D N,C,H,W input, not {input.dim()}-D")
    if mode not in ("nearest", "bilinear"):
        raise ValueError(f"ditto.torch.interpolate: mode '{mode}'; ditto has nearest and bilinear")
    if mode == "nearest" and align_corners is not None:
        raise ValueError("ditto.torch.interpolate: align_corners only goes with bilinear (as in PyTorch)")
    if (size is None) == (scale_factor is None):
        raise ValueError("ditto.torch.interpolate: give exactly one of size and scale_factor")
    h, w = input.shape[2], input.shape[3]
    if size is not None:
        oh, ow = (size, size) if isinstance(size, int) else tuple(size)
    else:
        sh, sw = (scale_factor, scale_factor) if isinstance(scale_factor, (int, float)) else tuple(scale_factor)
        oh, ow = _out_size(h, float(sh), "height"), _out_size(w, float(sw), "width")
    return _upsample(input, int(oh), int(ow), mode, bool(align_corners), deterministic)


# ---- grid_sample and affine_grid ------------------------------------------------------------------

@_op("ditto::grid_sample")
def _grid_sample(x: Tensor, grid: Tensor, align_corners: bool, deterministic: bool) -> Tensor:
    if x.is_cuda:
        # The forward has no reduction (one thread per output): PyTorch's kernel (the ATen op, which
        # patch() does not reroute) is deterministic and on the H100 twice as fast as ditto's; the
        # backward, where the atomics are, is ditto's.
        _f32(x, "input"), _f32(grid, "grid")
        return torch.grid_sampler(x.contiguous(), grid.contiguous(), 0, 0, align_corners)
    return _run("grid_sample", "_torch_grid_sample", deterministic, x, _f32(x, "input"), _f32(grid, "grid"),
                align_corners)[0]


@_grid_sample.register_fake
def _(x, grid, align_corners, deterministic):
    return x.new_empty((x.shape[0], x.shape[1], grid.shape[1], grid.shape[2]))


@_op("ditto::grid_sample_backward")
def _grid_sample_backward(grad: Tensor, x: Tensor, grid: Tensor, align_corners: bool, want_dx: bool,
                          want_dgrid: bool, deterministic: bool) -> Tuple[Tensor, Tensor]:
    dx, dg = _run("grid_sample", "_torch_grid_sample_backward", deterministic, x, _f32(grad, "grad"),
                  _f32(x, "input"), _f32(grid, "grid"), align_corners, want_dx, want_dgrid)
    return (dx if dx is not None else _empty(x)), (dg if dg is not None else _empty(grid))


@_grid_sample_backward.register_fake
def _(grad, x, grid, align_corners, want_dx, want_dgrid, deterministic):
    return (x.new_empty(x.shape) if want_dx else x.new_empty((0,)),
            grid.new_empty(grid.shape) if want_dgrid else grid.new_empty((0,)))


def _grid_sample_setup(ctx, inputs, output):
    x, grid, align_corners, deterministic = inputs
    ctx.save_for_backward(x, grid)
    ctx.align_corners, ctx.deterministic = align_corners, deterministic


def _grid_sample_bwd(ctx, grad):
    x, grid = ctx.saved_tensors
    want_dx, want_dgrid = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    dx, dg = _grid_sample_backward(grad.contiguous(), x, grid, ctx.align_corners, want_dx, want_dgrid,
                                   ctx.deterministic)
    return (dx if want_dx else None), (dg if want_dgrid else None), None, None


_grid_sample.register_autograd(_grid_sample_bwd, setup_context=_grid_sample_setup)


def grid_sample(input: Tensor, grid: Tensor, mode: str = "bilinear", padding_mode: str = "zeros",
                align_corners: Optional[bool] = None, *, deterministic: bool = True) -> Tensor:
    """``F.grid_sample`` (bilinear, zero padding): the input's gradient a gather per pixel after a stable
    sort of the samples that reach it (``deterministic``), or atomics, as PyTorch's kernel."""
    if mode != "bilinear" or padding_mode != "zeros":
        raise ValueError(f"ditto.torch.grid_sample: mode '{mode}' with padding '{padding_mode}'; ditto has "
                         "bilinear with zeros")
    return _grid_sample(input, grid, bool(align_corners), deterministic)


@_op("ditto::affine_grid")
def _affine_grid(theta: Tensor, height: int, width: int, align_corners: bool, deterministic: bool) -> Tensor:
    return _run("affine_grid", "_torch_affine_grid", deterministic, theta, _f32(theta, "theta"), height, width,
                align_corners)[0]


@_affine_grid.register_fake
def _(theta, height, width, align_corners, deterministic):
    return theta.new_empty((theta.shape[0], height, width, 2))


@_op("ditto::affine_grid_backward")
def _affine_grid_backward(grad: Tensor, align_corners: bool, deterministic: bool) -> Tensor:
    return _run("affine_grid", "_torch_affine_grid_backward", deterministic, grad, _f32(grad, "grad"),
                align_corners)[0]


@_affine_grid_backward.register_fake
def _(grad, align_corners, deterministic):
    return grad.new_empty((grad.shape[0], 2, 3))


def _affine_grid_setup(ctx, inputs, output):
    ctx.align_corners, ctx.deterministic = inputs[3], inputs[4]


def _affine_grid_bwd(ctx, grad):
    return _affine_grid_backward(grad.contiguous(), ctx.align_corners, ctx.deterministic), None, None, None, None


_affine_grid.register_autograd(_affine_grid_bwd, setup_context=_affine_grid_setup)


def affine_grid(theta: Tensor, size: Sequence[int], align_corners: Optional[bool] = None, *,
                deterministic: bool = True) -> Tensor:
    """``F.affine_grid`` for 2-D (size N, C, H, W): dtheta by fixed-order block sums (``deterministic``)."""
    if len(size) != 4:
        raise ValueError(f"ditto.torch.affine_grid: size N, C, H, W (2-D grids), not {tuple(size)}")
    return _affine_grid(theta, int(size[2]), int(size[3]), bool(align_corners), deterministic)


# ---- ROI align --------------------------------------------------------------------------------------

@_op("ditto::roi_align")
def _roi_align(x: Tensor, rois: Tensor, out_h: int, out_w: int, spatial_scale: float, sampling_ratio: int,
               aligned: bool, deterministic: bool) -> Tensor:
    return _run("roi_align", "_torch_roi_align", deterministic, x, _f32(x, "input"), _f32(rois, "boxes"), out_h,
                out_w, spatial_scale, sampling_ratio, aligned)[0]


@_roi_align.register_fake
def _(x, rois, out_h, out_w, spatial_scale, sampling_ratio, aligned, deterministic):
    return x.new_empty((rois.shape[0], x.shape[1], out_h, out_w))


@_op("ditto::roi_align_backward")
def _roi_align_backward(grad: Tensor, rois: Tensor, x_shape: List[int], out_h: int, out_w: int,
                        spatial_scale: float, sampling_ratio: int, aligned: bool, deterministic: bool) -> Tensor:
    return _run("roi_align", "_torch_roi_align_backward", deterministic, grad, _f32(grad, "grad"), list(x_shape),
                _f32(rois, "boxes"), out_h, out_w, spatial_scale, sampling_ratio, aligned)[0]


@_roi_align_backward.register_fake
def _(grad, rois, x_shape, out_h, out_w, spatial_scale, sampling_ratio, aligned, deterministic):
    return grad.new_empty(tuple(x_shape))


def _roi_align_setup(ctx, inputs, output):
    x, rois, out_h, out_w, spatial_scale, sampling_ratio, aligned, deterministic = inputs
    ctx.save_for_backward(rois)
    ctx.args = (list(x.shape), out_h, out_w, spatial_scale, sampling_ratio, aligned, deterministic)


def _roi_align_bwd(ctx, grad):
    (rois,) = ctx.saved_tensors
    dx = _roi_align_backward(grad.contiguous(), rois, *ctx.args)
    return (dx,) + (None,) * 7


_roi_align.register_autograd(_roi_align_bwd, setup_context=_roi_align_setup)


def roi_align(input: Tensor, boxes: Tensor, output_size, spatial_scale: float = 1.0, sampling_ratio: int = -1,
              aligned: bool = False, *, deterministic: bool = True) -> Tensor:
    """``torchvision.ops.roi_align`` with boxes as a K x 5 tensor (batch index, x1, y1, x2, y2): the input's
    gradient gathered per pixel from the rois that reach it (``deterministic``), or atomics."""
    if not isinstance(boxes, Tensor) or boxes.dim() != 2 or boxes.shape[1] != 5:
        raise ValueError("ditto.torch.roi_align: boxes as one K x 5 tensor (batch index, x1, y1, x2, y2)")
    oh, ow = (output_size, output_size) if isinstance(output_size, int) else tuple(output_size)
    return _roi_align(input, boxes, int(oh), int(ow), float(spatial_scale), int(sampling_ratio), bool(aligned),
                      deterministic)


# ---- CTC loss ---------------------------------------------------------------------------------------

@_op("ditto::ctc_loss")
def _ctc_loss(log_probs: Tensor, targets: Tensor, input_lengths: Tensor, target_lengths: Tensor, want_grad: bool,
              deterministic: bool) -> Tuple[Tensor, Tensor]:
    cost, grad = _run("ctc_loss", "_torch_ctc_loss", deterministic, log_probs, _f32(log_probs, "log_probs"),
                      _idx(targets), _idx(target_lengths), _idx(input_lengths), want_grad)
    return cost, (grad if grad is not None else _empty(log_probs))


@_ctc_loss.register_fake
def _(log_probs, targets, input_lengths, target_lengths, want_grad, deterministic):
    return (log_probs.new_empty((log_probs.shape[1],)),
            log_probs.new_empty(log_probs.shape) if want_grad else log_probs.new_empty((0,)))


def _ctc_setup(ctx, inputs, output):
    ctx.save_for_backward(output[1])


def _ctc_bwd(ctx, dcost, _unused):
    (grad,) = ctx.saved_tensors
    return grad * dcost.view(1, -1, 1), None, None, None, None, None


_ctc_loss.register_autograd(_ctc_bwd, setup_context=_ctc_setup)


def ctc_loss(log_probs: Tensor, targets: Tensor, input_lengths: Tensor, target_lengths: Tensor, blank: int = 0,
             reduction: str = "mean", zero_infinity: bool = False, *, deterministic: bool = True) -> Tensor:
    """``F.ctc_loss`` (log_probs T x N x C, blank 0; targets padded N x S or concatenated): each sequence
    in one thread block, no atomics (``deterministic``, ditto's), or cuDNN's nondeterministic algorithm."""
    if blank != 0:
        raise ValueError(f"ditto.torch.ctc_loss: blank {blank}; ditto's CTC takes class 0 as the blank")
    if reduction not in ("none", "sum", "mean"):
        raise ValueError(f"ditto.torch.ctc_loss: reduction '{reduction}'")
    input_lengths = torch.as_tensor(input_lengths, device=log_probs.device)
    target_lengths = torch.as_tensor(target_lengths, device=log_probs.device)
    if targets.dim() == 1:  # concatenated: pad to N x max length
        n = target_lengths.shape[0]
        s = max(int(target_lengths.max()), 1) if n else 1
        starts = torch.cumsum(target_lengths, 0) - target_lengths
        pos = torch.arange(s, device=targets.device).view(1, -1)
        take = (starts.view(-1, 1) + pos).clamp(max=max(targets.numel() - 1, 0))
        targets = torch.where(pos < target_lengths.view(-1, 1), targets[take.long()], torch.zeros_like(take))
    want_grad = torch.is_grad_enabled() and log_probs.requires_grad
    cost, _ = _ctc_loss(log_probs, targets, input_lengths, target_lengths, want_grad, deterministic)
    if zero_infinity:
        cost = torch.where(torch.isinf(cost), torch.zeros_like(cost), cost)
    if reduction == "none":
        return cost
    if reduction == "sum":
        return cost.sum()
    return (cost / target_lengths.clamp(min=1).to(cost.dtype)).mean()


# ---- pixel-wise cross-entropy and NLL ----------------------------------------------------------------

@_op("ditto::pixel_cross_entropy")
def _pixel_xent(logits: Tensor, labels: Tensor, ignore_index: int, deterministic: bool) -> Tuple[Tensor, Tensor, Tensor]:
    loss, lse, count = _run("pixel_xent", "_torch_pixel_cross_entropy", deterministic, logits,
                            _f32(logits, "input"), _idx(labels), ignore_index)
    return loss.view(()), lse, count


@_pixel_xent.register_fake
def _(logits, labels, ignore_index, deterministic):
    # The log-sum-exp per pixel on a GPU; the CPU reference keeps none.
    pixels = logits.shape[0] * logits.shape[2] * logits.shape[3] if logits.device.type == "cuda" else 0
    return logits.new_empty(()), logits.new_empty((pixels,)), logits.new_empty((1,), dtype=torch.int32)


@_op("ditto::pixel_cross_entropy_backward")
def _pixel_xent_backward(grad: Tensor, logits: Tensor, labels: Tensor, lse: Tensor, count: Tensor, ignore_index: int,
                         deterministic: bool) -> Tensor:
    return _run("pixel_xent", "_torch_pixel_cross_entropy_backward", deterministic, logits,
                _f32(grad, "grad").reshape(1), _f32(logits, "input"), _idx(labels), lse, count, ignore_index)[0]


@_pixel_xent_backward.register_fake
def _(grad, logits, labels, lse, count, ignore_index, deterministic):
    return logits.new_empty(logits.shape)


def _pixel_xent_setup(ctx, inputs, output):
    logits, labels, ignore_index, deterministic = inputs
    _, lse, count = output
    ctx.save_for_backward(logits, labels, lse, count)
    ctx.ignore_index, ctx.deterministic = ignore_index, deterministic


def _pixel_xent_bwd(ctx, grad, _lse_grad, _count_grad):
    logits, labels, lse, count = ctx.saved_tensors
    return (_pixel_xent_backward(grad, logits, labels, lse, count, ctx.ignore_index, ctx.deterministic), None, None,
            None)


_pixel_xent.register_autograd(_pixel_xent_bwd, setup_context=_pixel_xent_setup)


def cross_entropy(input: Tensor, target: Tensor, ignore_index: int = -100, reduction: str = "mean", *,
                  deterministic: bool = True) -> Tensor:
    """``F.cross_entropy`` of N,C,H,W logits and N,H,W labels with mean reduction (the segmentation loss):
    log-softmax and NLL fused, the pixel sum in a fixed order (``deterministic``) or by atomics."""
    if input.dim() != 4 or reduction != "mean":
        raise ValueError("ditto.torch.cross_entropy: N,C,H,W logits with N,H,W labels and reduction 'mean'")
    return _pixel_xent(input, _idx(target), int(ignore_index), deterministic)[0]


@_op("ditto::pixel_nll")
def _pixel_nll(log_probs: Tensor, labels: Tensor, ignore_index: int, deterministic: bool) -> Tuple[Tensor, Tensor]:
    loss, count = _run("pixel_xent", "_torch_pixel_nll", deterministic, log_probs, _f32(log_probs, "input"),
                       _idx(labels), ignore_index)
    return loss.view(()), count


@_pixel_nll.register_fake
def _(log_probs, labels, ignore_index, deterministic):
    return log_probs.new_empty(()), log_probs.new_empty((1,), dtype=torch.int32)


@_op("ditto::pixel_nll_backward")
def _pixel_nll_backward(grad: Tensor, log_probs: Tensor, labels: Tensor, count: Tensor, ignore_index: int,
                        deterministic: bool) -> Tensor:
    return _run("pixel_xent", "_torch_pixel_nll_backward", deterministic, log_probs, _f32(grad, "grad").reshape(1),
                _f32(log_probs, "input"), _idx(labels), count, ignore_index)[0]


@_pixel_nll_backward.register_fake
def _(grad, log_probs, labels, count, ignore_index, deterministic):
    return log_probs.new_empty(log_probs.shape)


def _pixel_nll_setup(ctx, inputs, output):
    log_probs, labels, ignore_index, deterministic = inputs
    ctx.save_for_backward(log_probs, labels, output[1])
    ctx.ignore_index, ctx.deterministic = ignore_index, deterministic


def _pixel_nll_bwd(ctx, grad, _count_grad):
    log_probs, labels, count = ctx.saved_tensors
    return (_pixel_nll_backward(grad, log_probs, labels, count, ctx.ignore_index, ctx.deterministic), None, None,
            None)


_pixel_nll.register_autograd(_pixel_nll_bwd, setup_context=_pixel_nll_setup)


def nll_loss(input: Tensor, target: Tensor, ignore_index: int = -100, reduction: str = "mean", *,
             deterministic: bool = True) -> Tensor:
    """``F.nll_loss`` of N,C,H,W log-probabilities and N,H,W labels with mean reduction: one read per counted
    pixel, the pixel sum in a fixed order (``deterministic``) or by atomics; the gradient is written once per
    element (PyTorch's nll_loss2d has no deterministic form)."""
    if input.dim() != 4 or reduction != "mean":
        raise ValueError("ditto.torch.nll_loss: N,C,H,W log-probabilities with N,H,W labels and reduction 'mean'")
    return _pixel_nll(input, _idx(target), int(ignore_index), deterministic)[0]


# ---- sparse x dense ------------------------------------------------------------------------------------

@_op("ditto::sparse_mm")
def _sparse_mm(row_ptr: Tensor, col_idx: Tensor, values: Tensor, rows: int, cols: int, b: Tensor,
               deterministic: bool) -> Tensor:
    return _run("spmm", "_torch_spmm", deterministic, b, _idx(row_ptr), _idx(col_idx), _f32(values, "values"),
                rows, cols, _f32(b, "dense operand"))[0]


@_sparse_mm.register_fake
def _(row_ptr, col_idx, values, rows, cols, b, deterministic):
    return b.new_empty((rows, b.shape[1]))


@_op("ditto::sparse_mm_backward")
def _sparse_mm_backward(grad: Tensor, row_ptr: Tensor, col_idx: Tensor, values: Tensor, rows: int, cols: int,
                        deterministic: bool) -> Tensor:
    return _run("spmm", "_torch_spmm_backward", deterministic, grad, _f32(grad, "grad"), _idx(row_ptr),
                _idx(col_idx), _f32(values, "values"), rows, cols, [cols, grad.shape[1]])[0]


@_sparse_mm_backward.register_fake
def _(grad, row_ptr, col_idx, values, rows, cols, deterministic):
    return grad.new_empty((cols, grad.shape[1]))


def _sparse_mm_setup(ctx, inputs, output):
    row_ptr, col_idx, values, rows, cols, b, deterministic = inputs
    ctx.save_for_backward(row_ptr, col_idx, values)
    ctx.rows, ctx.cols, ctx.deterministic = rows, cols, deterministic


def _sparse_mm_bwd(ctx, grad):
    row_ptr, col_idx, values = ctx.saved_tensors
    db = _sparse_mm_backward(grad.contiguous(), row_ptr, col_idx, values, ctx.rows, ctx.cols, ctx.deterministic)
    return None, None, None, None, None, db, None


_sparse_mm.register_autograd(_sparse_mm_bwd, setup_context=_sparse_mm_setup)


def sparse_mm(a: Tensor, b: Tensor, *, deterministic: bool = True) -> Tensor:
    """``torch.sparse.mm`` of a sparse matrix (CSR, or COO converted) and a dense one: the dense operand's
    gradient ``A^T dC`` by a stable sort of A's entries by column and one warp per column
    (``deterministic``), or cuSPARSE's transposed product. No gradient to A's values."""
    if a.layout == torch.sparse_coo:
        a = a.coalesce().to_sparse_csr()
    if a.layout != torch.sparse_csr or a.dim() != 2:
        raise ValueError(f"ditto.torch.sparse_mm: a 2-D sparse CSR (or COO) matrix, not {a.layout}")
    if a.requires_grad:
        raise ValueError("ditto.torch.sparse_mm: no gradient to the sparse matrix's values; detach it")
    return _sparse_mm(_idx(a.crow_indices()), _idx(a.col_indices()), a.values(), a.shape[0], a.shape[1], b,
                      deterministic)


# ---- conv2d with ditto's own deterministic backward ---------------------------------------------------

@_op("ditto::conv2d")
def _conv2d(x: Tensor, w: Tensor, stride: List[int], padding: List[int], dilation: List[int], groups: int,
            deterministic: bool) -> Tensor:
    return _run("conv2d", "_torch_conv2d", deterministic, x, _f32(x, "input"), _f32(w, "weight"), list(stride),
                list(padding), list(dilation), groups)[0]


def _conv_out(n: int, k: int, s: int, p: int, d: int) -> int:
    return (n + 2 * p - d * (k - 1) - 1) // s + 1


@_conv2d.register_fake
def _(x, w, stride, padding, dilation, groups, deterministic):
    return x.new_empty((x.shape[0], w.shape[0], _conv_out(x.shape[2], w.shape[2], stride[0], padding[0], dilation[0]),
                        _conv_out(x.shape[3], w.shape[3], stride[1], padding[1], dilation[1])))


@_op("ditto::conv2d_backward")
def _conv2d_backward(grad: Tensor, x: Tensor, w: Tensor, stride: List[int], padding: List[int], dilation: List[int],
                     groups: int, want_dx: bool, want_dw: bool, deterministic: bool) -> Tuple[Tensor, Tensor]:
    dx, dw = _run("conv2d", "_torch_conv2d_backward", deterministic, x, _f32(grad, "grad"), _f32(x, "input"),
                  _f32(w, "weight"), list(stride), list(padding), list(dilation), groups, want_dx, want_dw)
    return (dx if dx is not None else _empty(x)), (dw if dw is not None else _empty(w))


@_conv2d_backward.register_fake
def _(grad, x, w, stride, padding, dilation, groups, want_dx, want_dw, deterministic):
    return (x.new_empty(x.shape) if want_dx else x.new_empty((0,)),
            w.new_empty(w.shape) if want_dw else w.new_empty((0,)))


def _conv2d_setup(ctx, inputs, output):
    x, w, stride, padding, dilation, groups, deterministic = inputs
    ctx.save_for_backward(x, w)
    ctx.args = (list(stride), list(padding), list(dilation), groups)
    ctx.deterministic = deterministic


def _conv2d_bwd(ctx, grad):
    x, w = ctx.saved_tensors
    want_dx, want_dw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    dx, dw = _conv2d_backward(grad.contiguous(), x, w, *ctx.args, want_dx, want_dw, ctx.deterministic)
    return (dx if want_dx else None), (dw if want_dw else None), None, None, None, None, None


_conv2d.register_autograd(_conv2d_bwd, setup_context=_conv2d_setup)


def _pair(v) -> List[int]:
    return [int(v), int(v)] if isinstance(v, int) else [int(u) for u in v]


def conv2d(input: Tensor, weight: Tensor, bias: Optional[Tensor] = None, stride=1, padding=0, dilation=1,
           groups: int = 1, *, deterministic: bool = True) -> Tensor:
    """``F.conv2d`` (numeric padding), ``deterministic``: a 3x3 stride-1 convolution of one group
    (padding at most 2) by ditto's Winograd in all three directions, any other by cuDNN's deterministic
    forward and ditto's own GEMM-form backward; otherwise cuDNN's heuristics. The bias gradient is
    PyTorch's sum."""
    if isinstance(padding, str):
        raise ValueError("ditto.torch.conv2d: numeric padding, not '" + padding + "'")
    y = _conv2d(input, weight, _pair(stride), _pair(padding), _pair(dilation), int(groups), deterministic)
    return y if bias is None else y + bias.view(1, -1, 1, 1)


# ---- routing torch.nn.functional here --------------------------------------------------------------------

class _Patch(contextlib.AbstractContextManager):
    """The originals, restored by ``undo()`` or on leaving a ``with`` block."""

    def __init__(self, saved: Dict[Tuple[object, str], object]):
        self._saved = saved

    def undo(self) -> None:
        for (owner, name), fn in self._saved.items():
            setattr(owner, name, fn)
        self._saved = {}

    def __exit__(self, *exc) -> None:
        self.undo()


def patch(*, deterministic: bool = True, conv2d: bool = False) -> _Patch:
    """Routes the matching ``torch.nn.functional`` calls (and ``torchvision.ops.roi_align``) to ditto:
    grid_sample (bilinear, zeros), affine_grid (2-D), interpolate (bilinear; PyTorch's nearest
    backward is already a deterministic gather, and faster than ditto's), cross_entropy
    and nll_loss on N,C,H,W inputs with mean reduction, ctc_loss (blank 0), embedding, embedding_bag
    (sum, mean); with ``conv2d=True`` also conv2d. A call with arguments ditto does not implement goes
    to PyTorch's own function, unchanged. Returns a handle whose ``undo()`` (or a ``with`` block)
    restores PyTorch's functions."""
    saved: Dict[Tuple[object, str], object] = {}

    def route(owner, name, accepts, ours):
        original = getattr(owner, name)
        saved[(owner, name)] = original

        def routed(*args, **kwargs):
            if accepts(*args, **kwargs):
                return ours(*args, **kwargs)
            return original(*args, **kwargs)

        routed.__wrapped__ = original
        routed.__doc__ = original.__doc__
        setattr(owner, name, routed)

    det = deterministic

    def kw(args, kwargs, names):
        out = dict(zip(names, args))
        out.update(kwargs)
        return out

    def gs_ok(*a, **k):
        p = kw(a, k, ["input", "grid", "mode", "padding_mode", "align_corners"])
        return p.get("mode", "bilinear") == "bilinear" and p.get("padding_mode", "zeros") == "zeros" and \
            p["input"].dtype == torch.float32 and p["input"].dim() == 4
    route(F, "grid_sample", gs_ok, lambda *a, **k: grid_sample(*a, deterministic=det, **k))

    def ag_ok(*a, **k):
        p = kw(a, k, ["theta", "size", "align_corners"])
        return len(p["size"]) == 4 and p["theta"].dtype == torch.float32
    route(F, "affine_grid", ag_ok, lambda *a, **k: affine_grid(*a, deterministic=det, **k))

    def up_ok(*a, **k):
        p = kw(a, k, ["input", "size", "scale_factor", "mode", "align_corners", "recompute_scale_factor",
                      "antialias"])
        if p["input"].dim() != 4 or p["input"].dtype != torch.float32 or p.get("antialias"):
            return False
        # nearest stays PyTorch's: its backward is already a gather (deterministic), and faster.
        if p.get("mode", "nearest") != "bilinear" or p.get("recompute_scale_factor"):
            return False
        sf = p.get("scale_factor")
        if sf is not None:
            h, w = p["input"].shape[2:]
            sh, sw = (sf, sf) if isinstance(sf, (int, float)) else tuple(sf)
            return math.floor(h * sh) / h == sh and math.floor(w * sw) / w == sw
        return True

    def up(*a, **k):
        p = kw(a, k, ["input", "size", "scale_factor", "mode", "align_corners"])
        return interpolate(p["input"], p.get("size"), p.get("scale_factor"), p.get("mode", "nearest"),
                           p.get("align_corners"), deterministic=det)
    route(F, "interpolate", up_ok, up)

    def xent_ok(*a, **k):
        p = kw(a, k, ["input", "target", "weight", "size_average", "ignore_index", "reduce", "reduction",
                      "label_smoothing"])
        return (p["input"].dim() == 4 and p["input"].dtype == torch.float32 and p.get("weight") is None and
                p.get("size_average") is None and p.get("reduce") is None and
                p.get("reduction", "mean") == "mean" and not p.get("label_smoothing") and
                p["target"].dtype in (torch.int64, torch.int32))

    def xent(*a, **k):
        p = kw(a, k, ["input", "target", "weight", "size_average", "ignore_index"])
        return cross_entropy(p["input"], p["target"], p.get("ignore_index", -100), deterministic=det)
    route(F, "cross_entropy", xent_ok, xent)

    def nll_ok(*a, **k):
        p = kw(a, k, ["input", "target", "weight", "size_average", "ignore_index", "reduce", "reduction"])
        return (p["input"].dim() == 4 and p["input"].dtype == torch.float32 and p.get("weight") is None and
                p.get("size_average") is None and p.get("reduce") is None and p.get("reduction", "mean") == "mean")

    def nll(*a, **k):
        p = kw(a, k, ["input", "target", "weight", "size_average", "ignore_index"])
        return nll_loss(p["input"], p["target"], p.get("ignore_index", -100))
    route(F, "nll_loss", nll_ok, nll)

    def ctc_ok(*a, **k):
        p = kw(a, k, ["log_probs", "targets", "input_lengths", "target_lengths", "blank", "reduction",
                      "zero_infinity"])
        return p.get("blank", 0) == 0 and p["log_probs"].dtype == torch.float32 and p["log_probs"].dim() == 3
    route(F, "ctc_loss", ctc_ok, lambda *a, **k: ctc_loss(*a, deterministic=det, **k))

    def emb_ok(*a, **k):
        p = kw(a, k, ["input", "weight", "padding_idx", "max_norm", "norm_type", "scale_grad_by_freq", "sparse"])
        return (p["weight"].dtype == torch.float32 and p.get("max_norm") is None and
                not p.get("scale_grad_by_freq") and not p.get("sparse"))

    def emb(*a, **k):
        p = kw(a, k, ["input", "weight", "padding_idx"])
        return embedding(p["input"], p["weight"], p.get("padding_idx"), deterministic=det)
    route(F, "embedding", emb_ok, emb)

    def bag_ok(*a, **k):
        p = kw(a, k, ["input", "weight", "offsets", "max_norm", "norm_type", "scale_grad_by_freq", "mode", "sparse",
                      "per_sample_weights", "include_last_offset", "padding_idx"])
        return (p["weight"].dtype == torch.float32 and p.get("mode", "mean") in ("sum", "mean") and
                p.get("max_norm") is None and not p.get("scale_grad_by_freq") and not p.get("sparse") and
                p.get("per_sample_weights") is None and not p.get("include_last_offset") and
                p.get("padding_idx") is None)

    def bag(*a, **k):
        p = kw(a, k, ["input", "weight", "offsets", "max_norm", "norm_type", "scale_grad_by_freq", "mode"])
        return embedding_bag(p["input"], p["weight"], p.get("offsets"), p.get("mode", "mean"), deterministic=det)
    route(F, "embedding_bag", bag_ok, bag)

    if conv2d:
        def conv_ok(*a, **k):
            p = kw(a, k, ["input", "weight", "bias", "stride", "padding", "dilation", "groups"])
            return p["input"].dtype == torch.float32 and p["input"].dim() == 4 and not isinstance(
                p.get("padding", 0), str)
        route(F, "conv2d", conv_ok, lambda *a, **k: globals()["conv2d"](*a, deterministic=det, **k))

    try:
        import torchvision.ops as tvops
    except ImportError:
        tvops = None
    if tvops is not None:
        def roi_ok(*a, **k):
            p = kw(a, k, ["input", "boxes", "output_size", "spatial_scale", "sampling_ratio", "aligned"])
            b = p["boxes"]
            return isinstance(b, Tensor) and b.dim() == 2 and b.shape[1] == 5 and p["input"].dtype == torch.float32
        route(tvops, "roi_align", roi_ok, lambda *a, **k: roi_align(*a, deterministic=det, **k))
    return _Patch(saved)
