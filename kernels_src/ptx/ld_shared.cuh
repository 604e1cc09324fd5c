// PTX ISA "Data Movement and Conversion Instructions: ld" — ld.volatile.shared.u32, a shared-memory load that the
// compiler may neither remove nor merge.
#pragma once
#include "../common.cuh"

// addr: 4-byte aligned shared-memory address (cvta'd, 32-bit).
DASH_DEVICE uint32_t ld_volatile_shared_u32(uint32_t addr) {
  uint32_t r;
  asm volatile("ld.volatile.shared.u32 %0, [%1];\n" : "=r"(r) : "r"(addr) : "memory");
  return r;
}
