"""GPU tests of the public attention API (need an NVIDIA Hopper GPU; skipped elsewhere, see conftest.py).

What is checked:

* correctness of the forward and of the backward with every schedule (and the atomic ``deterministic=False``
  path) against the float64 oracle in :mod:`cupy_dash.reference`, with FA3's tolerance rule (the error may be at
  most twice the error of the same computation done in the input precision, plus a rounding floor);
* causal rows that see no key (``Sq > Sk``): ``out`` exactly 0, ``lse = -inf``, zero ``dq`` rows;
* bitwise run-to-run determinism of the backward (100 passes, also while another stream keeps the GPU busy);
* interop: torch / JAX / CuPy inputs give identical bits, outputs come back in the caller's type and device;
  the torch autograd and JAX custom_vjp adapters match the functional API bit for bit.

A corrupted schedule table's bounded wait: tests/gpu/test_gpu_stall_bound.py.

Inputs are fresh random numbers seeded by the case id (the test id without the schedule), so every schedule of a
case sees the same inputs and the float64 reference is computed once per case (module-level cache). The
backward is fed the reference ``out`` (rounded to the input dtype) and ``lse`` (fp32), so its tests do not
depend on the forward kernel. Before each API call the CuPy memory pool is poisoned with 0xFF bytes (NaN in
bf16/fp16/fp32), so an output element the kernels forget to write shows up as NaN.
"""
from __future__ import annotations

import numpy as np
import pytest

import cupy
import cupy_dash
from cupy_dash import config, reference
from cupy_dash.cuda import kernels
from gpu_helpers import (ATOMIC, BF16, DET_REPEATS, DTYPES, POLICIES, Case, _CACHE, _assert_finite, _assert_same_bits,
                         _case_data, _dev, _host, _poison_pool, _poison_size, _randn, _repeat_backward,
                         _schedule_kwargs, _seed, _torch_from_host)

pytestmark = pytest.mark.gpu

HDIMS = (64, 128)
SEQLENS = ((1, 1), (17, 17), (128, 128), (255, 255), (1000, 1000), (2048, 2048), (300, 1000), (1000, 300))
# head dim 96 (the head-dim-128 kernels padded): fewer lengths, the ragged ones
D96_SEQLENS = ((17, 17), (255, 255), (1000, 1000), (300, 1000), (1000, 300))
# head dims 192 and 256 (the warpgroups split the head dim: kernels_src/bwd/split_step.cuh): ragged lengths, Sq != Sk
# both ways, and 2048 (32 KV tiles of 64 keys per head)
D256_SEQLENS = ((1, 1), (17, 17), (255, 255), (1000, 1000), (300, 1000), (1000, 300), (2048, 2048))

# lse is fp32 (natural-log units). FA3's rule would allow 2x the error of the low-precision baseline (whose lse
# comes from scores rounded to bf16/fp16: ~5e-3 for bf16) plus LSE_ATOL; but the kernels compute the scores of
# the same bf16/fp16 inputs exactly in fp32, so their lse is good to ~1e-5: the bound is also capped at LSE_CAP.
LSE_ATOL = 1e-4
LSE_CAP = 1e-3

ATOMIC_REPEATS = 20


# ----------------------------------------------------------------------------------------------------------------
# cases
# ----------------------------------------------------------------------------------------------------------------
CASES = [Case(dt, d, causal, sq, sk)
         for dt in DTYPES for d in HDIMS for causal in (True, False) for sq, sk in SEQLENS]
CASES += [Case(dt, 96, causal, sq, sk) for dt in DTYPES for causal in (True, False) for sq, sk in D96_SEQLENS]
CASES += [Case(dt, d, causal, sq, sk) for dt in DTYPES for d in (192, 256) for causal in (True, False)
          for sq, sk in D256_SEQLENS]         # head dim 192: three MMA warpgroups, 64 x 96 tiles
