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

// The two 16-bit elements of a packed word (lo = lower address) as fp32.
DASH_DEVICE float2 unpack_elem2(uint32_t w) {
#if DASH_FP16
  float2 r;
  asm("{\n.reg .f16 lo, hi;\nmov.b32 {lo, hi}, %2;\ncvt.f32.f16 %0, lo;\ncvt.f32.f16 %1, hi;\n}\n"
      : "=f"(r.x), "=f"(r.y)
      : "r"(w));
  return r;
#else
  return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
#endif
}
