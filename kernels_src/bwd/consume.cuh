// Backward main kernel, MMA warpgroups: the visits of one CTA, in the table's order. Included after the plan's
// bwd_step and store_dkv (bwd/mainloop.cuh with bwd/epilogue.cuh, bwd/split_step.cuh or bwd/keys_step.cuh, whichever
// the including file chose).
#pragma once
#include "../schedule_view.cuh"
#include "config.cuh"

namespace bwd {

// One MMA warpgroup: dK, dV of the current KV tile (bwd/config.cuh's DkvAcc) live in registers across its run of
// visits. The visits come from the producer (VisitSlot), so the MMA warpgroups read nothing of the schedule table.
DASH_DEVICE void consume(const BwdParams& p, const ScheduleView& sched, const Smem& s, char* smem_generic, int wg,
                         int tid) {
  DkvAcc dK, dV;
  fill_zero(dK);
  fill_zero(dV);
  uint32_t groups = 0, j = 0;
  bool first = true;
  for (int64_t v = sched.begin; v < sched.end; ++v, ++j) {
    const VisitSlot done = bwd_step(p, s, smem_generic, v, j, groups, first, dK, dV, wg, tid);
    first = done.last;
    if (done.last) {
      store_dkv(p, s, done.w, dK, dV, wg, tid);
      ++groups;
    }
  }
  if (tid == 0) bulk_wait<0>();  // the last dK / dV stores (bwd/epilogue.cuh) have read shared memory
}

}  // namespace bwd
