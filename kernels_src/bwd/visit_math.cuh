// Backward main kernel, MMA warpgroups: what both visit plans share (bwd/mainloop.cuh: each warpgroup owns 64 keys;
// bwd/split_step.cuh: head dims 192 and 256, the warpgroups split the head dim): the masks, P^T and dS^T from the
// S^T and dP^T accumulators (64 keys x kWgQueries queries per warpgroup), dS^T (and at head dims 192 and 256 P^T) to
// shared memory, and the dQ hand-off to the writer warps.
#pragma once
#include "../ptx/cvt.cuh"
#include "../ptx/exp2.cuh"
#include "../ptx/fence.cuh"
#include "../ptx/mbarrier.cuh"
#include "../ptx/named_barrier.cuh"
#include "../ptx/tanh.cuh"
#include "../ptx/wgmma.cuh"
#include "../bwd_rows.cuh"
#include "../params.cuh"
#include "../schedule_view.cuh"
#include "../swizzled_tile.cuh"
#include "../wgmma_fragment.cuh"
#include "config.cuh"
#include "pipeline.cuh"
#include "timeline.cuh"

namespace bwd {

using TileKV = SwizzledTile<kBlockN>;  // K, V: keys x head dim
using TileQ = SwizzledTile<kBlockM>;   // Q, dO: queries x head dim; dS: queries x keys
using TileKQ = SwizzledTile<kBlockN>;  // P^T, dS^T, keys x queries (one panel): head dim 256, 192's 64 x 96
                                       // (192's 96 x 64: TileQ, P and dS queries x keys)

// The stage's P and dS tiles of head dims 192 and 256 (kPdSStages of them), the dS tile of the others.
DASH_DEVICE int pds_stage(int stage) { return kPdSStages == 1 ? 0 : stage; }

// Stores a warpgroup's rounded P^T or dS^T fragments (64 keys x its 32 queries) into the stage's tile: keys x queries
// at its query columns (head dim 256), queries x keys at its query rows (192).
DASH_DEVICE void store_split_tile(uint32_t tile, const uint32_t (&a)[kWgQueries / 16][4], int q0, int tid) {
  if constexpr (kPdSByQueries) {
    store_transposed<kBlockM>(tile, a, 0, tid, q0);
  } else {
    store_rows<kBlockN>(tile, a, 0, tid, q0);
  }
}

// The keys query q sees, bottom-right aligned: lo <= key - q <= hi with hi = Sk - Sq + window_right (causal:
// Sk - Sq) and lo = Sk - Sq - window_left; an unbounded side is the int extreme, which every offset satisfies.
struct Band {
  static constexpr int kUnboundedHi = 0x7fffffff, kUnboundedLo = -kUnboundedHi - 1;
  int lo, hi;
  DASH_DEVICE Band(const BwdParams& p, int seqlen_q, int seqlen_k) {
    const int64_t diag = (int64_t)seqlen_k - seqlen_q;
    const int64_t right = kCausal ? 0 : p.window_right;
    hi = right >= 0 ? clamp(diag + right) : kUnboundedHi;
    lo = p.window_left >= 0 ? clamp(diag - p.window_left) : kUnboundedLo;
  }
  DASH_DEVICE static int clamp(int64_t x) {
    return (int)(x > kUnboundedHi ? kUnboundedHi : x < kUnboundedLo ? kUnboundedLo : x);
  }
};

// The queries (columns) of a thread's P^T row that its key sees, relative to column query0 + f.col0 of the tile:
// [lo, hi], clamped to [-1, kWgQueries], empty (lo > hi) for a key >= Sk: one comparison pair per element masks it.
struct RowWindow {
  int lo, hi;
  DASH_DEVICE RowWindow(int key, int col_base, int seqlen_k, const Band& band) {
    const int64_t first = (int64_t)key - band.hi - col_base, last = (int64_t)key - band.lo - col_base;
    lo = key < seqlen_k ? (int)(first < -1 ? -1 : first) : 1;
    hi = key < seqlen_k ? (int)(last > kWgQueries ? kWgQueries : last) : 0;
  }
};

// A visit's tile as the mask sees it: whether it needs the mask at all, and the window of a thread's key row r (0 or
// 8: its two rows of the 64 x kWgQueries accumulator); query0: the warpgroup's first query.
struct TileMask {
  int key, col_base, seqlen_k;
  Band band;
  bool needed;
  DASH_DEVICE TileMask(int key0, int query0, int seqlen_k_, const Band& band_, const Fragment& f)
      : key(key0 + f.row0), col_base(query0 + f.col0), seqlen_k(seqlen_k_), band(band_),
        // NOTES: a tile needs the mask only if it reaches past Sk or one of its offsets key - q leaves the band:
        // the largest is key0 + 63 - query0, the smallest key0 - (query0 + kWgQueries - 1). Uniform per warpgroup.
        needed(key0 + 64 > seqlen_k_ || key0 + 63 - query0 > band_.hi ||
               key0 - (query0 + kWgQueries - 1) < band_.lo) {}
  DASH_DEVICE RowWindow row(int r) const { return RowWindow(key + r, col_base, seqlen_k, band); }
};

constexpr bool kCompactTables = DASH_COMPACT != 0;  // schedule_view.cuh defaults the define to 0
// NOTES: lse_log2 and dpsum of a thread's query columns are loaded into registers early (lse before the S^T wait,
// dpsum before the dP^T wait) where registers allow: the 64-query tile without soft-capping or compact tables.
// The others (128 queries at head dim 64, the 80-query tile, soft-capping, compact tables: 8-64 bytes of spills
// with them) read shared memory at the point of use, except kLseEarly's first column groups.
constexpr bool kRowsInRegs = kBlockM == 64 && !kSoftcap && !kCompactTables;
// NOTES: the uncapped 80-query tile with per-visit tables loads the lse_log2 of its first kLseEarlyGroups column
// groups (P^T's first three k-slices) into registers before its S^T issue, while no GEMM reads shared memory: loads
// issued after it queue behind the S^T and dP^T GEMMs' operand reads, and the softmax's first FFMA waited for them
// (docs/decisions/bwd-engine.md, "Where the softmax waits"; six groups measured 0.2-0.7 % ahead of four). All ten
// groups spill 32 bytes, eight 4 bytes. The host never defines DASH_LSE_EARLY_GROUPS: benchmarks/gemm_chain.py's
// rebuilt loops (levels below 12) take four, as six spill 8 bytes in some of their legs.
#ifndef DASH_LSE_EARLY_GROUPS
#define DASH_LSE_EARLY_GROUPS 6
#endif
constexpr bool kLseEarly = kBlockM == 80 && !kSoftcap && !kCompactTables && !kSplitHeadDim;
constexpr int kLseEarlyGroups = DASH_LSE_EARLY_GROUPS;

// lse_log2 or dpsum of the warpgroup's queries as a thread uses them: float2 per column group c (its two query
// columns q0 + 8 c + f.col0, + 1; q0 the warpgroup's first column of the stage's shared-memory row row_addr), groups
// c < kRegGroups from registers filled by load(), the others from the row at the point of use.
template <int kRegGroups>
struct RowValues {
  float2 regs[kRegGroups > 0 ? kRegGroups : 1];
  const float* row = nullptr;
  RowValues() = default;
  DASH_DEVICE RowValues(const char* smem_generic, const Smem& s, uint32_t row_addr, int q0, const Fragment& f) {
    load(smem_generic, s, row_addr, q0, f);
  }
  DASH_DEVICE void load(const char* smem_generic, const Smem& s, uint32_t row_addr, int q0, const Fragment& f) {
    row = reinterpret_cast<const float*>(smem_generic + (row_addr - s.base)) + q0 + f.col0;
#pragma unroll
    for (int c = 0; c < kRegGroups; ++c) regs[c] = *reinterpret_cast<const float2*>(row + 8 * c);
  }
  DASH_DEVICE float2 operator[](int c) const {
    if constexpr (kRegGroups > 0) {
      if (c < kRegGroups) return regs[c];
    }
    return *reinterpret_cast<const float2*>(row + 8 * c);
  }
};
// The rows as a visit's softmax reads them (every group in registers where kRowsInRegs), and kLseEarly's lse_log2,
// loaded by the step function before its S^T issue (empty without kLseEarly).
using TileRows = RowValues<kRowsInRegs ? kWgQueries / 8 : 0>;
using LseEarly = RowValues<kLseEarly ? kLseEarlyGroups : 0>;

// P^T = exp2(S^T * scale_log2 - lse_log2[q]) in place; kMask: 0 where the key does not see the query (the windows
// of the thread's two key rows, TileMask::row).
// NOTES: keys >= Sk and keys outside the query's band (window and causal masks) are masked by select. Queries >= Sq
// and rows whose lse is -inf (no key in their window) have lse_log2 = +inf (preprocess), so P = 2^-inf = 0 there
// without a mask; TMA zero-fills their Q and dO rows (varlen: loads the next sequence's), so S and dP stay finite.
// Varlen builds: Sq, Sk and the band are the visit's sequence's.
template <bool kMask, class Rows>
DASH_DEVICE void softmax_probs(float (&S)[kSRegs], const Rows& lse_log2, float scale_log2,
                               const TileMask& mask) {
  const RowWindow rows[2] = {mask.row(0), mask.row(8)};  // computed in the masked copy only (unused otherwise)
#pragma unroll
  for (int c = 0; c < kWgQueries / 8; ++c) {
    const float2 l = lse_log2[c];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = 4 * c + e, col = Fragment::col(i);
      const RowWindow& r = rows[(e / 2) % 2];
      const float x = fmaf(S[i], scale_log2, -(e % 2 ? l.y : l.x));
      S[i] = !kMask || (col >= r.lo && col <= r.hi) ? exp2_approx(x) : 0.f;
    }
  }
}

