"""GPU tests of the GQA / MQA backward (need an NVIDIA Hopper GPU; skipped elsewhere, see conftest.py).

q, do, out ``(B, Sq, H, D)`` with H = 16; k, v ``(B, Sk, Hkv, D)`` with H / Hkv in {1, 2, 8, 16} (16 is MQA).
The kernel visits a KV tile for every query head of its group on one CTA and keeps dK, dV in registers over
the whole group (kernels_src/schedule_view.cuh, same_kv_tile), so:

* every schedule and the atomic path are checked against the float64 oracle with FA3's tolerance rule
  (:func:`cupy_dash.reference.assert_close_fa3`), causal and full, odd lengths, Sq > Sk (rows without keys)
  and Sq < Sk, and ``dk``, ``dv`` come back as ``(B, Sk, Hkv, D)``;
* small persistent grids put many columns on one CTA, including consecutive columns that differ only in their
  KV head (Sk <= block_n), where a wrong grouping would mix two KV heads' dK, dV;
* the backward is bitwise reproducible over 100 runs for every schedule on one GQA shape;
* the torch and JAX adapters differentiate GQA and match the functional API bit for bit.

Helpers (device upload, pool poisoning, repeat loop) are those of gpu_helpers.py.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import pytest

import cupy
import cupy_dash
from cupy_dash import reference
from gpu_helpers import (ATOMIC, DET_REPEATS, POLICIES, CaseDerived, _assert_finite, _assert_same_bits, _dev,
                         _host, _poison_pool, _poison_size, _randn, _repeat_backward, _schedule_kwargs, _seed,
                         _torch_from_host)

pytestmark = pytest.mark.gpu

HEADS = 16
GROUPS = (1, 2, 8, HEADS)
SEQLENS = ((255, 255), (1000, 300), (300, 777))


@dataclass(frozen=True)
class GqaCase(CaseDerived):
    hdim: int
    causal: bool
    seqlen_q: int
    seqlen_k: int
    kv_heads: int
    dtype: str = "bf16"
    batch: int = 2
    heads: int = HEADS
    hdim_v: int = 0         # v's head dim where it differs from hdim (kernels.VALUE_HEAD_DIMS)

    @property
    def id(self) -> str:
        mask = "causal" if self.causal else "full"
        value = f"-v{self.hdim_v}" if self.hdim_v else ""
        return (f"{self.dtype}-d{self.hdim}{value}-{mask}-sq{self.seqlen_q}-sk{self.seqlen_k}-b{self.batch}"
                f"-h{self.heads}-hkv{self.kv_heads}")


@functools.lru_cache(maxsize=4)
def _data(case: GqaCase) -> dict:
    """Inputs (seeded by the case id) and the float64 / low-precision references of one case."""
    rng = np.random.default_rng(_seed(case.id))
    dt = case.np_dtype
    b, sq, sk, h, hk, d = case.batch, case.seqlen_q, case.seqlen_k, case.heads, case.kv_heads, case.hdim
    dv = case.hdim_v or d
    x = dict(q=_randn(rng, (b, sq, h, d), dt), k=_randn(rng, (b, sk, hk, d), dt), v=_randn(rng, (b, sk, hk, dv), dt),
             do=_randn(rng, (b, sq, h, dv), dt))
    out_ref, lse_ref = reference.forward(x["q"], x["k"], x["v"], causal=case.causal)
    out_lowp, lse_lowp = reference.forward_lowp(x["q"], x["k"], x["v"], causal=case.causal, dtype=dt)
    args = (x["do"], x["q"], x["k"], x["v"])
    x["dq_ref"], x["dk_ref"], x["dv_ref"] = reference.backward(*args, out_ref, lse_ref, causal=case.causal)
    x["dq_lowp"], x["dk_lowp"], x["dv_lowp"] = reference.backward_lowp(*args, out_lowp, lse_lowp,
                                                                      causal=case.causal, dtype=dt)
    x["out_in"], x["lse_in"] = out_ref.astype(dt), lse_ref.astype(np.float32)   # the exact forward, as given
    return x


def _check(case, data, grads):
    """Shapes, dtypes, finiteness, zero dq on rows without keys, and FA3's tolerance rule for dq, dk, dv."""
    b, sq, sk, h, hk, d = case.batch, case.seqlen_q, case.seqlen_k, case.heads, case.kv_heads, case.hdim
    dv = case.hdim_v or d
    for name, x, shape in zip(("dq", "dk", "dv"), grads, ((b, sq, h, d), (b, sk, hk, d), (b, sk, hk, dv))):
        assert isinstance(x, cupy.ndarray) and tuple(x.shape) == shape, f"{name}: {type(x)} {x.shape} != {shape}"
        assert np.dtype(x.dtype) == case.np_dtype
        host = _host(x)
        _assert_finite(name, host)
        if name == "dq" and case.empty_rows:
            assert (host[:, :case.empty_rows].astype(np.float32) == 0).all(), "dq must be 0 on rows without keys"
        reference.assert_close_fa3(name, host, data[f"{name}_ref"], data[f"{name}_lowp"])


