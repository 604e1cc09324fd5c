"""CPU tests of cupy_dash.reference, the float64 oracle that every GPU test compares against.

The oracle is checked three ways: against central finite differences of ``sum(out * do)``, against a second,
deliberately naive formulation (explicit Python loops, masked softmax written out, backward as an explicit
softmax-Jacobian product) that shares no code with the module, and against direct identities (lse is the
log-sum-exp of the masked scaled scores; rows that see no key are exactly 0 / -inf). The low-precision
baselines and the FA3 tolerance rule are checked for being close-but-not-equal and for accepting / rejecting
the right things.
"""
import math

import ml_dtypes
import numpy as np
import pytest

from cupy_dash import reference

BF16 = np.dtype(ml_dtypes.bfloat16)
FP16 = np.dtype(np.float16)


# ------------------------------------------------------------------------------------------------------------
# helpers
# ------------------------------------------------------------------------------------------------------------
def _case(B, Sq, Sk, H, Hkv, D, causal, scale=None):
    tag = f"B{B}-Sq{Sq}-Sk{Sk}-H{H}-Hkv{Hkv}-D{D}-{'causal' if causal else 'full'}"
    if scale is not None:
        tag += f"-scale{scale}"
    return pytest.param(dict(B=B, Sq=Sq, Sk=Sk, H=H, Hkv=Hkv, D=D, causal=causal, scale=scale), id=tag)


def _inputs(c, seed, dtype=np.float64, mag=1.0):
    rng = np.random.default_rng(seed)
    q = (mag * rng.standard_normal((c["B"], c["Sq"], c["H"], c["D"]))).astype(dtype)
    k = (mag * rng.standard_normal((c["B"], c["Sk"], c["Hkv"], c["D"]))).astype(dtype)
    v = rng.standard_normal((c["B"], c["Sk"], c["Hkv"], c["D"])).astype(dtype)
    do = rng.standard_normal((c["B"], c["Sq"], c["H"], c["D"])).astype(dtype)
    return q, k, v, do


def _naive(q, k, v, do, causal, scale):
    """Independent formulation: one (b, h, i) at a time, explicit loops, backward via the softmax Jacobian."""
    B, Sq, H, D = q.shape
    Sk, Hkv = k.shape[1], k.shape[2]
    group = H // Hkv
    out = np.zeros(q.shape)
    lse = np.full((B, H, Sq), -np.inf)
    dq = np.zeros(q.shape)
    dk = np.zeros(k.shape)
    dv = np.zeros(v.shape)
    for b in range(B):
        for h in range(H):
            kvh = h // group
            for i in range(Sq):
                visible = [j for j in range(Sk) if (not causal) or j - i <= Sk - Sq]
                if not visible:
                    continue
                scores = [scale * sum(q[b, i, h, d] * k[b, j, kvh, d] for d in range(D)) for j in visible]
                top = max(scores)
                weights = [math.exp(s - top) for s in scores]
                total = sum(weights)
                probs = np.array([w / total for w in weights])
                lse[b, h, i] = top + math.log(total)
                for p, j in zip(probs, visible):
                    out[b, i, h] += p * v[b, j, kvh]
                # d loss / d prob_j = do_i . v_j ; d loss / d score = J^T g with J = diag(p) - p p^T
                g = np.array([np.dot(do[b, i, h], v[b, j, kvh]) for j in visible])
                jac = np.diag(probs) - np.outer(probs, probs)
                dscore = jac.T @ g
                for t, j in enumerate(visible):
                    dq[b, i, h] += scale * dscore[t] * k[b, j, kvh]
                    dk[b, j, kvh] += scale * dscore[t] * q[b, i, h]
                    dv[b, j, kvh] += probs[t] * do[b, i, h]
    return out, lse, dq, dk, dv


def _scale_of(c):
    return 1.0 / math.sqrt(c["D"]) if c["scale"] is None else c["scale"]


