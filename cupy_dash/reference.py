"""NumPy reference attention, the oracle every GPU test compares against: float64 (:func:`forward`,
:func:`backward`), the input precision (:func:`forward_lowp`, :func:`backward_lowp`) and FA3's tolerance rule
(:func:`assert_close_fa3`). Layout (FlashAttention's, GQA: query head ``h`` reads kv head ``h // (H // Hkv)``) and
the two precisions: docs/api.md, "The float64 reference".
"""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np

__all__ = ["forward", "backward", "forward_lowp", "backward_lowp", "assert_close_fa3", "causal_mask",
           "visibility_mask"]

# Score-matrix elements per chunk (float64: 32 MiB per matrix).
_CHUNK_ELEMS = 1 << 22

_LOWP_DTYPES = (np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16), np.dtype(np.float32))


# --------------------------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------------------------
def causal_mask(seqlen_q: int, seqlen_k: int, causal: bool = True) -> np.ndarray:
    """Boolean ``(Sq, Sk)`` visibility mask: ``mask[i, j]`` is True iff query ``i`` may attend to key ``j``.

    With ``causal`` the alignment is bottom-right: ``j <= i + Sk - Sq``. Without it every entry is True.
    """
    return visibility_mask(seqlen_q, seqlen_k, causal)


def visibility_mask(seqlen_q: int, seqlen_k: int, causal: bool = False, window=(-1, -1)) -> np.ndarray:
    """Boolean ``(Sq, Sk)`` mask with a sliding window (FlashAttention's ``window_size``): query ``i`` sees key
    ``j`` iff ``i + Sk - Sq - left <= j <= i + Sk - Sq + right``, a side of -1 being unbounded; ``causal`` sets
    right to 0."""
    left, right = window
    if causal:
        right = 0
    i = np.arange(seqlen_q)[:, None]
    j = np.arange(seqlen_k)[None, :]
    diag = i + (seqlen_k - seqlen_q)
    mask = np.ones((seqlen_q, seqlen_k), dtype=bool)
    if right >= 0:
        mask &= j <= diag + right
    if left >= 0:
        mask &= j >= diag - left
    return mask


