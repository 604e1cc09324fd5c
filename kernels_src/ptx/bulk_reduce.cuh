// PTX ISA "Data Movement: cp.reduce.async.bulk, cp.async.bulk.commit_group / wait_group" — fp32 add of a shared
// memory range into global memory, and waiting for it.
#pragma once
#include "../common.cuh"

// gmem[i] += smem[i] for bytes / 4 floats (each add atomic, .relaxed.gpu); addresses 16-byte aligned, bytes a
// multiple of 16. Joins the calling thread's current bulk group.
DASH_DEVICE void bulk_reduce_add_f32(float* gmem, uint32_t smem, uint32_t bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(gmem),
               "r"(smem), "r"(bytes)
               : "memory");
}

DASH_DEVICE void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }

// NOTES: bulk groups belong to the issuing thread. bulk_wait_read: the shared-memory sources of all but kPending
// groups have been read (they may be overwritten). bulk_wait: those groups are complete and their global writes
// are visible to this thread, which can then publish them with a release.
template <int kPending>
DASH_DEVICE void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(kPending) : "memory");
}

template <int kPending>
DASH_DEVICE void bulk_wait() {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(kPending) : "memory");
}
