// Backward main kernel, MMA warpgroups: the visits of one CTA, in the table's order. Included after the plan's
// bwd_step and store_dkv (bwd/mainloop.cuh with bwd/epilogue.cuh, bwd/split_step.cuh or bwd/keys_step.cuh, whichever
// the including file chose).
#pragma once
#include "../schedule_view.cuh"
#include "config.cuh"
#include "pieces.cuh"

namespace bwd {

// One MMA warpgroup: dK, dV of the current KV tile (bwd/config.cuh's DkvAcc) live in registers across its run of
// visits. The visits come from the producer (VisitSlot), so the MMA warpgroups read nothing of the schedule table.
// NOTES: a loop per run of one KV tile, ended by the slot of its last visit (the producer marks the CTA's last visit
// so too), with the dK / dV epilogue after it, so that the visit loop's back-edge is direct: the flat loop's visits
// jump over the inlined epilogue to the loop's tail and back (docs/decisions/bwd-engine.md, "The rebuilt loop up to
// the kernel itself").
DASH_DEVICE void consume(const BwdParams& p, const ScheduleView& sched, const Smem& s, char* smem_generic, int wg,
                         int tid) {
  DkvAcc dK, dV;
  fill_zero(dK);
  fill_zero(dV);
  uint32_t groups = 0, j = 0;
  if constexpr (!kRunLoop) {
    // NOTES: the capped builds keep the flat loop: with a loop per run some spill (80-query under NVRTC 13.0, fp16
    // head dim 64 under 13.5).
    bool first = true;
    for (int64_t v = sched.begin; v < sched.end; ++v, ++j) {
      const VisitSlot done = bwd_step(p, s, smem_generic, v, j, groups, first, dK, dV, wg, tid);
      first = done.last;
      if (done.last) {
        store_dkv(p, s, done.w, dK, dV, wg, tid);  // NOTES: no pieces here (pieces.cuh kPiecesBuilt)
        ++groups;
      }
    }
  } else {
    for (int64_t v = sched.begin; v < sched.end; ++groups) {
      // NOTES: K and V are waited for once per run, before its first S^T, and released once, after its last visit
      // (FA3's order; the visits neither wait for nor release them when kRunLoop); dK, dV start from the zeros stored
      // after the last run's epilogue.
      wait_phase(p, s.k_full((int)(groups % kKStages)), (groups / kKStages) & 1);
      wait_phase(p, s.v_full(), groups & 1);
      bool first = true;
      VisitSlot done;
      do {
        done = bwd_step(p, s, smem_generic, v, j, groups, first, dK, dV, wg, tid);
        first = false;
        ++v;
        ++j;
      } while (!done.last);
      if (tid == 0) {  // the run's last visit is complete: its K and V buffers may be loaded again
        mbar_arrive(s.k_empty((int)(groups % kKStages)));
        mbar_arrive(s.v_empty());
      }
      // A piece of a split column stores its partial sums; the CTA whose piece completes the column stores it.
      const bool whole = done.piece < 0 || complete_piece(p, done.piece, dK, dV, wg, tid);
      if (whole) store_dkv(p, s, done.w, dK, dV, wg, tid);
      fill_zero(dK);
      fill_zero(dV);
    }
  }
  if (tid == 0) bulk_wait<0>();  // the last dK / dV stores (bwd/epilogue.cuh) have read shared memory
}

}  // namespace bwd
