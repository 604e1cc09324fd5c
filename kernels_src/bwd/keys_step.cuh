// Backward main kernel at head dim 192 with FA3's 64 x 96 tile (kSplitByKeys), MMA warpgroups: one call of bwd_step
// per visit (m_block, n_block). Three warpgroups share the 64 queries of the Q tile and the 96 keys of the KV tile:
// warpgroup wg computes S = Q K^T and dP = dO V^T for keys [32 wg, + 32) over the whole head dim, P and dS from them
// (stored transposed, keys x queries, into the one P^T / dS^T buffer), and then, once every warpgroup's keys are
// there, dV^T += dO^T P and dK^T += Q^T dS for head-dim rows [64 wg, + 64) by the 96 keys, and dQ = dS K for
// head-dim columns [64 wg, + 64): slice wg of the dq_accum tile, handed to the dQ writer warps in one piece.
// The GEMMs are bwd/keys_gemms.cuh's (operand layouts checked on the H200 by tests/gpu/kernels/bwd192_keys_visit.cu);
// the plan and its budgets: docs/decisions/head-dim-plans.md "Head dim 192: FA3's 64 x 96 tile".
#pragma once
#include "../ptx/st_global.cuh"
#include "keys_gemms.cuh"
#include "visit_math.cuh"

namespace bwd {

static_assert(kSplitByKeys && kNumMmaWg == 3 && kDqPieces == 1 && kDkvHalves == 1 && kPdSStages == 1 &&
                  kKStages == 1 && kDoStages == 1 && kDqHalves == 1,
              "head dim 192's 64 x 96 tile: three warpgroups of 64 head-dim rows, one dQ piece each, one K buffer, "
              "one dO stage and one P^T / dS^T buffer");

// The keys (columns) of a thread's S row that its query sees, relative to column col_base (the key of column
// f.col0 of the warpgroup's 32): [lo, hi] with key - query in the band and key < Sk, clamped to [-1, kWgKeys],
// empty (lo > hi) when the query sees none of them.
struct ColWindow {
  int lo, hi;
  DASH_DEVICE ColWindow(int query, int col_base, int seqlen_k, const Band& band) {
    const int64_t first = (int64_t)query + band.lo - col_base, band_last = (int64_t)query + band.hi - col_base;
    const int64_t end = (int64_t)seqlen_k - 1 - col_base, last = band_last < end ? band_last : end;
    lo = (int)(first < -1 ? -1 : first > kWgKeys ? kWgKeys : first);
    hi = (int)(last < -1 ? -1 : last > kWgKeys ? kWgKeys : last);
  }
};

// A visit's S tile (the 64 queries x the warpgroup's 32 keys) as the mask sees it: whether it needs the mask, and
// the window of a thread's query row r (0 or 8: its two rows of the m64n32 accumulator).
struct KeysTileMask {
  int query, col_base, seqlen_k;
  Band band;
  bool needed;
  DASH_DEVICE KeysTileMask(int query0, int key0, int seqlen_k_, const Band& band_, const Fragment& f)
      : query(query0 + f.row0), col_base(key0 + f.col0), seqlen_k(seqlen_k_), band(band_),
        // NOTES: the largest offset key - q of the tile is key0 + kWgKeys - 1 - query0, the smallest key0 - (query0
        // + kBlockM - 1); keys past Sk need the mask too. Uniform per warpgroup (its own key0).
        needed(key0 + kWgKeys > seqlen_k_ || key0 + kWgKeys - 1 - query0 > band_.hi ||
               key0 - (query0 + kBlockM - 1) < band_.lo) {}
  DASH_DEVICE ColWindow row(int r) const { return ColWindow(query + r, col_base, seqlen_k, band); }
};

// lse_log2 or dpsum of a thread's two query rows (f.row0 and f.row0 + 8) from the stage's shared-memory row.
DASH_DEVICE float2 query_pair(const char* smem_generic, const Smem& s, uint32_t row, const Fragment& f) {
  const float* r = reinterpret_cast<const float*>(smem_generic + (row - s.base)) + f.row0;
  return make_float2(r[0], r[8]);
}

// P = exp2(S * scale_log2 - lse_log2[q]) in place (register i: query row (i / 2) % 2, lse_log2 .x or .y); kMask: 0
// where the query does not see the key. Queries >= Sq have lse_log2 = +inf (visit_math.cuh's softmax_probs).
template <bool kMask>
DASH_DEVICE void softmax_probs_by_keys(float (&S)[kSRegs], float2 lse_log2, float scale_log2,
                                       const KeysTileMask& mask) {
  const ColWindow rows[2] = {mask.row(0), mask.row(8)};  // computed in the masked copy only
#pragma unroll
  for (int i = 0; i < kSRegs; ++i) {
    const int h = (i / 2) % 2, col = Fragment::col(i);
    const float x = fmaf(S[i], scale_log2, -(h ? lse_log2.y : lse_log2.x));
    S[i] = !kMask || (col >= rows[h].lo && col <= rows[h].hi) ? exp2_approx(x) : 0.f;
  }
}

// dS = P o (dP - dpsum[q]) from the rounded P fragments, straight into A fragments (soft-capping: times 1 - t^2,
// visit_math.cuh's softmax_grad). A register pair j of k-step ks sits in query row j % 2.
DASH_DEVICE void softmax_grad_by_keys(uint32_t (&dSa)[kSRegs / 8][4], const uint32_t (&Pa)[kSRegs / 8][4],
                                      const float (&dP)[kSRegs], float2 dpsum, const uint32_t (&dT)[kDtRegs]) {
#pragma unroll
  for (int ks = 0; ks < kSRegs / 8; ++ks) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int i = 8 * ks + 2 * j;
      const float d = j % 2 ? dpsum.y : dpsum.x;
      const float2 prob = unpack_elem2(Pa[ks][j]);
      float ds0 = prob.x * (dP[i] - d), ds1 = prob.y * (dP[i + 1] - d);
      static_assert(kDtPairs == (kSoftcap ? kSRegs / 2 : 0), "this plan keeps dT for every pair, in registers");
      if constexpr (kDtPairs > 0) {
        const float2 t = unpack_elem2(dT[i / 2]);
        ds0 *= t.x;
        ds1 *= t.y;
      }
      dSa[ks][j] = pack_elem2(ds0, ds1);
    }
  }
}