// Soft-capping: S^T -> t = tanh(S^T * prescale) in place (the scores in tanh units); dS gets the factor 1 - t^2.
// NOTES: dS gets 1 - t^2 of every element: dT[k] = 1 - t^2 of registers 2k, 2k + 1 rounded to an element pair, as
// dS itself (which it scales) is. Tiles of at most 32 registers of S^T keep every pair in registers (head dim 128's
// 64-query tile: 16 pairs, head dims 192 and 256: 8; live across the dP wait, they fit in an MMA warpgroup's 240).
// Head dim 64 (kBlockM 128: 32 pairs) keeps 20 in registers (with bf16, 16, 24, 28 and 32 spill; 20 does not, under
// NVRTC 13.0 and 13.5), the 80-query tile (20 pairs) 8 at head dim 128 (12 spill beside the slots' addresses) and all
// 20 at head dim 96; the other pairs wait in shared memory (DtSlots). Compact-table builds (224 registers per MMA
// thread) keep none at head dims 64 and 128, where any kept pair spilled. Measured in docs/decisions/softcap.md,
// "Keeping part of 1 - t^2" and "The other pairs through shared memory".
// NOTES: pairs [0, kDtPairs) keep dT in registers, the others (kDtSmemPairs) in shared memory (DtSlots) from the
// S^T wait to dS^T (keys_step.cuh's plan keeps all of them in registers or none).
constexpr int kDtPairs = !kSoftcap                                                  ? 0
                         : kCompactTables && (kHeadDimIO == 64 || kHeadDimIO == 128) ? 0
                         : kSRegs <= 32                                             ? kSRegs / 2
                         : kBlockM == 128                                           ? 20
                         : kBlockM == 80                                            ? (kHeadDimIO == 96 ? 20 : 8)
                                                                                    : 0;
