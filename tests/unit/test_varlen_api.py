"""Argument checks of cupy_dash.attention_forward_varlen and attention_backward_varlen, raised before any GPU work
(numpy inputs: the device check comes last, so every other error shows on a machine without a GPU)."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import cupy_dash

BF16 = np.dtype(ml_dtypes.bfloat16)


def _args(**over):
    a = dict(q=np.zeros((300, 4, 64), BF16), k=np.zeros((500, 2, 64), BF16), v=np.zeros((500, 2, 64), BF16),
             cu_seqlens_q=np.array([0, 100, 300], np.int32), cu_seqlens_k=np.array([0, 200, 500], np.int32),
             max_seqlen_q=200, max_seqlen_k=300)
    a.update(over)
    return a


def call(**over):
    a = _args(**over)
    causal = a.pop("causal", False)
    return cupy_dash.attention_forward_varlen(a.pop("q"), a.pop("k"), a.pop("v"), a.pop("cu_seqlens_q"),
                                              a.pop("cu_seqlens_k"), a.pop("max_seqlen_q"), a.pop("max_seqlen_k"),
                                              causal=causal, **a)


@pytest.mark.parametrize("over,exc,match", [
    (dict(cu_seqlens_q=np.array([0, 100, 300], np.int64)), ValueError, "cu_seqlens_q: expected dtype int32"),
    (dict(cu_seqlens_k=np.array([[0, 500]], np.int32)), ValueError, "cu_seqlens_k: expected a 1-D"),
    (dict(cu_seqlens_q=np.array([0], np.int32)), ValueError, "cu_seqlens_q: expected a 1-D"),
    (dict(cu_seqlens_k=np.array([0, 500], np.int32)), ValueError, "cu_seqlens_k: expected 3 entries"),
    (dict(max_seqlen_q=True), TypeError, "max_seqlen_q: expected an int"),
    (dict(max_seqlen_k=0), ValueError, "max_seqlen_k: expected an int >= 1"),
    (dict(max_seqlen_q=2.5), TypeError, "max_seqlen_q"),
    (dict(q=np.zeros((1, 300, 4, 64), BF16)), ValueError, "q: expected a 3-D packed tensor"),
    (dict(causal="yes"), TypeError, "causal"),
    (dict(window=(1, 2, 3)), TypeError, "window"),
    (dict(q=np.zeros((300, 4, 160), BF16), k=np.zeros((500, 2, 160), BF16), v=np.zeros((500, 2, 160), BF16)),
     NotImplementedError, "head dim"),
    (dict(), ValueError, "CUDA device"),                   # numpy arrays: everything else was fine
])
def test_varlen_argument_errors(over, exc, match):
    with pytest.raises(exc, match=match):
        call(**over)


def call_backward(**over):
    a = _args(**over)
    q, k, v = a.pop("q"), a.pop("k"), a.pop("v")
    do, out = a.pop("do", np.zeros_like(q)), a.pop("out", np.zeros_like(q))
    lse = a.pop("lse", np.zeros((q.shape[1] if q.ndim == 3 else 1, q.shape[0]), np.float32))
    causal = a.pop("causal", False)
    return cupy_dash.attention_backward_varlen(do, q, k, v, out, lse, a.pop("cu_seqlens_q"), a.pop("cu_seqlens_k"),
                                               a.pop("max_seqlen_q"), a.pop("max_seqlen_k"), causal=causal, **a)


@pytest.mark.parametrize("over,exc,match", [
    (dict(cu_seqlens_q=np.array([0, 200, 100, 300], np.int32), cu_seqlens_k=np.array([0, 1, 2, 500], np.int32)),
     ValueError, "cu_seqlens_q: expected 0 = cu"),                 # decreasing (host cu_seqlens)
    (dict(cu_seqlens_k=np.array([0, 200, 400], np.int32)), ValueError, "cu_seqlens_k: expected 0 = cu.*500"),
    (dict(cu_seqlens_q=[0, 250, 300]), ValueError, "cu_seqlens_q: a sequence of 250 rows exceeds max_seqlen_q"),
    (dict(cu_seqlens_k=np.array([0.0, 200, 500])), ValueError, "cu_seqlens_k: expected integers"),
    (dict(cu_seqlens_k=np.array([0, 500], np.int32), max_seqlen_k=500), ValueError,
     "cu_seqlens_k: expected 3 entries"),
    (dict(lse=np.zeros((1, 4, 300), np.float32)), ValueError, "lse: expected a 2-D tensor"),
    (dict(lse=np.zeros((4, 299), np.float32)), ValueError, "lse: expected shape"),
    (dict(do=np.zeros((300, 4, 64), np.float16)), ValueError, "do: expected dtype bfloat16"),
    (dict(out=np.zeros((300, 4), BF16)), ValueError, "out: expected a 3-D packed tensor"),
    (dict(schedule="fastest"), ValueError, "schedule"),
    (dict(deterministic="no"), TypeError, "deterministic"),
    (dict(max_seqlen_k=600), ValueError, "max_seqlen_q / max_seqlen_k"),
    (dict(), ValueError, "CUDA device"),                   # numpy arrays: everything else was fine
])
def test_varlen_backward_argument_errors(over, exc, match):
    with pytest.raises(exc, match=match):
        call_backward(**over)
