// PTX ISA "Floating point: ex2" — ex2.approx.ftz.f32, 2^x (2^-inf = 0).
#pragma once
#include "../common.cuh"

DASH_DEVICE float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
