"""The Python package on a CUDA device, beside PyTorch: tensors cross without copies on the GPU
(PyTorch's allocation is ditto's tensor), their bits hash alike on either device, and
deterministic GPU runs from Python repeat bit for bit. ctest label gpu (gpu_python)."""
import numpy as np
import pytest
import torch

import ditto


def test_torch_cuda_tensors_cross_without_copies():
    ctx = ditto.Context("cuda")
    x = torch.randn(64, 33, device="cuda")
    t = ctx.from_dlpack(x)
    assert t.device == "cuda:0" and t.dtype == "f32" and t.shape == [64, 33]
    back = torch.from_dlpack(t)
    assert back.data_ptr() == x.data_ptr()  # one allocation, PyTorch's
    x.mul_(2)  # queued on PyTorch's stream; seen through ditto's tensor
    assert torch.equal(torch.from_dlpack(t), x)
    # The same bits hash alike on the GPU and on the CPU.
    cpu = ditto.Context("cpu").from_dlpack(x.cpu().numpy())
    assert t.fingerprint() == cpu.fingerprint()


def test_reduced_precision_tensors_keep_their_type():
    ctx = ditto.Context("cuda")
    for dtype, name in ((torch.bfloat16, "bf16"), (torch.float16, "f16"), (torch.int32, "i32")):
        t = ctx.from_dlpack(torch.ones(8, device="cuda", dtype=dtype))
        assert t.dtype == name
        assert torch.from_dlpack(t).dtype == dtype


def test_a_cpu_array_is_refused_by_a_gpu_context():
    with pytest.raises(ditto.Error, match="make the context on the array's device"):
        ditto.Context("cuda").from_dlpack(np.ones(4, np.float32))


def test_deterministic_gpu_runs_from_python_repeat_bit_for_bit():
    flags = dict(device="cuda", synthetic_train=512, synthetic_test=256, synthetic_size=16, batch_size=64, epochs=1,
                 kernels="deterministic", seed_init=1, seed_order=2, seed_augment=3)
    a, b = ditto.train(**flags), ditto.train(**flags)
    assert a.weights_fingerprint == b.weights_fingerprint
    assert np.array_equal(a.predictions, b.predictions)
    assert all(op["device"] == "cuda:0" for op in a.ops if op["device"])
