"""Argument validation of the public API and the layout rules of ``interop``: CPU only, no GPU needed.

Inputs are numpy / ``ml_dtypes.bfloat16`` arrays, plus a tiny fake "CUDA" array (``__dlpack_device__`` says
CUDA) to reach the device checks. An autouse fixture (``gpu_work_log``, validation_helpers.py) replaces every
entry into GPU work (allocation, stream, DLPack import, occupancy query, schedule build, launch) with a sentinel,
so every test here also proves that an invalid call raises before anything is allocated or launched.
"""
from __future__ import annotations

import collections
import os
import subprocess
import sys

import numpy as np
import pytest

import cupy_dash
from cupy_dash import schedule
from cupy_dash.core import interop
from cupy_dash.cuda import errors
from validation_helpers import (BF16, F16, F32, FakeCuda, GpuTouched, _build_schedule, bwd, fake, fwd,  # noqa: F401
                                gpu_work_log, make, raises)  # gpu_work_log: the autouse fixture


# --------------------------------------------------------------------------------------------------------------
# dtype
# --------------------------------------------------------------------------------------------------------------
def test_q_dtype_float32():
    t = make(dtype=F32)
    raises(ValueError, lambda: fwd(t), "q:", "bfloat16 or float16", "float32")


@pytest.mark.parametrize("name", ["k", "v"])
def test_kv_dtype_mismatch_forward(name):
    t = make()
    t[name] = t[name].astype(F16)
    raises(ValueError, lambda: fwd(t), f"{name}:", "float16", "bfloat16")


@pytest.mark.parametrize("name", ["do", "out", "k"])
def test_dtype_mismatch_backward(name):
    t = make(dtype=F16)
    t[name] = t[name].astype(BF16)
    raises(ValueError, lambda: bwd(t), f"{name}:", "bfloat16", "float16")


def test_lse_dtype():
    t = make()
    t["lse"] = t["lse"].astype(BF16)
    raises(ValueError, lambda: bwd(t), "lse:", "float32")


# --------------------------------------------------------------------------------------------------------------
# rank and shapes
# --------------------------------------------------------------------------------------------------------------
def test_q_rank():
    t = make()
    t["q"] = t["q"][0]
    raises(ValueError, lambda: fwd(t), "q:", "4-D")


def test_v_rank():
    t = make()
    t["v"] = t["v"][None]
    raises(ValueError, lambda: fwd(t), "v:", "4-D")


def test_lse_rank():
    t = make()
    t["lse"] = t["lse"][0]
    raises(ValueError, lambda: bwd(t), "lse:", "3-D")


def test_k_batch_mismatch():
    t = make()
    t["k"] = np.zeros((3,) + t["k"].shape[1:], BF16)
    raises(ValueError, lambda: fwd(t), "k:", "B=2")


def test_k_head_dim_mismatch():
    t = make()
    t["k"] = np.zeros(t["k"].shape[:3] + (128,), BF16)
    t["v"] = np.zeros(t["v"].shape[:3] + (128,), BF16)
    raises(ValueError, lambda: fwd(t), "k:", "D=64")


def test_v_shape_mismatch():
    t = make()
    t["v"] = np.zeros((2, 161, 4, 64), BF16)
    raises(ValueError, lambda: fwd(t), "v:", "shape of k")


@pytest.mark.parametrize("name", ["do", "out"])
def test_do_out_shape_mismatch(name):
    t = make()
    t[name] = np.zeros((2, 95, 4, 64), BF16)
    raises(ValueError, lambda: bwd(t), f"{name}:", "shape of q")


def test_lse_shape_mismatch():
    t = make()
    t["lse"] = np.zeros((2, 96, 4), F32)          # (B, Sq, H) instead of (B, H, Sq)
    raises(ValueError, lambda: bwd(t), "lse:", "(2, 4, 96)")


# --------------------------------------------------------------------------------------------------------------
# head dim, heads, sizes
# --------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("D", [80, 160, 32, 512])
def test_head_dim_not_supported(D):
    t = make(D=D)
    raises(NotImplementedError, lambda: fwd(t), "q:", "head dim", "64", "96", "128", "192", "256", str(D))
    raises(NotImplementedError, lambda: bwd(t), "q:", "head dim", "64", "96", "128")


