// Read-only view of a backward schedule table (built on the host by cupy_dash/_schedule.pyx): the main kernel
// walks its CTA's visits in order and applies no policy of its own.
#pragma once
#include "common.cuh"

struct Visit {
  int bh;       // (batch, head) pair, b * H + h
  int n_block;  // KV tile
  int m_block;  // Q tile, and dQ tile
};

// NOTES: visits is (V, 4) int32 rows (cta, bh, n_block, m_block); the table is 16-byte aligned, so one vector
// load reads a row. cta_start is (num_ctas + 1,) int64: CTA c owns [cta_start[c], cta_start[c + 1]).
// The kernel relies on two properties that schedule validation must guarantee: every visit of one KV tile
// (bh, n_block) sits on one CTA in one consecutive run (dK, dV are accumulated in registers over the run and
// written once at its end), and every KV tile has at least one visit (otherwise its dK, dV rows stay unwritten).
struct ScheduleView {
  const int32_t* visits;
  const int32_t* rank;
  int64_t begin, end;

  DASH_DEVICE ScheduleView(const int32_t* visits_, const int32_t* rank_, const int64_t* cta_start, int cta)
      : visits(visits_), rank(rank_), begin(cta_start[cta]), end(cta_start[cta + 1]) {}

  DASH_DEVICE Visit visit(int64_t v) const {
    const int4 row = __ldg(reinterpret_cast<const int4*>(visits) + v);
    return Visit{row.y, row.z, row.w};
  }
  DASH_DEVICE int rank_of(int64_t v) const { return __ldg(rank + v); }
};

DASH_DEVICE bool same_kv_tile(const Visit& a, const Visit& b) { return a.bh == b.bh && a.n_block == b.n_block; }
