// PTX ISA "Parallel Synchronization and Communication: bar, barrier" — named barriers with compile-time ids.
#pragma once
#include "../common.cuh"

// NOTES: id 0 is __syncthreads(); ids are immediates (a register id makes ptxas reserve all 16 barriers);
// kThreads counts every thread that arrives or syncs on the barrier, a multiple of 32.
template <int kId, int kThreads>
DASH_DEVICE void named_barrier_sync() {
  static_assert(kId > 0 && kId < 16 && kThreads % 32 == 0, "barrier id 1..15, whole warps");
  asm volatile("bar.sync %0, %1;\n" ::"n"(kId), "n"(kThreads) : "memory");
}

template <int kId, int kThreads>
DASH_DEVICE void named_barrier_arrive() {
  static_assert(kId > 0 && kId < 16 && kThreads % 32 == 0, "barrier id 1..15, whole warps");
  asm volatile("bar.arrive %0, %1;\n" ::"n"(kId), "n"(kThreads) : "memory");
}
