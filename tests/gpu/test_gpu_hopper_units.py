"""Unit tests of the Hopper primitives the backward engine is built from (tests/gpu/kernels/hopper_units.cu):
TMA tensor maps (cupy_dash.cuda.tensormap, 5-D, strided, out-of-bound rows), 128B-swizzled tiles and wgmma
descriptors (K-major and MN-major), RS wgmma from packed accumulator fragments, stmatrix.trans.

The kernel compiles on any machine (checked here without a GPU: no spills); the products are compared with
numpy on a Hopper GPU. A failure here points at one primitive, where a wrong backward would not.
"""
from __future__ import annotations

import struct

import ml_dtypes
import numpy as np
import pytest

from unit_kernels import assert_no_spills, check_close, compile_unit, launch_unit

BF16 = np.dtype(ml_dtypes.bfloat16)
VARIANTS = [(n, d) for n in (64, 128) for d in (64, 128)]


@pytest.mark.parametrize("n,d", VARIANTS, ids=[f"n{n}-d{d}" for n, d in VARIANTS])
def test_units_compile_without_spills(n, d):
    assert_no_spills("hopper_units", f"UNIT_N={n}", f"UNIT_D={d}")


@pytest.mark.gpu
@pytest.mark.parametrize("n,d", VARIANTS, ids=[f"n{n}-d{d}" for n, d in VARIANTS])
def test_units_match_numpy(n, d, rng):
    import cupy
    from cupy_dash.cuda import tensormap

    # A: rows [40, 104) of head 2, batch 1 of a (2, 90, 3, d) view into a wider buffer (strided like a slice of
    # a packed qkv tensor); rows 90.. lie past S and must read as zeros. B: rows 0..n-1 of a (1, n + 5, 1, d).
    S, a_row, a_head, a_batch = 90, 40, 2, 1
    packed = rng.standard_normal((2, S, 3, 2 * d), dtype=np.float32).astype(BF16)
    b_host = rng.standard_normal((1, n + 5, 1, d), dtype=np.float32).astype(BF16)
    a_dev = cupy.asarray(packed.view(np.uint16)).view(cupy.uint16)[..., d:]       # (2, S, 3, d), row stride 6d
    b_dev = cupy.asarray(b_host.view(np.uint16))
    a_strides = tuple(s // 2 for s in a_dev.strides[:3])
    a_map = tensormap.bhsd_map(a_dev.data.ptr, "bfloat16", a_dev.shape, a_strides, 64)
    b_map = tensormap.bhsd_map(b_dev.data.ptr, "bfloat16", b_dev.shape, tuple(s // 2 for s in b_dev.strides[:3]), n)
    c, e, g = (cupy.full((64, w), np.nan, dtype=cupy.float32) for w in (n, d, d))
    params = struct.pack("<128s128sQQQiii", a_map, b_map, c.data.ptr, e.data.ptr, g.data.ptr, a_row, a_head,
                         a_batch)
    params += bytes(-len(params) % 64)
    smem = (64 * d + n * d + n * 64) * 2 + 8 + 1024
    launch_unit(compile_unit("hopper_units", f"UNIT_N={n}", f"UNIT_D={d}")[0], "hopper_units", 128,
                (np.frombuffer(params, dtype=np.dtype((np.void, len(params)))),), smem)

    a = np.zeros((64, d), np.float32)
    valid = S - a_row
    a[:valid] = packed[a_batch, a_row:, a_head, d:].astype(np.float32)
    b = b_host[0, :n, 0].astype(np.float32)
    c_ref = a.astype(np.float64) @ b.T.astype(np.float64)
    c_bf = c.get().astype(BF16).astype(np.float64)                # the kernel feeds its own rounded C onwards
    e_ref = c_bf @ b.astype(np.float64)
    g_ref = c_bf[:, :64].T @ a.astype(np.float64)

    check_close("C = A B^T (SS, K-major)", c.get(), c_ref)
    check_close("E = bf16(C) B (RS, B MN-major)", e.get(), e_ref)
    check_close("G = bf16(C)^T A (stmatrix.trans, SS, B MN-major)", g.get(), g_ref)
