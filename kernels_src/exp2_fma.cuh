// 2^x on the FMA and integer pipes instead of the MUFU unit (ptx/exp2.cuh): for softmax exponents, x <= 0.
// The MUFU unit returns 16 results per clock per SM, the FMA pipe 128: where a tile's softmax issues one ex2 per
// score (the forward at head dim 64, any tile with soft-capping's tanh beside it), moving part of the exponents
// here lets the two units share the work.
#pragma once
#include "common.cuh"

// Degree-3 fit of 2^f on [-1/2, 1/2] (relative-error weighted, coefficients rounded to float32): largest relative
// error 7.6e-5 over the interval, evaluated in float32 (tests/unit/test_exp2_fma.py emulates these exact
// operations). P is rounded to bf16 / fp16 (relative 3.9e-3 / 4.9e-4) before it is used, and the row sums' error
// stays far below the output's rounding.
constexpr float kExp2C0 = 0.99992824f;
constexpr float kExp2C1 = 0.69326359f;
constexpr float kExp2C2 = 0.24260990f;
constexpr float kExp2C3 = 0.055157457f;
constexpr float kRoundMagic = 12582912.f;  // 1.5 * 2^23: x + it rounds x to an integer held in the low mantissa bits

// NOTES: x = j + f with j = round(x) (from the bits of x + 1.5 * 2^23: they are 0x4B400000 + j) and |f| <= 1/2;
// 2^x = p(f) * 2^j with 2^j built from its bits, (j + 127) << 23, where bits(x + magic) << 23 is j << 23 modulo
// 2^32 (the magic's low nine bits are 0). x is clamped to -127 first: there the exponent field is 0, so the
// scale is +0 and the result exactly 0, as ex2.approx.ftz gives for x <= -126 and for -inf (a masked score).
// x > 0 is never passed (a softmax exponent is at most 0); x up to 127 would still be exact in form.
DASH_DEVICE float exp2_fma(float x) {
  x = fmaxf(x, -127.f);
  const float t = x + kRoundMagic;
  const float f = x - (t - kRoundMagic);
  const float p = fmaf(fmaf(fmaf(kExp2C3, f, kExp2C2), f, kExp2C1), f, kExp2C0);
  const float scale = __int_as_float((__float_as_int(t) << 23) + (127 << 23));
  return p * scale;
}
