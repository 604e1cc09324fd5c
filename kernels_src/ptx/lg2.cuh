// PTX ISA "Floating point: lg2" — lg2.approx.ftz.f32, log2(x) (log2(0) = -inf).
#pragma once
#include "../common.cuh"

DASH_DEVICE float lg2_approx(float x) {
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
