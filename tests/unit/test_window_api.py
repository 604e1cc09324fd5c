"""The ``window`` argument of the backward entry points, CPU only: checked before any GPU work (the sentinels of
validation_helpers.py), plans of another window rejected, the canonical form the kernels and caches get, and the
error message of a failed windowed backward. The GPU behaviour is in tests/gpu/test_gpu_window.py."""
from __future__ import annotations

import numpy as np
import pytest

import cupy_dash
from cupy_dash import schedule
from cupy_dash.core import problem
from cupy_dash.cuda import errors, kernels
from validation_helpers import GpuTouched, _build_schedule, bwd, fake, gpu_work_log, make, raises  # noqa: F401

BAD_WINDOWS = [((1, 2, 3), False, TypeError, "window: expected a pair"),
               ("ab", False, TypeError, "window: left must be an int"),
               ((0.5, 2), False, TypeError, "window: left must be an int"),
               ((-3, 0), False, ValueError, "window: left must be -1"),
               ((0, 1 << 31), False, ValueError, "window: right must be -1"),
               ((8, 1), True, ValueError, "window: right=1 contradicts causal=True")]


@pytest.mark.parametrize("window,causal,exc,match", BAD_WINDOWS)
def test_bad_window_backward(window, causal, exc, match, gpu_work_log):
    t = fake(make())
    with pytest.raises(exc, match=match):
        bwd(t, causal=causal, window=window)
    with pytest.raises(exc, match=match):
        cupy_dash.attention(t["q"], t["k"], t["v"], causal=causal, window=window)
    assert gpu_work_log == []


def test_window_is_checked_before_the_tensors(gpu_work_log):
    """A bad window raises even with CPU arrays, whose device check would otherwise come first."""
    raises(ValueError, lambda: bwd(make(), window=(-5, 0)), "window:")
    raises(ValueError, lambda: cupy_dash.attention_forward(make()["q"], make()["k"], make()["v"], window=(-5, 0)),
           "window:")
    assert gpu_work_log == []


@pytest.mark.parametrize("window,causal", [((16, 16), False), ((0, 0), True), ((100, -1), False), ((-1, 3), False)])
def test_windowed_backward_passes_validation(window, causal, gpu_work_log):
    t = fake(make())
    with pytest.raises(GpuTouched):
        bwd(t, causal=causal, window=window)
    assert gpu_work_log


def test_backward_with_plan_needs_the_calls_window(gpu_work_log):
    from cupy_dash.core.api import _backward_with_plan
    t = fake(make(Sq=96, Sk=160))
    tile = kernels.bwd_tile(64, False)         # the kernel's tiles: a GPU machine whose variant cache is warm checks them
    kw = dict(seqlen_q=96, seqlen_k=160, block_m=tile.block_m, block_n=tile.block_n, num_heads=8, causal=False,
              num_sms=4)
    plan = _build_schedule("shift", window=(20, 10), **kw)
    args = (t["do"], t["q"], t["k"], t["v"], t["out"], t["lse"])
    raises(ValueError, lambda: _backward_with_plan(*args, plan=plan, window=(20, 11)),
           "plan:", "window=(20, 10)", "(20, 11)")
    raises(ValueError, lambda: _backward_with_plan(*args, plan=plan), "plan:", "window=(20, 10)", "(-1, -1)")
    assert gpu_work_log == []
    # the same mask in another spelling (left >= Sk - 1 bounds nothing) is accepted: it reaches GPU work
    full = _build_schedule("shift", **kw)
    with pytest.raises(GpuTouched):
        _backward_with_plan(*args, plan=full, window=(159, 95))
    with pytest.raises(GpuTouched):
        _backward_with_plan(*args, plan=plan, window=(20, 10))


@pytest.mark.parametrize("sq,sk,bn", [(100, 1000, 128), (1000, 100, 64), (513, 513, 128), (1, 4096, 128)])
def test_unseen_keys_are_the_empty_kv_tiles(sq, sk, bn):
    """api zeroes dk, dv exactly when schedule.unseen_keys covers a whole KV tile, i.e. when a table has a KV
    tile without visits."""
    from cupy_dash import reference
    from cupy_dash.schedule import _schedule
    for causal in (False, True):
        for window in ((0, 0), (5, -1), (63, 7), (300, 300), (-1, 0), (sk - sq - bn, 2), (sk - sq - bn + 1, 2)):
            if window[0] < -1 or (causal and window[1] > 0):
                continue
            canon = schedule.canonical_window(window, sq, sk, causal)
            unseen = schedule.unseen_keys(sq, sk, causal, canon)
            seen = reference.visibility_mask(sq, sk, causal, window).any(axis=0)
            assert np.array_equal(~seen, np.arange(sk) < unseen), (sq, sk, causal, window)
            lo, hi = _schedule.column_ranges(sq, sk, 64, bn, causal, *canon)
            assert (unseen >= bn) == bool((lo == hi).any()), (sq, sk, causal, window)


def test_failure_message_names_the_window():
    info = ("shift", 2, 4, 300, 1000, 128, False, (100, 50))
    assert "window=(100, 50)" in errors._format_failure(info, 1, 7, 3, 2)
    plain = errors._format_failure(("shift", 2, 4, 300, 1000, 128, True, (-1, 0)), 1, 7, 3, 2)
    assert "causal=True)" in plain and "window" not in plain.split("causal=True")[1].split(":")[0]


def test_check_window_then_canonical_is_what_the_kernels_get():
    """attention_forward / attention_backward pass schedule.canonical_window(_check_window(window)) to the
    kernels: the same mask, with vacuous sides as -1 (so huge windows never overflow the kernels' int math)."""
    for window, causal, sq, sk, want in [((2**31 - 1, 2**31 - 1), False, 300, 1000, (-1, -1)),
                                         ((2**31 - 1, -1), True, 300, 1000, (-1, 0)),
                                         ((998, 298), False, 300, 1000, (998, 298)),
                                         ((5, 0), True, 1000, 300, (5, 0))]:
        assert schedule.canonical_window(problem.check_window(window, causal), sq, sk, causal) == want
