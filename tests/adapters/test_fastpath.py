"""The host fast path's signatures (cupy_dash.core.fastpath): CPU tests with CPU torch tensors (skipped without torch).
What must hold: a call whose arguments the full path would check differently never shares a signature with a
validated one (bool vs int flags, tuple vs list windows, alignment, dtype, strides, device, spin timeout)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from cupy_dash.core import fastpath  # noqa: E402


def _qkv(dtype=torch.bfloat16):
    return [torch.zeros(2, 64, 4, 64, dtype=dtype) for _ in range(3)]


def test_forward_key_types_rule_out_the_fast_path():
    q, k, v = _qkv()
    assert fastpath.fwd_key(q, k, v, True, None, (-1, -1)) is not None
    assert fastpath.fwd_key(q, k, v, 1, None, (-1, -1)) is None            # an int causal must meet the check
    assert fastpath.fwd_key(q, k, v, True, None, [-1, -1]) is None         # a list window: full path
    assert fastpath.fwd_key(q, k, v, True, 1, (-1, -1)) is None            # an int scale: full path
    assert fastpath.fwd_key(q, k, v, True, 0.125, (-1, -1)) is not None
    assert fastpath.fwd_key(q.float().numpy(), k, v, True, None, (-1, -1)) is None   # not torch


def test_forward_key_tells_layouts_and_alignment_apart():
    q, k, v = _qkv()
    base = fastpath.fwd_key(q, k, v, False, None, (-1, -1))
    assert base == fastpath.fwd_key(*_qkv(), False, None, (-1, -1))          # same metadata, other tensors
    assert base != fastpath.fwd_key(q.to(torch.float16), k, v, False, None, (-1, -1))
    wide = torch.zeros(2, 64, 4, 128, dtype=torch.bfloat16)[..., :64]          # same shape, other strides
    assert base != fastpath.fwd_key(wide, k, v, False, None, (-1, -1))
    buf = torch.zeros(2 * 64 * 4 * 64 + 1, dtype=torch.bfloat16)
    shifted = buf[1:].view(2, 64, 4, 64)                                      # 2-byte offset: misaligned
    key = fastpath.fwd_key(shifted, k, v, False, None, (-1, -1))
    assert key[:-1] == base[:-1] and key[-1] is False and base[-1] is True
    assert base != fastpath.fwd_key(q, k, v, True, None, (-1, -1))
    assert base != fastpath.fwd_key(q, k, v, False, None, (8, -1))


def test_backward_key_includes_flags_schedule_and_spin_timeout(monkeypatch):
    q, k, v = _qkv()
    do, out = torch.zeros_like(q), torch.zeros_like(q)
    lse = torch.zeros(2, 4, 64)
    args = (do, q, k, v, out, lse)
    monkeypatch.delenv("CUPY_DASH_SPIN_TIMEOUT_MS", raising=False)
    base = fastpath.bwd_key(*args, True, None, "auto", True, (-1, -1))
    assert base is not None
    assert base != fastpath.bwd_key(*args, True, None, "shift", True, (-1, -1))
    assert base != fastpath.bwd_key(*args, True, None, "auto", False, (-1, -1))
    assert fastpath.bwd_key(*args, True, None, "auto", 1, (-1, -1)) is None
    assert fastpath.bwd_key(*args, True, None, None, True, (-1, -1)) is None
    monkeypatch.setenv("CUPY_DASH_SPIN_TIMEOUT_MS", "3000")
    assert base != fastpath.bwd_key(*args, True, None, "auto", True, (-1, -1))


def test_no_plan_means_the_full_path(monkeypatch):
    fastpath.clear()
    q, k, v = _qkv()
    assert fastpath.forward(fastpath.fwd_key(q, k, v, False, None, (-1, -1)), q, k, v) is None
    monkeypatch.setenv("CUPY_DASH_FASTPATH", "0")
    assert not fastpath.enabled()