static_assert(kDtPairs % 4 == 0 && kDtPairs <= kSRegs / 2, "dT kept for whole k-steps (4 pairs each)");
constexpr int kDtRegs = kDtPairs > 0 ? kDtPairs : 1;
constexpr int kDtSmemPairs = kSoftcap ? kSRegs / 2 - kDtPairs : 0;

// Where a thread keeps dT of pairs [kDtPairs, kSRegs / 2) between softcap_scores and softmax_grad: 4-byte words in
// the bytes of the stage's dS tile that its own warp's dS^T store (store_transposed) overwrites at the end of
// probs_and_grads: logical chunks 2 warp, 2 warp + 1 of its warpgroup's panel, in every row. Slot k (pair kDtPairs +
// k) of lane l: row 8 (k / 2) + 2 (l / 8) + k % 2, chunk 2 warp + (l % 8) / 4, word l % 4; the four rows of a slot
// differ in (row % 8) / 2, so the swizzle puts the 32 words in 32 banks.
// NOTES: that panel is free from this visit's S^T wait: its last readers are visit j - 2's dQ GEMMs (kStages 2),
// which both warpgroups completed before visit j - 1's kBarPdS; the other warpgroup writes only its own panel. At a
// KV tile's first visit they are the last tile's dK / dV stores (epilogue.cuh, whose staging either warpgroup may
// have written there), read before dkv_staging_free lets the visit go on. A thread's words are overwritten only by
// lanes of its warp, after the __syncwarp in probs_and_grads.
struct DtSlots {
  uint32_t* word[2];  // this lane's word of slots 0 and 1 (slot k: word[k % 2] + 256 (k / 2))
  DASH_DEVICE DtSlots(char* smem_generic, uint32_t smem_base, uint32_t ds_tile, int wg, int tid) {
    const int warp = tid / 32, lane = tid % 32;
#pragma unroll
    for (int odd = 0; odd < 2; ++odd) {
      const uint32_t addr = TileQ::chunk_addr(ds_tile, 2 * (lane / 8) + odd, 8 * wg + 2 * warp + (lane % 8) / 4) +
                            4 * (lane % 4);
      word[odd] = reinterpret_cast<uint32_t*>(smem_generic + (addr - smem_base));
    }
  }
  DASH_DEVICE uint32_t& operator[](int k) const { return word[k % 2][256 * (k / 2)]; }
};
static_assert(kDtSmemPairs == 0 || (!kSplitHeadDim && kStages >= 2 && 8 * ((kDtSmemPairs + 1) / 2) <= kBlockM),
              "dT slots: rows of the warpgroup's own panel of a dS tile that no GEMM of the last visit reads");
