// Backward main kernel, producer warp (warp 0, one lane): TMA loads in the schedule's order. K_j, V_j once per
// run of visits of one KV tile (K into the next of its kKStages buffers); per visit Q_i with lse_log2_i into the next
// Q stage, with the visit itself in the stage's VisitSlot for the MMA warpgroups, and dO_i with dpsum_i into the next
// dO stage.
#pragma once
#include "../bwd_rows.cuh"
#include "../params.cuh"
#include "../ptx/mbarrier.cuh"
#include "../ptx/tma.cuh"
#include "../tile_tma.cuh"
#include "../schedule_view.cuh"
#include "config.cuh"
#include "pipeline.cuh"
#include "timeline.cuh"

namespace bwd {

// NOTES: tiles land as SwizzledTiles (tile_tma.cuh: the tensor maps, head dim 96 padded); rows past S are
// zero-filled.
// lse_log2 and dpsum rows are padded to seqlen_q_rounded by preprocess, so their copies need no bounds. Varlen
// builds: the maps cover the packed tensors as one batch, so the last tile of a sequence also loads rows of the
// next one (masked in the mainloop: keys by the sequence's Sk, queries by their +inf lse_log2).
DASH_DEVICE void produce(const BwdParams& p, const ScheduleView& sched, const Smem& s) {
  tma_prefetch_desc(&p.tma_q);
  tma_prefetch_desc(&p.tma_k);
  tma_prefetch_desc(&p.tma_v);
  tma_prefetch_desc(&p.tma_do);
  tma_prefetch_desc(&p.tma_dk);  // the MMA warpgroups' dK / dV stores (epilogue.cuh)
  tma_prefetch_desc(&p.tma_dv);
  constexpr uint32_t kQBytes = SmemLayout::kQ + SmemLayout::kRow;
  int groups = 0;
  Visit prev{}, w = sched.visit(sched.begin);
  int j = 0;
  // Split columns (bwd/pieces.cuh): from visit piece_from on, each run is a piece, its code the next of piece_code.
  int64_t piece_from = sched.end;
  int next_piece = 0, piece = -1;
  if (p.cta_pieces != nullptr) {
    piece_from = sched.begin + __ldg(p.cta_pieces + 2 * blockIdx.x);
    next_piece = __ldg(p.cta_pieces + 2 * blockIdx.x + 1);
  }
  for (int64_t v = sched.begin; v < sched.end; ++v, ++j) {
    const Visit next = v + 1 < sched.end ? sched.visit(v + 1) : w;
    const bool first = v == sched.begin || !sched.same_kv_tile(prev, w);
    const bool last = v + 1 == sched.end || !sched.same_kv_tile(w, next);
    const Head hd(p, w.bh);
    const BwdRows<kBlockM> seq(p, hd.b, hd.h);
    const int stage = j % kStages;
    const uint32_t phase = (j / kStages) & 1;
    const int do_stage = j % kDoStages;
    const uint32_t do_phase = (j / kDoStages) & 1;
    const int64_t row_offset = seq.scratch_row + w.m_block * kBlockM;
    const int q_row = seq.row_q + w.m_block * kBlockM, k_row = seq.row_k + w.n_block * kBlockN;

    if (first) piece = v >= piece_from ? __ldg(p.piece_code + next_piece++) : -1;

    wait_phase(p, s.q_empty(stage), phase ^ 1);
    VisitSlot::publish(s.visit(stage), w, last, piece);
    mbar_arrive_expect_tx(s.q_full(stage), kQBytes);
    tma_load_tile<kBlockM, kHeadDimIO>(s.q(stage), &p.tma_q, s.q_full(stage), q_row, hd.h, seq.batch);
    bulk_load(s.lse(stage), p.lse_log2 + row_offset, SmemLayout::kRow, s.q_full(stage));
    stamp_producer(p, v, kProdQIssued);

    if (first) {
      const int kbuf = groups % kKStages;
      wait_phase(p, s.k_empty(kbuf), ((groups / kKStages) & 1) ^ 1);
      mbar_arrive_expect_tx(s.k_full(kbuf), SmemLayout::kKV);
      tma_load_tile<kBlockN, kHeadDimIO>(s.k(kbuf), &p.tma_k, s.k_full(kbuf), k_row, hd.hk, seq.batch);
      wait_phase(p, s.v_empty(), (groups & 1) ^ 1);
      mbar_arrive_expect_tx(s.v_full(), SmemLayout::kVLoad);
      tma_load_tile<kBlockN, kHeadDimVIO>(s.v(), &p.tma_v, s.v_full(), k_row, hd.hk, seq.batch);
      ++groups;
    }

    wait_phase(p, s.do_empty(do_stage), do_phase ^ 1);
    mbar_arrive_expect_tx(s.do_full(do_stage), SmemLayout::kDoLoad + SmemLayout::kRow);
    tma_load_tile<kBlockM, kHeadDimVIO>(s.dout(do_stage), &p.tma_do, s.do_full(do_stage), q_row, hd.h, seq.batch);
    bulk_load(s.dpsum(do_stage), p.dpsum + row_offset, SmemLayout::kRow, s.do_full(do_stage));
    stamp_producer(p, v, kProdDoIssued);
    prev = w;
    w = next;
  }
}

}  // namespace bwd