def _inputs(data):
    return tuple(_dev(data[n]) for n in ("do", "q", "k", "v", "out_in", "lse_in"))


CASES = [GqaCase(d, causal, sq, sk, HEADS // g) for g in GROUPS for d in (64, 128) for causal in (True, False)
         for sq, sk in SEQLENS]
CASES += [GqaCase(96, causal, sq, sk, HEADS // g) for g in (2, HEADS) for causal in (True, False)
          for sq, sk in SEQLENS[1:]]          # head dim 96 (padded to 128): grouped and MQA, ragged lengths
CASES += [GqaCase(d, causal, sq, sk, HEADS // g) for d in (192, 256) for g in (2, HEADS) for causal in (True, False)
          for sq, sk in SEQLENS[1:]]          # head dims 192 and 256 (the split head dim): grouped and MQA
FP16_CASES = [GqaCase(64, True, 255, 255, HEADS // g, dtype="fp16") for g in (2, HEADS)]
FP16_CASES += [GqaCase(256, False, 300, 1000, 2, dtype="fp16"), GqaCase(192, True, 1000, 300, 2, dtype="fp16")]
CASES += [GqaCase(192, causal, sq, sk, HEADS // g, hdim_v=128) for g in (2, HEADS) for causal in (True, False)
          for sq, sk in SEQLENS[1:]]          # value head dim 128 with 192: grouped and MQA


def _params():
    params = [pytest.param(c, s, id=f"{c.id}-{s}") for c in CASES for s in POLICIES + (ATOMIC,)]
    return params + [pytest.param(c, s, id=f"{c.id}-{s}") for c in FP16_CASES for s in ("auto", ATOMIC)]


@pytest.mark.parametrize("case,schedule", _params())
def test_gqa_backward(case, schedule):
    data = _data(case)
    do, q, k, v, out, lse = _inputs(data)
    _poison_pool(_poison_size(do, q, k, v))
    grads = cupy_dash.attention_backward(do, q, k, v, out, lse, causal=case.causal, **_schedule_kwargs(schedule))
    cupy_dash.check_errors()
    _check(case, data, grads)


# Many columns per CTA: K, V reloaded and dK, dV restarted at every change of KV head or n_block. With
# Sk <= block_n there is one KV tile per KV head, so consecutive columns on a CTA differ only in the KV head.
SMALL_GRID_CASES = [GqaCase(128, True, 1537, 1537, 8), GqaCase(64, False, 700, 1299, 2, batch=1),
                    GqaCase(128, True, 700, 100, 1), GqaCase(64, False, 333, 128, 4, batch=3),
                    GqaCase(96, True, 1537, 1537, 8), GqaCase(256, True, 1537, 1537, 8),
                    GqaCase(192, False, 1537, 1537, 8)]


@pytest.mark.parametrize("num_ctas", [1, 3, 7])
@pytest.mark.parametrize("case,schedule", [pytest.param(c, s, id=f"{c.id}-{s}") for c in SMALL_GRID_CASES
                                           for s in ("fa3", "descending", "shift", "symmetric_shift")])
def test_gqa_backward_small_grid_matches_reference(case, schedule, num_ctas):
    from cupy_dash import schedule as dash_schedule
    from cupy_dash.cuda import kernels
    from cupy_dash.core.api import _backward_with_plan

    data = _data(case)
    do, q, k, v, out, lse = _inputs(data)
    tile = kernels.bwd_tile(case.hdim, case.causal)
    g = case.heads // case.kv_heads
    plan = dash_schedule.build(schedule, seqlen_q=case.seqlen_q, seqlen_k=case.seqlen_k, block_m=tile.block_m,
                               block_n=tile.block_n, num_heads=case.batch * case.heads, group_size=g,
                               causal=case.causal, num_sms=num_ctas).validate()
    assert plan.num_ctas == min(num_ctas, case.batch * case.kv_heads * -(-case.seqlen_k // tile.block_n))
    _poison_pool(_poison_size(do, q, k, v))
    grads = _backward_with_plan(do, q, k, v, out, lse, plan=plan, causal=case.causal)
    cupy_dash.check_errors()
    _check(case, data, grads)


DET_CASE = GqaCase(128, True, 1024, 1024, 4)


@pytest.mark.parametrize("schedule", POLICIES)
def test_gqa_backward_bitwise_deterministic(schedule, request):
    rng = np.random.default_rng(_seed(request.node.nodeid))
    c = DET_CASE
    dt = c.np_dtype
    q, do = (_dev(_randn(rng, (c.batch, c.seqlen_q, c.heads, c.hdim), dt)) for _ in range(2))
    k, v = (_dev(_randn(rng, (c.batch, c.seqlen_k, c.kv_heads, c.hdim), dt)) for _ in range(2))
    out, lse = cupy_dash.attention_forward(q, k, v, causal=c.causal)
    first, counts = _repeat_backward(c, (do, q, k, v, out, lse), _schedule_kwargs(schedule), DET_REPEATS)
    cupy_dash.check_errors()
    assert tuple(first[1].shape) == (c.batch, c.seqlen_k, c.kv_heads, c.hdim)
    for name, x in zip(("dq", "dk", "dv"), first):
        _assert_finite(name, _host(x))
    bad = np.nonzero(counts.any(axis=1))[0]
    assert bad.size == 0, (f"{bad.size} of {DET_REPEATS - 1} repeats differ bitwise from the first (first at "
                           f"repeat {int(bad[0]) + 1}: differing elements dq/dk/dv = {counts[bad[0]].tolist()})")


ADAPTER_CASE = GqaCase(64, True, 255, 300, 2)


def test_torch_autograd_gqa_matches_functional_api():
    torch = pytest.importorskip("torch")
    import cupy_dash.torch as dash_torch
    c, data = ADAPTER_CASE, _data(ADAPTER_CASE)
    device = torch.device("cuda", cupy.cuda.Device().id)
    q, k, v, do = (_torch_from_host(data[n], device) for n in ("q", "k", "v", "do"))
    qg, kg, vg = (x.clone().requires_grad_(True) for x in (q, k, v))
    out = dash_torch.attention(qg, kg, vg, causal=c.causal)
    out.backward(do)
    out2, lse2 = cupy_dash.attention_forward(q, k, v, causal=c.causal)
    dq2, dk2, dv2 = cupy_dash.attention_backward(do, q, k, v, out2, lse2, causal=c.causal)
    cupy_dash.check_errors()
    assert kg.grad.shape == k.shape and vg.grad.shape == v.shape
    for name, x, e in (("out", out, out2), ("dq", qg.grad, dq2), ("dk", kg.grad, dk2), ("dv", vg.grad, dv2)):
        _assert_same_bits(name, x, e)


def test_jax_vjp_gqa_matches_functional_api():
    jax = pytest.importorskip("jax")
    import cupy_dash.jax as dash_jax
    c, data = ADAPTER_CASE, _data(ADAPTER_CASE)
    device = jax.devices("gpu")[0]
    q, k, v, do = (jax.device_put(data[n], device) for n in ("q", "k", "v", "do"))
    out, vjp = jax.vjp(lambda q_, k_, v_: dash_jax.attention(q_, k_, v_, causal=c.causal), q, k, v)
    dq, dk, dv = vjp(do)
    out2, lse2 = cupy_dash.attention_forward(q, k, v, causal=c.causal)
    dq2, dk2, dv2 = cupy_dash.attention_backward(do, q, k, v, out2, lse2, causal=c.causal)
    cupy_dash.check_errors()
    assert dk.shape == k.shape and dv.shape == v.shape
    for name, x, e in (("out", out, out2), ("dq", dq, dq2), ("dk", dk, dk2), ("dv", dv, dv2)):
        _assert_same_bits(name, x, e)