@pytest.mark.parametrize("D", [192])
def test_head_dims_of_the_forward_only(D, monkeypatch):
    """A head dim the forward takes and the backward does not (as 192 was before its backward passed on the H200:
    kernels.BWD_PENDING_HEAD_DIMS) passes the forward's checks (the CPU tensors then fail the device check) and the
    backward refuses it, naming its head dims and the forward's."""
    from cupy_dash.cuda import kernels
    monkeypatch.setattr(kernels, "BWD_HEAD_DIMS", tuple(d for d in kernels.BWD_HEAD_DIMS if d != D))
    t = make(D=D)
    raises(ValueError, lambda: fwd(t), "q:", "CUDA device")
    raises(NotImplementedError, lambda: bwd(t), "q:", f"D={D}", "by the backward", "64, 96, 128, 256",
           "the forward also takes 192")


def test_heads_not_divisible():
    t = make(H=6, Hkv=4)
    raises(ValueError, lambda: fwd(t), "k:", "Hkv=4", "H=6")


def test_seqlen_q_zero():
    t = make(Sq=0)
    raises(ValueError, lambda: fwd(t), "q:", "Sq")
    raises(ValueError, lambda: bwd(t), "q:", "Sq")


def test_seqlen_k_zero():
    t = make(Sk=0)
    raises(ValueError, lambda: fwd(t), "k:", "Sk")


def test_batch_zero():
    t = make(B=0)
    raises(ValueError, lambda: fwd(t), "q:", "batch")


# --------------------------------------------------------------------------------------------------------------
# schedule, softmax_scale, GQA backward
# --------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", ["Shift", "spt", "", None, 3])
def test_bad_schedule_name(bad):
    t = make()
    msg = raises(ValueError, lambda: bwd(t, schedule=bad), "schedule:")
    for policy in schedule.POLICIES:
        assert repr(policy) in msg
    raises(ValueError, lambda: cupy_dash.attention(t["q"], t["k"], t["v"], schedule=bad), "schedule:")


@pytest.mark.parametrize("scale", [0.0, -0.125, float("nan"), float("inf"), "abc", [1.0]])
def test_bad_softmax_scale(scale):
    t = make()
    raises(ValueError, lambda: fwd(t, softmax_scale=scale), "softmax_scale")
    raises(ValueError, lambda: bwd(t, softmax_scale=scale), "softmax_scale")


@pytest.mark.parametrize("cap,exc", [(-1.0, ValueError), (float("nan"), ValueError), (float("inf"), ValueError),
                                     (True, TypeError), ("50", TypeError), ([1.0], TypeError)])
def test_bad_softcap(cap, exc):
    """Checked with the other arguments, before anything touches a GPU (numpy arrays reach it)."""
    t = make()
    raises(exc, lambda: fwd(t, softcap=cap), "softcap")
    raises(exc, lambda: bwd(t, softcap=cap), "softcap")


def test_bad_softcap_varlen():
    q = np.zeros((40, 2, 64), BF16)
    lse = np.zeros((2, 40), F32)
    cu = np.array([0, 40], np.int32)
    raises(ValueError, lambda: cupy_dash.attention_forward_varlen(q, q, q, cu, cu, 40, 40, softcap=-2.0), "softcap")
    raises(TypeError, lambda: cupy_dash.attention_backward_varlen(q, q, q, q, q, lse, cu, cu, 40, 40, softcap="x"),
           "softcap")
    raises(TypeError, lambda: cupy_dash.prepare_varlen_backward(cu, cu, 40, 40, num_heads=2, num_heads_kv=2,
                                                                head_dim=64, softcap=None), "softcap")