// From the S wait to the dS^T store of a visit: P into Pa and the P^T tile, dS into dSa and the dS^T tile (this
// warpgroup's 32 key rows of each); V released after the group's last dP. Issued after S and dP (two commit groups).
// NOTES: instantiated per kMask and branched on before the S wait, as visit_math.cuh's probs_and_grads (a branch
// between the wait and the store splits ptxas's scheduling region).
template <bool kMask>
DASH_DEVICE void probs_and_grads_by_keys(float (&S)[kSRegs], float (&dP)[kSRegs], uint32_t (&Pa)[kSRegs / 8][4],
                                         uint32_t (&dSa)[kSRegs / 8][4], const KeysTileMask& mask,
                                         const BwdParams& p, const Smem& s, const char* smem_generic,
                                         int stage, bool release_v, int64_t v, int wg, int tid, const Fragment& f) {
  const float2 lse_log2 = query_pair(smem_generic, s, s.lse(stage), f);
  wgmma_wait<1>();
  wgmma_fence_operand(S);
  stamp_wg(p, v, wg, tid, kWgSDone);
  uint32_t dT[kDtRegs];
  if constexpr (kSoftcap) softcap_scores(S, dT, p.softcap_prescale);
  softmax_probs_by_keys<kMask>(S, lse_log2, p.softmax_scale_log2, mask);
  const float2 dpsum = query_pair(smem_generic, s, s.dpsum(0), f);
  pack_fragments<kSRegs>(Pa, S);
  // NOTES: one P^T / dS^T buffer: every MMA warpgroup's GEMMs of the previous visit, its last readers, are complete
  // (each visit ends with wgmma_wait<0>) once all of them are here.
  named_barrier_sync<kBarPdSFree, kPdSThreads>();
  store_transposed<kBlockN>(s.pt(0), Pa, 0, tid, kWgKeys * wg);  // while dP runs
  wgmma_wait<0>();
  wgmma_fence_operand(dP);
  stamp_wg(p, v, wg, tid, kWgDpDone);
  softmax_grad_by_keys(dSa, Pa, dP, dpsum, dT);
  store_transposed<kBlockN>(s.ds(0), dSa, 0, tid, kWgKeys * wg);
  if (release_v && tid == 0) mbar_arrive(s.v_empty());  // dP was V's last use
}