CASES += [Case(dt, 192, causal, sq, sk, hdim_v=128) for dt in DTYPES for causal in (True, False)
          for sq, sk in D256_SEQLENS[1:]]     # value head dim 128 with 192 (v, out, dout, dv 128 wide)


def _backward_params():
    params = []
    for case in CASES:
        schedules = POLICIES + (ATOMIC,) if case.dtype == "bf16" else ("auto", ATOMIC)
        params += [pytest.param(case, s, id=f"{case.id}-{s}") for s in schedules]
    return params


# ----------------------------------------------------------------------------------------------------------------
# host / device helpers
# ----------------------------------------------------------------------------------------------------------------


def _assert_close_lse(lse, ref64, lowp):
    """FA3's rule on lse, compared in fp32: ``err <= min(2 * lowp error + LSE_ATOL, LSE_CAP)``; -inf (rows
    that see no key) must match exactly."""
    a = np.asarray(lse, dtype=np.float32).astype(np.float64)
    r = np.asarray(ref64, dtype=np.float64).astype(np.float32).astype(np.float64)
    lp = np.asarray(lowp, dtype=np.float32).astype(np.float64)
    assert a.shape == r.shape, f"lse: shape {a.shape} != {r.shape}"
    ref_inf, got_inf = np.isneginf(r), np.isneginf(a)
    if not np.array_equal(ref_inf, got_inf):
        where = tuple(int(i) for i in np.argwhere(ref_inf != got_inf)[0])
        raise AssertionError(f"lse: -inf pattern differs from the reference at {where}: got {a[where]!r}, "
                             f"ref {r[where]!r}")
    fin = ~ref_inf
    if not fin.any():
        return
    with np.errstate(invalid="ignore"):
        err_all = np.where(fin, np.abs(a - r), 0.0)
        base = float(np.where(fin, np.abs(lp - r), 0.0).max())
    err_all = np.where(np.isnan(err_all), np.inf, err_all)
    err = float(err_all.max())
    bound = min(2.0 * base + LSE_ATOL, LSE_CAP)
    if not err <= bound:
        where = tuple(int(i) for i in np.unravel_index(int(np.argmax(err_all)), err_all.shape))
        raise AssertionError(f"lse: max |lse - ref| = {err:.3g} exceeds {bound:.3g} (= min(2 * lowp error "
                             f"{base:.3g} + {LSE_ATOL:g}, {LSE_CAP:g})); worst at {where}: got {a[where]!r}, "
                             f"ref {r[where]!r}")


# ----------------------------------------------------------------------------------------------------------------
# inputs and float64 reference, cached per case
# ----------------------------------------------------------------------------------------------------------------


_USES: dict[str, int] = {}     # case id -> number of parametrized tests that read its cached data


def _count_uses(params):
    for p in params:
        case = p.values[0] if hasattr(p, "values") else p
        _USES[case.id] = _USES.get(case.id, 0) + 1
    return params


@pytest.fixture(scope="module", autouse=True)
def _clear_reference_cache():
    yield
    _CACHE.clear()


@pytest.fixture(autouse=True)
def _evict_reference_when_done(request):
    """Drop a case's cached inputs and references after the last test that uses it has run (with a -k subset
    the count never reaches zero and the data simply stays until the end of the module)."""
    yield
    case = getattr(getattr(request.node, "callspec", None), "params", {}).get("case")
    if isinstance(case, Case) and case.id in _USES:
        _USES[case.id] -= 1
        if _USES[case.id] <= 0:
            _CACHE.pop(case.id, None)


def _check_outputs_cupy(outs, shapes, dtypes):
    for x, shape, dtype in zip(outs, shapes, dtypes):
        assert isinstance(x, cupy.ndarray), f"expected a cupy.ndarray, got {type(x)}"
        assert tuple(x.shape) == tuple(shape), f"shape {tuple(x.shape)} != {tuple(shape)}"
        assert np.dtype(x.dtype) == np.dtype(dtype), f"dtype {x.dtype} != {dtype}"
        assert x.device.id == cupy.cuda.Device().id


