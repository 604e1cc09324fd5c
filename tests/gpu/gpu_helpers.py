"""Helpers of the GPU tests in this folder (not a test module): the dtypes, schedules and cases of the backward
tests, uploads and downloads (bf16 through ml_dtypes included), bitwise and finiteness checks, pool poisoning,
inputs and float64 references cached per case, the repeat loop of the determinism tests, and the packed-batch
lengths of the varlen tests. Shared by test_gpu_attention.py, test_gpu_compact.py, test_gpu_fold.py,
test_gpu_gqa.py, test_gpu_window.py, test_gpu_varlen.py, test_gpu_varlen_bwd.py and test_gpu_softcap.py."""
from __future__ import annotations

import zlib
from dataclasses import dataclass

import ml_dtypes
import numpy as np

import cupy
import cupy_dash
from cupy_dash import reference

BF16 = np.dtype(ml_dtypes.bfloat16)
FP16 = np.dtype(np.float16)
DTYPES = {"bf16": BF16, "fp16": FP16}

POLICIES = ("fa3", "descending", "shift", "symmetric_shift", "auto")
ATOMIC = "atomic"           # test-id name of deterministic=False
BATCH, HEADS = 2, 3

DET_REPEATS = 100

LENGTHS = {  # the varlen tests' packed batches: (query lengths, key lengths) per sequence
    "mixed": ([1, 17, 128, 300, 1000, 129, 256], [1, 17, 128, 300, 1000, 129, 256]),
    "empty_and_unequal": ([0, 64, 200, 5, 513], [10, 0, 777, 5, 400]),
    "long_and_short": ([3000, 1, 64], [2048, 2, 64]),
}


# ----------------------------------------------------------------------------------------------------------------
# cases
# ----------------------------------------------------------------------------------------------------------------
class CaseDerived:
    """What a kernel-test case (a dataclass with dtype, causal, seqlen_q, seqlen_k and an ``id``) derives."""

    @property
    def np_dtype(self):
        return DTYPES[self.dtype]

    @property
    def empty_rows(self) -> int:
        """Number of leading query rows that see no key (bottom-right causal alignment)."""
        return max(0, self.seqlen_q - self.seqlen_k) if self.causal else 0

    def __str__(self):
        return self.id


@dataclass(frozen=True)
class Case(CaseDerived):
    dtype: str              # "bf16" | "fp16"
    hdim: int
    causal: bool
    seqlen_q: int
    seqlen_k: int
    batch: int = BATCH
    heads: int = HEADS
    hdim_v: int = 0         # v's head dim where it differs from hdim (kernels.VALUE_HEAD_DIMS)

    @property
    def dv(self) -> int:
        return self.hdim_v or self.hdim

    @property
    def id(self) -> str:
        mask = "causal" if self.causal else "full"
        value = f"-v{self.hdim_v}" if self.hdim_v else ""
        text = f"{self.dtype}-d{self.hdim}{value}-{mask}-sq{self.seqlen_q}-sk{self.seqlen_k}"
        if (self.batch, self.heads) != (BATCH, HEADS):
            text += f"-b{self.batch}-h{self.heads}"
        return text


def _schedule_kwargs(schedule):
    if schedule == ATOMIC:
        return dict(schedule="auto", deterministic=False)
    return dict(schedule=schedule, deterministic=True)


# ----------------------------------------------------------------------------------------------------------------
# host / device helpers
# ----------------------------------------------------------------------------------------------------------------
def _seed(text: str) -> int:
    return zlib.crc32(text.encode("utf-8"))


def _randn(rng, shape, dtype):
    return rng.standard_normal(shape, dtype=np.float32).astype(dtype)


def _dev(a: np.ndarray) -> cupy.ndarray:
    """Upload a numpy array (bf16 through ml_dtypes included) to the current CuPy device."""
    a = np.ascontiguousarray(a)
    try:
        return cupy.asarray(a)
    except Exception:
        if a.dtype.itemsize == 2:
            return cupy.asarray(a.view(np.uint16)).view(a.dtype)
        raise


def _host(x) -> np.ndarray:
    """Download a CuPy array to numpy, keeping the dtype (bf16 as ml_dtypes.bfloat16)."""
    try:
        return cupy.asnumpy(x)
    except Exception:
        if x.dtype.itemsize == 2:
            return cupy.asnumpy(x.view(cupy.uint16)).view(x.dtype)
        raise


