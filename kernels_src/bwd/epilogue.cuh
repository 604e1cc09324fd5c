// Backward main kernel, dK / dV epilogue: after the last visit of a KV tile each MMA warpgroup writes its 64 rows
// of dK (scaled by softmax_scale) and dV from the accumulators, rows < Sk (of the sequence, in varlen builds)
// only: a varlen sequence's last KV tile must not write into the next sequence's rows. dK and dV are contiguous
// (the host allocates them): rows and 8-column groups start on 16-byte boundaries. The rows go through shared
// memory to TMA stores (stage_dkv), or, at head dim 64 and where a box would reach into the next varlen sequence,
// from the registers to global memory (store_dkv_rows); store_dkv is the plan's entry (bwd/consume.cuh).
#pragma once
#include "../bwd_rows.cuh"
#include "../params.cuh"
#include "../ptx/bulk_reduce.cuh"
#include "../ptx/cvt.cuh"
#include "../ptx/fence.cuh"
#include "../ptx/named_barrier.cuh"
#include "../ptx/st_global.cuh"
#include "../ptx/tma.cuh"
#include "../schedule_view.cuh"
#include "../swizzled_tile.cuh"
#include "../tile_tma.cuh"
#include "../wgmma_fragment.cuh"
#include "config.cuh"

namespace bwd {

// NOTES: register i of the m64 fragment is key 16 warp + lane / 4 + 8 ((i / 2) % 2), head-dim column
// 8 (i / 4) + 2 (lane % 4) + i % 2: the four lanes of a quad hold a key row's 8-column group c as four element
// pairs. A 4 x 4 transpose within the quad (lane_transpose<1>) gives each lane all 8 columns of one group of a run
// of four, stored as one 16-byte word: a warp writes 8 rows x 64 bytes per store instead of 8 rows x 16 bytes
// (the 4-byte stores left the MMA warpgroups waiting on the store queue: decision record bwd-engine).
static_assert(kHeadDimIO / 8 % 4 == 0, "runs of four 8-column groups");

DASH_DEVICE void store_dkv_rows(const BwdParams& p, const Visit& w, const DkvAcc& dK, const DkvAcc& dV, int wg,
                                int tid) {
  const Head hd(p, w.bh);
  const BwdRows<kBlockM> seq(p, hd.b, hd.h);
  const int lane = tid % 32, q = lane % 4;
  const int key0 = w.n_block * kBlockN + 64 * wg + 16 * (tid / 32) + lane / 4;
  const float scale = p.softmax_scale;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int key = key0 + 8 * half;
    const int64_t row = seq.row_k + key;
    elem_t* dk_row = p.dk + seq.batch * p.dk_stride.batch + row * p.dk_stride.row + hd.hk * p.dk_stride.head;
    elem_t* dv_row = p.dv + seq.batch * p.dv_stride.batch + row * p.dv_stride.row + hd.hk * p.dv_stride.head;
#pragma unroll
    for (int c0 = 0; c0 < kHeadDimIO / 8; c0 += 4) {  // head dim 96: columns 96..127 (all zero) are not stored
      uint32_t k4[4], v4[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const int i = 4 * (c0 + k) + 2 * half;
        k4[k] = pack_elem2(dK[i] * scale, dK[i + 1] * scale);
        v4[k] = pack_elem2(dV[i], dV[i + 1]);
      }
      lane_transpose<1>(k4, q);
      lane_transpose<1>(v4, q);
      if (key < seq.seqlen_k) {  // after the shuffles, which every lane of the warp takes part in
        st_global_v4(dk_row + 8 * (c0 + q), k4[0], k4[1], k4[2], k4[3]);
        st_global_v4(dv_row + 8 * (c0 + q), v4[0], v4[1], v4[2], v4[3]);
      }
    }
  }
}

// NOTES: the staging slots are the stage dS tiles (kPdSStages x SmemLayout::kDS bytes, 1024-aligned), free at a
// KV tile's end once both MMA warpgroups' GEMMs of its last visit are complete: the other warpgroup's dQ GEMM reads
// this warpgroup's keys of the dS tile, so both pass kBarDkv first. A slot holds one warpgroup's 64 rows of dK or
// dV as a SwizzledTile<64> (the box of the dk / dv maps: 64 rows by every 64-column panel): dV first, then dK once
// its TMA store has read the slot. The next visit writes the dS tiles only after dkv_staging_free (its first visit of
// a KV tile).
// NOTES: head dim 64 (the 128-query tile) keeps the stores from the registers (store_dkv_rows): staged there, its change
// of KV tile was 500-900 cycles shorter but every visit's phases 2 % longer, the backward 0.8-1.7 % slower (decision
// record bwd-engine, "After stage_dkv"); its capped builds have no registers left for the staging anyway.
constexpr bool kDkvStaged = kHeadDim != 64;
constexpr int kDkvTileBytes = 64 * kHeadDim * 2;
constexpr int kDkvSlots = kPdSStages * SmemLayout::kDS / kDkvTileBytes;
static_assert(!kDkvStaged || (kDkvSlots >= kNumMmaWg && kDkvTileBytes % kSmemAlign == 0),
              "a 1024-aligned slot per warpgroup");