# ----------------------------------------------------------------------------------------------------------------
# correctness
# ----------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", _count_uses([pytest.param(c, id=c.id) for c in CASES]))
def test_forward(case):
    data = _case_data(case)
    q, k, v = _dev(data["q"]), _dev(data["k"]), _dev(data["v"])
    _poison_pool(_poison_size(q, k, v))
    out, lse = cupy_dash.attention_forward(q, k, v, causal=case.causal)
    _check_outputs_cupy((out, lse), (data["out_ref"].shape, (case.batch, case.heads, case.seqlen_q)),
                        (case.np_dtype, np.float32))
    out_h, lse_h = _host(out), _host(lse)
    e = case.empty_rows
    _assert_finite("out", out_h, rows_from=e)
    assert np.isfinite(lse_h[:, :, e:]).all(), "lse has non-finite values on rows that see keys"
    if e:
        assert (out_h[:, :e].astype(np.float32) == 0).all(), "out must be exactly 0 on rows that see no key"
        assert np.isneginf(lse_h[:, :, :e]).all(), "lse must be -inf on rows that see no key"
    reference.assert_close_fa3("out", out_h, data["out_ref"], data["out_lowp"])
    _assert_close_lse(lse_h, data["lse_ref"], data["lse_lowp"])


@pytest.mark.parametrize("case,schedule", _count_uses(_backward_params()))
def test_backward(case, schedule):
    data = _case_data(case, backward=True)
    do, q, k, v, out = (_dev(data[n]) for n in ("do", "q", "k", "v", "out_in"))
    lse = _dev(data["lse_in"])
    _poison_pool(_poison_size(do, q, k, v))
    dq, dk, dv = cupy_dash.attention_backward(do, q, k, v, out, lse, causal=case.causal,
                                              **_schedule_kwargs(schedule))
    cupy_dash.check_errors()
    _check_outputs_cupy((dq, dk, dv), (q.shape, k.shape, v.shape), (case.np_dtype,) * 3)
    dq_h, dk_h, dv_h = _host(dq), _host(dk), _host(dv)
    e = case.empty_rows
    _assert_finite("dq", dq_h)
    _assert_finite("dk", dk_h)
    _assert_finite("dv", dv_h)
    if e:
        assert (dq_h[:, :e].astype(np.float32) == 0).all(), "dq must be 0 on rows that see no key"
    reference.assert_close_fa3("dq", dq_h, data["dq_ref"], data["dq_lowp"])
    reference.assert_close_fa3("dk", dk_h, data["dk_ref"], data["dk_lowp"])
    reference.assert_close_fa3("dv", dv_h, data["dv_ref"], data["dv_lowp"])


# The 80-query tile (kernels.bwd_tile): head dim 128 (and 96, padded) without a window, from FULL80_MIN_SEQLEN
# queries on, with a partial last Q tile and several KV tiles per CTA. Causal calls take it from CAUSAL80_MIN_SEQLEN:
# the causal cases force it (CUPY_DASH_BWD_CAUSAL_BLOCK_M=80, unless the environment forces 64) at a length whose
# float64 reference stays cheap; Sq < Sk, so the diagonal is offset and crosses the 80-query tiles at every phase.
LONG_CASES = [Case("bf16", 128, False, 4197, 4300, batch=1, heads=2),
              Case("bf16", 96, False, 4197, 4300, batch=1, heads=2),
              Case("bf16", 128, True, 4197, 4300, batch=1, heads=2),
              Case("fp16", 96, True, 4111, 4111, batch=1, heads=2),
              # the other 80-query builds, shorter (bf16 head dim 96 causal, fp16 head dim 128 causal, fp16 96 full)
              Case("bf16", 96, True, 1111, 1200, batch=1, heads=2),
              Case("fp16", 128, True, 1111, 1200, batch=1, heads=2),
              Case("fp16", 96, False, 1111, 1200, batch=1, heads=2)]


