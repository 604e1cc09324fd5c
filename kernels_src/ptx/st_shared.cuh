// PTX ISA "Data Movement and Conversion Instructions: st" — st.shared.u32, a 32-bit shared-memory store.
#pragma once
#include "../common.cuh"

// addr: 4-byte aligned shared-memory address (cvta'd, 32-bit).
DASH_DEVICE void st_shared_u32(uint32_t addr, uint32_t value) {
  asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(addr), "r"(value) : "memory");
}