// One warpgroup's 64 x kHeadDimIO rows (dK scaled by `scale`, else 1) into slot `slot` of the dS tiles.
template <bool kScaled>
DASH_DEVICE void stage_rows(const Smem& s, int slot, const DkvAcc& acc, float scale, int tid) {
  uint32_t a[kDkvRegs / 8][4];
#pragma unroll
  for (int ks = 0; ks < kDkvRegs / 8; ++ks) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float x = acc[8 * ks + 2 * j], y = acc[8 * ks + 2 * j + 1];
      a[ks][j] = kScaled ? pack_elem2(x * scale, y * scale) : pack_elem2(x, y);
    }
  }
  store_rows<64>(s.ds(0) + slot * kDkvTileBytes, a, 0, tid);
}

// TMA store of slot `slot` to rows [row, row + 64) of head hk, batch `batch` of the map's tensor (head dim 96: one
// box per 64-column panel, the second clipped at column 96). Joins the calling thread's bulk group.
DASH_DEVICE void store_slot(const TmaDesc* map, const Smem& s, int slot, int row, int hk, int batch) {
  using Panel = MapPanel<kHeadDimIO>;
  const uint32_t src = s.ds(0) + slot * kDkvTileBytes;
  if constexpr (Panel::kByColumn) {
#pragma unroll
    for (int panel = 0; panel < kHeadDim / 64; ++panel) {
      tma_store_5d(map, src + panel * SwizzledTile<64>::kPanelBytes, Panel::col(panel), row, Panel::index(panel), hk,
                   batch);
    }
  } else {
    tma_store_5d(map, src, 0, row, 0, hk, batch);
  }
}

// The KV tile of visit w is done: both MMA warpgroups (every thread) write their dK and dV rows.
DASH_DEVICE void stage_dkv(const BwdParams& p, const Smem& s, const Visit& w, const DkvAcc& dK, const DkvAcc& dV,
                           int wg, int tid) {
  const Head hd(p, w.bh);
  const BwdRows<kBlockM> seq(p, hd.b, hd.h);
  const int key0 = w.n_block * kBlockN + 64 * wg;
  // NOTES: fixed-length maps clip rows past Sk; a packed varlen map would write the next sequence's rows.
  const bool staged = !is_varlen(p) || key0 + 64 <= seq.seqlen_k;
  const bool issuer = staged && tid == 0;
  if (!staged) store_dkv_rows(p, w, dK, dV, wg, tid);
  named_barrier_sync<kBarDkv, kPdSThreads>();
  if (staged) {
    stage_rows<false>(s, wg, dV, 1.f, tid);
    fence_proxy_async_smem();
  }
  named_barrier_sync<kBarDkv, kPdSThreads>();
  const int row = seq.row_k + key0;
  if (issuer) {
    store_slot(&p.tma_dv, s, wg, row, hd.hk, seq.batch);
    bulk_commit();
    bulk_wait_read<0>();
  }
  named_barrier_sync<kBarDkv, kPdSThreads>();
  if (staged) {
    stage_rows<true>(s, wg, dK, p.softmax_scale, tid);
    fence_proxy_async_smem();
  }
  named_barrier_sync<kBarDkv, kPdSThreads>();
  if (issuer) {
    store_slot(&p.tma_dk, s, wg, row, hd.hk, seq.batch);
    bulk_commit();
  }
}

// The KV tile of visit w is done, every plan's entry (bwd/consume.cuh; split_step.cuh and keys_step.cuh have
// their own): its dK / dV rows staged, or from the registers where kDkvStaged is false.
DASH_DEVICE void store_dkv(const BwdParams& p, const Smem& s, const Visit& w, const DkvAcc& dK, const DkvAcc& dV,
                           int wg, int tid) {
  if constexpr (kDkvStaged) {
    stage_dkv(p, s, w, dK, dV, wg, tid);
  } else {
    store_dkv_rows(p, w, dK, dV, wg, tid);
  }
}

// The dS tiles may be written again: the stores of the previous KV tile's epilogue have read their slots. Every
// MMA thread, before the first visit of a KV tile writes a dS tile.
DASH_DEVICE void dkv_staging_free(int tid) {
  if constexpr (!kDkvStaged) return;
  if (tid == 0) bulk_wait_read<0>();
  named_barrier_sync<kBarDkv, kPdSThreads>();
}

}  // namespace bwd