SMALL_CASES = [
    _case(1, 1, 1, 2, 1, 4, False),
    _case(1, 1, 1, 2, 2, 4, True),
    _case(1, 1, 7, 2, 2, 4, True),               # Sq < Sk: the single query sees every key
    _case(2, 5, 3, 2, 1, 4, True),               # Sq > Sk: query rows 0, 1 see no key
    _case(1, 7, 1, 2, 2, 4, True),               # Sq > Sk: only the last row sees a key
    _case(1, 7, 5, 2, 2, 8, False),
    _case(2, 3, 7, 2, 1, 8, True),
    _case(1, 7, 7, 2, 1, 4, True),
    _case(2, 5, 5, 2, 2, 4, False, scale=0.7),
    _case(1, 3, 5, 2, 1, 8, False),
    _case(1, 5, 7, 4, 2, 4, True, scale=1.3),
]


# ------------------------------------------------------------------------------------------------------------
# float64 oracle: finite differences
# ------------------------------------------------------------------------------------------------------------
def _numeric_grad(f, x, eps=1e-6):
    g = np.zeros_like(x)
    flat, gflat = x.reshape(-1), g.reshape(-1)
    for idx in range(flat.size):
        orig = flat[idx]
        flat[idx] = orig + eps
        up = f()
        flat[idx] = orig - eps
        down = f()
        flat[idx] = orig
        gflat[idx] = (up - down) / (2 * eps)
    return g


@pytest.mark.parametrize("c", SMALL_CASES)
def test_gradients_match_finite_differences(c):
    q, k, v, do = _inputs(c, seed=1)
    kw = dict(causal=c["causal"], softmax_scale=c["scale"])

    def loss():
        return float(np.sum(reference.forward(q, k, v, **kw)[0] * do))

    out, lse = reference.forward(q, k, v, **kw)
    dq, dk, dv = reference.backward(do, q, k, v, out, lse, **kw)
    for name, analytic, x in (("dq", dq, q), ("dk", dk, k), ("dv", dv, v)):
        numeric = _numeric_grad(loss, x)
        np.testing.assert_allclose(analytic, numeric, rtol=1e-6, atol=1e-8, err_msg=name)


def test_rows_that_see_no_key():
    # Sq=6 > Sk=3, causal: query i sees key j iff j <= i - 3, so rows 0..2 see nothing.
    c = dict(B=2, Sq=6, Sk=3, H=4, Hkv=2, D=8, causal=True, scale=None)
    q, k, v, do = _inputs(c, seed=2)
    out, lse = reference.forward(q, k, v, causal=True)
    dq, dk, dv = reference.backward(do, q, k, v, out, lse, causal=True)
    dead = slice(0, 3)
    assert np.all(out[:, dead] == 0.0)
    assert np.all(lse[:, :, dead] == -np.inf)
    assert np.all(dq[:, dead] == 0.0)
    assert np.all(np.isfinite(lse[:, :, 3:]))
    for t in (out, dq, dk, dv):
        assert np.all(np.isfinite(t))
    # The dead rows add nothing to dk/dv: changing their q and do changes no bit of dk, dv.
    rng = np.random.default_rng(3)
    q2, do2 = q.copy(), do.copy()
    q2[:, dead] = rng.standard_normal(q2[:, dead].shape)
    do2[:, dead] = rng.standard_normal(do2[:, dead].shape)
    out2, lse2 = reference.forward(q2, k, v, causal=True)
    _, dk2, dv2 = reference.backward(do2, q2, k, v, out2, lse2, causal=True)
    np.testing.assert_array_equal(dk2, dk)
    np.testing.assert_array_equal(dv2, dv)
    # Finite differences agree on the dead rows too (gradient exactly 0 there).
    loss = lambda: float(np.sum(reference.forward(q, k, v, causal=True)[0] * do))  # noqa: E731
    np.testing.assert_allclose(dq, _numeric_grad(loss, q), rtol=1e-6, atol=1e-8)


