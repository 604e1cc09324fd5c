"""GPU tests of the varlen backward under CUDA graph capture (need an NVIDIA Hopper GPU and torch with CUDA; skipped
elsewhere). Forward and backward of one packing are captured with ``torch.cuda.graph`` after one eager step on a side
stream, then replayed with the captured and with new q, k, v, dout: bit for bit the eager calls' results. The
lengths reach the backward as a device tensor kept in place (the eager step waited for the forward's host copy;
through the autograd op) or as a host array (through the functional API). A packing that never ran eagerly is
captured too (its table made outside the capture); a device cu_seqlens whose host copy no eager call took raises
RuntimeError during capture."""
from __future__ import annotations

import zlib

import numpy as np
import pytest

import cupy_dash

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
from torch_helpers import assert_same_bits, torch_cuda  # noqa: E402, F401  (torch_cuda: an autouse fixture)

LENGTHS = (200, 31, 0, 281, 512)          # one packing of 1024 tokens, an empty sequence among them
H, HKV, D = 4, 2, 128


def _cu(lengths) -> np.ndarray:
    return np.concatenate(([0], np.cumsum(lengths))).astype(np.int32)


def _inputs(total, salt):
    """q, k, v, dout ``(total, heads, D)`` bf16 on the GPU, seeded by ``salt``."""
    gen = torch.Generator(device="cuda").manual_seed(zlib.crc32(salt.encode()))
    shapes = ((total, H, D), (total, HKV, D), (total, HKV, D), (total, H, D))
    return tuple(torch.randn(s, generator=gen, device="cuda", dtype=torch.bfloat16) for s in shapes)


def _functional(q, k, v, dout, cu_dev, cu_host, longest):
    """(out, dq, dk, dv): the functional forward on device lengths, its backward on host ones."""
    out, lse = cupy_dash.attention_forward_varlen(q, k, v, cu_dev, cu_dev, longest, longest, causal=True)
    grads = cupy_dash.attention_backward_varlen(dout, q, k, v, out, lse, cu_host, cu_host, longest, longest,
                                                causal=True)
    return (out, *grads)


def _autograd(q, k, v, dout, cu_dev, cu_host, longest):
    """(out, dq, dk, dv) of the differentiable op, device lengths for both passes (the backward takes the forward's
    host copy)."""
    leaves = [x.detach().requires_grad_(True) for x in (q, k, v)]
    out = cupy_dash.torch.attention_varlen(*leaves, cu_dev, cu_dev, longest, longest, causal=True)
    return (out, *torch.autograd.grad(out, leaves, dout))


@pytest.mark.parametrize("step", [_functional, _autograd], ids=["host lengths", "device buffer"])
def test_a_captured_packing_replays_the_eager_bits(step):
    cu_host = _cu(LENGTHS)
    total, longest = int(cu_host[-1]), max(LENGTHS)
    cu_dev = torch.from_numpy(cu_host).cuda()             # kept in place, as a module buffer
    inputs = _inputs(total, "captured")
    static = [x.clone() for x in inputs]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step(*static, cu_dev, cu_host, longest)            # eager: kernels, the packing's table, the host copy
    torch.cuda.current_stream().wait_stream(side)
    _capture_and_replay(step, static, cu_dev, cu_host, longest, ("captured", "new inputs", "captured"))


def _capture_and_replay(step, static, cu_dev, cu_host, longest, salts):
    """``step`` on the ``static`` inputs captured in a CUDA graph, then replayed with the inputs of each salt copied
    in: bit for bit the eager ``step`` on those inputs; the captured backward's record reports no failure."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step(*static, cu_dev, cu_host, longest)
    for salt in salts:
        new = _inputs(int(cu_host[-1]), salt)
        with torch.no_grad():
            for dst, src in zip(static, new):
                dst.copy_(src)
        graph.replay()
        torch.cuda.synchronize()
        got = tuple(x.clone() for x in captured)
        assert_same_bits(f"varlen graph replay ({salt})", got, step(*new, cu_dev, cu_host, longest))
    cupy_dash.check_errors()


def test_a_packing_never_run_eagerly_is_captured_with_the_eager_bits():
    """Host lengths of a packing no call has used (other lengths of the same total): the captured backward builds,
    uploads and expands its table outside the capture (cupy_dash.cuda.capture); replays give the eager bits."""
    cu_host = _cu(LENGTHS[::-1])
    total, longest = int(cu_host[-1]), max(LENGTHS)
    cu_dev = torch.from_numpy(cu_host).cuda()
    static = [x.clone() for x in _inputs(total, "never eager")]
    torch.cuda.synchronize()
    _capture_and_replay(_functional, static, cu_dev, cu_host, longest, ("never eager", "new inputs"))


def test_device_lengths_without_a_host_copy_raise_during_capture():
    """The same lengths in a device tensor that no eager forward copied (a tensor that the graph copies in): the
    backward cannot read them without a wait, which a capture forbids."""
    cu_host = _cu(LENGTHS)
    total, longest = int(cu_host[-1]), max(LENGTHS)
    inputs = _inputs(total, "refused")
    _functional(*inputs, torch.from_numpy(cu_host).cuda(), cu_host, longest)      # the variant's kernels loaded
    cu_arg = torch.from_numpy(cu_host).cuda()
    cu_dev = torch.from_numpy(cu_host).cuda()
    static = [x.clone() for x in inputs]
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="has none.*run one eager step first"):
        with torch.cuda.graph(graph):
            _functional(*static, cu_dev, cu_arg, longest)
    torch.cuda.synchronize()
    want = _functional(*inputs, cu_dev, cu_host, longest)
    assert_same_bits("eager after the refused capture", _functional(*inputs, cu_dev, cu_host, longest), want)
