// PTX ISA "Floating point: tanh" — tanh.approx.f32 (sm_75+), the hyperbolic tangent, max relative error 2^-11.
#pragma once
#include "../common.cuh"

DASH_DEVICE float tanh_approx(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
