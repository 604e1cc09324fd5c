"""CPU tests of cupy_dash.cuda.tensormap's encoding: the dimensions, strides and boxes handed to
cuTensorMapEncodeTiled (the driver is replaced by a recorder), for the whole-panel maps of head dims 64 and 128 and
the real-width map of head dim 96 (kernels_src/tile_tma.cuh)."""
from __future__ import annotations

import types

import pytest

from cupy_dash.cuda import tensormap


class _Enum:
    def __getattr__(self, name):
        return name


@pytest.fixture
def encoded(monkeypatch):
    calls = []

    def encode(dtype, rank, ptr, dims, strides, box, elem_strides, *rest):
        calls.append(dict(rank=rank, dims=[int(x) for x in dims], strides=[int(x) for x in strides],
                          box=[int(x) for x in box]))
        return "ok", types.SimpleNamespace(opaque=[0] * 16)

    drv = types.SimpleNamespace(cuTensorMapEncodeTiled=encode, cuuint64_t=int, cuuint32_t=int,
                                CUresult=types.SimpleNamespace(CUDA_SUCCESS="ok"), CUtensorMapDataType=_Enum(),
                                CUtensorMapInterleave=_Enum(), CUtensorMapSwizzle=_Enum(),
                                CUtensorMapL2promotion=_Enum(), CUtensorMapFloatOOBfill=_Enum())
    monkeypatch.setattr(tensormap, "cuda_driver", lambda: drv)
    monkeypatch.setattr(tensormap, "_cache", type(tensormap._cache)())
    return calls


@pytest.mark.parametrize("D", [64, 128])
def test_whole_panel_maps(encoded, D):
    tensormap.bhsd_map(0x1000, "bfloat16", (2, 300, 4, D), (300 * 4 * D, 4 * D, D), 128, "q")
    assert encoded[-1] == dict(rank=5, dims=[64, 300, D // 64, 4, 2], strides=[8 * D, 128, 2 * D, 2400 * D],
                               box=[64, 128, D // 64, 1, 1])


def test_head_dim_96_map(encoded):
    """{96, S, 1, H, B} with a one-panel box: the kernels copy it at columns 0 and 64 (zero-filled past 96)."""
    tensormap.bhsd_map(0x1000, "bfloat16", (2, 300, 4, 96), (300 * 4 * 96, 4 * 96, 96), 64, "k")
    assert encoded[-1] == dict(rank=5, dims=[96, 300, 1, 4, 2], strides=[768, 128, 192, 230400],
                               box=[64, 64, 1, 1, 1])
    tensormap.bhsd_map(0x2000, "bfloat16", (2, 300, 4, 96), (300 * 4 * 96, 4 * 96, 96), 64, "out", box_panels=1)
    assert encoded[-1]["box"] == [64, 64, 1, 1, 1]
    with pytest.raises(ValueError, match="box panels 2"):
        tensormap.bhsd_map(0x3000, "bfloat16", (2, 300, 4, 96), (300 * 4 * 96, 4 * 96, 96), 64, "out", box_panels=2)


@pytest.mark.parametrize("D", [80, 160, 32])
def test_other_head_dims_rejected(encoded, D):
    with pytest.raises(ValueError, match=f"q: head dim {D}"):
        tensormap.check_encodable("q", (2, 300, 4, D), (300 * 4 * D, 4 * D, D), 0x1000)
