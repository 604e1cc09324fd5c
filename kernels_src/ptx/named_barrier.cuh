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

// bar.red.or.pred: syncs like named_barrier_sync and returns whether any arriving thread passed `pred`.
template <int kId, int kThreads>
DASH_DEVICE bool named_barrier_or(bool pred) {
  static_assert(kId > 0 && kId < 16 && kThreads % 32 == 0, "barrier id 1..15, whole warps");
  int any;
  asm volatile(
      "{\n .reg .pred p, q;\n setp.ne.b32 p, %1, 0;\n bar.red.or.pred q, %2, %3, p;\n selp.b32 %0, 1, 0, q;\n}\n"
      : "=r"(any)
      : "r"((int)pred), "n"(kId), "n"(kThreads)
      : "memory");
  return any != 0;
}
