"""The CUPY_DASH_BWD_PDL experiment on the GPU (programmatic dependent launch of the backward's preprocess -> main
-> postprocess, kernels_src/ptx/griddepcontrol.cuh): through the torch fast path and the CuPy full path, every
deterministic schedule gives the bits of the ordinary launches, the atomic path passes FA3's rule, and a CUDA
graph captured with the programmatic edges replays the same bits. Sizes above the fold limit (a folded backward
is one launch). Skipped without a Hopper GPU."""
from __future__ import annotations

import numpy as np
import pytest

import cupy_dash
from gpu_helpers import BF16, POLICIES, _assert_same_bits, _dev, _randn, assert_scaled_grads, scaled_case_data

pytestmark = pytest.mark.gpu

CASE = ("bf16", 128, True, 3000, 3000, 8, 4, (-1, -1), 0.0)      # 47 x 24 tiles x 8 heads: above the fold limit


def _grads(data, **kw):
    q, k, v, do = (_dev(data[n]) for n in ("q", "k", "v", "do"))
    out, lse = cupy_dash.attention_forward(q, k, v, **data["kw"])
    grads = cupy_dash.attention_backward(do, q, k, v, out, lse, **data["kw"], **kw)
    cupy_dash.check_errors()
    return grads


@pytest.mark.parametrize("schedule", POLICIES)
def test_pdl_launches_give_the_same_bits(schedule, monkeypatch):
    data = scaled_case_data(CASE, 1.0)
    monkeypatch.delenv("CUPY_DASH_BWD_PDL", raising=False)
    plain = _grads(data, schedule=schedule)
    monkeypatch.setenv("CUPY_DASH_BWD_PDL", "1")
    for _ in range(3):
        for name, a, b in zip(("dq", "dk", "dv"), _grads(data, schedule=schedule), plain):
            _assert_same_bits(name, a, b)


def test_pdl_atomic_backward_matches_reference(monkeypatch):
    data = scaled_case_data(CASE, 1.0)
    monkeypatch.setenv("CUPY_DASH_BWD_PDL", "1")
    assert_scaled_grads(data, _grads(data, deterministic=False))


def test_pdl_torch_fast_path_and_graph_replay(monkeypatch):
    torch = pytest.importorskip("torch")
    import cupy_dash.torch  # noqa: F401  (registers the ops)
    monkeypatch.setenv("CUPY_DASH_BWD_PDL", "1")
    rng = np.random.default_rng(7)
    q, k, v, do = (torch.from_numpy(_randn(rng, (2, 2500, 4, 128), BF16).view(np.int16)).view(torch.bfloat16).cuda()
                   for _ in range(4))
    out, lse = torch.ops.cupy_dash.attention_forward(q, k, v, True, None, "auto", True, -1, -1)

    def backward():
        return torch.ops.cupy_dash.attention_backward(do, q, k, v, out, lse, True, None, "auto", True, -1, -1)
    first = [g.clone() for g in backward()]
    for _ in range(3):                                       # the fast path's re-launches
        for name, a, b in zip(("dq", "dk", "dv"), backward(), first):
            assert torch.equal(a.view(torch.int16), b.view(torch.int16)), name
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = backward()
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        for name, a, b in zip(("dq", "dk", "dv"), captured, first):
            assert torch.equal(a.view(torch.int16), b.view(torch.int16)), name
    cupy_dash.check_errors()
    assert all(bool(torch.isfinite(g).all()) for g in first)