@pytest.mark.parametrize("stream,exc", [("torch-like", TypeError), ("device 1", ValueError)])
def test_prepare_varlen_backward_checks_its_stream(stream, exc):
    """The upload's stream is a CuPy stream of the device the tables go to: checked before anything touches a GPU."""
    import types
    stream = types.SimpleNamespace(cuda_stream=7) if stream == "torch-like" else types.SimpleNamespace(ptr=7,
                                                                                                     device_id=1)
    cu = np.array([0, 40], np.int32)
    raises(exc, lambda: cupy_dash.prepare_varlen_backward(cu, cu, 40, 40, num_heads=2, num_heads_kv=2, head_dim=64,
                                                          device=0, stream=stream), "stream")


def test_a_long_soft_capped_backward_takes_the_capped_compact_build(monkeypatch):
    """A soft-capped backward follows the table-form rule of any other (compact tables above AUTO_VISITS visits, or
    with CUPY_DASH_COMPACT_TABLES=1), and its compact build keeps the cap: DASH_SOFTCAP with DASH_COMPACT, at every
    head dim (kernels_src/bwd/visit_math.cuh, kDtPairs: no 1 - t^2 pair in registers at 64 and 128)."""
    from cupy_dash.cuda import kernels
    from cupy_dash.schedule import compact_device
    tile = kernels.bwd_tile(128, True)
    monkeypatch.delenv("CUPY_DASH_COMPACT_TABLES", raising=False)
    monkeypatch.setattr(compact_device, "AUTO_VISITS", 10)
    assert compact_device.wanted(4096, 4096, tile.block_m, tile.block_n, 8, True, (-1, 0))
    monkeypatch.setattr(compact_device, "AUTO_VISITS", 10 ** 9)
    assert not compact_device.wanted(4096, 4096, tile.block_m, tile.block_n, 8, True, (-1, 0))
    monkeypatch.setenv("CUPY_DASH_COMPACT_TABLES", "1")
    assert compact_device.wanted(4096, 4096, tile.block_m, tile.block_n, 8, True, (-1, 0))
    assert compact_device.table_form(None, varlen=True) == "compact"
    for head_dim in kernels.BWD_BUILT_HEAD_DIMS:
        main = kernels.bwd_specs("bfloat16", head_dim, True, compact=True, softcap=True).main
        assert {"DASH_SOFTCAP", "DASH_COMPACT"} <= {name for name, _ in main.defines}, head_dim


@pytest.mark.parametrize("window,causal,exc,match", [
    ((1, 2, 3), False, TypeError, "window: expected a pair"),
    (5, False, TypeError, "window: expected a pair"),
    ((1.5, 2), False, TypeError, "window: left must be an int"),
    ((1, True), False, TypeError, "window: right must be an int"),
    ((-2, 0), False, ValueError, "window: left must be -1"),
    ((0, -3), False, ValueError, "window: right must be -1"),
    ((4, 2), True, ValueError, "window: right=2 contradicts causal=True")])
def test_bad_window(window, causal, exc, match, gpu_work_log):
    t = make()
    with pytest.raises(exc, match=match):
        fwd(t, causal=causal, window=window)
    assert gpu_work_log == []


@pytest.mark.parametrize("window,causal,want", [((-1, -1), False, (-1, -1)), ((-1, -1), True, (-1, 0)),
                                                ((7, 0), True, (7, 0)), ((np.int64(3), 9), False, (3, 9))])
def test_window_as_the_kernel_gets_it(window, causal, want):
    from cupy_dash.core import problem
    assert problem.check_window(window, causal) == want


def test_value_head_dim():
    """v's head dim may differ from q's only as (192, 128): that pair passes the shape checks (the CPU tensors then
    fail the device check), out and do take v's head dim, any other pair names v."""
    t = make(D=192, Dv=128)
    raises(ValueError, lambda: fwd(t), "q:", "CUDA device")
    from cupy_dash.core import problem
    p = problem.validate(*(fake(t)[n] for n in ("q", "k", "v", "do", "out", "lse")), backward=False)
    assert (p.D, p.Dv) == (192, 128)
    for D, Dv in ((128, 64), (64, 128), (192, 64), (256, 128)):
        raises(NotImplementedError, lambda: fwd(make(D=D, Dv=Dv)), "v:", f"value head dim {Dv}", f"head dim {D}",
               "192 with 128")
    for name in ("do", "out"):
        t = make(D=192, Dv=128)
        t[name] = np.zeros((2, 96, 4, 192), BF16)
        raises(ValueError, lambda: bwd(t), f"{name}:", "(2, 96, 4, 128)", "v's head dim")
    t = make(D=192, Dv=128)
    t["v"] = np.zeros((2, 161, 4, 128), BF16)
    raises(ValueError, lambda: fwd(t), "v:", "shape of k")


