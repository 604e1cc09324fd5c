// Forward kernel, producer (one lane of warp 0): TMA loads of Q once, then K and V of each KV tile from the last
// visible one down to the first, in the order the MMA warpgroups consume them: K_n is needed one step before V_n.
#pragma once
#include "../params.cuh"
#include "../ptx/mbarrier.cuh"
#include "../ptx/tma.cuh"
#include "../tile_tma.cuh"
#include "config.cuh"

namespace fwd {

// NOTES: tiles land as SwizzledTiles (tile_tma.cuh: the tensor maps, head dim 96 padded); rows past S are
// zero-filled (masked or never stored).
// Load i of a ring uses stage i % kStages at parity (i / kStages) & 1; the producer waits for the opposite
// parity on the empty barrier, which a fresh barrier grants for the first kStages loads.
// kCols: the tensor's head dim (k: kHeadDimIO, v: kHeadDimVIO); kBytes: what the load fills.
template <int kCols, int kBytes>
DASH_DEVICE void load_kv_tile(const TmaDesc* map, uint32_t dst, uint32_t full, uint32_t empty, int i, int n_block,
                              const Tile& t) {
  mbar_wait(empty, ((i / kStages) & 1) ^ 1);
  mbar_arrive_expect_tx(full, kBytes);
  tma_load_tile<kBlockN, kCols>(dst, map, full, t.row_k + n_block * kBlockN, t.hk, t.batch);
}

DASH_DEVICE void produce(const FwdParams& p, const Smem& s, const Tile& t) {
  if (t.n_blocks == 0) return;
  tma_prefetch_desc(&p.tma_q);
  tma_prefetch_desc(&p.tma_k);
  tma_prefetch_desc(&p.tma_v);
  mbar_arrive_expect_tx(s.q_full(), SmemLayout::kQ);
  tma_load_tile<kBlockM, kHeadDimIO>(s.q(), &p.tma_q, s.q_full(), t.row_q + t.m_block * kBlockM, t.h, t.batch);
  const int last = t.n_block_min + t.n_blocks - 1;
  const auto load_k = [&](int i) {
    load_kv_tile<kHeadDimIO, SmemLayout::kKV>(&p.tma_k, s.k(i % kStages), s.k_full(i % kStages),
                                              s.k_empty(i % kStages), i, last - i, t);
  };
  const auto load_v = [&](int i) {
    load_kv_tile<kHeadDimVIO, SmemLayout::kVLoad>(&p.tma_v, s.v(i % kStages), s.v_full(i % kStages),
                                                  s.v_empty(i % kStages), i, last - i, t);
  };
  load_k(0);
  for (int i = 1; i < t.n_blocks; ++i) {
    load_k(i);
    load_v(i - 1);
  }
  load_v(t.n_blocks - 1);
}

}  // namespace fwd
