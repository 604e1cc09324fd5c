// Read-only view of a backward schedule table (built on the host by cupy_dash/schedule/_schedule.pyx): the main
// kernel walks its CTA's visits in order and applies no policy of its own.
#pragma once
#include "common.cuh"

struct Visit {
  int bh;       // (batch, query head) pair, b * H + h
  int n_block;  // KV tile
  int m_block;  // Q tile, and dQ tile
};

// Whether two (batch, query head) pairs share a KV head: bh / group_size alike. Without GQA (group_size 1, a
// warp-uniform value) no integer division is issued (the producer compares each visit with the next).
DASH_DEVICE bool same_kv_head(int bh_a, int bh_b, int group_size) {
  return group_size == 1 ? bh_a == bh_b : bh_a / group_size == bh_b / group_size;
}

#ifndef DASH_COMPACT
#define DASH_COMPACT 0
#endif

#if DASH_COMPACT
#include "compact_view.cuh"  // the same interface over per-column records
#else
// NOTES: visits is (V, 4) int32 rows (cta, bh, n_block, m_block); the table is 16-byte aligned, so one vector
// load reads a row. cta_start is (num_ctas + 1,) int64: CTA c owns [cta_start[c], cta_start[c + 1]).
// A KV tile is (bh / group_size, n_block) = (b * Hkv + hk, n_block): with GQA / MQA the group_size = H / Hkv
// query heads of one KV head share it. The kernel relies on a property that schedule validation must
// guarantee: every visit of one KV tile sits on one CTA in one consecutive run, over every query head of its
// group (dK, dV are accumulated in registers over the run and written once at its end). A KV tile without
// visits (with a sliding window: keys no query sees) is never written here; the host zeroes dk, dv for it. The
// producer and the MMA warpgroups find the runs with the same same_kv_tile, so they agree on where K, V change.
struct ScheduleView {
  const int32_t* visits;
  const int32_t* rank;
  int64_t begin, end;
  int group_size;  // query heads per KV head, H / Hkv

  DASH_DEVICE ScheduleView(const int32_t* visits_, const int32_t* rank_, const int64_t* cta_start, int cta,
                           int group_size_)
      : visits(visits_), rank(rank_), begin(cta_start[cta]), end(cta_start[cta + 1]), group_size(group_size_) {}

  DASH_DEVICE Visit visit(int64_t v) const {
    const int4 row = __ldg(reinterpret_cast<const int4*>(visits) + v);
    return Visit{row.y, row.z, row.w};
  }
  DASH_DEVICE int rank_of(int64_t v) const { return __ldg(rank + v); }

  DASH_DEVICE bool same_kv_tile(const Visit& a, const Visit& b) const {
    return a.n_block == b.n_block && same_kv_head(a.bh, b.bh, group_size);
  }
};
#endif  // DASH_COMPACT