def _bits(x) -> np.ndarray:
    """Raw bits of a CuPy / torch / JAX / numpy array as a host numpy integer array of the same shape."""
    module = type(x).__module__
    if module.startswith("torch"):
        import torch
        t = x.detach()
        as_int = {2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
        return t.contiguous().view(as_int).cpu().numpy()
    if isinstance(x, cupy.ndarray):
        a = _host(x)
    else:                                   # JAX arrays and numpy arrays
        a = np.asarray(x)
    a = np.ascontiguousarray(a)
    return a.view({2: np.int16, 4: np.int32, 8: np.int64}[a.dtype.itemsize])


def _assert_same_bits(name, actual, expected):
    a, e = _bits(actual), _bits(expected)
    assert a.shape == e.shape, f"{name}: shape {a.shape} != {e.shape}"
    if a.tobytes() != e.tobytes():
        n = int(np.count_nonzero(a != e))
        raise AssertionError(f"{name}: {n} of {a.size} elements differ bitwise")


def _poison_pool(nbytes: int) -> None:
    """Fill a block of the CuPy pool with 0xFF bytes and give it back, so that the next allocations on this
    stream (the API's outputs and workspaces) start as NaN instead of zeros left over from earlier tests."""
    buf = cupy.empty(int(nbytes), dtype=cupy.uint8)
    buf.fill(0xFF)
    del buf


def _poison_size(*arrays) -> int:
    return 8 * sum(int(a.nbytes) for a in arrays) + (1 << 20)


def _assert_finite(name, a, rows_from=0):
    """No NaN / Inf in a (B, S, H, D) host array (rows before ``rows_from`` are checked elsewhere)."""
    a = np.asarray(a)[:, rows_from:].astype(np.float32)
    bad = ~np.isfinite(a)
    if bad.any():
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        raise AssertionError(f"{name}: {int(bad.sum())} non-finite values, first at {where} "
                             f"(offset by {rows_from} rows): {a[where]!r}")


# ----------------------------------------------------------------------------------------------------------------
# inputs and float64 reference, cached per case
# ----------------------------------------------------------------------------------------------------------------
_CACHE: dict[str, dict] = {}     # case id -> inputs and references (test_gpu_attention.py evicts them when done)


def _case_data(case: Case, backward: bool = False) -> dict:
    data = _CACHE.get(case.id)
    if data is None:
        rng = np.random.default_rng(_seed(case.id))
        dt = case.np_dtype
        b, sq, sk, h, d, dv = case.batch, case.seqlen_q, case.seqlen_k, case.heads, case.hdim, case.dv
        data = dict(q=_randn(rng, (b, sq, h, d), dt), k=_randn(rng, (b, sk, h, d), dt),
                    v=_randn(rng, (b, sk, h, dv), dt), do=_randn(rng, (b, sq, h, dv), dt))
        q, k, v = data["q"], data["k"], data["v"]
        data["out_ref"], data["lse_ref"] = reference.forward(q, k, v, causal=case.causal)
        data["out_lowp"], data["lse_lowp"] = reference.forward_lowp(q, k, v, causal=case.causal, dtype=dt)
        _CACHE[case.id] = data
    if backward and "dq_ref" not in data:
        args = (data["do"], data["q"], data["k"], data["v"])
        data["dq_ref"], data["dk_ref"], data["dv_ref"] = reference.backward(
            *args, data["out_ref"], data["lse_ref"], causal=case.causal)
        data["dq_lowp"], data["dk_lowp"], data["dv_lowp"] = reference.backward_lowp(
            *args, data["out_lowp"], data["lse_lowp"], causal=case.causal, dtype=case.np_dtype)
        # What the GPU backward is given: the exact forward, in the precisions the forward kernel returns.
        data["out_in"] = data["out_ref"].astype(case.np_dtype)
        data["lse_in"] = data["lse_ref"].astype(np.float32)
    return data


# ----------------------------------------------------------------------------------------------------------------
# determinism and interop
# ----------------------------------------------------------------------------------------------------------------
def _repeat_backward(case, inputs, kwargs, repeats, busy=None):
    """Run the backward ``repeats`` times; return (first result, per-repeat counts of differing dq/dk/dv
    elements vs the first, as an int array (repeats - 1, 3)). ``case``: its ``causal``; None when ``kwargs`` hold
    it."""
    do, q, k, v, out, lse = inputs
    if case is not None:
        kwargs = dict(kwargs, causal=case.causal)
    first = cupy_dash.attention_backward(do, q, k, v, out, lse, **kwargs)
    first_bits = [x.view(cupy.int16) for x in first]
    diffs = []
    for _ in range(repeats - 1):
        if busy is not None:
            busy.step()
        grads = cupy_dash.attention_backward(do, q, k, v, out, lse, **kwargs)
        for x, x0 in zip(grads, first_bits):
            diffs.append(cupy.count_nonzero(x.view(cupy.int16) != x0))
    if busy is not None:
        busy.finish()
    counts = cupy.stack(diffs).reshape(repeats - 1, 3).get() if diffs else np.zeros((0, 3), np.int64)
    return first, counts


def _torch_from_host(a, device):
    import torch
    a = np.ascontiguousarray(a)
    if a.dtype == BF16:
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16).to(device)
    return torch.from_numpy(a).to(device)