@pytest.mark.parametrize("schedule", ["auto", "shift", ATOMIC])
@pytest.mark.parametrize("case", LONG_CASES, ids=str)
def test_long_backward_takes_the_80_query_tile(case, schedule, monkeypatch):
    if case.causal and config.BWD_CAUSAL_BLOCK_M.get() is None:
        monkeypatch.setenv("CUPY_DASH_BWD_CAUSAL_BLOCK_M", "80")
    forced = (config.BWD_CAUSAL_BLOCK_M if case.causal else config.BWD_FULL_BLOCK_M).get()
    assert kernels.bwd_tile(case.hdim, case.causal, seqlen_q=case.seqlen_q).block_m == (64 if forced == 64 else 80)
    data = _case_data(case, backward=True)
    do, q, k, v, out = (_dev(data[n]) for n in ("do", "q", "k", "v", "out_in"))
    lse = _dev(data["lse_in"])
    _poison_pool(_poison_size(do, q, k, v))
    runs = [cupy_dash.attention_backward(do, q, k, v, out, lse, causal=case.causal, **_schedule_kwargs(schedule))
            for _ in range(2)]
    cupy_dash.check_errors()
    grads = [tuple(_host(x) for x in run) for run in runs]
    for name, got, ref, lowp in zip(("dq", "dk", "dv"), grads[0], ("dq_ref", "dk_ref", "dv_ref"),
                                    ("dq_lowp", "dk_lowp", "dv_lowp")):
        _assert_finite(name, got)
        reference.assert_close_fa3(name, got, data[ref], data[lowp])
    if schedule != ATOMIC:
        assert all(np.array_equal(a.view(np.uint16), b.view(np.uint16)) for a, b in zip(*grads)), \
            "the deterministic backward's bits changed between two calls"


# Valid tables on a small persistent grid: each CTA runs several KV tiles, of several heads, back to back (dK, dV
# restart from zero at every KV-tile change, K and V are reloaded, the Q / dO stages keep cycling), and the dQ
# tiles collect partials from several CTAs. Long enough that the diagonal, tails and many ranks all occur.
SMALL_GRID_CASES = [Case("bf16", 128, True, 1537, 1537, batch=2, heads=2),
                    Case("bf16", 128, False, 700, 1299, batch=1, heads=3),
                    Case("bf16", 64, True, 1299, 700, batch=1, heads=3),
                    Case("fp16", 64, False, 1537, 1537, batch=2, heads=2)]


@pytest.mark.parametrize("num_ctas", [1, 3, 7])
@pytest.mark.parametrize("case,schedule", _count_uses([pytest.param(c, s, id=f"{c.id}-{s}")
                                                       for c in SMALL_GRID_CASES
                                                       for s in ("fa3", "descending", "shift", "symmetric_shift")]))
