// Backward main kernel, MMA warpgroups: one call of bwd_step per visit (m_block, n_block) of the schedule.
// Warpgroup wg owns keys [64 wg, 64 wg + 64) of the KV tile. S and dP are computed transposed (keys x queries,
// FA3's SdP_swapAB), so P^T and dS^T leave the accumulators directly as register A operands of
// dV += P^T dO and dK += dS^T Q; dS goes through shared memory for dQ = dS K, whose fp32 piece is handed to
// the dQ writer warp (dq_reduce.cuh), stored into its staging slice beside dK's commit groups (kDqStoreParts).
#pragma once
#include "epilogue.cuh"
#include "visit_math.cuh"

namespace bwd {

static_assert(!kSplitHeadDim, "head dim 256: bwd/split_step.cuh");
static_assert(kDqHalves == 1, "one staging slot per MMA warpgroup: the dQ store is split over dK instead");

// acc (64 keys x kBlockM queries) = A B^T over the head dim, A = this warpgroup's 64 rows of K or V (a_desc at
// k-step 0), B = the Q or dO tile; both K-major: S^T = K Q^T, dP^T = V dO^T. Issues the wgmmas, no commit. Head
// dim 96: the k-steps of the zero columns 96..127 are skipped.
DASH_DEVICE void gemm_keys_by_queries(float (&acc)[kSRegs], uint64_t a_desc, uint32_t b_tile) {
  gemm_ss_kmajor<kBlockM, kHeadDimIO / 16, TileKV, TileQ>(acc, a_desc, TileQ::kmajor(b_tile, 0));
}

// acc (64 keys x kHeadDimIO) += A B over k-steps [kBegin, kEnd) (all kBlockM / 16 by default), A = rounded fragments
// of P^T or dS^T (64 keys x kBlockM queries), B = the dO or Q tile as an MN-major operand: dV += P^T dO,
// dK += dS^T Q. restart: the first k-step ignores acc (new KV tile). Issues the wgmmas, no commit.
template <int kBegin = 0, int kEnd = kBlockM / 16>
DASH_DEVICE void gemm_accumulate_rs(float (&acc)[kDkvRegs], const uint32_t (&a)[kBlockM / 16][4], uint32_t b_tile,
                                    bool restart) {
  const uint64_t b_desc = TileQ::mnmajor(b_tile, 0);
#pragma unroll
  for (int ks = kBegin; ks < kEnd; ++ks) {
    wgmma_rs<kHeadDimIO, 1>(acc, a[ks], desc_advance(b_desc, TileQ::mnmajor_step(ks)), !(restart && ks == 0));
  }
}

// Part i of n things split into kDqStoreParts parts starts at dq_part_begin(i, n); the first parts take the rest.
constexpr int dq_part_begin(int i, int n) { return (i * n + kDqStoreParts - 1) / kDqStoreParts; }

// dK += dS^T Q in kDqStoreParts commit groups (part kPart's k-steps, then the following parts').
template <int kPart = 0>
DASH_DEVICE void issue_dk_in_parts(float (&dK)[kDkvRegs], const uint32_t (&dSa)[kBlockM / 16][4], uint32_t q_tile,
                                   bool restart) {
  constexpr int kSteps = kBlockM / 16;
  gemm_accumulate_rs<dq_part_begin(kPart, kSteps), dq_part_begin(kPart + 1, kSteps)>(dK, dSa, q_tile, restart);
  wgmma_commit();
  if constexpr (kPart + 1 < kDqStoreParts) issue_dk_in_parts<kPart + 1>(dK, dSa, q_tile, restart);
}

// The dQ piece into the staging slice in kDqStoreParts parts of its float4 groups (store_dq's layout), part i > 0
// once dK's commit group i - 1 is complete (dK's parts the only GEMMs in flight).
template <int kPart = 0>
DASH_DEVICE void store_dq_beside_dk(uint32_t slice, const float (&dQ)[kDqRegs], int tid) {
  constexpr int kGroups = kDqRegs / 4, kFirst = dq_part_begin(kPart, kGroups);
  if constexpr (kPart > 0) wgmma_wait<kDqStoreParts - kPart>();
  store_dq(slice + 16 * 128 * kFirst, dQ, tid, kFirst, dq_part_begin(kPart + 1, kGroups) - kFirst);
  if constexpr (kPart + 1 < kDqStoreParts) store_dq_beside_dk<kPart + 1>(slice, dQ, tid);
}

// This warpgroup's dQ piece = dS K over all kBlockN keys, from the dS tile (both warpgroups' dS^T) and the K tile.
// Issues the wgmmas, no commit.
DASH_DEVICE void gemm_dq(float (&dQ)[kDqRegs], uint32_t ds_tile, uint32_t k_tile, int wg) {
  if constexpr (DqLayout::kTransposed) {
    // dQ^T piece = K^T dS^T: A = head-dim panel wg of K (MN-major), B = dS (K-major, all kBlockM queries).
    const uint64_t kt_desc = TileKV::mnmajor(k_tile, 64 * wg), ds_desc = TileQ::kmajor(ds_tile, 0);
#pragma unroll
    for (int ks = 0; ks < kBlockN / 16; ++ks) {
      wgmma_ss<kDqCols, 1, 0>(dQ, desc_advance(kt_desc, TileKV::mnmajor_step(ks)),
                              desc_advance(ds_desc, TileQ::kmajor_step(ks)), ks > 0);
    }
  } else {
    const uint64_t ds_desc = TileQ::kmajor(ds_tile, DqLayout::row0(wg));
    const uint64_t kb_desc = TileKV::mnmajor(k_tile, DqLayout::col0(wg));
#pragma unroll
    for (int ks = 0; ks < kBlockN / 16; ++ks) {
      wgmma_ss<kDqCols, 0, 1>(dQ, desc_advance(ds_desc, TileQ::kmajor_step(ks)),
                              desc_advance(kb_desc, TileKV::mnmajor_step(ks)), ks > 0);
    }
  }
}

// One visit (index v of the table, read from the producer's VisitSlot, returned): j is the CTA-local visit counter
// (selects the stage and phase of the Q / dO / dS buffers and the slot), group the CTA-local KV-tile counter
// (selects the K buffer and the K, V phases). first_in_group (the previous visit was its KV tile's last, or there
// was none): the dK / dV stores of the last KV tile must have read their staging; in the flat loop also K and V must
// be waited for and dK, dV start from zero, and on the slot's last V is released after dP^T, K after dQ.
DASH_DEVICE VisitSlot bwd_step(const BwdParams& p, const Smem& s, char* smem_generic, int64_t v, uint32_t j,
                               uint32_t group, bool first_in_group, float (&dK)[kDkvRegs], float (&dV)[kDkvRegs],
                               int wg, int tid) {
  const int stage = (int)(j % kStages), do_stage = (int)(j % kDoStages);
  const int kbuf = (int)(group % kKStages);
  const Fragment f(tid);

  // S^T = K_wg Q^T and dP^T = V_wg dO^T (both K-major from shared memory), two commit groups.
  const uint64_t k_desc = TileKV::kmajor(s.k(kbuf), 64 * wg), v_desc = TileKV::kmajor(s.v(), 64 * wg);
  float S[kSRegs], dP[kSRegs];
  LseEarly lse_early;
  const VisitSlot slot = issue_scores(p, s, v, j, group, first_in_group, wg, tid,
                                      [&] {  // kLseEarly: lse_log2 while no GEMM reads shared memory
                                        lse_early.load(smem_generic, s, s.lse(stage), 0, f);
                                        gemm_keys_by_queries(S, k_desc, s.q(stage));
                                      },
                                      [&] { gemm_keys_by_queries(dP, v_desc, s.dout(do_stage)); });
  const Visit& w = slot.w;
  const bool last_in_group = slot.last;
  // NOTES: with kRunLoop the run's loop (bwd/consume.cuh) waits for and releases K and V and zeroes dK / dV; the
  // flat loop's visits do it themselves, on their KV tile's first and last visit.
  const bool opens_run = !kRunLoop && first_in_group, closes_run = !kRunLoop && last_in_group;
  const int key0 = w.n_block * kBlockN + 64 * wg, query0 = w.m_block * kBlockM;
  const Head hd(p, w.bh);
  const BwdRows<kBlockM> seq(p, hd.b, hd.h);
  const Band band(p, seq.seqlen_q, seq.seqlen_k);
  const TileMask mask(key0, query0, seq.seqlen_k, band, f);

  // P^T from S^T while dP^T is still running, then dS^T (first in a KV tile: once the last one's dK / dV stores
  // have read the dS tiles).
  if (first_in_group) dkv_staging_free(tid);
  uint32_t Pa[kBlockM / 16][4], dSa[kBlockM / 16][4];
  probs_and_grads_of(S, dP, Pa, dSa, mask, p, s, smem_generic, stage, do_stage, closes_run, v, wg, tid, f, lse_early);

  // dV += P^T dO.
  wgmma_fence();
  gemm_accumulate_rs(dV, Pa, s.dout(do_stage), opens_run);
  wgmma_commit();

  // dQ piece = dS K over all kBlockN keys, once both warpgroups' dS^T is in shared memory.
  fence_proxy_async_smem();
  stamp_wg(p, v, wg, tid, kWgDvIssued);
  named_barrier_sync<kBarPdS, kPdSThreads>();
  stamp_wg(p, v, wg, tid, kWgBarrier);
  float dQ[kDqRegs];
  gemm_dq(dQ, s.ds(stage), s.k(kbuf), wg);
  wgmma_commit();

  // dK += dS^T Q, in kDqStoreParts commit groups.
  issue_dk_in_parts(dK, dSa, s.q(stage), opens_run);

  // dV and dQ done: dO (and, closing a run of the flat loop, K) may be overwritten; dQ goes to the writer, stored
  // beside dK's parts.
  wgmma_wait<kDqStoreParts>();
  stamp_wg(p, v, wg, tid, kWgDqDone);
  wgmma_fence_operand(dQ);
  wgmma_fence_operand(dV);
  wgmma_fence_operand(Pa);
  if (tid == 0) {
    mbar_arrive(s.do_empty(do_stage));
    if (closes_run) mbar_arrive(s.k_empty(kbuf));
    if (wg == 0) stamp(p, v, kStampDqReady);
  }
  hand_dq_slice(s, wg, [&](uint32_t slice) { store_dq_beside_dk(slice, dQ, tid); });

  // dK done: Q may be overwritten.
  wgmma_wait<0>();
  stamp_wg(p, v, wg, tid, kWgDkDone);
  wgmma_fence_operand(dK);
  wgmma_fence_operand(dSa);
  if (tid == 0) mbar_arrive(s.q_empty(stage));
  return slot;
}

}  // namespace bwd
