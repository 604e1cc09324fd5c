"""The README's Python snippets run as written: the schedule one on any machine, the CuPy / torch / JAX ones on a
Hopper GPU (each in a namespace holding the tensors its prose names, small bf16 inputs)."""
from __future__ import annotations

import re
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
BF16 = np.dtype(ml_dtypes.bfloat16)


def _snippet(needle: str) -> str:
    blocks = re.findall(r"```python\n(.*?)\n```", (ROOT / "README.md").read_text(), re.S)
    found = [b for b in blocks if needle in b]
    assert len(found) == 1, f"expected one README snippet containing {needle!r}, found {len(found)}"
    return found[0]


def _host_inputs(q_heads=4, kv_heads=2):
    rng = np.random.default_rng(0)
    q, do = (rng.standard_normal((2, 256, q_heads, 64), dtype=np.float32).astype(BF16) for _ in range(2))
    k, v = (rng.standard_normal((2, 256, kv_heads, 64), dtype=np.float32).astype(BF16) for _ in range(2))
    return q, k, v, do


def test_schedule_snippet():
    ns: dict = {}
    exec(_snippet("schedule.build("), ns)
    assert ns["plan"].num_visits > 0


@pytest.mark.gpu
def test_cupy_snippet():
    import cupy
    q, k, v, do = (cupy.asarray(x.view(np.uint16)).view(BF16) for x in _host_inputs())
    ns = dict(q=q, k=k, v=v, do=do)
    exec(_snippet("cupy_dash.attention_backward(do, q, k, v"), ns)
    assert ns["dq"].shape == q.shape and ns["dk"].shape == k.shape


@pytest.mark.gpu
def test_torch_snippet():
    torch = pytest.importorskip("torch")
    import cupy_dash
    q, k, v, dout = (torch.from_numpy(x.view(np.int16)).view(torch.bfloat16).cuda() for x in _host_inputs())
    ns = dict(q=q, k=k, v=v, dout=dout, torch=torch, cupy_dash=cupy_dash)
    exec(_snippet("torch.ops.cupy_dash.attention_forward"), ns)
    assert ns["out"].shape == q.shape and ns["dv"].shape == v.shape


@pytest.mark.gpu
def test_jax_snippet():
    jax = pytest.importorskip("jax")
    import cupy_dash
    q, k, v, dout = (jax.device_put(x) for x in _host_inputs())
    ns = dict(q=q, k=k, v=v, dout=dout, cupy_dash=cupy_dash)
    exec(_snippet("cupy_dash.jax.attention_forward"), ns)
    assert ns["out"].shape == q.shape and ns["dk"].shape == k.shape