# ------------------------------------------------------------------------------------------------------------
# float64 oracle: independent formulation and identities
# ------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("c", SMALL_CASES)
def test_matches_naive_loop_formulation(c):
    q, k, v, do = _inputs(c, seed=4)
    kw = dict(causal=c["causal"], softmax_scale=c["scale"])
    out, lse = reference.forward(q, k, v, **kw)
    dq, dk, dv = reference.backward(do, q, k, v, out, lse, **kw)
    n_out, n_lse, n_dq, n_dk, n_dv = _naive(q, k, v, do, c["causal"], _scale_of(c))
    np.testing.assert_allclose(out, n_out, rtol=1e-12, atol=1e-13, err_msg="out")
    np.testing.assert_array_equal(np.isinf(lse), np.isinf(n_lse))
    np.testing.assert_allclose(lse, n_lse, rtol=1e-12, atol=1e-13, err_msg="lse")
    np.testing.assert_allclose(dq, n_dq, rtol=1e-11, atol=1e-12, err_msg="dq")
    np.testing.assert_allclose(dk, n_dk, rtol=1e-11, atol=1e-12, err_msg="dk")
    np.testing.assert_allclose(dv, n_dv, rtol=1e-11, atol=1e-12, err_msg="dv")


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("Sq,Sk", [(9, 4), (4, 9), (6, 6)], ids=["Sq>Sk", "Sq<Sk", "Sq=Sk"])
def test_lse_is_logsumexp_of_masked_scaled_scores(Sq, Sk, causal):
    c = dict(B=2, Sq=Sq, Sk=Sk, H=3, Hkv=1, D=16, causal=causal, scale=None)
    # Scores of magnitude ~1e3: a naive exp would overflow; the reference must stay exact.
    q, k, v, _ = _inputs(c, seed=5, mag=20.0)
    out, lse = reference.forward(q, k, v, causal=causal)
    scores = np.einsum("bihd,bjhd->bhij", q, np.repeat(k, 3, axis=2)) / math.sqrt(16)
    visible = np.array([[(not causal) or j <= i + Sk - Sq for j in range(Sk)] for i in range(Sq)])
    masked = np.where(visible, scores, -np.inf)
    expected = np.logaddexp.reduce(masked, axis=-1)
    assert np.abs(scores).max() > 710             # exp() of that overflows float64
    np.testing.assert_array_equal(np.isinf(lse), np.isinf(expected))
    np.testing.assert_allclose(lse, expected, rtol=1e-13)
    assert np.all(np.isfinite(out))
    # Rows that see a key are convex combinations of v rows.
    dead = ~visible.any(axis=1)
    live = out[:, ~dead]
    vmax = np.repeat(v, 3, axis=2).max(axis=1, keepdims=True)
    vmin = np.repeat(v, 3, axis=2).min(axis=1, keepdims=True)
    assert np.all(live <= vmax + 1e-12) and np.all(live >= vmin - 1e-12)
    assert dead.any() == (causal and Sq > Sk)
    assert np.all(out[:, dead] == 0.0) and np.all(lse[:, :, dead] == -np.inf)


def test_default_scale_and_input_dtypes():
    c = dict(B=1, Sq=5, Sk=6, H=2, Hkv=1, D=8, causal=True, scale=None)
    q, k, v, do = _inputs(c, seed=6)
    out, lse = reference.forward(q, k, v, causal=True)
    out2, lse2 = reference.forward(q, k, v, causal=True, softmax_scale=1 / math.sqrt(8))
    np.testing.assert_array_equal(out, out2)
    np.testing.assert_array_equal(lse, lse2)
    for dt in (BF16, FP16, np.dtype(np.float32)):
        ql, kl, vl, dol = (t.astype(dt) for t in (q, k, v, do))
        o, l = reference.forward(ql, kl, vl, causal=True)
        assert o.dtype == np.float64 and l.dtype == np.float64 and o.shape == (1, 5, 2, 8) and l.shape == (1, 2, 5)
        # Same as running the float64 code on the exactly-converted values.
        up = [t.astype(np.float64) for t in (ql, kl, vl, dol)]
        o64, l64 = reference.forward(*up[:3], causal=True)
        np.testing.assert_array_equal(o, o64)
        grads = reference.backward(dol, ql, kl, vl, o.astype(np.float32), l.astype(np.float32), causal=True)
        for g, shape in zip(grads, ((1, 5, 2, 8), (1, 6, 1, 8), (1, 6, 1, 8))):
            assert g.dtype == np.float64 and g.shape == shape


