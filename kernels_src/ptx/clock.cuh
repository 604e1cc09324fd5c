// PTX ISA "Special registers: %clock64, %smid" — the SM's cycle counter and the SM a thread runs on (debug stamps).
#pragma once
#include "../common.cuh"

DASH_DEVICE int64_t clock64_cycles() {
  int64_t t;
  asm volatile("mov.u64 %0, %%clock64;\n" : "=l"(t));
  return t;
}

DASH_DEVICE int sm_id() {
  int id;
  asm volatile("mov.u32 %0, %%smid;\n" : "=r"(id));
  return id;
}
