// Backward main kernel at head dims 192 and 256, MMA warpgroups: one call of bwd_step per visit (m_block, n_block).
// The warpgroups (two at 256, three at 192) work on the same 64 keys and 32 queries each and split the head dim
// (bwd/config.cuh, kSplitHeadDim): warpgroup wg computes S^T = K Q^T and dP^T = V dO^T for queries [32 wg, 32 wg +
// 32) over the whole head dim, P^T and dS^T from them (bwd/visit_math.cuh, stored to shared memory), and then, once
// every warpgroup's queries are there, dV^T += dO^T P and dK^T += Q^T dS for its kHeadRows head-dim rows (m64
// halves) and its two dQ pieces for the dQ writer warps: at 256, dQ = dS K for head-dim columns [128 wg, + 128) in
// two 64 x 64 chunks; at 192, dQ^T = K^T dS^T for head-dim rows [64 wg, + 64) in two chunks of 48 queries.
// The plan and its budgets: docs/decisions/head-dim-plans.md "Head dims 192 and 256: a backward plan".
#pragma once
#include "../ptx/st_global.cuh"
#include "visit_math.cuh"

namespace bwd {

static_assert(kSplitHeadDim && kDqPieces == 2 && kKStages == 1 && kDoStages == 1 &&
                  ((kNumMmaWg == 2 && kDkvHalves == 2 && !kPdSByQueries) ||
                   (kNumMmaWg == 3 && kDkvHalves == 1 && kPdSByQueries)),
              "head dims 256 and 192 (bwd/mainloop.cuh otherwise): two dQ pieces per warpgroup, one K buffer and one "
              "dO stage; two warpgroups of two dK^T / dV^T halves, or three of one");

// dK^T or dV^T of one warpgroup (DkvAcc): half h holds head-dim rows [kHeadRows wg + 64 h, + 64) x the 64 keys
// (m64n64 fragments).
constexpr int kHalfRegs = kDkvRegs / kDkvHalves;

// acc (64 head-dim rows x 64 keys) (+)= A B over the tile's kBlockM queries: A = the Q or dO tile read MN-major from
// head-dim column d0, B = the dS or P tile (256: keys x queries, K-major; 192: queries x keys, MN-major): dK^T += Q^T
// dS, dV^T += dO^T P. restart: the first k-step ignores acc (new KV tile). Issues the wgmmas, no commit.
DASH_DEVICE void gemm_head_by_keys(float (&acc)[kHalfRegs], uint32_t a_tile, int d0, uint32_t b_tile, bool restart) {
  const uint64_t a_desc = TileQ::mnmajor(a_tile, d0);
#pragma unroll
  for (int ks = 0; ks < kBlockM / 16; ++ks) {
    const uint64_t a = desc_advance(a_desc, TileQ::mnmajor_step(ks));
    if constexpr (kPdSByQueries) {
      wgmma_ss<kBlockN, 1, 1>(acc, a, desc_advance(TileQ::mnmajor(b_tile, 0), TileQ::mnmajor_step(ks)),
                              !(restart && ks == 0));
    } else {
      wgmma_ss<kBlockN, 1, 0>(acc, a, desc_advance(TileKQ::kmajor(b_tile, 0), TileKQ::kmajor_step(ks)),
                              !(restart && ks == 0));
    }
  }
}

// dQ piece c of warpgroup wg over the 64 keys. Head dim 256: dQ (64 queries x head-dim columns [128 wg + 64 c, + 64))
// = dS K, A = the dS^T tile read MN-major, B = the K tile read MN-major. Head dim 192: dQ^T (head-dim rows [64 wg,
// + 64) x queries [48 c, + 48)) = K^T dS^T, A = the K tile read MN-major, B = the dS tile (queries x keys) K-major
// from row 48 c. Issues the wgmmas, no commit.
DASH_DEVICE void gemm_dq_piece(float (&acc)[kDqRegs], uint32_t ds_tile, uint32_t k_tile, int wg, int c) {
#pragma unroll
  for (int ks = 0; ks < kBlockN / 16; ++ks) {
    if constexpr (kPdSByQueries) {
      wgmma_ss<kDqPieceCols, 1, 0>(acc,
                                   desc_advance(TileKV::mnmajor(k_tile, kHeadRows * wg), TileKV::mnmajor_step(ks)),
                                   desc_advance(TileQ::kmajor(ds_tile, kDqPieceCols * c), TileQ::kmajor_step(ks)),
                                   ks > 0);
    } else {
      wgmma_ss<kDqPieceCols, 1, 1>(acc, desc_advance(TileKQ::mnmajor(ds_tile, 0), TileKQ::mnmajor_step(ks)),
                                   desc_advance(TileKV::mnmajor(k_tile, kHeadRows * wg + 64 * c),
                                                TileKV::mnmajor_step(ks)),
                                   ks > 0);
    }
  }
}

// One visit, as bwd/mainloop.cuh's bwd_step (the same arguments and hand-offs); dK, dV: the transposed accumulators.
// NOTES: head dim 256's P^T and dS^T tiles alternate by visit parity (the Q stage). A warpgroup stores visit j + 2's
// tiles only after passing visit j + 1's barrier, which the other warpgroup reaches only after its visit-j GEMMs, the
// last readers of those tiles, completed (each visit ends with wgmma_wait<0>). Head dim 192's one P / dS buffer:
// visit_math.cuh's kBarPdSFree.
DASH_DEVICE VisitSlot bwd_step(const BwdParams& p, const Smem& s, char* smem_generic, int64_t v, uint32_t j,
                               uint32_t group, bool first_in_group, DkvAcc& dK, DkvAcc& dV, int wg, int tid) {
  const int stage = (int)(j % kStages);
  const Fragment f(tid);
  const int q0 = kWgQueries * wg;

  // S^T = K Q_wg^T and dP^T = V dO_wg^T over the whole head dim (both K-major), two commit groups.
  float S[kSRegs], dP[kSRegs];
  const VisitSlot slot = issue_scores(
      p, s, v, j, group, first_in_group, wg, tid,
      [&] {
        gemm_ss_kmajor<kWgQueries, kHeadDim / 16, TileKV, TileQ>(S, TileKV::kmajor(s.k(0), 0),
                                                                 TileQ::kmajor(s.q(stage), q0));
      },
      [&] {
        gemm_ss_kmajor<kWgQueries, kHeadDimV / 16, TileKV, TileQ>(dP, TileKV::kmajor(s.v(), 0),
                                                                  TileQ::kmajor(s.dout(0), q0));
      });
  const Visit& w = slot.w;
  const bool last_in_group = slot.last;
  const bool closes_run = !kRunLoop && last_in_group;  // as in bwd/mainloop.cuh's bwd_step
  const Head hd(p, w.bh);
  const BwdRows<kBlockM> seq(p, hd.b, hd.h);
  const Band band(p, seq.seqlen_q, seq.seqlen_k);
  const TileMask mask(w.n_block * kBlockN, w.m_block * kBlockM + q0, seq.seqlen_k, band, f);

  // P^T and dS^T of this warpgroup's queries, into the P / dS tiles.
  uint32_t Pa[kWgQueries / 16][4], dSa[kWgQueries / 16][4];
  static_assert(!kLseEarly, "the split plans read lse_log2 at the point of use");
  probs_and_grads_of(S, dP, Pa, dSa, mask, p, s, smem_generic, stage, 0, closes_run, v, wg, tid, f, LseEarly{});
  fence_proxy_async_smem();
  stamp_wg(p, v, wg, tid, kWgDvIssued);
  named_barrier_sync<kBarPdS, kPdSThreads>();
  stamp_wg(p, v, wg, tid, kWgBarrier);

  // dV^T += dO^T P, the dQ pieces, dK^T += Q^T dS: three commit groups, dQ's before dK's so that the writer starts
  // early.
  const int d0 = kHeadRows * wg, pds = pds_stage(stage);
  wgmma_fence();
#pragma unroll
  for (int h = 0; h < kDkvHalves; ++h) gemm_head_by_keys(dV[h], s.dout(0), d0 + 64 * h, s.pt(pds), first_in_group);
  wgmma_commit();
  float dQ[kDqPieces][kDqRegs];
#pragma unroll
  for (int c = 0; c < kDqPieces; ++c) gemm_dq_piece(dQ[c], s.ds(pds), s.k(0), wg, c);
  wgmma_commit();
#pragma unroll
  for (int h = 0; h < kDkvHalves; ++h) gemm_head_by_keys(dK[h], s.q(stage), d0 + 64 * h, s.ds(pds), first_in_group);
  wgmma_commit();

  // dV^T done: dO may be overwritten.
  wgmma_wait<2>();
#pragma unroll
  for (int h = 0; h < kDkvHalves; ++h) wgmma_fence_operand(dV[h]);
  if (tid == 0) mbar_arrive(s.do_empty(0));

  // dQ done: (after the group's last visit) K may be overwritten; the pieces go to the writer.
  wgmma_wait<1>();
  stamp_wg(p, v, wg, tid, kWgDqDone);
#pragma unroll
  for (int c = 0; c < kDqPieces; ++c) wgmma_fence_operand(dQ[c]);
  if (tid == 0) {
    if (closes_run) mbar_arrive(s.k_empty(0));
    if (wg == 0) stamp(p, v, kStampDqReady);
  }
#pragma unroll
  for (int c = 0; c < kDqPieces; ++c) hand_dq_to_writer(s, dQ[c], wg, tid);

  // dK^T done: Q may be overwritten.
  wgmma_wait<0>();
  stamp_wg(p, v, wg, tid, kWgDkDone);
#pragma unroll
  for (int h = 0; h < kDkvHalves; ++h) wgmma_fence_operand(dK[h]);
  if (tid == 0) mbar_arrive(s.q_empty(stage));
  return slot;
}

// dK (scaled by softmax_scale) and dV of the KV tile from the transposed accumulators, rows < Sk (of the sequence).
// NOTES: register i = 4 c + 2 h8 + e of half h holds head-dim row kHeadRows wg + 64 h + 16 warp + lane / 4 + 8 h8,
// key 8 c + 2 (lane % 4) + e: for fixed (h, h8, e) the eight lanes with one lane % 4 hold eight consecutive head-dim
// rows for eight keys. lane_transpose<4> gives each of them the eight rows of one key, key 8 (lane / 4) + 2 (lane %
// 4) + e: one 16-byte store into dK or dV.
DASH_DEVICE void store_dkv(const BwdParams& p, const Smem&, const Visit& w, const DkvAcc& dK, const DkvAcc& dV,
                           int wg, int tid) {
  const Head hd(p, w.bh);
  const BwdRows<kBlockM> seq(p, hd.b, hd.h);
  const int lane = tid % 32, r = lane / 4;
  const float scale = p.softmax_scale;
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    const int key = w.n_block * kBlockN + 8 * r + 2 * (lane % 4) + e;
    const int64_t row = seq.row_k + key;
    elem_t* dk_row = p.dk + seq.batch * p.dk_stride.batch + row * p.dk_stride.row + hd.hk * p.dk_stride.head;
    elem_t* dv_row = p.dv + seq.batch * p.dv_stride.batch + row * p.dv_stride.row + hd.hk * p.dv_stride.head;
#pragma unroll
    for (int h = 0; h < kDkvHalves; ++h) {
#pragma unroll
      for (int h8 = 0; h8 < 2; ++h8) {
        float k8[8], v8[8];
#pragma unroll
        for (int c = 0; c < 8; ++c) {
          k8[c] = dK[h][4 * c + 2 * h8 + e] * scale;
          v8[c] = dV[h][4 * c + 2 * h8 + e];
        }
        lane_transpose<4>(k8, r);
        lane_transpose<4>(v8, r);
        const int col = kHeadRows * wg + 64 * h + 16 * (tid / 32) + 8 * h8;
        if (key < seq.seqlen_k) {  // after the shuffles, which every lane of the warp takes part in
          st_global_v4(dk_row + col, pack_elem2(k8[0], k8[1]), pack_elem2(k8[2], k8[3]), pack_elem2(k8[4], k8[5]),
                       pack_elem2(k8[6], k8[7]));
          if (has_value_rows(col)) {
            st_global_v4(dv_row + col, pack_elem2(v8[0], v8[1]), pack_elem2(v8[2], v8[3]), pack_elem2(v8[4], v8[5]),
                         pack_elem2(v8[6], v8[7]));
          }
        }
      }
    }
  }
}

}  // namespace bwd