@pytest.mark.parametrize("direction", ["forward", "backward"])
def test_head_dim_96_passes_validation(direction, gpu_work_log):
    """Head dim 96 (the head-dim-128 kernels padded) is supported: validation passes, the call reaches GPU work, and
    the default scale is 1 / sqrt(96)."""
    import math
    from cupy_dash.core import problem
    t = fake(make(D=96))
    with pytest.raises(GpuTouched):
        (fwd if direction == "forward" else bwd)(t)
    assert gpu_work_log
    p = problem.validate(t["q"], t["k"], t["v"], t["do"], t["out"], t["lse"], backward=direction == "backward")
    assert p.D == 96 and p.scale == pytest.approx(1 / math.sqrt(96))


@pytest.mark.parametrize("H,Hkv", [(8, 2), (8, 1)], ids=["gqa", "mqa"])
def test_gqa_backward_passes_validation(H, Hkv, gpu_work_log):
    """GQA / MQA backward is supported: validation passes and the call reaches GPU work (the sentinel)."""
    t = fake(make(H=H, Hkv=Hkv))
    with pytest.raises(GpuTouched):
        bwd(t)
    assert gpu_work_log


def test_gqa_backward_rejects_a_plan_of_another_group_size(gpu_work_log):
    from cupy_dash.core.api import _backward_with_plan
    t = fake(make(H=8, Hkv=2))
    plan = _build_schedule("shift", seqlen_q=96, seqlen_k=160, block_m=64, block_n=128, num_heads=16,
                           causal=False, num_sms=4)                      # built as MHA: group_size 1, not 4
    raises(ValueError, lambda: _backward_with_plan(t["do"], t["q"], t["k"], t["v"], t["out"], t["lse"], plan=plan),
           "plan:", "group_size=1", "Hkv=2", "group_size 4")
    assert gpu_work_log == []


def test_gqa_forward_passes_validation():
    """GQA forward is supported: validation passes and the call reaches GPU work (the sentinel)."""
    t = fake(make(H=8, Hkv=2))
    with pytest.raises(GpuTouched):
        fwd(t)


# --------------------------------------------------------------------------------------------------------------
# device
# --------------------------------------------------------------------------------------------------------------
def test_cpu_arrays_rejected_forward():
    raises(ValueError, lambda: fwd(make()), "q:", "CUDA", "cpu")


@pytest.mark.parametrize("name", ["k", "v"])
def test_cpu_operand_rejected_forward(name):
    t = fake(make(), skip=(name,))
    raises(ValueError, lambda: fwd(t), f"{name}:", "CUDA", "cpu")


@pytest.mark.parametrize("name", ["do", "out", "lse"])
def test_cpu_operand_rejected_backward(name):
    t = fake(make(), skip=(name,))
    raises(ValueError, lambda: bwd(t), f"{name}:", "CUDA", "cpu")


def test_mixed_devices_rejected():
    t = fake(make())
    t["k"] = FakeCuda(make()["k"], device_id=1)
    raises(ValueError, lambda: fwd(t), "k:", "cuda:1", "cuda:0")


def test_valid_inputs_reach_gpu_work(gpu_work_log):
    """The positive control: fully valid (fake CUDA) inputs pass validation and stop at the first GPU step."""
    t = fake(make())
    with pytest.raises(GpuTouched):
        fwd(t, causal=True, softmax_scale=0.1)
    with pytest.raises(GpuTouched):
        bwd(t, schedule="shift")
    assert len(gpu_work_log) == 2


