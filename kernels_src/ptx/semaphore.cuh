// PTX ISA "Memory consistency model: ld.acquire / red.release" at gpu scope — the ordered-reduction semaphore.
#pragma once
#include "../common.cuh"

DASH_DEVICE int ld_acquire_gpu(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// A relaxed read at gpu scope: no cache invalidation (ld.acquire.gpu invalidates the SM's L1 each time, CCTL.IVALL,
// which a warp polling all the time must not do); a fence_acq_rel_gpu after the value is seen makes it an acquire.
DASH_DEVICE int ld_relaxed_gpu(const int* p) {
  int v;
  asm volatile("ld.relaxed.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// NOTES: callers make every thread's dQ writes precede this (each writer fences, then a CTA barrier), so the
// release publishes them to whoever acquires the incremented value.
DASH_DEVICE void red_release_gpu_add(int* p, int v) {
  asm volatile("red.release.gpu.global.add.s32 [%0], %1;\n" :: "l"(p), "r"(v) : "memory");
}

// An atomic add at gpu scope with acquire-release order, returning the old value: the arrival count of a split
// KV column's pieces (bwd/pieces.cuh), whose last arrival reads what the others released.
DASH_DEVICE int atom_acq_rel_gpu_add(int* p, int v) {
  int old;
  asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], %2;\n" : "=r"(old) : "l"(p), "r"(v) : "memory");
  return old;
}