DASH_DEVICE void softcap_scores(float (&S)[kSRegs], uint32_t (&dT)[kDtRegs], float prescale,
                                const DtSlots* slots = nullptr) {
#pragma unroll
  for (int k = 0; k < kSRegs / 2; ++k) {
    const float t0 = tanh_approx(S[2 * k] * prescale), t1 = tanh_approx(S[2 * k + 1] * prescale);
    S[2 * k] = t0;
    S[2 * k + 1] = t1;
    const uint32_t dt = pack_elem2(fmaf(-t0, t0, 1.f), fmaf(-t1, t1, 1.f));
    if (k < kDtPairs) {
      dT[k] = dt;
    } else if constexpr (kDtSmemPairs > 0) {
      (*slots)[k - kDtPairs] = dt;
    }
  }
}

// dS^T = P^T o (dP^T - dpsum[q]) from the rounded P^T fragments, straight into A fragments (soft-capping: times
// dT).
// NOTES: dS uses P rounded to the input precision, as the low-precision baseline of the tolerance rule does
// (reference.backward_lowp): keeping fp32 P, its fragments, dP and dpsum live together needs more than the 240
// registers of an MMA warpgroup (measured 241), and then ptxas serializes the wgmmas and spills.
// dS of P^T registers i, i + 1 (rounded pair pa) as softmax_grad packs it; kScaled (soft-capping): times the pair
// dt of 1 - t^2.
template <bool kScaled>
DASH_DEVICE uint32_t ds_pair(uint32_t pa, const float (&dP)[kSRegs], const TileRows& dpsum, uint32_t dt, int i) {
  const float2 d = dpsum[i / 4];
  const float2 prob = unpack_elem2(pa);
  float ds0 = prob.x * (dP[i] - d.x), ds1 = prob.y * (dP[i + 1] - d.y);
  if constexpr (kScaled) {
    const float2 t = unpack_elem2(dt);
    ds0 *= t.x;
    ds1 *= t.y;
  }
  return pack_elem2(ds0, ds1);
}

DASH_DEVICE void softmax_grad(uint32_t (&dSa)[kWgQueries / 16][4], const uint32_t (&Pa)[kWgQueries / 16][4],
                              const float (&dP)[kSRegs], const TileRows& dpsum, const uint32_t (&dT)[kDtRegs],
                              const DtSlots& slots) {
#pragma unroll
  for (int ks = 0; ks < kDtPairs / 4; ++ks) {
#pragma unroll
    for (int j = 0; j < 4; ++j) dSa[ks][j] = ds_pair<true>(Pa[ks][j], dP, dpsum, dT[4 * ks + j], 8 * ks + 2 * j);
  }
#pragma unroll
  for (int ks = kDtPairs / 4; ks < kWgQueries / 16; ++ks) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint32_t dt = kSoftcap ? slots[4 * ks + j - kDtPairs] : 0u;
      dSa[ks][j] = ds_pair<kSoftcap>(Pa[ks][j], dP, dpsum, dt, 8 * ks + 2 * j);
    }
  }
}

