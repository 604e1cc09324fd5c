// Compact-table builds (DASH_COMPACT=1): ScheduleView over one record per KV column (format and CPU reference:
// cupy_dash/schedule/compact.py, cupy_dash/schedule/_compact_view.pyx visit_of / rank_of). Included by
// schedule_view.cuh after Visit, in place of the per-visit view; the kernel code that walks the schedule is the same.
#pragma once
#include "common.cuh"
#include "params.cuh"

#if DASH_TIMELINE
#error "timeline builds index p.timeline by table row: they need the per-visit tables, not DASH_COMPACT"
#endif

// One column's Q-tile rule. s-th visit -> Q tile (tile) and back (index), lo <= m < hi, 0 <= s < hi - lo:
//   split < 0:  descending, m = hi - 1 - s;
//   otherwise:  R = hi - split; s < R: m = split + (s + rot) mod R (the rotated rectangle), then lo + s - R.
struct ColumnRule {
  int lo, hi, split, rot;

  DASH_DEVICE int tile(int s) const {
    if (split < 0) return hi - 1 - s;
    const int r = hi - split;
    if (s >= r) return lo + s - r;
    const int x = s + rot;
    return split + (x >= r ? x - r : x);
  }
  DASH_DEVICE int index(int m) const {
    if (split < 0) return hi - 1 - m;
    const int r = hi - split;
    if (m < split) return r + m - lo;
    const int x = m - split - rot;
    return x < 0 ? x + r : x;
  }
};

// One record: (step, lo, hi, split) (rot, cta, kv_head, n_block), two 16-byte loads.
struct ColumnRecord {
  int step, kv_head, n_block;
  ColumnRule rule;

  DASH_DEVICE static ColumnRecord load(const int32_t* records, int i) {
    const int4 a = __ldg(reinterpret_cast<const int4*>(records) + 2 * i);
    const int4 b = __ldg(reinterpret_cast<const int4*>(records) + 2 * i + 1);
    return ColumnRecord{a.x, b.z, b.w, ColumnRule{a.y, a.z, a.w, b.x}};
  }
  DASH_DEVICE int end() const { return step + rule.hi - rule.lo; }  // one past its last KV-head visit
};

enum RankRule { kRankCount = 0, kRankAscendingN = 1, kRankDescendingN = 2 };

// NOTES: a CTA's visit index v (0 .. end) counts query-head visits: KV-head visit iv = v / g, query head
// v % g (Q-tile-major, as in the per-visit table), and record r holds iv in [r.step, r.end()). Each role walks
// its visits in increasing v, so a cursor over the CTA's column list (mutable: every thread owns its copy of
// the view) gives visit(v) in O(1) amortized. K, V change exactly at record boundaries, so same_kv_tile
// agrees with the per-visit view. Visit indices in p.error[1] are CTA-local in these builds.
struct ScheduleView {
  const BwdParams& p;
  int64_t begin, end;
  int group_size;
  mutable int col;             // position of the current record in cta_columns
  mutable ColumnRecord rec;    // the current record
  mutable int ranked_iv, ranked;  // rank_of's last KV-head visit and its rank

  DASH_DEVICE ScheduleView(const BwdParams& p_, int cta)
      : p(p_), begin(0), end(0), group_size((int)(p_.num_heads / p_.num_heads_kv)),
        col((int)p_.cta_col_start[cta]), ranked_iv(-1), ranked(0) {
    const int last = (int)p.cta_col_start[cta + 1] - 1;
    if (last < col) return;
    rec = ColumnRecord::load(p.col_records, __ldg(p.cta_columns + col));
    end = (int64_t)ColumnRecord::load(p.col_records, __ldg(p.cta_columns + last)).end() * group_size;
  }

  DASH_DEVICE Visit visit(int64_t v) const {
    const int iv = (int)v / group_size, q = (int)v - iv * group_size;
    while (iv >= rec.end()) rec = ColumnRecord::load(p.col_records, __ldg(p.cta_columns + ++col));
    return Visit{rec.kv_head * group_size + q, rec.n_block, rec.rule.tile(iv - rec.step)};
  }

  DASH_DEVICE bool same_kv_tile(const Visit& a, const Visit& b) const {
    return a.n_block == b.n_block && same_kv_head(a.bh, b.bh, group_size);
  }

