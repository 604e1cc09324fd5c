"""Helpers of the torch GPU tests in this folder (not a test module; imports torch, so import it after
``pytest.importorskip("torch")``): the torch cases and inputs, an eager forward + backward step, the bitwise
comparison with eager, a CUDA graph capture of forward + ``autograd.grad`` with its replay, and the fixture
``torch_cuda`` (import it into a test module to apply it to every test there). Shared by test_gpu_torch_ops.py,
test_gpu_fold.py and test_gpu_training_graphs.py."""
from __future__ import annotations

import zlib

import pytest
import torch

import cupy_dash
from framework_case import Case  # noqa: F401  (re-exported: the torch tests take Case from here)


@pytest.fixture(autouse=True)
def torch_cuda():
    """Skips without a CUDA build of torch; after the test, raises any failure its backwards recorded."""
    if not torch.cuda.is_available():
        pytest.skip("torch was built without CUDA or sees no GPU")
    yield
    cupy_dash.check_errors()


def make_inputs(case: Case, salt: str = ""):
    """q, k, v, dout on the GPU, seeded by the case id (and ``salt``)."""
    gen = torch.Generator(device="cuda").manual_seed(zlib.crc32((case.id + salt).encode()))
    dtype = getattr(torch, case.dtype)
    b, sq, sk, h, hkv, d = case.batch, case.seqlen_q, case.seqlen_k, case.heads, case.heads_kv, case.hdim
    shapes = ((b, sq, h, d), (b, sk, hkv, d), (b, sk, hkv, d), (b, sq, h, d))
    return tuple(torch.randn(s, generator=gen, device="cuda", dtype=dtype) for s in shapes)


def attention_fn(case: Case):
    from cupy_dash.torch import attention

    def fn(q, k, v):
        return attention(q, k, v, causal=case.causal)
    return fn


def run_step(fn, q, k, v, dout):
    """(out, dq, dk, dv) of ``fn`` on fresh leaves, cloned so that later calls cannot overwrite them."""
    leaves = [x.detach().clone().requires_grad_(True) for x in (q, k, v)]
    out = fn(*leaves)
    out.backward(dout)
    return tuple(x.detach().clone() for x in (out, *(t.grad for t in leaves)))


def eager(case, q, k, v, dout):
    return run_step(attention_fn(case), q, k, v, dout)


def assert_same_bits(what, got, want):
    names = ("out", "dq", "dk", "dv")
    for name, a, b in zip(names, got, want):
        assert a.shape == b.shape and a.dtype == b.dtype, f"{what} {name}: {a.shape} {a.dtype} vs {b.shape} {b.dtype}"
        ints = {2: torch.int16, 4: torch.int32}[a.element_size()]
        same = a.contiguous().view(ints) == b.contiguous().view(ints)
        if not bool(same.all()):
            bad = int((~same).sum())
            raise AssertionError(f"{what} {name}: {bad} of {a.numel()} elements differ from eager in their bits")
    for name, b in zip(names, want):    # not trivially equal: finite and not all zero
        assert bool(torch.isfinite(b).all()) and bool((b != 0).any()), f"eager {name} is degenerate"


# --------------------------------------------------------------------------------------------------------------
# manual CUDA graph capture
# --------------------------------------------------------------------------------------------------------------
def capture_step(case, q, k, v, dout, warm_up=True):
    """Static leaves + one eager warm-up on a side stream (as torch's docs advise; none with ``warm_up=False``),
    then forward and ``autograd.grad`` captured in a CUDA graph. Returns (graph, static inputs, static outputs)."""
    fn = attention_fn(case)
    leaves = [x.detach().clone().requires_grad_(True) for x in (q, k, v)]
    static_dout = dout.clone()
    if warm_up:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            out = fn(*leaves)
            torch.autograd.grad(out, leaves, static_dout)
        torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn(*leaves)
        grads = torch.autograd.grad(out, leaves, static_dout)
    return graph, (*leaves, static_dout), (out, *grads)


def replay(graph, static_in, static_out, inputs):
    with torch.no_grad():
        for dst, src in zip(static_in, inputs):
            dst.copy_(src)
    graph.replay()
    torch.cuda.synchronize()
    return tuple(x.clone() for x in static_out)
