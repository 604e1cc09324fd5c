// PTX ISA "Data Movement: cp.async.bulk.tensor, cp.async.bulk" — TMA tile loads and flat bulk loads from global
// into shared memory, completing on an mbarrier; TMA tile stores from shared memory (bulk_group completion).
#pragma once
#include "../common.cuh"

// A CUtensorMap, encoded on the host (cupy_dash/cuda/tensormap.py) and passed in a __grid_constant__ parameter block.
struct alignas(64) TmaDesc {
  uint64_t opaque[16];
};

DASH_DEVICE void tma_prefetch_desc(const TmaDesc* desc) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(desc) : "memory");
}

// One box of a 5-D tensor map at element coordinates (c0 innermost .. c4) into shared memory at dst; the copy
// adds its bytes to bar's transaction count. Out-of-bound elements are written as zeros.
DASH_DEVICE void tma_load_5d(uint32_t dst, const TmaDesc* desc, uint32_t bar, int c0, int c1, int c2, int c3,
                             int c4) {
  asm volatile(
      "cp.async.bulk.tensor.5d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4, %5, %6}], [%7];\n" ::"r"(dst),
      "l"(desc), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4), "r"(bar)
      : "memory");
}

// The box of a 5-D tensor map at (c0 .. c4) from shared memory at src into global memory; elements outside the
// tensor are not written. Joins the calling thread's current bulk group (commit / wait: ptx/bulk_reduce.cuh).
DASH_DEVICE void tma_store_5d(const TmaDesc* desc, uint32_t src, int c0, int c1, int c2, int c3, int c4) {
  asm volatile("cp.async.bulk.tensor.5d.global.shared::cta.tile.bulk_group [%0, {%1, %2, %3, %4, %5}], [%6];\n" ::"l"(
                   desc),
               "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4), "r"(src)
               : "memory");
}

// bytes (a multiple of 16) from src (16-byte aligned) to dst (16-byte aligned), completing on bar.
DASH_DEVICE void bulk_load(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}
