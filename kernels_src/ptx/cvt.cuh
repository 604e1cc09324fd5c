// PTX ISA "Data conversion: cvt" — two fp32 values to one packed bf16x2 / f16x2 word (round to nearest).
#pragma once
#include "../common.cuh"

// Returns (hi << 16) | lo as 16-bit elements: lo is the element at the lower address / even column.
DASH_DEVICE uint32_t pack_elem2(float lo, float hi) {
  uint32_t r;
#if DASH_FP16
  asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
#else
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
#endif
  return r;
}

// One 16-bit element to fp32.
DASH_DEVICE float elem_to_float(elem_t x) {
#if DASH_FP16
  float f;
  asm("cvt.f32.f16 %0, %1;\n" : "=f"(f) : "h"(x));
  return f;
#else
  return __uint_as_float(((uint32_t)x) << 16);
#endif
}

DASH_DEVICE elem_t float_to_elem(float f) { return (elem_t)(pack_elem2(f, 0.f) & 0xffffu); }
