// PTX ISA "Data movement: cp.async" — 16-byte global->shared copies with zero fill, commit and wait groups.
#pragma once
#include "../common.cuh"

// Copies 16 bytes when pred is true; otherwise writes 16 zero bytes (src-size 0) and reads nothing.
DASH_DEVICE void cp_async_16(uint32_t smem_addr, const void* gmem, bool pred) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
               :: "r"(smem_addr), "l"(gmem), "r"(pred ? 16 : 0) : "memory");
}

DASH_DEVICE void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

template <int N>
DASH_DEVICE void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" :: "n"(N) : "memory"); }