// One visit, as bwd/mainloop.cuh's bwd_step (the same arguments and hand-offs); dK, dV: the transposed accumulators
// (head-dim rows [64 wg, + 64) x the 96 keys).
DASH_DEVICE VisitSlot bwd_step(const BwdParams& p, const Smem& s, char* smem_generic, int64_t v, uint32_t j,
                               uint32_t group, bool first_in_group, DkvAcc& dK, DkvAcc& dV, int wg, int tid) {
  const int stage = (int)(j % kStages);
  const Fragment f(tid);

  // S = Q K_wg^T and dP = dO V_wg^T over the whole head dim (both K-major), two commit groups.
  float S[kSRegs], dP[kSRegs];
  const VisitSlot slot = issue_scores(
      p, s, v, j, group, first_in_group, wg, tid,
      [&] { gemm_scores_by_keys<kHeadDim / 16, TileQ, TileKV>(S, s.q(stage), s.k(0), wg); },
      [&] { gemm_scores_by_keys<kHeadDimV / 16, TileQ, TileKV>(dP, s.dout(0), s.v(), wg); });
  const Visit& w = slot.w;
  const bool last_in_group = slot.last;
  const bool closes_run = !kRunLoop && last_in_group;  // as in bwd/mainloop.cuh's bwd_step
  const Head hd(p, w.bh);
  const BwdRows<kBlockM> seq(p, hd.b, hd.h);
  const Band band(p, seq.seqlen_q, seq.seqlen_k);
  const KeysTileMask mask(w.m_block * kBlockM, w.n_block * kBlockN + kWgKeys * wg, seq.seqlen_k, band, f);

  // P and dS of this warpgroup's keys, into the P^T and dS^T tiles.
  uint32_t Pa[kSRegs / 8][4], dSa[kSRegs / 8][4];
  if (mask.needed) {
    probs_and_grads_by_keys<true>(S, dP, Pa, dSa, mask, p, s, smem_generic, stage, closes_run, v, wg, tid, f);
  } else {
    probs_and_grads_by_keys<false>(S, dP, Pa, dSa, mask, p, s, smem_generic, stage, closes_run, v, wg, tid, f);
  }
  fence_proxy_async_smem();
  stamp_wg(p, v, wg, tid, kWgDvIssued);
  named_barrier_sync<kBarPdS, kPdSThreads>();
  stamp_wg(p, v, wg, tid, kWgBarrier);

  // dV^T += dO^T P, dQ = dS K, dK^T += Q^T dS: three commit groups, dQ's before dK's so that the writer starts early.
  const int d0 = kHeadRows * wg;
  wgmma_fence();
  gemm_head_rows_by_keys<kBlockM, kBlockN, TileQ, TileKQ>(dV[0], s.dout(0), d0, s.pt(0), !first_in_group);
  wgmma_commit();
  float dQ[kDqRegs];
  gemm_dq_by_keys<kBlockN, TileKV>(dQ, s.ds(0), s.k(0), d0);
  wgmma_commit();
  gemm_head_rows_by_keys<kBlockM, kBlockN, TileQ, TileKQ>(dK[0], s.q(stage), d0, s.ds(0), !first_in_group);
  wgmma_commit();

  // dV^T done: dO may be overwritten.
  wgmma_wait<2>();
  wgmma_fence_operand(dV[0]);
  if (tid == 0) mbar_arrive(s.do_empty(0));

  // dQ done: (after the group's last visit) K may be overwritten; slice wg goes to the writer.
  wgmma_wait<1>();
  stamp_wg(p, v, wg, tid, kWgDqDone);
  wgmma_fence_operand(dQ);
  if (tid == 0) {
    if (closes_run) mbar_arrive(s.k_empty(0));
    if (wg == 0) stamp(p, v, kStampDqReady);
  }
  hand_dq_to_writer(s, dQ, wg, tid);

  // dK^T done: Q may be overwritten.
  wgmma_wait<0>();
  stamp_wg(p, v, wg, tid, kWgDkDone);
  wgmma_fence_operand(dK[0]);
  if (tid == 0) mbar_arrive(s.q_empty(stage));
  return slot;
}

