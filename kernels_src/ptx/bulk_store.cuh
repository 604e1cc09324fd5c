// PTX ISA "Data Movement: cp.async.bulk" (shared::cta -> global, bulk_group completion) — a plain bulk store.
#pragma once
#include "../common.cuh"

// gmem[0 .. bytes) = smem[0 .. bytes); addresses 16-byte aligned, bytes a multiple of 16. Joins the calling
// thread's current bulk group (commit and wait with ptx/bulk_reduce.cuh).
DASH_DEVICE void bulk_store(void* gmem, uint32_t smem, uint32_t bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(gmem), "r"(smem), "r"(bytes)
               : "memory");
}