// From the S^T wait to the dS^T store of a visit: P^T into Pa, dS^T into dSa and the stage's dS tile (head dim 256:
// P^T too, both keys x queries at the warpgroup's query columns); V released after the group's last dP^T. Issued
// after S^T and dP^T (two commit groups). do_stage: the dO stage (its dpsum row).
// NOTES: instantiated per kMask and branched on before the S^T wait, so that neither copy has a branch from the
// wait to the dS^T store: a branch there splits ptxas's scheduling region (it waits for every outstanding load and
// MUFU result at a branch), and masking every tile by select cost 19 % more executed instructions
// (docs/decisions/bwd-visit-loop.md, "The branch-free softmax, measured").
template <bool kMask>
DASH_DEVICE void probs_and_grads(float (&S)[kSRegs], float (&dP)[kSRegs], uint32_t (&Pa)[kWgQueries / 16][4],
                                 uint32_t (&dSa)[kWgQueries / 16][4], const TileMask& mask, const BwdParams& p,
                                 const Smem& s, char* smem_generic, int stage, int do_stage, bool release_v,
                                 int64_t v, int wg, int tid, const Fragment& f, const LseEarly& lse_early) {
  const int q0 = kSplitHeadDim ? kWgQueries * wg : 0;
  // NOTES: lse_log2 into registers (kRowsInRegs) just before the S^T wait, after the visit's last branch: loads
  // issued before a branch are waited for at its join, and while S^T runs shared memory is the tensor cores' (ncu
  // at causal 8k: 8 % of the samples at the join after the V wait when they were issued right after S^T). kLseEarly
  // loads its first groups before the S^T issue instead, when they complete before that join.
  const TileRows lse_row(smem_generic, s, s.lse(stage), q0, f);
  wgmma_wait<1>();
  wgmma_fence_operand(S);
  stamp_wg(p, v, wg, tid, kWgSDone);
  uint32_t dT[kDtRegs];
  const DtSlots slots(smem_generic, s.base, s.ds(stage), wg, tid);
  if constexpr (kSoftcap) softcap_scores(S, dT, p.softcap_prescale, &slots);
  if constexpr (kLseEarly) {
    softmax_probs<kMask>(S, lse_early, p.softmax_scale_log2, mask);
  } else {
    softmax_probs<kMask>(S, lse_row, p.softmax_scale_log2, mask);
  }
  const TileRows dpsum_row(smem_generic, s, s.dpsum(do_stage), q0, f);
  pack_fragments<kSRegs>(Pa, S);
  if constexpr (kSplitHeadDim) {
    // NOTES: head dim 192's one P / dS buffer: every MMA warpgroup's GEMMs of the previous visit, its last readers,
    // are complete (each visit ends with wgmma_wait<0>) once all of them are here.
    if constexpr (kPdSStages == 1) named_barrier_sync<kBarPdSFree, kPdSThreads>();
    store_split_tile(s.pt(pds_stage(stage)), Pa, q0, tid);  // while dP^T runs
  }
  wgmma_wait<0>();
  wgmma_fence_operand(dP);
  stamp_wg(p, v, wg, tid, kWgDpDone);
  softmax_grad(dSa, Pa, dP, dpsum_row, dT, slots);
  if constexpr (kDtSmemPairs > 0) __syncwarp();  // every lane's dT words read before the warp's dS^T overwrites them
  // dS^T also to shared memory for dQ, which needs the keys (head dim 256: the queries) of both warpgroups.
  if constexpr (kSplitHeadDim) {
    store_split_tile(s.ds(pds_stage(stage)), dSa, q0, tid);
  } else {
    store_transposed<kBlockM>(s.ds(stage), dSa, 64 * wg, tid);
  }
  if (release_v && tid == 0) mbar_arrive(s.v_empty());  // dP^T was V's last use
}

// probs_and_grads in the copy the visit's tile needs (mask.needed, uniform per warpgroup): the plans' entry.
// NOTES: a template (the sizes deduced), so that head dim 192's 64 x 96 plan, whose S has other sizes and which has
// its own (keys_step.cuh), never instantiates it.
template <int kRegs, int kSteps>
DASH_DEVICE void probs_and_grads_of(float (&S)[kRegs], float (&dP)[kRegs], uint32_t (&Pa)[kSteps][4],
                                    uint32_t (&dSa)[kSteps][4], const TileMask& mask, const BwdParams& p,
                                    const Smem& s, char* smem_generic, int stage, int do_stage, bool release_v,
                                    int64_t v, int wg, int tid, const Fragment& f, const LseEarly& lse_early) {
  if (mask.needed) {
    probs_and_grads<true>(S, dP, Pa, dSa, mask, p, s, smem_generic, stage, do_stage, release_v, v, wg, tid, f,
                          lse_early);
  } else {
    probs_and_grads<false>(S, dP, Pa, dSa, mask, p, s, smem_generic, stage, do_stage, release_v, v, wg, tid, f,
                           lse_early);
  }
}