# --------------------------------------------------------------------------------------------------------------
# strides and alignment (interop.describe / check_layout, and through the API)
# --------------------------------------------------------------------------------------------------------------
def test_describe_numpy_strides_in_elements():
    a = np.zeros((2, 16, 4, 128), BF16)[:, ::2, :, :64]
    info = interop.describe(a, "q")
    assert info.shape == (2, 8, 4, 64)
    assert info.strides == (16 * 4 * 128, 2 * 4 * 128, 128, 1)
    assert info.dtype == "bfloat16" and info.itemsize == 2
    assert info.framework == "numpy" and info.device_type == interop.DLPACK_CPU and not info.is_cuda
    assert info.data_ptr == a.__array_interface__["data"][0]
    interop.check_layout(info)              # strided but legal: multiples of 8 elements, aligned base


def test_describe_float16_and_float32():
    assert interop.describe(np.zeros((1, 2, 3, 8), F16), "x").dtype == "float16"
    assert interop.describe(np.zeros((1, 2, 3), F32), "lse").dtype == "float32"


def test_describe_rejects_non_arrays():
    raises(TypeError, lambda: interop.describe(3, "q"), "q:")
    raises(TypeError, lambda: interop.describe(None, "k"), "k:")
    raises(TypeError, lambda: cupy_dash.attention_forward(None, None, None), "q:")


def test_non_contiguous_last_dim():
    a = np.zeros((2, 16, 4, 128), BF16)[..., ::2]
    raises(ValueError, lambda: interop.check_layout(interop.describe(a, "k")), "k:", "last dimension", "stride 1")
    t = make()
    t["q"] = np.zeros((2, 96, 4, 128), BF16)[..., ::2]
    raises(ValueError, lambda: fwd(t), "q:", "last dimension")


def test_misaligned_stride():
    a = np.zeros((2, 16, 4, 68), BF16)[..., :64]       # head stride 68 elements = 136 bytes
    raises(ValueError, lambda: interop.check_layout(interop.describe(a, "v")), "v:", "68", ".contiguous()")
    t = make()
    t["v"] = np.zeros((2, 160, 4, 68), BF16)[..., :64]
    raises(ValueError, lambda: fwd(t), "v:", ".contiguous()")


def test_misaligned_base_pointer():
    base = np.zeros((2, 16, 4, 72), BF16)
    if base.__array_interface__["data"][0] % 16:
        pytest.skip("numpy gave a base that is not 16-byte aligned")
    a = base[..., 1:65]                                 # strides fine, base pointer 2 bytes off
    raises(ValueError, lambda: interop.check_layout(interop.describe(a, "do")), "do:", "aligned")


def test_negative_stride():
    a = np.zeros((2, 16, 4, 64), BF16)[:, ::-1]
    raises(ValueError, lambda: interop.check_layout(interop.describe(a, "q")), "q:", "positive multiple")


def test_size_one_dims_may_have_any_stride():
    a = np.zeros((1, 16, 1, 72), BF16)[..., :64]        # batch and head dims of size 1: strides unused
    interop.check_layout(interop.describe(a, "q"))


def test_lse_must_be_contiguous():
    t = make()
    t["lse"] = np.zeros((2, 4, 192), F32)[..., ::2]
    raises(ValueError, lambda: bwd(t), "lse:", "contiguous")


def test_byte_stride_not_multiple_of_itemsize():
    base = np.zeros(2 * 16 * 4 * 64 + 8, BF16)
    a = np.lib.stride_tricks.as_strided(base, shape=(2, 16, 4, 64), strides=(16 * 4 * 64 * 2 + 1, 512, 128, 2))
    raises(ValueError, lambda: interop.describe(a, "k"), "k:", "element size")


