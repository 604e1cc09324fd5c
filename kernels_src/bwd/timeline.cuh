// Backward main kernel, debug builds (DASH_TIMELINE=1): %globaltimer stamps per visit, written to p.timeline
// (V, 4) int64 ns, to see where CTAs wait (benchmarks/timeline.py). Normal builds compile every stamp away.
#pragma once
#include "../params.cuh"
#include "../ptx/globaltimer.cuh"

#ifndef DASH_TIMELINE
#define DASH_TIMELINE 0
#endif

namespace bwd {

constexpr bool kTimeline = DASH_TIMELINE != 0;

// Stamp columns: the MMA warpgroups start the visit (Q tile ready); its dQ piece is computed (then they wait
// for the dQ slice to be free); the dQ writer's turn came (deterministic: semaphore == rank); the partial is
// added and released.
enum TimelineStamp { kStampStart = 0, kStampDqReady = 1, kStampTurn = 2, kStampReleased = 3 };

DASH_DEVICE void stamp(const BwdParams& p, int64_t v, TimelineStamp what) {
  if constexpr (kTimeline) p.timeline[4 * v + what] = (int64_t)globaltimer_ns();
}

}  // namespace bwd