// The top of a visit, every plan alike: waits for Q (and, first in its KV tile, K), issues S through issue_s,
// reads the producer's VisitSlot of the visit, waits for V (first in its KV tile) and dO, issues dP through
// issue_dp: two commit groups. Returns the slot.
// NOTES: first_in_group comes from the caller, not from the slot, so that the S issue waits only for Q (and K): the
// slot's shared-memory load is read after the issue. The fence before dP is not required by the ISA there, but
// ptxas 13.0 injects one (C7519) after the wait loop.
template <class IssueS, class IssueDp>
DASH_DEVICE VisitSlot issue_scores(const BwdParams& p, const Smem& s, int64_t v, uint32_t j, uint32_t group,
                                   bool first_in_group, int wg, int tid, IssueS issue_s, IssueDp issue_dp) {
  const int stage = (int)(j % kStages), kbuf = (int)(group % kKStages), do_stage = (int)(j % kDoStages);
  stamp_wg(p, v, wg, tid, kWgTop);
  wait_phase(p, s.q_full(stage), (j / kStages) & 1);
  if (!kRunLoop && first_in_group) wait_phase(p, s.k_full(kbuf), (group / kKStages) & 1);
  stamp(p, v, kStampStart, wg == 0 && tid == 0);
  stamp_wg(p, v, wg, tid, kWgSIssue);
  wgmma_fence();
  issue_s();
  wgmma_commit();
  const VisitSlot slot = VisitSlot::read(s.visit(stage));
  if (!kRunLoop && first_in_group) wait_phase(p, s.v_full(), group & 1);
  wait_phase(p, s.do_full(do_stage), (j / kDoStages) & 1);
  stamp_wg(p, v, wg, tid, kWgDpIssue);
  wgmma_fence();
  issue_dp();
  wgmma_commit();
  return slot;
}

// Hands this warpgroup's fp32 dQ piece to the dQ writer warp: thread tid stores its registers 4c..4c+3 as one
// 16-byte word at slice + 16 (128 c + tid) (the dq_accum layout of dq_accum_layout.cuh), conflict-free. first,
// count: only the float4 groups [first, first + count), at slice + 16 (128 (c - first) + tid) (a half's own slot).
DASH_DEVICE void store_dq(uint32_t slice, const float (&dQ)[kDqRegs], int tid, int first = 0,
                          int count = kDqRegs / 4) {
#pragma unroll
  for (int c = 0; c < count; ++c) {
    const int r = 4 * (first + c);
    asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(slice + 16 * (128 * c + tid)), "f"(dQ[r]),
                 "f"(dQ[r + 1]), "f"(dQ[r + 2]), "f"(dQ[r + 3])
                 : "memory");
  }
}

// One staging slot per MMA warpgroup (kDqHalves 1): waits for warpgroup wg's slice to be free, store(slice) writes
// the piece into it, and the slice goes to the dQ writer.
template <class Store>
DASH_DEVICE void hand_dq_slice(const Smem& s, int wg, Store store) {
  dq_handoff_barrier<kBarDqEmpty, true>(wg);
  store(s.dq(wg));
  fence_proxy_async_smem();
  dq_handoff_barrier<kBarDqFull, false>(wg);
}

// Hands this warpgroup's dQ piece to the dQ writer through its staging slice; with kDqHalves 2 in two halves (float4
// groups c < kDqRegs / 8 and the rest: the first and second half of the slice's fragment order), each into its own
// half of the slice behind its own barrier pair.
DASH_DEVICE void hand_dq_to_writer(const Smem& s, const float (&dQ)[kDqRegs], int wg, int tid) {
  if constexpr (kDqHalves == 2) {
    static_assert(kDqRegs % 8 == 0, "two halves of whole float4 groups");
    constexpr int kHalfC = kDqRegs / 8;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      dq_handoff_barrier<kBarDqEmpty, true>(wg, half);
      store_dq(s.dq(wg) + half * (SmemLayout::kDqSlice / 2), dQ, tid, half * kHalfC, kHalfC);
      fence_proxy_async_smem();
      dq_handoff_barrier<kBarDqFull, false>(wg, half);
    }
  } else {
    hand_dq_slice(s, wg, [&](uint32_t slice) { store_dq(slice, dQ, tid); });
  }
}


}  // namespace bwd
