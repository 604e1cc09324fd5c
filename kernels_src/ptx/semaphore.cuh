// PTX ISA "Memory consistency model: ld.acquire / red.release" at gpu scope — the ordered-reduction semaphore.
#pragma once
#include "../common.cuh"

DASH_DEVICE int ld_acquire_gpu(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// NOTES: callers make every thread's dQ writes precede this (each writer fences, then a CTA barrier), so the
// release publishes them to whoever acquires the incremented value.
DASH_DEVICE void red_release_gpu_add(int* p, int v) {
  asm volatile("red.release.gpu.global.add.s32 [%0], %1;\n" :: "l"(p), "r"(v) : "memory");
}
