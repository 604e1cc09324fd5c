// Backward main kernel, dQ writer warps (warps 1 .. kDqWriters of the producer warpgroup, alternate visits): add
// each visit's dQ partial, handed over in shared memory by the MMA warpgroups, into the fp32 dq_accum tile with
// bulk reductions — in the schedule's rank order when deterministic: wait for the tile's turn, add, wait for
// completion, release.
#pragma once
#include "../bwd_rows.cuh"
#include "../params.cuh"
#include "../ptx/bulk_reduce.cuh"
#include "../ptx/bulk_store.cuh"
#include "../ptx/globaltimer.cuh"
#include "../ptx/named_barrier.cuh"
#include "../ptx/semaphore.cuh"
#include "../schedule_view.cuh"
#include "config.cuh"
#include "error_record.cuh"
#include "timeline.cuh"

namespace bwd {

// Deterministic mode: waits until rank dQ partials have been added to the visit's dQ tile. Returns false (after
// recording the failure in p.error, first failure only) on timeout, on an impossible semaphore value, or when
// another CTA has already failed. Called by one thread.
DASH_DEVICE bool wait_for_turn(const BwdParams& p, const int* sem, int64_t v, int rank) {
  const uint64_t t0 = globaltimer_ns();
  while (true) {
    const int seen = ld_acquire_gpu(sem);
    if (seen == rank) return true;
    const bool other_failed = *reinterpret_cast<volatile int*>(p.error) != 0;
    if (other_failed || seen > rank || (int64_t)(globaltimer_ns() - t0) > p.spin_timeout_ns) {
      error_record_claim(p, kErrorSemaphoreTimeout, (int)v, rank, seen);
      return false;
    }
  }
}

// Every MMA warpgroup's dQ staging slice may be overwritten.
DASH_DEVICE void dq_staging_free() {
  dq_handoff_barrier<kBarDqEmpty, false>(0);
  dq_handoff_barrier<kBarDqEmpty, false>(1);
  if constexpr (kNumMmaWg == 3) dq_handoff_barrier<kBarDqEmpty, false>(2);
}

// Half `half` of both MMA warpgroups' staging may be overwritten (kDqHalves 2).
DASH_DEVICE void dq_half_free(int half) {
  dq_handoff_barrier<kBarDqEmpty, false>(0, half);
  dq_handoff_barrier<kBarDqEmpty, false>(1, half);
}

// The slice (kBytes of it) of one MMA warpgroup into its part of the dq_accum tile: stored by the first visit of the
// tile's reduction order (deterministic mode: the tile was not zeroed), added by every later one.
template <int kBytes = SmemLayout::kDqSlice>
DASH_DEVICE void put_slice(float* dst, uint32_t slice, bool first) {
  if (first) {
    bulk_store(dst, slice, kBytes);
  } else {
    bulk_reduce_add_f32(dst, slice, kBytes);
  }
}

// Half `half` of piece `piece` of both MMA warpgroups (kDqHalves 2), as they hand it over: put into the tile
// (skipped after a failed wait: ok false) as one bulk group.
DASH_DEVICE void put_half(const Smem& s, float* tile, int piece, int half, bool first, bool ok, int lane) {
  constexpr int kHalfFloats = kDqPieceFloats / 2, kHalfBytes = SmemLayout::kDqSlice / 2;
#pragma unroll
  for (int wg = 0; wg < 2; ++wg) {
    dq_handoff_barrier<kBarDqFull, true>(wg, half);
    if (lane == 0 && ok) {
      put_slice<kHalfBytes>(tile + (kDqPieces * wg + piece) * kDqPieceFloats + half * kHalfFloats,
                            s.dq(wg) + half * kHalfBytes, first);
    }
  }
  if (lane == 0) bulk_commit();
}

// A visit's pieces in halves (kDqHalves 2), in the order piece 0 half 0, half 1, piece 1 half 0, ...: after each
// half but the first the previous one's copies have been read (wait_group.read 1) and its slots are freed, the last
// one's at the end (wait_group.read 0); a slot's last use in the CTA (more: false) is not freed, as no one waits.
DASH_DEVICE void put_halves(const Smem& s, float* tile, bool first, bool ok, bool more, int lane) {
#pragma unroll
  for (int i = 0; i < 2 * kDqPieces; ++i) {
    put_half(s, tile, i / 2, i % 2, first, ok, lane);
    if (i > 0) {
      if (lane == 0) bulk_wait_read<1>();
      __syncwarp();
      if (more || i + 1 < 2 * kDqPieces) dq_half_free((i - 1) % 2);
    }
  }
  if (lane == 0) bulk_wait_read<0>();
  __syncwarp();
  if (more) dq_half_free(1);
}

// Piece `piece` of every MMA warpgroup (at float (kDqPieces wg + piece) kDqPieceFloats of the tile), as they hand it
// over: put into the tile (skipped after a failed wait: ok false) and read out of the staging slices when this
// returns.
// NOTES: written out per warpgroup rather than as a loop: the loop form compiled the two-warpgroup writer
// differently (the head-dim 64 / 96 / 128 SASS, measured on the H200, is this form's).
DASH_DEVICE void put_piece(const Smem& s, float* tile, int piece, bool first, bool ok, int lane) {
  constexpr int kLast = kNumMmaWg - 1;
  dq_handoff_barrier<kBarDqFull, true>(0);
  if (lane == 0 && ok) put_slice(tile + piece * kDqPieceFloats, s.dq(0), first);
  if constexpr (kNumMmaWg == 3) {
    dq_handoff_barrier<kBarDqFull, true>(1);
    if (lane == 0 && ok) put_slice(tile + (kDqPieces + piece) * kDqPieceFloats, s.dq(1), first);
  }
  dq_handoff_barrier<kBarDqFull, true>(kLast);
  if (lane == 0) {
    if (ok) put_slice(tile + (kDqPieces * kLast + piece) * kDqPieceFloats, s.dq(kLast), first);
    bulk_commit();
    bulk_wait_read<0>();
  }
  __syncwarp();
}

// NOTES: deterministic mode is p.dq_semaphore != null (the host's choice per launch, as in row_passes.cuh). The
// order of the adds into one dq_accum element is then the rank order of the visits: the store of rank 0 or the
// add of rank r completes (bulk_wait, not .read: the global writes are then visible to this thread) before the
// release that lets rank r + 1 start. Within a visit the slices are disjoint. Atomic mode adds into the tile
// that preprocess zeroed. After a failed wait this CTA skips its adds and releases (the result is
// discarded: the host raises) but keeps handing the slices back, so that the MMA warpgroups finish.
DASH_DEVICE void write_dq(const BwdParams& p, const ScheduleView& sched, const Smem& s, int writer, int lane) {
  // NOTES: the MMA warpgroups wait for the staging slices to be free once per dQ piece (kDqPieces per visit; per
  // half with kDqHalves 2), so they are freed once for each: up front for the first, then after each that has a
  // successor (named barriers count arrivals: none may be left over). Writer w runs visits j = w, w + kDqWriters,
  // ... (bwd/config.cuh's kDqWriters).
  if (writer == 0) {
    if constexpr (kDqHalves == 2) {
      dq_half_free(0);
      dq_half_free(1);
    } else {
      dq_staging_free();
    }
  }
  const bool deterministic = p.dq_semaphore != nullptr;
  bool ok = true;
  int jv = writer;
  for (int64_t v = sched.begin + writer; v < sched.end; v += kDqWriters, jv += kDqWriters) {
    const Visit w = sched.visit(v);
    const Head hd(p, w.bh);
    const BwdRows<kBlockM> seq(p, hd.b, hd.h);
    float* tile = p.dq_accum + (seq.scratch_row + w.m_block * kBlockM) * kHeadDim;
    int* sem = nullptr;
    int rank = 1;  // atomic mode: every visit adds
    if (deterministic) {
      sem = p.dq_semaphore + seq.semaphore(w.m_block);
      rank = sched.rank_of(v);
      if (lane == 0 && ok) ok = wait_for_turn(p, sem, v, rank);
    }
    if (kDqWriters == 2) {
      __syncwarp();
      if (jv > 0) writer_token<true>(writer);
    }
    stamp(p, v, kStampTurn, lane == 0);
    if constexpr (kDqHalves == 2) {
      put_halves(s, tile, rank == 0, ok, v + 1 < sched.end, lane);
    } else {
      put_piece(s, tile, 0, rank == 0, ok, lane);
      if constexpr (kDqPieces == 2) {
        dq_staging_free();
        put_piece(s, tile, 1, rank == 0, ok, lane);
      }
      if (v + 1 < sched.end) dq_staging_free();
    }
    if (kDqWriters == 2 && v + 1 < sched.end) writer_token<false>(writer ^ 1);
    if (deterministic && lane == 0 && ok) {
      bulk_wait<0>();
      red_release_gpu_add(sem, 1);
    }
    stamp(p, v, kStampReleased, lane == 0);
  }
  if (lane == 0) bulk_wait<0>();
}

}  // namespace bwd
