// Backward main kernel: the mbarriers of the load pipelines, their setup and bounded waits.
#pragma once
#include "../params.cuh"
#include "../ptx/globaltimer.cuh"
#include "../ptx/mbarrier.cuh"
#include "../schedule_view.cuh"
#include "config.cuh"
#include "error_record.cuh"

namespace bwd {

// One thread sets up every load pipeline's barriers (full: the producer's one arrival with its bytes; empty: one
// arrival per MMA warpgroup), then fences them for the other threads; the caller synchronizes the CTA after it.
DASH_DEVICE void init_pipeline_barriers(const Smem& s) {
#pragma unroll
  for (int buf = 0; buf < kKStages; ++buf) {
    mbar_init(s.k_full(buf), 1);
    mbar_init(s.k_empty(buf), kNumMmaWg);
  }
  mbar_init(s.v_full(), 1);
  mbar_init(s.v_empty(), kNumMmaWg);
#pragma unroll
  for (int stage = 0; stage < kStages; ++stage) {
    mbar_init(s.q_full(stage), 1);
    mbar_init(s.q_empty(stage), kNumMmaWg);
    if (stage < kDoStages) {  // NOTES: kDoStages <= kStages (bwd/config.cuh)
      mbar_init(s.do_full(stage), 1);
      mbar_init(s.do_empty(stage), kNumMmaWg);
    }
  }
  mbar_fence_init();
}

// Waits until the phase of the given parity of bar has completed (stage s of a ring is used for the n-th time
// at parity n & 1; producers wait on "empty" barriers with the opposite parity, which a fresh barrier grants).
// NOTES: every such wait ends within a CTA: a stage is held up at most by the dQ writer, whose semaphore waits
// give up after spin_timeout_ns. A wait past the stall bound (stall_expired) is a kernel bug; it is recorded as
// [kErrorPipelineStall, cta, barrier offset, parity] and abandoned (results invalid, the host raises) rather than
// hanging the GPU.
// __trap() here would be simpler, but ptxas then serializes every wgmma of the kernel and spills (measured).
DASH_DEVICE void wait_phase(const BwdParams& p, uint32_t bar, uint32_t parity) {
  if (mbar_try_wait(bar, parity)) return;
  const uint64_t t0 = globaltimer_ns();
  while (!mbar_try_wait(bar, parity)) {
    if (stall_expired(p, t0)) {
      error_record_claim(p, kErrorPipelineStall, (int)blockIdx.x, (int)(bar % 1024u), (int)parity);
      return;
    }
  }
}

// One visit as the producer hands it to the MMA warpgroups, in the VisitSlot of its Q stage: written before the
// producer's arrive on q_full, read after the wait for it (the mbarrier's release / acquire order the two), and
// overwritten only after both MMA warpgroups have released the stage (q_empty).
// NOTES: the MMA warpgroups thus never read the schedule table: a table row loaded at the top of each visit left
// the tensor pipe idle for its latency (Nsight Compute: decision record bwd-engine).
// NOTES: only the end of a run is published: a visit starts its KV tile's run exactly when the one before it ended
// one (or it is the CTA's first), which the MMA warpgroups know before they read the slot (bwd_step). The fourth
// word is 1 + 2 (piece + 1): piece is the run's code when it is a piece of a split column (bwd/pieces.cuh), else -1.
struct VisitSlot {
  Visit w;
  bool last;  // the visit ends its run of one KV tile (V, K released; dK, dV stored)
  int piece;  // the run's piece code, or -1: a whole KV tile

  DASH_DEVICE static void publish(uint32_t slot, const Visit& w, bool last, int piece) {
    asm volatile("st.shared.v4.s32 [%0], {%1, %2, %3, %4};\n" ::"r"(slot), "r"(w.bh), "r"(w.n_block), "r"(w.m_block),
                 "r"((last ? 1 : 0) + 2 * (piece + 1))
                 : "memory");
  }
  DASH_DEVICE static VisitSlot read(uint32_t slot) {
    int bh, n_block, m_block, flags;
    asm volatile("ld.shared.v4.s32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(bh), "=r"(n_block), "=r"(m_block), "=r"(flags)
                 : "r"(slot)
                 : "memory");
    return VisitSlot{Visit{bh, n_block, m_block}, (flags & 1) != 0, (flags >> 1) - 1};
  }
};

}  // namespace bwd
