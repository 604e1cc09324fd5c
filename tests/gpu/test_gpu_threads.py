"""GPU test: cupy_dash called from a thread of its own, after the main thread has loaded the kernels and stored the
plans, gives the main thread's bits: forward and backward with CuPy arrays and with JAX arrays. A new thread has no
CUDA context current, and with everything cached its first CUDA call could be a driver-API launch
(CUDA_ERROR_INVALID_CONTEXT); the executor then binds the device's primary context and launches again
(cupy_dash.gpu.bind_context).
Skipped without a Hopper GPU; the JAX case without JAX."""
from __future__ import annotations

import threading

import numpy as np
import pytest

import cupy
import cupy_dash

pytestmark = pytest.mark.gpu


def _inputs(seed, S=300, H=4, Hkv=2, D=128):
    rng = np.random.default_rng(seed)
    mk = lambda n: cupy.asarray(rng.standard_normal((1, S, n, D), np.float32)).astype(cupy.float16)  # noqa: E731
    return mk(H), mk(Hkv), mk(Hkv), mk(H)


def _in_a_new_thread(fn):
    """fn() run on a fresh thread: (result, None) or (None, the exception it raised)."""
    box = {}

    def run():
        try:
            box["result"] = fn()
        except BaseException as exc:                       # reported by the caller's assert
            box["error"] = exc
    worker = threading.Thread(target=run)
    worker.start()
    worker.join()
    return box.get("result"), box.get("error")


def _bits(x):
    return np.asarray(cupy.asnumpy(cupy.asarray(x))).view(np.uint8)


def _step(q, k, v, do):
    out, lse = cupy_dash.attention_forward(q, k, v, causal=True)
    return (out, lse, *cupy_dash.attention_backward(do, q, k, v, out, lse, causal=True))


def test_cupy_calls_from_a_new_thread_give_the_main_threads_bits():
    q, k, v, do = _inputs(3)
    want = _step(q, k, v, do)
    cupy.cuda.Device().synchronize()
    got, error = _in_a_new_thread(lambda: [cupy.asnumpy(x) for x in _step(q, k, v, do)])
    assert error is None, repr(error)
    for name, a, b in zip(("out", "lse", "dq", "dk", "dv"), got, want):
        assert np.array_equal(np.asarray(a).view(np.uint8), _bits(b)), name


def test_jax_calls_from_a_new_thread_give_the_main_threads_bits():
    jax = pytest.importorskip("jax")
    arrays = tuple(jax.dlpack.from_dlpack(x) for x in _inputs(4))
    want = [np.asarray(x) for x in _step(*arrays)]
    got, error = _in_a_new_thread(lambda: [np.asarray(x) for x in _step(*arrays)])
    assert error is None, repr(error)
    for name, a, b in zip(("out", "lse", "dq", "dk", "dv"), got, want):
        assert np.array_equal(a.view(np.uint8), b.view(np.uint8)), name
