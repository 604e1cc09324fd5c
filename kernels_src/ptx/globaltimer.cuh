// PTX ISA "Special registers: %globaltimer" — a nanosecond timer, used to bound semaphore spins.
#pragma once
#include "../common.cuh"

DASH_DEVICE uint64_t globaltimer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t));
  return t;
}