# ----------------------------------------------------------------------------------------------------------------
# Cases of the kernels' numerical variants (soft-capping, the FMA-pipe exp2): (dtype, head dim, causal, Sq, Sk, H,
# Hkv, window, cap) with scores of several units, the float64 and low-precision references of both passes
# ----------------------------------------------------------------------------------------------------------------
def scaled_case_id(c) -> str:
    """``c``'s head dim is an int, or (q / k's, v's) where they differ."""
    dtype, d, causal, sq, sk, h, hkv, window, cap = c
    d = f"{d[0]}v{d[1]}" if isinstance(d, tuple) else d
    text = f"{dtype}-d{d}-{'causal' if causal else 'full'}-sq{sq}-sk{sk}-h{h}-hkv{hkv}-cap{cap:g}"
    return text + (f"-window{window[0]}_{window[1]}" if window != (-1, -1) else "")


_SCALED = {}


def scaled_case_data(c, mag: float) -> dict:
    """Inputs (q, k scaled by ``mag`` so that the scores reach several units), kwargs, and the forward's and the
    backward's float64 and low-precision references of case ``c``, cached."""
    key = (scaled_case_id(c), mag)
    if key not in _SCALED:
        dtype, d, causal, sq, sk, h, hkv, window, cap = c
        d, dv = d if isinstance(d, tuple) else (d, d)
        rng = np.random.default_rng(_seed(key[0]))
        q = (mag * _randn(rng, (1, sq, h, d), np.float32)).astype(DTYPES[dtype])
        k = (mag * _randn(rng, (1, sk, hkv, d), np.float32)).astype(DTYPES[dtype])
        v, do = _randn(rng, (1, sk, hkv, dv), DTYPES[dtype]), _randn(rng, (1, sq, h, dv), DTYPES[dtype])
        kw = dict(causal=causal, window=window, softcap=cap)
        out, lse = reference.forward(q, k, v, **kw)
        out_lowp, lse_lowp = reference.forward_lowp(q, k, v, **kw)
        _SCALED[key] = dict(q=q, k=k, v=v, do=do, out=out, lse=lse, out_lowp=out_lowp, lse_lowp=lse_lowp, kw=kw,
                            grads=reference.backward(do, q, k, v, out, lse, **kw),
                            grads_lowp=reference.backward_lowp(do, q, k, v, out_lowp, lse_lowp, **kw))
    return _SCALED[key]


def assert_scaled_forward(data: dict, out, lse, cap: float) -> None:
    """out under FA3's rule, lse -inf exactly where the reference's is, and within 1e-3 plus the cap's tanh error
    elsewhere (NOTES: tanh.approx.f32's relative error is up to 2^-11, so a logit c * t is off by up to
    c |t| 2^-11 <= c * 4.9e-4, and lse by as much)."""
    out_h, lse_h = _host(out), _host(lse)
    _assert_finite("out", out_h)
    reference.assert_close_fa3("out", out_h, data["out"], data["out_lowp"])
    seen = np.isfinite(data["lse"])
    assert np.all(np.isfinite(lse_h) == seen), "lse must be -inf exactly on rows that see no key"
    np.testing.assert_allclose(lse_h[seen], data["lse"][seen], rtol=0, atol=1e-3 + cap * 4.9e-4)


def assert_scaled_grads(data: dict, grads) -> None:
    """dq, dk, dv finite and under FA3's rule against the case's references."""
    for name, g, ref, lowp in zip(("dq", "dk", "dv"), grads, data["grads"], data["grads_lowp"]):
        g = _host(g)
        _assert_finite(name, g)
        reference.assert_close_fa3(name, g, ref, lowp)


def assert_backward_repeats(inputs, kwargs: dict, repeats: int) -> None:
    """The deterministic backward of ``inputs`` (do, q, k, v, out, lse) called ``repeats`` more times gives the
    first call's bits every time (:func:`_repeat_backward`)."""
    _, counts = _repeat_backward(None, inputs, kwargs, repeats + 1)
    cupy_dash.check_errors()
    assert not counts.any(), f"differing dq / dk / dv elements per repeat: {counts.tolist()}"
