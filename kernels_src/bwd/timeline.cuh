// Backward main kernel, debug builds (DASH_TIMELINE=1): stamps per visit, written to p.timeline (V, kTimelineCols
// of constants.cuh) int64, to see where CTAs and their warpgroups wait (benchmarks/timeline.py). Normal builds
// compile every stamp away.
#pragma once
#include "../constants.cuh"
#include "../params.cuh"
#include "../ptx/clock.cuh"
#include "../ptx/globaltimer.cuh"
#include "../ptx/st_global.cuh"
#include "../ptx/wgmma.cuh"

#ifndef DASH_TIMELINE
#define DASH_TIMELINE 0
#endif

namespace bwd {

constexpr bool kTimeline = DASH_TIMELINE != 0;

// Columns 0-3, %globaltimer ns: the MMA warpgroups start the visit (Q tile ready); its dQ piece is computed (then
// they wait for the dQ slice to be free); the dQ writer's turn came (deterministic: semaphore == rank); the
// partial is added and released.
enum TimelineStamp { kStampStart = 0, kStampDqReady = 1, kStampTurn = 2, kStampReleased = 3 };

// Columns 4 + kWgStamps * wg + s, %clock64 of the CTA's SM, MMA warpgroup wg's thread 0: the phases of a visit in
// its order (mainloop.cuh), and the SM (column 4 + kWgSm, warpgroup 0 only).
// NOTES: a warpgroup has GEMMs in flight from kWgSIssue to kWgDpDone and from kWgDvIssued to kWgDkDone; when neither
// warpgroup of a CTA has, its SM's tensor pipe is idle (benchmarks/timeline_phases.py).
enum WgStamp {
  kWgTop = 0,        // the visit begins: the Q wait next
  kWgSIssue = 1,     // Q (and a new KV tile's K) arrived, S^T about to be issued
  kWgDpIssue = 2,    // dO (and a new KV tile's V) arrived, dP^T about to be issued
  kWgSDone = 3,      // S^T complete (P^T next)
  kWgDpDone = 4,     // dP^T complete (dS^T next)
  kWgDvIssued = 5,   // dS^T stored, dV issued, about to wait for the other warpgroup's dS^T
  kWgBarrier = 6,    // both dS^T stored: dQ and dK issued next
  kWgDqDone = 7,     // dV and dQ complete (dQ hand-off next)
  kWgDkDone = 8,     // dK complete: the visit ends
  kWgSm = 9,
  kWgStamps = 10
};
// Columns 4 + 2 kWgStamps + s, %clock64 of the CTA's SM, the producer: when it issued the visit's Q and dO loads
// (their lead over the warpgroups' waits tells a late producer from a slow load).
enum ProducerStamp { kProdQIssued = 0, kProdDoIssued = 1, kProdStamps = 2 };
static_assert(kTimelineCols == 4 + 2 * kWgStamps + kProdStamps, "constants.cuh: kTimelineCols");

// NOTES: a stamp is a predicated store that every lane of the warp issues (the clock read and the address too), not
// a branch around one lane's store, which made each stamp a divergent region (BSSY / BSYNC). The stamps of a visit
// still cost its MMA warpgroups 460-620 cycles (480-650 as branches; docs/decisions/bwd-engine.md, "FA3's run
// structure, measured and merged"), so a timeline build's phases describe a slower loop than the normal build's.
DASH_DEVICE void stamp(const BwdParams& p, int64_t v, TimelineStamp what, bool on = true) {
  if constexpr (kTimeline) st_global_b64_if(on, p.timeline + kTimelineCols * v + what, (int64_t)globaltimer_ns());
}

// NOTES: a row holds two warpgroups' stamps; head dim 192's third MMA warpgroup stamps nothing (its columns would be
// the producer's and the next visit's, past the buffer's end at the last visit).
DASH_DEVICE void stamp_wg(const BwdParams& p, int64_t v, int wg, int tid, WgStamp what) {
  if constexpr (kTimeline) {
    if (wg < 2) {
      int64_t* row = p.timeline + kTimelineCols * v + 4 + kWgStamps * wg;
      st_global_b64_if(tid == 0, row + what, clock64_cycles());
      if (what == kWgTop && wg == 0) st_global_b64_if(tid == 0, row + kWgSm, sm_id());
    }
    if (what == kWgBarrier) wgmma_fence();
  }
}

DASH_DEVICE void stamp_producer(const BwdParams& p, int64_t v, ProducerStamp what) {
  if constexpr (kTimeline) p.timeline[kTimelineCols * v + 4 + 2 * kWgStamps + what] = clock64_cycles();
}

}  // namespace bwd
