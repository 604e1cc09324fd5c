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

// The loads of tile t, K / V ring loads kv.. of the CTA, after `done` earlier tiles (persistent launches): the
// first K goes before Q there, as its stage may be free while the previous tile's O stores still read Q's shared
// memory (q_empty). A tile without KV tiles loads Q alone (persistent launches only; fwd.cu's NOTES say why).
DASH_DEVICE void produce(const FwdParams& p, const Smem& s, const Tile& t, int kv, int done) {
  if (done == 0) {
    tma_prefetch_desc(&p.tma_q);
    tma_prefetch_desc(&p.tma_k);
    tma_prefetch_desc(&p.tma_v);
  }
  const int last = t.n_block_min + t.n_blocks - 1;
  const auto load_k = [&](int i) {
    const int g = kv + i;
    load_kv_tile<kHeadDimIO, SmemLayout::kKV>(&p.tma_k, s.k(g % kStages), s.k_full(g % kStages),
                                              s.k_empty(g % kStages), g, last - i, t);
  };
  const auto load_v = [&](int i) {
    const int g = kv + i;
    load_kv_tile<kHeadDimVIO, SmemLayout::kVLoad>(&p.tma_v, s.v(g % kStages), s.v_full(g % kStages),
                                                  s.v_empty(g % kStages), g, last - i, t);
  };
  const auto load_q = [&]() {
    mbar_arrive_expect_tx(s.q_full(), SmemLayout::kQ);
    tma_load_tile<kBlockM, kHeadDimIO>(s.q(), &p.tma_q, s.q_full(), t.row_q + t.m_block * kBlockM, t.h, t.batch);
  };
  if (t.n_blocks == 0) {
    if (done > 0) mbar_wait(s.q_empty(), (done - 1) & 1);
    load_q();
    return;
  }
  if (done == 0) {
    load_q();
    load_k(0);
  } else {
    load_k(0);
    mbar_wait(s.q_empty(), (done - 1) & 1);
    load_q();
  }
  for (int i = 1; i < t.n_blocks; ++i) {
    load_k(i);
    load_v(i - 1);
  }
  load_v(t.n_blocks - 1);
}

}  // namespace fwd