def _check_shapes(q, k, v, extra=()):
    """Validate the q/k/v shapes; return (B, Sq, Sk, H, Hkv, D, Dv)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.ndim != 4:
            raise ValueError(f"{name} must be 4-D (batch, seqlen, heads, headdim), got shape {t.shape}")
    B, Sq, H, D = q.shape
    Bk, Sk, Hkv, Dk = k.shape
    if Bk != B or Dk != D:
        raise ValueError(f"k shape {k.shape} does not match q shape {q.shape} (batch and headdim must agree)")
    if v.shape[:3] != k.shape[:3]:
        raise ValueError(f"v shape {v.shape} does not match k shape {k.shape} in (batch, seqlen_k, heads_kv)")
    if Hkv == 0 or H % Hkv != 0:
        raise ValueError(f"number of query heads {H} must be a multiple of the number of kv heads {Hkv}")
    Dv = v.shape[3]
    for name, t, shape in extra:
        if tuple(t.shape) != tuple(shape):
            raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(t.shape)}")
    return B, Sq, Sk, H, Hkv, D, Dv


def _scale(softmax_scale, D):
    return 1.0 / math.sqrt(D) if softmax_scale is None else float(softmax_scale)


def _softcap(softcap) -> float:
    """``softcap`` as a float >= 0 (0: no cap); raises ValueError naming it otherwise."""
    c = float(softcap)
    if not (np.isfinite(c) and c >= 0):
        raise ValueError(f"softcap: expected a finite number >= 0 (0: none), got {softcap!r}")
    return c


def _row_chunk(Sq, g, Sk):
    """Number of query rows per chunk so that (rows * g, Sk) stays below _CHUNK_ELEMS elements."""
    return max(1, min(Sq, _CHUNK_ELEMS // max(1, g * Sk)))


def _identity(x):
    return x


def _rounder(dtype):
    """Function that rounds a float32 array to ``dtype`` and returns it as float32 again."""
    dtype = np.dtype(dtype)
    if dtype == np.float32:
        return _identity

    def rnd(x):
        return x.astype(dtype).astype(np.float32)

    return rnd


def _lowp_dtype(dtype, like):
    if dtype is None:
        dtype = like.dtype
    dtype = np.dtype(dtype)
    if dtype not in _LOWP_DTYPES:
        raise ValueError(f"low-precision dtype must be bfloat16, float16 or float32, got {dtype}")
    return dtype


# --------------------------------------------------------------------------------------------------------------
# shared core (float64 with no rounding, or float32 with rounding to a low-precision dtype)
# --------------------------------------------------------------------------------------------------------------
def _scores(qk, scale, softcap, work):
    """Logits from raw dot products: ``qk * scale``, or with a cap c > 0 ``c * tanh(qk * scale / c)``; and the
    factor ``1 - tanh^2`` that the cap puts on their gradient (None without a cap)."""
    if not softcap:
        return qk * work.type(scale), None
    t = np.tanh(qk * work.type(scale / softcap))
    return t * work.type(softcap), 1 - t * t


def _forward_core(q, k, v, causal, scale, work, rnd, window=(-1, -1), softcap=0.0):
    """q, k, v already in the work dtype. Returns out (B, Sq, H, Dv) and lse (B, H, Sq), both in ``work``."""
    B, Sq, Sk, H, Hkv, D, Dv = _check_shapes(q, k, v)
    g = H // Hkv
    out = np.zeros((B, Sq, H, Dv), dtype=work)
    lse = np.full((B, H, Sq), -np.inf, dtype=work)
    if Sq == 0 or Sk == 0:
        return out, lse
    mask_full = visibility_mask(Sq, Sk, causal, window)
    rows = _row_chunk(Sq, g, Sk)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        for b in range(B):
            for hk in range(Hkv):
                heads = slice(hk * g, (hk + 1) * g)
                kt = np.ascontiguousarray(k[b, :, hk, :].T)          # (D, Sk)
                vv = np.ascontiguousarray(v[b, :, hk, :])            # (Sk, Dv)
                for i0 in range(0, Sq, rows):
                    i1 = min(Sq, i0 + rows)
                    n = i1 - i0
                    # (n, g, D) -> (n*g, D): row r = (query i0 + r // g, head hk*g + r % g)
                    qg = q[b, i0:i1, heads, :].reshape(n * g, D)
                    s = rnd(_scores(qg @ kt, scale, softcap, work)[0])   # (n*g, Sk) logits
                    mask = np.repeat(mask_full[i0:i1], g, axis=0)    # (n*g, Sk)
                    s = np.where(mask, s, -np.inf)
                    m = s.max(axis=1)
                    m_safe = np.where(np.isfinite(m), m, 0).astype(work)
                    p = np.exp(s - m_safe[:, None])                  # masked entries -> exp(-inf) = 0
                    l = p.sum(axis=1)
                    seen = l > 0
                    row_lse = np.where(seen, m_safe + np.log(np.where(seen, l, 1)), -np.inf)
                    p = rnd(p / np.where(seen, l, 1)[:, None])       # normalised probabilities
                    o = rnd(p @ vv)                                   # (n*g, Dv); 0 for unseen rows
                    out[b, i0:i1, heads, :] = o.reshape(n, g, Dv)
                    lse[b, heads, i0:i1] = row_lse.reshape(n, g).T
    return out, lse


def _backward_core(do, q, k, v, out, lse, causal, scale, work, rnd, window=(-1, -1), softcap=0.0):
    """All tensors already in the work dtype. Returns dq, dk, dv in ``work``."""
    B, Sq, Sk, H, Hkv, D, Dv = _check_shapes(q, k, v)
    _check_shapes(q, k, v, extra=(("do", do, (B, Sq, H, Dv)), ("out", out, (B, Sq, H, Dv)),
                                  ("lse", lse, (B, H, Sq))))
    g = H // Hkv
    dq = np.zeros((B, Sq, H, D), dtype=work)
    dk = np.zeros((B, Sk, Hkv, D), dtype=work)
    dv = np.zeros((B, Sk, Hkv, Dv), dtype=work)
    if Sq == 0 or Sk == 0:
        return dq, dk, dv
    mask_full = visibility_mask(Sq, Sk, causal, window)
    rows = _row_chunk(Sq, g, Sk)
    sc = work.type(scale)
    # D_i = rowsum(dO * O), (B, Sq, H), accumulated in the work precision.
    delta = np.einsum("bshd,bshd->bsh", do, out)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        for b in range(B):
            for hk in range(Hkv):
                heads = slice(hk * g, (hk + 1) * g)
                kk = np.ascontiguousarray(k[b, :, hk, :])            # (Sk, D)
                vv = np.ascontiguousarray(v[b, :, hk, :])            # (Sk, Dv)
                dk_acc = np.zeros((Sk, D), dtype=work)
                dv_acc = np.zeros((Sk, Dv), dtype=work)
                for i0 in range(0, Sq, rows):
                    i1 = min(Sq, i0 + rows)
                    n = i1 - i0
                    qg = q[b, i0:i1, heads, :].reshape(n * g, D)
                    dog = do[b, i0:i1, heads, :].reshape(n * g, Dv)
                    lse_g = lse[b, heads, i0:i1].T.reshape(n * g)
                    delta_g = delta[b, i0:i1, heads].reshape(n * g)
                    mask = np.repeat(mask_full[i0:i1], g, axis=0)
                    valid = np.isfinite(lse_g)                        # lse = -inf: the row saw no key
                    lse_safe = np.where(valid, lse_g, 0).astype(work)
                    s, dcap = _scores(qg @ kk.T, scale, softcap, work)
                    s = rnd(s)
                    p = np.exp(np.where(mask, s, -np.inf) - lse_safe[:, None])
                    p = rnd(np.where(valid[:, None], p, 0).astype(work, copy=False))
                    dv_acc += p.T @ dog
                    dp = rnd(dog @ vv.T)                              # (n*g, Sk)
                    ds = p * (dp - delta_g[:, None])
                    ds = rnd(ds if dcap is None else ds * dcap)
                    dq[b, i0:i1, heads, :] = rnd((ds @ kk) * sc).reshape(n, g, D)
                    dk_acc += ds.T @ qg
                dk[b, :, hk, :] = rnd(dk_acc * sc)
                dv[b, :, hk, :] = rnd(dv_acc)
    return dq, dk, dv


# --------------------------------------------------------------------------------------------------------------
# float64 reference
# --------------------------------------------------------------------------------------------------------------
def forward(q, k, v, *, causal=False, softmax_scale=None, window=(-1, -1), softcap=0.0):
    """Exact (float64) attention forward.

    Args:
        q: ``(B, Sq, H, D)``, any numpy float dtype (including ``ml_dtypes.bfloat16`` and float16).
        k: ``(B, Sk, Hkv, D)`` with ``H % Hkv == 0``.
        v: ``(B, Sk, Hkv, Dv)`` (normally ``Dv == D``).
        causal: bottom-right aligned causal mask (query ``i`` sees key ``j`` iff ``j <= i + Sk - Sq``).
        softmax_scale: score scale, default ``1 / sqrt(D)``.
        window: ``(left, right)`` sliding window (:func:`visibility_mask`), ``(-1, -1)``: none.
        softcap: logit soft-capping, ``c > 0``: the logits are ``c * tanh(softmax_scale * q_i . k_j / c)``
            (Gemma 2's ``attn_logit_softcapping``); 0: none.

    Returns:
        ``(out, lse)``: ``out`` ``(B, Sq, H, Dv)`` float64 and ``lse`` ``(B, H, Sq)`` float64, the natural log of
        ``sum_j exp(logit_ij)`` over visible keys. Rows that see no key: ``out = 0``,
        ``lse = -inf``.
    """
    f64 = np.dtype(np.float64)
    q = np.asarray(q, dtype=f64)
    k = np.asarray(k, dtype=f64)
    v = np.asarray(v, dtype=f64)
    return _forward_core(q, k, v, causal, _scale(softmax_scale, q.shape[-1]), f64, _identity, window,
                         _softcap(softcap))


def backward(do, q, k, v, out, lse, *, causal=False, softmax_scale=None, window=(-1, -1), softcap=0.0):
    """Exact (float64) attention backward, FlashAttention's formulation.

    With ``S = softmax_scale * Q K^T`` (masked entries ``-inf``) and the *given* ``out`` and ``lse``:
    ``P = exp(S - lse)`` (0 where masked and on rows with ``lse = -inf``), ``dV = P^T dO``, ``dP = dO V^T``,
    ``D = rowsum(dO * O)``, ``dS = P * (dP - D)``, ``dQ = scale * dS K``, ``dK = scale * dS^T Q``; with a
    ``softcap`` c, ``S = c tanh(scale Q K^T / c)`` and dS gets the factor ``1 - (S / c)^2``. With GQA,
    ``dK`` and ``dV`` of a kv head are summed over the ``H // Hkv`` query heads that read it.

    Args:
        do: ``(B, Sq, H, Dv)`` upstream gradient of ``out``.
        q, k, v: as in :func:`forward`.
        out: ``(B, Sq, H, Dv)`` forward output (used for ``D = rowsum(dO * O)``, as the GPU kernel does).
        lse: ``(B, H, Sq)`` forward log-sum-exp (any float dtype; ``-inf`` marks rows that saw no key).

    Returns:
        ``(dq, dk, dv)`` float64 with shapes ``(B, Sq, H, D)``, ``(B, Sk, Hkv, D)``, ``(B, Sk, Hkv, Dv)``.
    """
    f64 = np.dtype(np.float64)
    do, q, k, v, out, lse = (np.asarray(t, dtype=f64) for t in (do, q, k, v, out, lse))
    return _backward_core(do, q, k, v, out, lse, causal, _scale(softmax_scale, q.shape[-1]), f64, _identity,
                          window, _softcap(softcap))


# --------------------------------------------------------------------------------------------------------------
# low-precision baseline (emulates a bf16 / fp16 PyTorch implementation)
# --------------------------------------------------------------------------------------------------------------
def forward_lowp(q, k, v, *, causal=False, softmax_scale=None, window=(-1, -1), dtype=None, softcap=0.0):
    """Attention forward "in the input precision": the baseline of FA3's tolerance rule.

    Computation (float32 arithmetic; ``rnd`` = round to ``dtype``):

    1. ``q, k, v`` are rounded to ``dtype``;
    2. ``S = rnd(float32(Q K^T) * softmax_scale)``, with a ``softcap`` c ``rnd(c tanh(float32(Q K^T) *
       softmax_scale / c))`` (masked entries set to ``-inf`` after rounding);
    3. softmax in float32 from the rounded ``S`` (max-subtracted), ``P = rnd(softmax(S))``;
       ``lse = log(sum exp(S))`` of the rounded ``S``, kept in float32 (like the GPU's fp32 lse);
    4. ``out = rnd(float32(P V))``.

    Args:
        q, k, v: as in :func:`forward`.
        dtype: ``ml_dtypes.bfloat16`` or ``np.float16`` (``np.float32`` gives an un-rounded float32 run);
            default: the dtype of ``q``.

    Returns:
        ``(out, lse)``: ``out`` ``(B, Sq, H, Dv)`` in ``dtype``, ``lse`` ``(B, H, Sq)`` float32.
    """
    dtype = _lowp_dtype(dtype, np.asarray(q))
    rnd = _rounder(dtype)
    f32 = np.dtype(np.float32)
    q, k, v = (rnd(np.asarray(t, dtype=f32)) for t in (q, k, v))
    out, lse = _forward_core(q, k, v, causal, _scale(softmax_scale, q.shape[-1]), f32, rnd, window,
                             _softcap(softcap))
    return out.astype(dtype), lse


def backward_lowp(do, q, k, v, out, lse, *, causal=False, softmax_scale=None, window=(-1, -1), dtype=None,
                  softcap=0.0):
    """Attention backward "in the input precision": the baseline of FA3's tolerance rule.

    Computation (float32 arithmetic; ``rnd`` = round to ``dtype``):

    1. ``do, q, k, v, out`` are rounded to ``dtype``; ``lse`` is used in float32;
    2. ``S = rnd(float32(Q K^T) * scale)``; ``P = rnd(exp(S - lse))`` (0 where masked or ``lse = -inf``);
    3. ``dP = rnd(float32(dO V^T))``; ``D = rowsum(dO * O)`` in float32 (not rounded: a vector, as in
       PyTorch's softmax backward); ``dS = rnd(P * (dP - D))``, with a ``softcap`` ``rnd(P * (dP - D) * (1 -
       tanh^2))`` (tanh in float32, not rounded);
    4. ``dQ = rnd(scale * float32(dS K))``; ``dK = rnd(scale * float32(dS^T Q))`` and ``dV = rnd(float32(P^T dO))``,
       where for GQA the float32 sums over the query heads of a group are rounded once.

    Args:
        As in :func:`backward`, plus ``dtype`` as in :func:`forward_lowp`.

    Returns:
        ``(dq, dk, dv)`` in ``dtype`` with shapes ``(B, Sq, H, D)``, ``(B, Sk, Hkv, D)``, ``(B, Sk, Hkv, Dv)``.
    """
    dtype = _lowp_dtype(dtype, np.asarray(q))
    rnd = _rounder(dtype)
    f32 = np.dtype(np.float32)
    do, q, k, v, out = (rnd(np.asarray(t, dtype=f32)) for t in (do, q, k, v, out))
    lse = np.asarray(lse, dtype=f32)
    dq, dk, dv = _backward_core(do, q, k, v, out, lse, causal, _scale(softmax_scale, q.shape[-1]), f32, rnd,
                                window, _softcap(softcap))
    return dq.astype(dtype), dk.astype(dtype), dv.astype(dtype)


# --------------------------------------------------------------------------------------------------------------
# FA3 tolerance rule
# --------------------------------------------------------------------------------------------------------------
def _absdiff(a, b):
    """|a - b| in float64 with equal entries (including equal infinities) giving exactly 0 and NaN -> inf."""
    with np.errstate(invalid="ignore"):
        d = np.abs(a - b)
    d = np.where(a == b, 0.0, d)
    return np.where(np.isnan(d), np.inf, d)


def _rounding_noise(ref64, dtype):
    """max |(r + 0.3 - 0.3) - r| with r = ref rounded to ``dtype`` and each operation rounded to ``dtype``."""
    if ref64.size == 0:
        return 0.0
    dtype = np.dtype(dtype)
    r = ref64.astype(dtype)
    if dtype == np.float64:
        t = (r + 0.3) - 0.3
    else:
        c = np.float32(0.3)      # a Python scalar in a bf16/fp16 torch op is applied in float32 op-math
        t = (r.astype(np.float32) + c).astype(dtype)
        t = (t.astype(np.float32) - c).astype(dtype)
    return float(_absdiff(t.astype(np.float64), r.astype(np.float64)).max())


def assert_close_fa3(name, actual, ref, lowp, *, rtol=2.0, dtype=None):
    """FA3's tolerance rule: ``max|actual - ref| <= rtol * max|lowp - ref| + atol``.

    ``ref`` is the float64 answer (:func:`forward` / :func:`backward`), ``lowp`` the same computation in the
    input precision (:func:`forward_lowp` / :func:`backward_lowp`), ``actual`` the result under test; all have
    the same shape. ``atol = 2 * max|(r + 0.3 - 0.3) - r| + 1e-6`` where ``r`` is ``ref`` rounded to the
    low-precision dtype and the additions are rounded in that dtype: the dtype's rounding noise at the values'
    magnitude. That dtype is ``dtype`` if given, else ``actual``'s dtype, or ``lowp``'s when ``actual`` is
    float64. Equal infinities (e.g. ``lse = -inf`` on rows that see no key) count as exact; NaN counts as an
    infinite error.

    Returns:
        ``(err, bound)`` as floats.

    Raises:
        AssertionError: naming ``name``, the max error, the bound and the index of the worst element.
    """
    actual = np.asarray(actual)
    lowp = np.asarray(lowp)
    ref = np.asarray(ref)
    if not (actual.shape == ref.shape == lowp.shape):
        raise AssertionError(f"{name}: shape mismatch: actual {actual.shape}, ref {ref.shape}, "
                             f"lowp {lowp.shape}")
    if dtype is None:
        dtype = actual.dtype if actual.dtype != np.float64 else lowp.dtype
    dtype = np.dtype(dtype)
    if dtype not in _LOWP_DTYPES and dtype != np.float64:
        dtype = np.dtype(np.float32)
    a64 = actual.astype(np.float64)
    r64 = ref.astype(np.float64)
    l64 = lowp.astype(np.float64)
    if a64.size == 0:
        return 0.0, 0.0
    diff = _absdiff(a64, r64)
    err = float(diff.max())
    base = float(_absdiff(l64, r64).max())
    atol = 2.0 * _rounding_noise(r64, dtype) + 1e-6
    bound = rtol * base + atol
    if not err <= bound:
        worst = tuple(int(i) for i in np.unravel_index(int(np.argmax(diff)), diff.shape))
        raise AssertionError(
            f"{name}: max |actual - ref| = {err:.6g} exceeds bound {bound:.6g} "
            f"(= {rtol:g} * max|lowp - ref| {base:.6g} + atol {atol:.6g}); worst element at index {worst}: "
            f"actual {a64[worst]!r}, ref {r64[worst]!r}, lowp {l64[worst]!r}")
    return err, bound