  // Rank of visit v in its dQ tile's reduction order; v is the visit last passed to visit(). Computed once
  // per KV-head visit, reused for its g query heads.
  // NOTES: called by all 32 lanes of one warp together (the dQ writer): the count is a warp reduction.
  DASH_DEVICE int rank_of(int64_t v) const {
    const int iv = (int)v / group_size;
    if (iv != ranked_iv) {
      ranked = column_rank(rec.rule.tile(iv - rec.step));
      ranked_iv = iv;
    }
    return ranked;
  }

 private:
  DASH_DEVICE static int overlap(int a0, int a1, int b0, int b1) {
    const int lo = max(a0, b0), hi = min(a1, b1);
    return hi > lo ? hi - lo : 0;
  }

  // This lane's share of the records j in [j0, j1) (all visiting Q tile m) whose key (step at which they reach
  // m, tie_sign * n) is smaller than (key, tb). Record j is column n = n0 + j of its head.
  // NOTES: the loads of different iterations are independent; unrolled, they are in flight together (the dQ
  // writer computes the rank while the MMA warpgroups run the visit, so its latency is what counts).
  DASH_DEVICE int count_smaller(int j0, int j1, int n0, int m, int key, int tb) const {
    const int tie = (int)p.tie_sign;
    int count = 0;
#pragma unroll 4
    for (int j = j0 + (int)(threadIdx.x % 32); j < j1; j += 32) {
      const int4 a = __ldg(reinterpret_cast<const int4*>(p.col_records) + 2 * j);
      const ColumnRule rule{a.y, a.z, a.w, __ldg(p.col_records + 8 * j + 4)};
      const int step = a.x + rule.index(m);
      count += step < key || (step == key && tie * (n0 + j) < tb);
    }
    return count;
  }

  // rank(kv head, m, n) of the current record at Q tile m, as _compact_view.rank_at in MODE_KERNEL: the head's
  // columns visiting m are the records [a, b) (lo and hi rise with n; every head has the same column ranges, so
  // p.tile_columns holds a and b per Q tile: one load instead of two dependent binary searches); the closed
  // forms need only a or b, the count compares keys within the scan bounds (x, y, x2, y2): the head's first x
  // and last y columns finished before this one started (all smaller), those outside the first x2 and last y2
  // start after it ends (all larger).
  // Varlen records: the head is segment s = b * Hkv + kv head, whose columns and Q tiles are its sequence's.
  DASH_DEVICE int column_rank(int m) const {
    int NC, base, n_first;
    int2 ab;
    if (p.seg_col_start != nullptr) {  // varlen records (the expand kernel's block has no cu_seqlens)
      const int seq = rec.kv_head / (int)p.num_heads_kv;
      base = __ldg(p.seg_col_start + rec.kv_head);
      NC = __ldg(p.seg_col_start + rec.kv_head + 1) - base, n_first = __ldg(p.seq_n_first + seq);
      ab = __ldg(reinterpret_cast<const int2*>(p.tile_columns) + __ldg(p.seq_tile_start + seq) + m);
    } else {
      NC = (int)p.columns_per_head, base = rec.kv_head * NC, n_first = (int)p.n_first;
      ab = __ldg(reinterpret_cast<const int2*>(p.tile_columns) + m);
    }
    const int me = base + rec.n_block - n_first, n0 = n_first - base;
    const int a = base + ab.x, b = base + ab.y;
    if (p.rank_rule == kRankAscendingN) return me - a;
    if (p.rank_rule == kRankDescendingN) return b - 1 - me;
    const int key = rec.step + rec.rule.index(m), tb = (int)p.tie_sign * rec.n_block;
    if (p.scan_bounds == nullptr) return __reduce_add_sync(0xffffffffu, count_smaller(a, b, n0, m, key, tb));
    const int4 bd = __ldg(reinterpret_cast<const int4*>(p.scan_bounds) + me);
    const int ra = a - base, rb = b - base;
    const int before = overlap(0, bd.x, ra, rb) + overlap(NC - bd.y, NC, ra, rb);
    const int mine = count_smaller(base + max(ra, bd.x), base + min(rb, bd.z), n0, m, key, tb) +
                     count_smaller(base + max(ra, NC - bd.w), base + min(rb, NC - bd.y), n0, m, key, tb);
    return before + __reduce_add_sync(0xffffffffu, mine);
  }
};