def test_backward_small_grid_matches_reference(case, schedule, num_ctas):
    from cupy_dash import schedule as dash_schedule
    from cupy_dash.core.api import _backward_with_plan

    data = _case_data(case, backward=True)
    do, q, k, v, out = (_dev(data[n]) for n in ("do", "q", "k", "v", "out_in"))
    lse = _dev(data["lse_in"])
    tile = kernels.bwd_tile(case.hdim, case.causal)
    plan = dash_schedule.build(schedule, seqlen_q=case.seqlen_q, seqlen_k=case.seqlen_k, block_m=tile.block_m,
                               block_n=tile.block_n, num_heads=case.batch * case.heads, causal=case.causal,
                               num_sms=num_ctas)
    plan.validate()
    kv_tiles = case.batch * case.heads * -(-case.seqlen_k // tile.block_n)
    assert plan.num_ctas == min(num_ctas, kv_tiles)
    _poison_pool(_poison_size(do, q, k, v))
    dq, dk, dv = _backward_with_plan(do, q, k, v, out, lse, plan=plan, causal=case.causal)
    cupy_dash.check_errors()
    for name, x in (("dq", dq), ("dk", dk), ("dv", dv)):
        h = _host(x)
        _assert_finite(name, h)
        reference.assert_close_fa3(name, h, data[f"{name}_ref"], data[f"{name}_lowp"])


EMPTY_ROW_CASES = [Case("bf16", d, True, sq, sk) for d in HDIMS
                   for sq, sk in ((64, 63), (129, 1), (200, 7), (513, 200))]
EMPTY_ROW_CASES += [Case("bf16", 96, True, sq, sk) for sq, sk in ((129, 1), (513, 200))]


@pytest.mark.parametrize("case,schedule", _count_uses([pytest.param(c, s, id=f"{c.id}-{s}")
                                                       for c in EMPTY_ROW_CASES for s in POLICIES + (ATOMIC,)]))
def test_causal_rows_without_keys(case, schedule):
    """Sq > Sk with a causal mask: the first Sq - Sk query rows see no key. Forward through the GPU, then the
    backward from the GPU's own out / lse (the path autograd takes)."""
    data = _case_data(case, backward=True)
    do, q, k, v = (_dev(data[n]) for n in ("do", "q", "k", "v"))
    e = case.empty_rows
    _poison_pool(_poison_size(do, q, k, v))
    out, lse = cupy_dash.attention_forward(q, k, v, causal=True)
    out_h, lse_h = _host(out), _host(lse)
    assert (out_h[:, :e].astype(np.float32) == 0).all(), "out must be exactly 0 on rows that see no key"
    assert np.isneginf(lse_h[:, :, :e]).all(), "lse must be -inf on rows that see no key"
    _assert_finite("out", out_h, rows_from=e)
    assert np.isfinite(lse_h[:, :, e:]).all()
    _poison_pool(_poison_size(do, q, k, v))
    dq, dk, dv = cupy_dash.attention_backward(do, q, k, v, out, lse, causal=True, **_schedule_kwargs(schedule))
    cupy_dash.check_errors()
    dq_h, dk_h, dv_h = _host(dq), _host(dk), _host(dv)
    assert (dq_h[:, :e].astype(np.float32) == 0).all(), "dq must be 0 on rows that see no key"
    for name, x in (("dq", dq_h), ("dk", dk_h), ("dv", dv_h)):
        _assert_finite(name, x)
    reference.assert_close_fa3("dq", dq_h, data["dq_ref"], data["dq_lowp"])
    reference.assert_close_fa3("dk", dk_h, data["dk_ref"], data["dk_lowp"])
    reference.assert_close_fa3("dv", dv_h, data["dv_ref"], data["dv_lowp"])


# ----------------------------------------------------------------------------------------------------------------
# bitwise determinism
# ----------------------------------------------------------------------------------------------------------------
DET_CASES = [Case("bf16", 128, True, 1024, 1024, batch=2, heads=4),
             Case("bf16", 64, False, 777, 1500, batch=1, heads=8),
             Case("bf16", 128, False, 1111, 1500, batch=2, heads=4),
             Case("bf16", 192, True, 1111, 1500, batch=2, heads=4, hdim_v=128)]


def _gpu_inputs(case, rng):
    dt = case.np_dtype
    b, sq, sk, h, d, dv = case.batch, case.seqlen_q, case.seqlen_k, case.heads, case.hdim, case.dv
    q, k, v = _dev(_randn(rng, (b, sq, h, d), dt)), _dev(_randn(rng, (b, sk, h, d), dt)), \
        _dev(_randn(rng, (b, sk, h, dv), dt))
    do = _dev(_randn(rng, (b, sq, h, dv), dt))
    out, lse = cupy_dash.attention_forward(q, k, v, causal=case.causal)
    return do, q, k, v, out, lse


class _BusyStream:
    """Keeps the GPU busy from a separate non-blocking stream: one large fp32 matmul enqueued per step."""

    def __init__(self, n=4096):
        self.stream = cupy.cuda.Stream(non_blocking=True)
        with self.stream:
            self.a = cupy.random.standard_normal((n, n), dtype=cupy.float32)
            self.b = cupy.random.standard_normal((n, n), dtype=cupy.float32)
            self.c = cupy.empty((n, n), dtype=cupy.float32)
        self.stream.synchronize()

    def step(self, count=2):
        with self.stream:
            for _ in range(count):
                cupy.matmul(self.a, self.b, out=self.c)

    def finish(self):
        self.stream.synchronize()


@pytest.mark.parametrize("load", ["idle", "busy-stream"])
@pytest.mark.parametrize("schedule", POLICIES)
@pytest.mark.parametrize("case", DET_CASES, ids=str)
def test_backward_bitwise_deterministic(case, schedule, load, request):
    rng = np.random.default_rng(_seed(request.node.nodeid))
    inputs = _gpu_inputs(case, rng)
    busy = _BusyStream() if load == "busy-stream" else None
    first, counts = _repeat_backward(case, inputs, _schedule_kwargs(schedule), DET_REPEATS, busy)
    cupy_dash.check_errors()
    for name, x in zip(("dq", "dk", "dv"), first):
        _assert_finite(name, _host(x))
    bad = np.nonzero(counts.any(axis=1))[0]
    assert bad.size == 0, (
        f"{bad.size} of {DET_REPEATS - 1} repeated backward passes differ bitwise from the first "
        f"(first at repeat {int(bad[0]) + 1}: differing elements dq/dk/dv = {counts[bad[0]].tolist()})")


@pytest.mark.parametrize("case", DET_CASES, ids=str)
def test_backward_atomic_repeatability_report(case, request, record_property):
    """deterministic=False is allowed to differ run to run: record (not assert) whether it does."""
    rng = np.random.default_rng(_seed(request.node.nodeid))
    inputs = _gpu_inputs(case, rng)
    _, counts = _repeat_backward(case, inputs, _schedule_kwargs(ATOMIC), ATOMIC_REPEATS)
    cupy_dash.check_errors()
    differing = int(counts.any(axis=1).sum())
    line = (f"deterministic=False, {case.id}: {differing} of {ATOMIC_REPEATS - 1} repeats differ bitwise from "
            f"the first (max differing elements dq/dk/dv = {counts.max(axis=0).tolist()})")
    print(line)
    record_property("report", line)


# ----------------------------------------------------------------------------------------------------------------
# interop
# ----------------------------------------------------------------------------------------------------------------
INTEROP_CASE = Case("bf16", 128, True, 300, 1000)
INTEROP_SCHEDULE = "shift"


def _cupy_run(case, data, schedule):
    q, k, v, do = (_dev(data[n]) for n in ("q", "k", "v", "do"))
    out, lse = cupy_dash.attention_forward(q, k, v, causal=case.causal)
    grads = cupy_dash.attention_backward(do, q, k, v, out, lse, causal=case.causal, schedule=schedule)
    cupy_dash.check_errors()
    return (out, lse) + tuple(grads)


@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_interop_identical_bits(framework, request):
    fw = pytest.importorskip(framework)
    case = INTEROP_CASE
    rng = np.random.default_rng(_seed(request.node.nodeid))
    b, sq, sk, h, d = case.batch, case.seqlen_q, case.seqlen_k, case.heads, case.hdim
    data = {n: _randn(rng, (b, s, h, d), BF16) for n, s in (("q", sq), ("k", sk), ("v", sk), ("do", sq))}
    expected = _cupy_run(case, data, INTEROP_SCHEDULE)

    if framework == "torch":
        device = fw.device("cuda", cupy.cuda.Device().id)
        t = {n: _torch_from_host(a, device) for n, a in data.items()}

        def check_type(x, ref):
            assert isinstance(x, fw.Tensor), f"expected torch.Tensor, got {type(x)}"
            assert x.device == ref.device, f"output on {x.device}, inputs on {ref.device}"
    else:
        import jax
        device = jax.devices("gpu")[0]
        t = {n: jax.device_put(a, device) for n, a in data.items()}

        def check_type(x, ref):
            assert isinstance(x, jax.Array), f"expected jax.Array, got {type(x)}"
            assert x.devices() == ref.devices(), f"output on {x.devices()}, inputs on {ref.devices()}"

    out, lse = cupy_dash.attention_forward(t["q"], t["k"], t["v"], causal=case.causal)
    dq, dk, dv = cupy_dash.attention_backward(t["do"], t["q"], t["k"], t["v"], out, lse, causal=case.causal,
                                              schedule=INTEROP_SCHEDULE)
    cupy_dash.check_errors()
    for name, x, e in zip(("out", "lse", "dq", "dk", "dv"), (out, lse, dq, dk, dv), expected):
        check_type(x, t["q"])
        _assert_same_bits(f"{framework} {name}", x, e)


def test_torch_autograd_matches_functional_api(request):
    torch = pytest.importorskip("torch")
    import cupy_dash.torch as dash_torch
    case = Case("bf16", 64, True, 255, 255)
    rng = np.random.default_rng(_seed(request.node.nodeid))
    device = torch.device("cuda", cupy.cuda.Device().id)
    b, sq, sk, h, d = case.batch, case.seqlen_q, case.seqlen_k, case.heads, case.hdim
    host = {n: _randn(rng, (b, s, h, d), BF16) for n, s in (("q", sq), ("k", sk), ("v", sk), ("do", sq))}
    q, k, v, do = (_torch_from_host(host[n], device) for n in ("q", "k", "v", "do"))
    qg, kg, vg = (x.clone().requires_grad_(True) for x in (q, k, v))
    res = dash_torch.attention(qg, kg, vg, causal=True)
    out = res[0] if isinstance(res, (tuple, list)) else res
    assert isinstance(out, torch.Tensor) and out.requires_grad
    out.backward(do)
    out2, lse2 = cupy_dash.attention_forward(q, k, v, causal=True)
    dq2, dk2, dv2 = cupy_dash.attention_backward(do, q, k, v, out2, lse2, causal=True)
    cupy_dash.check_errors()
    _assert_same_bits("out", out, out2)
    _assert_same_bits("dq", qg.grad, dq2)
    _assert_same_bits("dk", kg.grad, dk2)
    _assert_same_bits("dv", vg.grad, dv2)


def test_jax_vjp_matches_functional_api(request):
    jax = pytest.importorskip("jax")
    import cupy_dash.jax as dash_jax
    case = Case("bf16", 128, False, 200, 333)
    rng = np.random.default_rng(_seed(request.node.nodeid))
    device = jax.devices("gpu")[0]
    b, sq, sk, h, d = case.batch, case.seqlen_q, case.seqlen_k, case.heads, case.hdim
    host = {n: _randn(rng, (b, s, h, d), BF16) for n, s in (("q", sq), ("k", sk), ("v", sk), ("do", sq))}
    q, k, v, do = (jax.device_put(host[n], device) for n in ("q", "k", "v", "do"))

    def fn(q_, k_, v_):
        res = dash_jax.attention(q_, k_, v_, causal=False)
        return res[0] if isinstance(res, (tuple, list)) else res

    out, vjp = jax.vjp(fn, q, k, v)
    dq, dk, dv = vjp(do)
    out2, lse2 = cupy_dash.attention_forward(q, k, v, causal=False)
    dq2, dk2, dv2 = cupy_dash.attention_backward(do, q, k, v, out2, lse2, causal=False)
    cupy_dash.check_errors()
    for name, x, e in (("out", out, out2), ("dq", dq, dq2), ("dk", dk, dk2), ("dv", dv, dv2)):
        assert isinstance(x, jax.Array)
        _assert_same_bits(name, x, e)