# --------------------------------------------------------------------------------------------------------------
# nothing is allocated or launched on error
# --------------------------------------------------------------------------------------------------------------
def _bad_calls():
    def with_(**changes):
        t = make()
        t.update(changes)
        return t
    return {
        "dtype": lambda: fwd(make(dtype=F32)),
        "rank": lambda: fwd(with_(q=np.zeros((2, 96, 64), BF16))),
        "shape": lambda: bwd(with_(out=np.zeros((2, 95, 4, 64), BF16))),
        "head_dim": lambda: bwd(make(D=160)),
        "heads": lambda: fwd(make(H=6, Hkv=4)),
        "empty": lambda: fwd(make(Sk=0)),
        "scale": lambda: bwd(make(), softmax_scale=-1.0),
        "schedule": lambda: bwd(make(), schedule="nope"),
        "gqa_heads": lambda: bwd(with_(k=np.zeros((2, 160, 3, 64), BF16), v=np.zeros((2, 160, 3, 64), BF16))),
        "layout": lambda: fwd(with_(q=np.zeros((2, 96, 4, 128), BF16)[..., ::2])),
        "device": lambda: bwd(make()),
        "fake_device_mix": lambda: bwd({**fake(make()), "lse": make()["lse"]}),
    }


@pytest.mark.parametrize("case", list(_bad_calls()))
def test_errors_happen_before_any_gpu_work(case, gpu_work_log):
    with pytest.raises((ValueError, NotImplementedError)):
        _bad_calls()[case]()
    assert gpu_work_log == [], f"{case}: GPU work started before the error: {gpu_work_log}"


# --------------------------------------------------------------------------------------------------------------
# deferred error reporting, plan checks, environment (CPU-level pieces)
# --------------------------------------------------------------------------------------------------------------
@pytest.fixture
def fresh_error_state(monkeypatch):
    """No pending backward and no CUDA-graph error records (a GPU run of earlier test modules may have captured
    calls, whose records check_errors would then read from the device)."""
    monkeypatch.setattr(errors, "_pending", collections.deque())
    monkeypatch.setattr(errors, "_slot_pools", {})


def test_check_errors_without_pending_work(fresh_error_state):
    assert cupy_dash.check_errors() is None


class _FakePool:
    def __init__(self):
        self.free = []


def _failed_record(values, policy="shift"):
    slot = errors._Slot()
    slot.host = np.array([1, *values, 0, 0, 0], np.int32)     # finished (host[0] = 1), then the device record
    slot.pool = _FakePool()
    rec = errors._Pending()
    rec.event, rec.slot, rec.keep = None, slot, None
    rec.info = (policy, 2, 4, 1000, 1000, 128, True)
    return rec


def test_poll_raises_for_a_failed_backward(monkeypatch):
    monkeypatch.setattr(errors, "_pending", collections.deque([_failed_record([1, 17, 3, 1])]))
    msg = raises(RuntimeError, errors.poll_errors, "semaphore", "schedule 'shift'", "B=2", "H=4", "Sq=1000",
                 "Sk=1000", "D=128", "causal=True", "visit 17 waited for rank 3, saw 1", "inconsistent")
    assert "CUPY_DASH_SPIN_TIMEOUT_MS" in msg
    assert not errors._pending                              # retired, reported once
    errors.poll_errors()


def test_public_call_reports_a_failed_backward_first(monkeypatch):
    monkeypatch.setattr(errors, "_pending", collections.deque([_failed_record([1, 0, 1, 0], "fa3")]))
    raises(RuntimeError, lambda: fwd(make()), "schedule 'fa3'")
    raises(ValueError, lambda: fwd(make()), "q:")       # the next call validates normally


def test_poll_waits_for_the_postprocess_flag(monkeypatch):
    """A slot is finished only once its postprocess kernel set host[0]; poll_errors retires records in order."""
    running = _failed_record([1, 9, 2, 1])
    running.slot.host[0] = 0
    later = _failed_record([1, 3, 1, 0])
    pending = collections.deque([running, later])
    monkeypatch.setattr(errors, "_pending", pending)
    errors.poll_errors()                                     # nothing finished in order yet: no raise
    assert list(pending) == [running, later]
    running.slot.host[0] = 1
    raises(RuntimeError, errors.poll_errors, "2 cupy_dash backward calls failed", "visit 9", "visit 3")
    assert not pending