def test_gqa_equals_repeated_kv_heads():
    c = dict(B=2, Sq=5, Sk=7, H=6, Hkv=2, D=4, causal=True, scale=None)
    q, k, v, do = _inputs(c, seed=7)
    out, lse = reference.forward(q, k, v, causal=True)
    dq, dk, dv = reference.backward(do, q, k, v, out, lse, causal=True)
    kr, vr = np.repeat(k, 3, axis=2), np.repeat(v, 3, axis=2)
    out_r, lse_r = reference.forward(q, kr, vr, causal=True)
    dq_r, dk_r, dv_r = reference.backward(do, q, kr, vr, out_r, lse_r, causal=True)
    np.testing.assert_allclose(out, out_r, rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(lse, lse_r, rtol=1e-13)
    np.testing.assert_allclose(dq, dq_r, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(dk, dk_r.reshape(2, 7, 2, 3, 4).sum(axis=3), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(dv, dv_r.reshape(2, 7, 2, 3, 4).sum(axis=3), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_row_chunking_does_not_change_results(monkeypatch, causal):
    c = dict(B=2, Sq=11, Sk=6, H=4, Hkv=2, D=8, causal=causal, scale=None)
    q, k, v, do = _inputs(c, seed=8)
    whole_f = reference.forward(q, k, v, causal=causal)
    whole_b = reference.backward(do, q, k, v, *whole_f, causal=causal)
    whole_lp = reference.backward_lowp(do, q, k, v, *whole_f, causal=causal, dtype=BF16)
    monkeypatch.setattr(reference, "_CHUNK_ELEMS", 30)     # 2 query rows (x 2 heads x 6 keys) per chunk
    assert reference._row_chunk(11, 2, 6) == 2
    chunk_f = reference.forward(q, k, v, causal=causal)
    chunk_b = reference.backward(do, q, k, v, *chunk_f, causal=causal)
    chunk_lp = reference.backward_lowp(do, q, k, v, *whole_f, causal=causal, dtype=BF16)
    for a, b in zip(whole_f + whole_b, chunk_f + chunk_b):
        np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-14)
    np.testing.assert_array_equal(whole_lp[0], chunk_lp[0])           # dq rows are independent of chunking
    for a, b in zip(whole_lp[1:], chunk_lp[1:]):                      # dk, dv: float32 sum order may differ
        np.testing.assert_allclose(a.astype(np.float64), b.astype(np.float64), rtol=2e-2, atol=2e-2)


def test_shape_validation():
    q = np.zeros((1, 4, 3, 8))
    with pytest.raises(ValueError, match="multiple"):
        reference.forward(q, np.zeros((1, 4, 2, 8)), np.zeros((1, 4, 2, 8)))
    with pytest.raises(ValueError):
        reference.forward(q, np.zeros((2, 4, 3, 8)), np.zeros((2, 4, 3, 8)))
    with pytest.raises(ValueError):
        reference.forward(q, np.zeros((1, 4, 3, 8)), np.zeros((1, 5, 3, 8)))
    out, lse = reference.forward(q, np.zeros((1, 4, 3, 8)), np.zeros((1, 4, 3, 8)))
    with pytest.raises(ValueError, match="lse"):
        reference.backward(out, q, np.zeros((1, 4, 3, 8)), np.zeros((1, 4, 3, 8)), out, lse[:, :, :2])


# ------------------------------------------------------------------------------------------------------------
# low-precision baselines and FA3's tolerance rule
# ------------------------------------------------------------------------------------------------------------
LOWP = [pytest.param(BF16, 3e-2, id="bf16"), pytest.param(FP16, 4e-3, id="fp16")]
LOWP_SHAPES = [
    _case(2, 64, 48, 4, 2, 32, True),            # Sq > Sk: 16 rows see no key
    _case(1, 40, 72, 2, 1, 64, True),            # Sq < Sk
    _case(2, 33, 33, 2, 2, 16, False),
]


def _run_all(c, dt):
    q, k, v, do = _inputs(c, seed=9, dtype=dt)
    kw = dict(causal=c["causal"], softmax_scale=c["scale"])
    out, lse = reference.forward(q, k, v, **kw)
    grads = reference.backward(do, q, k, v, out, lse, **kw)
    out_lp, lse_lp = reference.forward_lowp(q, k, v, **kw, dtype=dt)
    grads_lp = reference.backward_lowp(do, q, k, v, out_lp, lse_lp, **kw, dtype=dt)
    names = ("out", "lse", "dq", "dk", "dv")
    return names, (out, lse) + tuple(grads), (out_lp, lse_lp) + tuple(grads_lp)


@pytest.mark.parametrize("c", LOWP_SHAPES)
@pytest.mark.parametrize("dt,tol", LOWP)
def test_lowp_is_close_but_not_equal(c, dt, tol):
    names, ref, lowp = _run_all(c, dt)
    assert lowp[0].dtype == dt and lowp[1].dtype == np.float32
    assert all(g.dtype == dt for g in lowp[2:])
    for name, r, l in zip(names, ref, lowp):
        assert l.shape == r.shape, name
        l64 = l.astype(np.float64)
        assert np.array_equal(np.isinf(l64), np.isinf(r)), name
        fin = np.isfinite(r)
        err = np.abs(l64[fin] - r[fin]).max()
        scale = max(1.0, np.abs(r[fin]).max())
        assert 0 < err <= tol * scale, (name, err, scale)
    if c["causal"] and c["Sq"] > c["Sk"]:
        dead = slice(0, c["Sq"] - c["Sk"])
        assert np.all(lowp[0][:, dead].astype(np.float64) == 0) and np.all(lowp[1][:, :, dead] == -np.inf)
        assert np.all(lowp[2][:, dead].astype(np.float64) == 0)


@pytest.mark.parametrize("c", LOWP_SHAPES)
@pytest.mark.parametrize("dt,tol", LOWP)
def test_fa3_rule_accepts_good_results(c, dt, tol):
    names, ref, lowp = _run_all(c, dt)
    for name, r, l in zip(names, ref, lowp):
        # The low-precision baseline itself passes (err = base <= 2 * base + atol) ...
        err, bound = reference.assert_close_fa3(name, l, r, l)
        assert err > 0 and err <= bound
        # ... and so does the exact answer rounded once to the output dtype (what a good kernel approaches).
        reference.assert_close_fa3(name, r.astype(l.dtype), r, l)


@pytest.mark.parametrize("c", LOWP_SHAPES)
@pytest.mark.parametrize("dt,tol", LOWP)
def test_fa3_rule_rejects_bad_results(c, dt, tol):
    names, ref, lowp = _run_all(c, dt)
    rng = np.random.default_rng(10)
    for name, r, l in zip(names, ref, lowp):
        if name == "lse":
            continue
        l64 = l.astype(np.float64)
        # Ten times the low-precision implementation's error.
        with pytest.raises(AssertionError, match=name):
            reference.assert_close_fa3(name, (r + 10 * (l64 - r)).astype(dt), r, l)
        # A permuted tensor (sequence positions shuffled).
        axis = 1
        perm = rng.permutation(r.shape[axis])
        while np.array_equal(perm, np.arange(r.shape[axis])):
            perm = rng.permutation(r.shape[axis])
        with pytest.raises(AssertionError, match=name):
            reference.assert_close_fa3(name, np.take(l, perm, axis=axis), r, l)
    # One corrupted element: the message names the tensor, the error, the bound and the worst index.
    out, out_lp = ref[0], lowp[0]
    _, bound = reference.assert_close_fa3("out", out_lp, out, out_lp)
    bad = out_lp.astype(np.float64)
    idx = (0, out.shape[1] - 1, 1, 3)
    bad[idx] = out[idx] + 3 * bound
    with pytest.raises(AssertionError) as info:
        reference.assert_close_fa3("out_corrupted", bad.astype(dt), out, out_lp)
    msg = str(info.value)
    assert "out_corrupted" in msg and "bound" in msg and str(idx) in msg


def test_fa3_rule_infinities_nan_and_shapes():
    c = dict(B=1, Sq=8, Sk=5, H=2, Hkv=1, D=16, causal=True, scale=None)
    q, k, v, _ = _inputs(c, seed=11, dtype=BF16)
    _, lse = reference.forward(q, k, v, causal=True)
    _, lse_lp = reference.forward_lowp(q, k, v, causal=True, dtype=BF16)
    assert np.isinf(lse).any()
    # -inf where the reference has -inf counts as exact.
    err, _ = reference.assert_close_fa3("lse", lse.astype(np.float32), lse, lse_lp)
    assert np.isfinite(err)
    # A finite value where the reference says -inf, or a NaN anywhere, is rejected.
    finite_where_dead = lse.astype(np.float32)
    finite_where_dead[0, 0, 0] = 0.0
    with pytest.raises(AssertionError, match=r"lse.*\(0, 0, 0\)"):
        reference.assert_close_fa3("lse", finite_where_dead, lse, lse_lp)
    with_nan = lse.astype(np.float32)
    with_nan[0, 1, 7] = np.nan
    with pytest.raises(AssertionError, match=r"\(0, 1, 7\)"):
        reference.assert_close_fa3("lse", with_nan, lse, lse_lp)
    with pytest.raises(AssertionError, match="shape"):
        reference.assert_close_fa3("lse", lse[:, :, :4], lse, lse_lp)


def test_fa3_atol_is_rounding_noise_of_the_dtype():
    ref = np.array([0.0, 0.01, 0.25, 1.7, -3.3])
    # With actual == lowp == ref the bound is atol alone: 2 * max|(r + 0.3 - 0.3) - r| + 1e-6, with the dtype
    # taken from ``dtype=`` (by default from ``actual``).
    _, b_bf16 = reference.assert_close_fa3("x", ref, ref, ref, dtype=BF16)
    _, b_fp16 = reference.assert_close_fa3("x", ref, ref, ref, dtype=FP16)
    _, b_fp32 = reference.assert_close_fa3("x", ref.astype(np.float32), ref, ref.astype(np.float32))
    assert b_fp32 < b_fp16 < b_bf16
    # Below magnitude 4 a bf16 ulp is at most 2**-6 and an fp16 ulp 2**-9; the noise is at most one ulp.
    assert b_bf16 <= 2 * 2 ** -6 + 1e-6
    assert b_fp16 <= 2 * 2 ** -9 + 1e-6
    assert b_fp32 < 1e-5
    with pytest.raises(AssertionError):
        reference.assert_close_fa3("x", ref.astype(BF16) + np.float32(0.1), ref, ref)
    # Explicit rtol scales the baseline error.
    lowp = ref + 0.5
    err, bound = reference.assert_close_fa3("x", ref + 0.9, ref, lowp, rtol=2.0)
    assert math.isclose(err, 0.9) and bound > 1.0
    with pytest.raises(AssertionError):
        reference.assert_close_fa3("x", ref + 0.9, ref, lowp, rtol=1.0)


@pytest.mark.parametrize("sq,sk", [(7, 7), (5, 11), (11, 5)])
@pytest.mark.parametrize("window,causal", [((-1, -1), False), ((-1, -1), True), ((2, -1), False), ((-1, 3), False),
                                           ((2, 3), False), ((3, 0), False), ((4, -1), True), ((0, 0), False)])
def test_visibility_mask_matches_the_definition(sq, sk, window, causal):
    mask = reference.visibility_mask(sq, sk, causal, window)
    left, right = window[0], 0 if causal else window[1]
    for i in range(sq):
        for j in range(sk):
            d = i + sk - sq
            want = (left < 0 or j >= d - left) and (right < 0 or j <= d + right)
            assert mask[i, j] == want, (i, j)
    if window == (-1, -1):
        assert (mask == reference.causal_mask(sq, sk, causal)).all()


def test_window_forward_equals_masking_by_hand():
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((1, n, 2, 8)) for n in (9, 13, 13))
    out, lse = reference.forward(q, k, v, window=(3, 2))
    mask = reference.visibility_mask(9, 13, False, (3, 2))
    s = np.einsum("bihd,bjhd->bhij", q, k) / np.sqrt(8)
    s = np.where(mask, s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    want = np.einsum("bhij,bjhd->bihd", p / p.sum(-1, keepdims=True), v)
    np.testing.assert_allclose(out, want, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(lse, np.log(np.exp(s).sum(-1)), rtol=1e-12)


# ------------------------------------------------------------------------------------------------------------
# logit soft-capping
# ------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("softcap", [0.7, 3.0], ids=["cap0.7", "cap3"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_softcap_gradients_match_finite_differences(softcap, causal):
    """With a cap the logits are c tanh(scale q.k / c): the backward's extra factor 1 - tanh^2 against central
    differences, with scores large enough (mag 2) that the cap bends them."""
    c = dict(B=1, Sq=5, Sk=7, H=2, Hkv=1, D=4, causal=causal, scale=None)
    q, k, v, do = _inputs(c, seed=11, mag=2.0)
    kw = dict(causal=causal, softcap=softcap)

    def loss():
        return float(np.sum(reference.forward(q, k, v, **kw)[0] * do))

    out, lse = reference.forward(q, k, v, **kw)
    dq, dk, dv = reference.backward(do, q, k, v, out, lse, **kw)
    for name, analytic, x in (("dq", dq, q), ("dk", dk, k), ("dv", dv, v)):
        np.testing.assert_allclose(analytic, _numeric_grad(loss, x), rtol=1e-6, atol=1e-8, err_msg=name)


def test_softcap_bounds_the_logits_and_vanishes_for_a_large_cap():
    c = dict(B=1, Sq=9, Sk=9, H=2, Hkv=2, D=8, causal=False, scale=None)
    q, k, v, do = _inputs(c, seed=12, mag=3.0)
    _, lse_capped = reference.forward(q, k, v, softcap=1.0)
    assert np.all(lse_capped <= 1.0 + math.log(9) + 1e-12)        # every logit < 1: lse < 1 + log(Sk)
    plain = reference.forward(q, k, v)
    loose = reference.forward(q, k, v, softcap=1e6)
    for a, b in zip(plain, loose):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-9)
    with pytest.raises(ValueError, match="softcap"):
        reference.forward(q, k, v, softcap=-1.0)


def test_softcap_lowp_baseline_is_close_but_not_equal():
    c = dict(B=1, Sq=33, Sk=40, H=2, Hkv=1, D=16, causal=True, scale=None)
    q, k, v, do = _inputs(c, seed=13, mag=2.0)
    ref = reference.forward(q, k, v, causal=True, softcap=5.0)
    low = reference.forward_lowp(q, k, v, causal=True, softcap=5.0, dtype=BF16)
    np.testing.assert_allclose(low[0].astype(np.float64), ref[0], atol=3e-2)
    assert not np.array_equal(low[0].astype(np.float64), ref[0])
    dref = reference.backward(do, q, k, v, *ref, causal=True, softcap=5.0)
    dlow = reference.backward_lowp(do, q, k, v, *low, causal=True, softcap=5.0, dtype=BF16)
    for a, b in zip(dlow, dref):
        np.testing.assert_allclose(a.astype(np.float64), b, atol=6e-2)
