"""kernels_src/exp2_fma.cuh (2^x on the FMA and integer pipes, for softmax exponents x <= 0): its float32
operations emulated in numpy, step for step, with the header's own constants. CPU only."""
from __future__ import annotations

import pathlib
import re

import numpy as np

HEADER = pathlib.Path(__file__).resolve().parents[2] / "kernels_src" / "exp2_fma.cuh"


def _constants() -> dict:
    found = re.findall(r"constexpr float (k\w+) = ([-0-9.e]+)f;", HEADER.read_text())
    return {name: np.float32(value) for name, value in found}


def exp2_fma(x) -> np.ndarray:
    """The header's exp2_fma, in float32 (fmaf as float64 fused then rounded: exact for one multiply-add)."""
    c = _constants()
    f32 = np.float32
    x = np.maximum(np.asarray(x, f32), f32(-127))
    t = (x + c["kRoundMagic"]).astype(f32)
    f = (x - (t - c["kRoundMagic"]).astype(f32)).astype(f32)

    def fma(a, b, d):
        return (np.float64(a) * np.float64(b) + np.float64(d)).astype(f32)

    p = fma(fma(fma(c["kExp2C3"], f, c["kExp2C2"]), f, c["kExp2C1"]), f, c["kExp2C0"])
    bits = (t.view(np.int32).astype(np.int64) << 23) + (127 << 23)
    scale = (bits & 0xFFFFFFFF).astype(np.uint32).view(np.float32)
    return (p * scale).astype(f32)


def test_the_header_has_its_five_constants():
    assert set(_constants()) == {"kExp2C0", "kExp2C1", "kExp2C2", "kExp2C3", "kRoundMagic"}


def test_relative_error_over_the_softmax_range():
    """Largest relative error below 8e-5 over x in [-126, 0] (ex2.approx's own: about 2e-7), far below the bf16
    / fp16 rounding P gets next."""
    x = np.concatenate([np.linspace(-126, 0, 2_000_001, dtype=np.float32),
                        np.float32(-np.arange(127)),                    # the integers, where f = 0
                        np.float32(-np.arange(126) - 0.5)])             # the rounding ties
    y = exp2_fma(x).astype(np.float64)
    exact = np.exp2(x.astype(np.float64))
    assert np.max(np.abs(y - exact) / exact) < 8e-5


def test_masked_and_underflowing_exponents_give_exactly_zero():
    """A masked score's exponent is -inf (and far below -126 for a finite one): P must be exactly 0, as
    ex2.approx.ftz gives, or a row that sees no key would sum to a positive value."""
    x = np.array([-np.inf, -1e30, -1000, -200, -127.4, -127], np.float32)
    assert np.all(exp2_fma(x) == 0) and not np.signbit(exp2_fma(x)).any()


def test_zero_gives_one_within_the_fit():
    assert abs(float(exp2_fma(np.float32(0))) - 1) < 8e-5