// Eight consecutive head-dim values [col, col + 8) of one key (row of the sequence) into dk (scaled) and dv.
DASH_DEVICE void store_key_row8(elem_t* dk_row, elem_t* dv_row, int col, const float (&k8)[8], const float (&v8)[8]) {
  st_global_v4(dk_row + col, pack_elem2(k8[0], k8[1]), pack_elem2(k8[2], k8[3]), pack_elem2(k8[4], k8[5]),
               pack_elem2(k8[6], k8[7]));
  if (has_value_rows(col)) {
    st_global_v4(dv_row + col, pack_elem2(v8[0], v8[1]), pack_elem2(v8[2], v8[3]), pack_elem2(v8[4], v8[5]),
                 pack_elem2(v8[6], v8[7]));
  }
}

// dK (scaled by softmax_scale) and dV of the KV tile from the transposed accumulators, keys < Sk (of the sequence).
// NOTES: register i = 4 c + 2 h8 + e (c = 0..11) holds head-dim row 64 wg + 16 warp + lane / 4 + 8 h8, key 8 c + 2
// (lane % 4) + e of the tile. For fixed (h8, e) the eight lanes with one lane % 4 hold eight consecutive head-dim
// rows, and lane_transpose<4> over c = 0..7 gives lane r the rows of key 8 r + 2 (lane % 4) + e (split_step.cuh's
// epilogue); keys 64..95 (c = 8..11) take the eight values x = 2 (c - 8) + e of both e at once, lane r then holding
// key 64 + 8 (r / 2) + 2 (lane % 4) + r % 2. Each lane stores 16 bytes per key row.
DASH_DEVICE void store_dkv(const BwdParams& p, const Smem&, const Visit& w, const DkvAcc& dK, const DkvAcc& dV,
                           int wg, int tid) {
  const Head hd(p, w.bh);
  const BwdRows<kBlockM> seq(p, hd.b, hd.h);
  const int lane = tid % 32, r = lane / 4;
  const float scale = p.softmax_scale;
  const int key0 = w.n_block * kBlockN + 2 * (lane % 4);
  elem_t* dk_base = p.dk + seq.batch * p.dk_stride.batch + hd.hk * p.dk_stride.head;
  elem_t* dv_base = p.dv + seq.batch * p.dv_stride.batch + hd.hk * p.dv_stride.head;
  static_assert(kBlockN == 96 && kDkvRegs == 48, "64 + 32 keys per tile");
#pragma unroll
  for (int h8 = 0; h8 < 2; ++h8) {
    const int col = kHeadRows * wg + 16 * (tid / 32) + 8 * h8;
#pragma unroll
    for (int e = 0; e < 3; ++e) {  // e 0, 1: keys 0..63 of parity e; 2: keys 64..95
      float k8[8], v8[8];
#pragma unroll
      for (int x = 0; x < 8; ++x) {
        const int i = e < 2 ? 4 * x + 2 * h8 + e : 4 * (8 + x / 2) + 2 * h8 + x % 2;
        k8[x] = dK[0][i] * scale;
        v8[x] = dV[0][i];
      }
      lane_transpose<4>(k8, r);
      lane_transpose<4>(v8, r);
      const int key = key0 + (e < 2 ? 8 * r + e : 64 + 8 * (r / 2) + r % 2);
      if (key < seq.seqlen_k) {  // after the shuffles, which every lane of the warp takes part in
        const int64_t row = seq.row_k + key;
        store_key_row8(dk_base + row * p.dk_stride.row, dv_base + row * p.dv_stride.row, col, k8, v8);
      }
    }
  }
}

}  // namespace bwd
