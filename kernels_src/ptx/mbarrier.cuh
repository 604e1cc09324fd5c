// PTX ISA "Parallel Synchronization and Communication: mbarrier" — init, arrive, arrive.expect_tx, try_wait.parity.
#pragma once
#include "../common.cuh"

// bar: shared-window address of an 8-byte-aligned 64-bit barrier object.
DASH_DEVICE void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}

// Makes barrier initialisation visible to the async proxy (TMA completes on these barriers); then a CTA barrier.
DASH_DEVICE void mbar_fence_init() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }

DASH_DEVICE void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

// Arrives and adds tx_bytes to the transaction count of the current phase (the bytes the copies will deliver).
DASH_DEVICE void mbar_arrive_expect_tx(uint32_t bar, uint32_t tx_bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(tx_bytes) : "memory");
}

// True once the phase of the given parity has completed (ISA: parity names the current or immediately preceding
// phase; a fresh barrier satisfies parity 1). Acquires, so the data of the completed copies is visible.
DASH_DEVICE bool mbar_try_wait(uint32_t bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(bar), "r"(parity)
      : "memory");
  return done != 0;
}

// Spins until the phase of the given parity has completed. NOTES: only for waits that end by construction (the
// forward's pipelines inside one CTA); the backward bounds its waits (bwd/pipeline.cuh).
DASH_DEVICE void mbar_wait(uint32_t bar, uint32_t parity) {
  while (!mbar_try_wait(bar, parity)) {
  }
}
