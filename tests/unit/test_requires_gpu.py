"""Without a usable GPU, the entry points that touch a device without a CUDA tensor in hand
(:func:`cupy_dash.prepare_varlen_backward`, loading a kernel) raise one clear RuntimeError from
:func:`cupy_dash.gpu.require` (what is missing, who needed it) instead of CuPy's raw cudaErrorInsufficientDriver.
CPU only: the device probe is replaced where a test needs a particular machine."""
from __future__ import annotations

import numpy as np
import pytest

import cupy_dash
from cupy_dash import gpu
from cupy_dash.cuda import jit, kernels

CU = np.array([0, 128, 300], np.int32)


def prepare(**kw):
    args = dict(num_heads=4, num_heads_kv=2, head_dim=64, causal=True)
    args.update(kw)
    return cupy_dash.prepare_varlen_backward(CU, CU, 172, 172, **args)


@pytest.fixture
def machine(monkeypatch):
    """Make gpu's probe answer for a made-up machine: ``machine(state, description, device count)``."""
    monkeypatch.setattr(gpu, "_hopper", set())

    def set_machine(st, desc, count):
        monkeypatch.setattr(gpu, "_probe", lambda device: (st, desc, count))
    return set_machine


def test_prepare_varlen_backward_on_this_machine():
    if gpu.state(0)[0] == "hopper":
        pytest.skip("a Hopper GPU is present")
    with pytest.raises(RuntimeError, match=r"^cupy_dash.prepare_varlen_backward .* needs an NVIDIA Hopper GPU") as e:
        prepare()
    assert "cudaError" not in type(e.value).__name__
    if gpu.state(0)[0] == "none":
        assert "no CUDA GPU is available here" in str(e.value)


def test_no_driver_message(machine):
    machine("none", "no NVIDIA driver is installed (cudaErrorInsufficientDriver: ...)", 0)
    with pytest.raises(RuntimeError, match="needs an NVIDIA Hopper GPU .*; no CUDA GPU is available here: no NVIDIA "
                                           "driver is installed"):
        prepare()


def test_other_gpu_and_missing_device(machine):
    machine("other", "NVIDIA A100-SXM4-80GB (sm_80, 108 SMs)", 1)
    with pytest.raises(RuntimeError, match=r"CUDA device 0 is NVIDIA A100-SXM4-80GB \(sm_80, 108 SMs\), not a Hopper"):
        prepare()
    machine("none", "there is no CUDA device 3 (1 present)", 1)
    with pytest.raises(RuntimeError, match=r"there is no CUDA device 3 \(1 present\)"):
        prepare(device=3)


def test_argument_errors_come_first(machine):
    """Bad arguments are reported as such on any machine, before the GPU check."""
    machine("none", "no NVIDIA driver is installed", 0)
    with pytest.raises(ValueError, match="head_dim"):
        prepare(head_dim=160)
    with pytest.raises(ValueError, match="num_heads % num_heads_kv"):
        prepare(num_heads=3)
    for bad in (-1, "cuda:0", True, 0.0):
        with pytest.raises(TypeError, match="^device: expected a CUDA device ordinal"):
            prepare(device=bad)


def test_a_hopper_gpu_is_asked_once(machine, monkeypatch):
    calls = []
    monkeypatch.setattr(gpu, "_probe", lambda device: calls.append(device) or ("hopper", "H200", 1))
    gpu.require("x", 0)
    gpu.require("x", 0)
    assert calls == [0]


def test_kernel_load_names_the_kernel(machine, monkeypatch):
    """jit.load (every launch path's first load of a kernel) refuses a GPU that is not a Hopper one before it
    compiles or loads anything."""
    import cupy
    machine("other", "NVIDIA A100-SXM4-80GB (sm_80, 108 SMs)", 1)
    monkeypatch.setattr(cupy.cuda.runtime, "getDevice", lambda: 0)
    monkeypatch.setattr(jit, "compile_spec", lambda *a, **kw: pytest.fail("compiled"))
    spec = kernels.fwd_spec("bfloat16", 64, False)
    with pytest.raises(RuntimeError, match=r"loading the kernel fwd\[bf16,d64,full\]\) needs an NVIDIA Hopper GPU"):
        jit.load(spec)


def test_state_never_raises():
    st, desc = gpu.state(0)
    assert st in ("none", "other", "hopper") and desc
    assert gpu.state(10 ** 6)[0] == "none"