def test_a_record_never_published_is_reported(monkeypatch, fresh_error_state):
    rec = _failed_record([0, 0, 0, 0], "fa3")
    rec.slot.host[0] = 0
    monkeypatch.setattr(errors._Pending, "wait", lambda self: None)     # the device sync, without a device
    monkeypatch.setattr(errors, "_pending", collections.deque([rec]))
    raises(RuntimeError, cupy_dash.check_errors, "without its kernels writing its error record")


def test_check_errors_raises_and_drains(monkeypatch, fresh_error_state):
    ok = _failed_record([0, 0, 0, 0])
    bad = _failed_record([1, 5, 2, 1], "descending")
    monkeypatch.setattr(errors, "_pending", collections.deque([ok, bad]))
    raises(RuntimeError, cupy_dash.check_errors, "schedule 'descending'", "visit 5")
    assert not errors._pending
    cupy_dash.check_errors()


def test_plan_bounds_checks():
    plan = _build_schedule("shift", seqlen_q=256, seqlen_k=512, block_m=64, block_n=128, num_heads=3,
                           causal=False, num_sms=5)
    visits, rank, cta_start, num_ctas = schedule.check_plan(plan, 3, 4, 4)
    assert visits.dtype == np.int32 and rank.dtype == np.int32 and cta_start.dtype == np.int64
    assert num_ctas == plan.num_ctas

    class Bad:
        pass

    for col, value, needle in ((1, 3, "bh"), (2, 4, "n_block"), (3, -1, "m_block")):
        bad = Bad()
        bad.visits = plan.visits.copy()
        bad.visits[0, col] = value
        bad.rank, bad.cta_start, bad.num_ctas, bad.policy = plan.rank, plan.cta_start, plan.num_ctas, "bad"
        raises(ValueError, lambda: schedule.check_plan(bad, 3, 4, 4), "plan:", needle)
    # a wrong rank is memory-safe: allowed through (the kernel's bounded wait reports it)
    bad = Bad()
    bad.visits, bad.cta_start, bad.num_ctas, bad.policy = plan.visits, plan.cta_start, plan.num_ctas, "bad"
    bad.rank = plan.rank + 1
    schedule.check_plan(bad, 3, 4, 4)


def test_import_does_not_pull_torch_or_jax():
    code = "import sys, cupy_dash; assert 'torch' not in sys.modules and 'jax' not in sys.modules"
    root = os.path.dirname(os.path.dirname(os.path.abspath(cupy_dash.__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    subprocess.run([sys.executable, "-c", code], check=True, env=env)


def test_batches_and_packings_beyond_a_grid_dimension_raise():
    """The grids put heads in y and the batch (varlen: the sequences) in z, at most 65535 each: a larger batch (a
    jax.vmap folds its mapped axis into B) raises before anything is launched, naming the argument."""
    t = make(B=65536, Sq=1, Sk=1, H=1, Hkv=1, D=64)
    raises(ValueError, lambda: fwd(t), "q: batch size B=65536", "65535")
    raises(ValueError, lambda: bwd(t), "q: batch size B=65536")
    q = np.zeros((65536, 1, 64), BF16)
    cu = np.arange(65537, dtype=np.int32)
    raises(ValueError, lambda: cupy_dash.attention_forward_varlen(q, q, q, cu, cu, 1, 1), "65536 sequences")
    raises(ValueError, lambda: cupy_dash.prepare_varlen_backward(cu, cu, 1, 1, num_heads=1, num_heads_kv=1,
                                                                 head_dim=64), "65536 sequences")


def test_an_expanded_operand_raises_naming_it():
    """A broadcast (stride 0) dimension, e.g. k expanded over the query heads, is refused at validation (the TMA
    maps take none), naming the argument, instead of failing when its map is encoded."""
    t = make(H=4, Hkv=1)
    t["k"] = np.broadcast_to(t["k"], (2, 160, 4, 64))          # MQA k repeated by a view: head stride 0
    t["v"] = np.ascontiguousarray(np.broadcast_to(t["v"], (2, 160, 4, 64)))
    raises(ValueError, lambda: fwd(fake(t)), "k: stride 0 of dimension 2", "expanded")
