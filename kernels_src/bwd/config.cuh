// Backward main kernel (Hopper engine): compile-time configuration, thread roles, named barriers and the
// shared-memory layout. The DASH_* defines come from cupy_dash/cuda/kernels.py (one cubin per variant).
#pragma once
#include "../common.cuh"
#include "../constants.cuh"
#include "../ptx/named_barrier.cuh"
#include "../tile_tma.cuh"
#include "../warp_roles.cuh"
#include "dq_accum_layout.cuh"

#if !defined(DASH_HEAD_DIM) || !defined(DASH_CAUSAL) || !defined(DASH_BLOCK_M) || !defined(DASH_BLOCK_N) || \
    !defined(DASH_NUM_THREADS) || !defined(DASH_SMEM_BYTES)
#error "the backward main kernel needs DASH_HEAD_DIM, DASH_CAUSAL, DASH_BLOCK_M, DASH_BLOCK_N, DASH_NUM_THREADS, " \
       "DASH_SMEM_BYTES"
#endif

namespace bwd {

constexpr int kHeadDimIO = DASH_HEAD_DIM;                // columns of q, k, dq, dk in global memory
constexpr int kHeadDim = padded_head_dim(kHeadDimIO);  // compute width: 96 runs as 128 (tile_tma.cuh)
constexpr int kHeadDimVIO = DASH_HEAD_DIM_V;  // columns of v, out, dout, dv (tile_tma.cuh: value head dim)
constexpr int kHeadDimV = value_compute_dim(kHeadDimIO, kHeadDimVIO);  // columns of v / dO a tile load fills
constexpr bool kCausal = DASH_CAUSAL != 0;
#ifndef DASH_SOFTCAP
#define DASH_SOFTCAP 0
#endif
constexpr bool kSoftcap = DASH_SOFTCAP != 0;  // logit soft-capping (params.cuh: softcap_prescale)
// The MMA warpgroups loop once per run of a KV tile (bwd/consume.cuh): the capped builds keep the flat loop.
constexpr bool kRunLoop = !kSoftcap;
constexpr int kBlockM = DASH_BLOCK_M;  // queries per Q tile (m_block)
constexpr int kBlockN = DASH_BLOCK_N;  // keys per KV tile (n_block)

// Thread roles: warpgroup 0 is the producer (warp 0 issues TMA loads, warps 1 .. kDqWriters add dQ partials into
// dq_accum, the others leave at once); warpgroups 1..kNumMmaWg compute, each for 64 keys of the KV tile.
using namespace roles;  // kNumMmaWg, kWgThreads, kNumThreads, kProducerRegs, kMmaRegs (warp_roles.cuh)
static_assert(DASH_NUM_THREADS == kNumThreads, "launched with kNumThreads (384 or 512) threads");

static_assert(supported_head_dim(kHeadDimIO), "head dim 64, 96, 128, 192 or 256");
static_assert(supported_value_head_dim(kHeadDimIO, kHeadDimVIO), "value head dim: q's, or 128 with 192");
// NOTES: head dims 192 and 256 split the head dim, not the keys, between the MMA warpgroups (bwd/split_step.cuh):
// 64 x d x 2 fp32 accumulators of dK and dV per warpgroup would need d registers per thread, more than its 240 with
// S^T and dP^T beside them. All warpgroups then work on the same 64 keys: warpgroup wg computes S^T and dP^T for
// queries [32 wg, + 32) and dK^T, dV^T and dQ for head-dim [kHeadRows wg, + kHeadRows): two warpgroups of 128
// head-dim rows at 256 (64 x 64 tiles), three of 64 at 192 (96 x 64 tiles of compact tables, 512 threads).
constexpr bool kSplitHeadDim = kHeadDim == 256 || kHeadDim == 192;
static_assert(kHeadDimV == kHeadDim || kSplitHeadDim, "a value head dim of its own: the split plan only");
// Whether head-dim row d of dV^T (column d of dv) exists in the split plans: value head dim 128 with 192 gives
// warpgroup 2 none, which then stores no dV^T (tile_tma.cuh).
// NOTES: warpgroup 2 still issues its dV^T GEMMs (over the dO tile's third panel, which no load writes): skipping
// them by a branch on wg made ptxas 13.0 inject warpgroup.arrive around the GEMMs (C7519).
DASH_DEVICE constexpr bool has_value_rows(int d) { return kHeadDimV == kHeadDim || d < kHeadDimV; }
constexpr int kHeadRows = kHeadDim / kNumMmaWg;
// NOTES: head dim 192's 64 x 96 tile (FA3's; bwd/keys_step.cuh) splits S = Q K^T and dP = dO V^T by keys instead:
// warpgroup wg computes all 64 queries against keys [32 wg, + 32), then, like the others, its 64 head-dim rows of
// dK^T and dV^T (by the 96 keys) and its 64 head-dim columns of dQ = dS K.
constexpr bool kSplitByKeys = kHeadDim == 192 && kBlockN == 96;
static_assert(kSplitByKeys ? kBlockM == 64 && kBlockN == 32 * kNumMmaWg && kNumMmaWg == 3
              : kSplitHeadDim ? kBlockN == 64 && kBlockM == 32 * kNumMmaWg && kHeadRows % 64 == 0
                              : kBlockN == 64 * kNumMmaWg && kNumMmaWg == 2,
              "each MMA warpgroup owns 64 keys (the rows of its S^T, dP^T, dK, dV), or all of them share 64 keys and "
              "32 queries each (head dims 192 and 256), or 64 queries and 32 keys each (head dim 192's 64 x 96)");
// the columns of a warpgroup's S^T (the 64 x 96 tile: the rows of its S, every query of the tile)
constexpr int kWgQueries = kSplitHeadDim && !kSplitByKeys ? kBlockM / kNumMmaWg : kBlockM;
constexpr int kWgKeys = kSplitByKeys ? kBlockN / kNumMmaWg : 64;  // the rows of its S^T (columns of its S)
// NOTES: head dim 192 stores P and dS as queries x keys (dQ^T = K^T dS^T needs dS as a K-major B whose rows are the
// queries: an MN-major B cannot start 48 queries into a swizzled row, a K-major one can); head dim 256 as keys x
// queries. At 192 they have one buffer (two do not fit), guarded by a barrier of the MMA warpgroups (kBarPdSFree).
constexpr bool kPdSByQueries = kHeadDim == 192 && !kSplitByKeys;
// NOTES: the 64 x 96 tile stores P^T and dS^T, keys x queries (one 64-column panel of 96 rows each), the operands of
// the unit kernel that passed on the H200 (bwd/keys_gemms.cuh), also in one buffer behind kBarPdSFree.
constexpr int kPdSStages = kHeadDim == 192 ? 1 : kBwdStages;
// dQ = dS K: warpgroup wg computes a 64 x kDqCols piece of the kBlockM x kHeadDim tile. With kBlockM = 128
// (hdim 64) it owns query rows [64 wg, 64 wg + 64) and every column; with kBlockM = 64 (hdim 128) every row and
// head-dim columns [64 wg, 64 wg + 64). Either way its B operand (K) is one whole 64-column panel. With kBlockM =
// 80 (hdim 128, FA3's full-mask plan) m64 cannot tile the queries: the warpgroup computes dQ^T = K^T dS^T, head-dim
// rows [64 wg, 64 wg + 64) by the 80 queries, K^T being an MN-major A operand (one panel of K) and dS a K-major B.
using DqLayout = DqAccumLayout<kBlockM, kHeadDim>;
static_assert(DqLayout::kSplitRows ? kHeadDim == 64
              : kSplitHeadDim ? (kHeadDim == 256 && kBlockM == 64) ||
                                    (kHeadDim == 192 && (kBlockM == 96 || kSplitByKeys))
                              : ((kBlockM == 64 || kBlockM == 80) && kHeadDim == 64 * kNumMmaWg),
              "tile plans: hdim 64 with kBlockM 128, hdim 128 with kBlockM 64 or 80, hdim 192 with kBlockM 96 (or 64 "
              "x 96), hdim 256 with kBlockM 64");
constexpr int kDqCols = DqLayout::kCols;

// dQ pieces a warpgroup hands to the dQ writer per visit, each kDqPieceFloats of the tile: one; at head dim 256 two
// 64 x 64 chunks of dQ (slices 2 wg, 2 wg + 1); at 192 two 64 x 48 chunks of dQ^T (the halves of slice wg: 48
// queries each); the 64 x 96 tile one, dQ's 64 x 64 slice wg (head-dim columns [64 wg, + 64): head dim 256's slice
// layout). Piece c of warpgroup wg is always at float (kDqPieces wg + c) kDqPieceFloats of the tile.
constexpr int kDqPieces = kSplitHeadDim && !kSplitByKeys ? 2 : 1;
constexpr int kDqPieceFloats = kBlockM * kHeadDim / (kNumMmaWg * kDqPieces);
constexpr int kDqPieceCols = kDqPieceFloats / 64;  // N of the m64 accumulator of a piece

// Accumulator registers per thread (m64nN fp32: N / 2).
constexpr int kSRegs = (kSplitByKeys ? kWgKeys : kWgQueries) / 2;  // S^T, dP^T: 64 keys x kWgQueries queries; S, dP
// dK and dV: 64 keys x kHeadDimIO (head dim 96: N = 96, no padding); head dims 192 and 256: dK^T and dV^T, m64
// halves of 64 head-dim rows x kBlockN keys each (kDkvHalves x kBlockN / 2: one at 192, two at 256).
constexpr int kDkvRegs = kSplitHeadDim ? kHeadRows * kBlockN / 128 : kHeadDimIO / 2;
constexpr int kDkvHalves = kSplitHeadDim ? kHeadRows / 64 : 1;
template <bool kSplit>
struct DkvAccOf {
  using type = float[kDkvRegs];
};
template <>
struct DkvAccOf<true> {
  using type = float[kDkvHalves][kDkvRegs / kDkvHalves];
};
using DkvAcc = DkvAccOf<kSplitHeadDim>::type;  // one MMA warpgroup's dK or dV (192, 256: dK^T or dV^T, by halves)
constexpr int kDqRegs = kDqPieceCols / 2;  // dQ piece: 64 x kDqPieceCols

#ifndef DASH_DQ_WRITERS
#define DASH_DQ_WRITERS 2
#endif
// NOTES: two dQ writer warps (warps 1 and 2 of the producer warpgroup), visits alternating, so that in
// deterministic mode one waits for its tile's turn and for its bulk adds to complete while the other hands the
// next visit's slices to the TMA unit; a writer waits for a turn only after releasing its previous visit, so no
// wait holds a release back. The barrier work (dQ full, adds issued and read, dQ free) stays in visit order: a
// token (named barrier kBarWriterToken + writer) passes it from one writer to the other. Deterministic or atomic
// is a launch's choice (dq_reduce.cuh), not the build's: one cubin serves both.
constexpr int kDqWriters = DASH_DQ_WRITERS;
static_assert(DASH_DQ_WRITERS == 1 || DASH_DQ_WRITERS == 2, "one or two dQ writer warps");

constexpr int kStages = kBwdStages;                            // Q (+ lse_log2) and (kPdSStages) P, dS
// dO (+ dpsum) buffers: one at head dims 192 and 256, whose second would not fit.
constexpr int kDoStages = kSplitHeadDim ? 1 : kBwdStages;
// K buffers: the next KV tile's K loads early into the second one, unless its 32 KB went to the larger Q, dO, dS
// and dQ tiles of the 80-query plan (which then fill 224 KB without it).
constexpr int kKStages = !DqLayout::kTransposed && !kSplitHeadDim ? kBwdKStages : 1;

// Named barriers (id 0 is __syncthreads), all of the kernel's: both MMA warpgroups after writing dS; per MMA
// warpgroup, its dQ slice written (MMA warpgroup arrives, dQ writer warp syncs) and free again (the other way
// round); in a folded backward (fold.cuh), the dQ writer warp's adds done (writer arrives, MMA warpgroups sync) and
// the MMA warpgroups among themselves.
// NOTES: head dim 256 hands each dQ piece over in two halves, each with its own slot (half of the warpgroup's
// staging) and barrier pair, so that a warpgroup stores one half while the writer's copy reads the other and the
// next piece's first half waits only for the first half's drain (docs/decisions/head-dim-plans.md "Head dims 192 and
// 256").
constexpr int kDqHalves = kHeadDim == 256 ? 2 : 1;
// NOTES: bwd/mainloop.cuh (head dims 64, 96, 128) issues dK in kDqStoreParts commit groups and stores the dQ piece
// into its staging slice in as many parts, each once the dK group before it is complete: the store's bytes share
// the shared-memory bandwidth that dK's RS GEMM leaves instead of arriving in one burst (-2.2 % of the SM cycles at
// full 3840, same bits; docs/decisions/bwd-engine.md "The dQ store spread over dK").
constexpr int kDqStoreParts = 2;
constexpr int kBarPdS = 1;
constexpr int kBarDqFull = kBarPdS + 1;                            // + kDqHalves wg + half
constexpr int kBarDqEmpty = kBarDqFull + kDqHalves * kNumMmaWg;    // + kDqHalves wg + half
constexpr int kBarDqDone = kBarDqEmpty + kDqHalves * kNumMmaWg;
constexpr int kBarFold = kBarDqDone + 1;
constexpr int kBarWriterToken = kBarFold + 1;                     // + the dQ writer warp that waits for it
constexpr int kBarPdSFree = kBarWriterToken + 2;                  // head dim 192: the P / dS tiles free again
constexpr int kBarDkv = kBarPdSFree + 1;                          // the dK / dV epilogue's staging (epilogue.cuh)
static_assert(kBarDkv < 16, "16 named barriers per CTA");
constexpr int kPdSThreads = kNumMmaWg * kWgThreads;
constexpr int kDqBarThreads = kWgThreads + 32;

// The barrier token between the two dQ writer warps: writer w waits for it (kSync) or hands it to writer w
// (arrives); 64 threads, ids immediates.
template <bool kSync>
DASH_DEVICE void writer_token(int w) {
  if constexpr (kSync) {
    if (w == 0) named_barrier_sync<kBarWriterToken, 64>(); else named_barrier_sync<kBarWriterToken + 1, 64>();
  } else {
    if (w == 0) named_barrier_arrive<kBarWriterToken, 64>(); else named_barrier_arrive<kBarWriterToken + 1, 64>();
  }
}

template <int kId, bool kSync>
DASH_DEVICE void dq_handoff_barrier_at() {
  if constexpr (kSync) {
    named_barrier_sync<kId, kDqBarThreads>();
  } else {
    named_barrier_arrive<kId, kDqBarThreads>();
  }
}

// The dQ hand-off between MMA warpgroup wg (warp-uniform) and the dQ writer warp through wg's staging slice (half
// `half` of it with kDqHalves 2): waits at (kSync) or arrives at named barrier kBase + kDqHalves wg + half, kBase
// being kBarDqFull or kBarDqEmpty. The ids stay immediates (ptx/named_barrier.cuh).
template <int kBase, bool kSync>
DASH_DEVICE void dq_handoff_barrier(int wg, int half = 0) {
  static_assert(kNumMmaWg == 2 || kNumMmaWg == 3, "two or three MMA warpgroups");
  static_assert(kDqHalves == 1 || kNumMmaWg == 2, "halves: two MMA warpgroups");
  if constexpr (kDqHalves == 2) {
    if (wg == 0) {
      if (half == 0) dq_handoff_barrier_at<kBase, kSync>(); else dq_handoff_barrier_at<kBase + 1, kSync>();
    } else {
      if (half == 0) dq_handoff_barrier_at<kBase + 2, kSync>(); else dq_handoff_barrier_at<kBase + 3, kSync>();
    }
  } else if (wg == 0) {
    dq_handoff_barrier_at<kBase, kSync>();
  } else if (kNumMmaWg == 2 || wg == 1) {
    dq_handoff_barrier_at<kBase + 1, kSync>();
  } else {
    dq_handoff_barrier_at<kBase + 2, kSync>();
  }
}

// NOTES: shared memory, from a 1024-byte-aligned base (the 128B swizzle pattern of TMA and wgmma starts on
// 1024-byte boundaries): K x2 | V | Q x2 | dO x2 | dS x2 | dQ fp32 staging | lse_log2 x2 | dpsum x2 | mbarriers |
// visit slots. The host computes the same size (cupy_dash/cuda/kernels.py) from the constants.cuh values used here.
// K is double-buffered and V released right after the last dP^T of its KV tile, so that loading the next KV tile
// overlaps the last visit of the current one (V is single-buffered: hdim 128 has no room for a second one).
// K, V, Q, dO are K-major for S^T = K Q^T and dP^T = V dO^T (rows x head dim, 64-column panels of rows x 128 B);
// the same bytes serve as MN-major B operands of dV += P^T dO, dK += dS^T Q and dQ = dS K. dS is queries x keys
// (panel wg holds the keys of MMA warpgroup wg). Every tile size is a multiple of 1024 bytes. The producer
// publishes each visit's coordinates in its stage's VisitSlot (producer.cuh). Head dims 192 and 256: one K buffer,
// one dO stage (with its dpsum), a P tile beside each dS tile (one 64-column panel: P^T and dS^T keys x queries,
// or queries x keys with kPdSByQueries), the staging one dQ piece per MMA warpgroup.
struct SmemLayout {
  static constexpr int kKV = kBlockN * kHeadDim * 2;
  static constexpr int kQ = kBlockM * kHeadDim * 2;  // also dO
  static constexpr int kVLoad = kBlockN * kHeadDimV * 2;   // bytes a V load fills (kKV but with the value head dim)
  static constexpr int kDoLoad = kBlockM * kHeadDimV * 2;  // bytes a dO load fills
  static constexpr int kDS = kBlockM * kBlockN * 2;  // also P
  static constexpr int kDqSlice = kDqPieceFloats * 4;  // one MMA warpgroup's fp32 dQ piece
  static constexpr int kRow = kBlockM * 4;           // lse_log2 or dpsum of one Q tile
  static constexpr int kK = 0;
  static constexpr int kV = kK + kKStages * kKV;
  static constexpr int kQs = kV + kKV;
  static constexpr int kDOs = kQs + kStages * kQ;
  static constexpr int kPs = kDOs + kDoStages * kQ;
  static constexpr int kDSs = kPs + (kSplitHeadDim ? kPdSStages * kDS : 0);
  static constexpr int kDq = kDSs + kPdSStages * kDS;
  static constexpr int kLse = kDq + kNumMmaWg * kDqSlice;
  static constexpr int kDpsum = kLse + kStages * kRow;
  static constexpr int kBars = kDpsum + kDoStages * kRow;
  // k_full[], k_empty[], v_full, v_empty, q_full[], q_empty[], do_full[], do_empty[]
  static constexpr int kNumBars = 2 * kKStages + 2 + 2 * kStages + 2 * kDoStages;
  static constexpr int kVisits = kBars + kMbarrierBytes * kNumBars;  // one VisitSlot per stage
  static constexpr int kBytes = kVisits + kVisitSlotBytes * kStages;
  static constexpr int kDynamicBytes = kBytes + kSmemAlign;  // slack to align the base
};
static_assert(SmemLayout::kVisits % kVisitSlotBytes == 0, "visit slots are 16-byte words");
static_assert(SmemLayout::kKV % kSmemAlign == 0 && SmemLayout::kQ % kSmemAlign == 0 &&
                  SmemLayout::kDS % kSmemAlign == 0,
              "tiles keep 1024-byte alignment");
static_assert(SmemLayout::kDynamicBytes == DASH_SMEM_BYTES, "host smem formula out of sync with the layout");
static_assert(SmemLayout::kDynamicBytes <= kSmemMaxBytes, "more than the 227 KB a CTA can have");

struct Smem {
  uint32_t base;  // shared-window address, 1024-byte aligned
  DASH_DEVICE uint32_t k(int buf) const { return base + SmemLayout::kK + buf * SmemLayout::kKV; }
  DASH_DEVICE uint32_t v() const { return base + SmemLayout::kV; }
  DASH_DEVICE uint32_t q(int stage) const { return base + SmemLayout::kQs + stage * SmemLayout::kQ; }
  DASH_DEVICE uint32_t dout(int stage) const { return base + SmemLayout::kDOs + stage * SmemLayout::kQ; }
  DASH_DEVICE uint32_t pt(int stage) const { return base + SmemLayout::kPs + stage * SmemLayout::kDS; }
  DASH_DEVICE uint32_t ds(int stage) const { return base + SmemLayout::kDSs + stage * SmemLayout::kDS; }
  DASH_DEVICE uint32_t dq(int wg) const { return base + SmemLayout::kDq + wg * SmemLayout::kDqSlice; }
  DASH_DEVICE uint32_t lse(int stage) const { return base + SmemLayout::kLse + stage * SmemLayout::kRow; }
  DASH_DEVICE uint32_t dpsum(int stage) const { return base + SmemLayout::kDpsum + stage * SmemLayout::kRow; }
  DASH_DEVICE uint32_t bar(int i) const { return base + SmemLayout::kBars + kMbarrierBytes * i; }
  DASH_DEVICE uint32_t visit(int stage) const { return base + SmemLayout::kVisits + kVisitSlotBytes * stage; }
  DASH_DEVICE uint32_t k_full(int buf) const { return bar(buf); }
  DASH_DEVICE uint32_t k_empty(int buf) const { return bar(kKStages + buf); }
  DASH_DEVICE uint32_t v_full() const { return bar(2 * kKStages); }
  DASH_DEVICE uint32_t v_empty() const { return bar(2 * kKStages + 1); }
  DASH_DEVICE uint32_t q_full(int stage) const { return bar(2 * kKStages + 2 + stage); }
  DASH_DEVICE uint32_t q_empty(int stage) const { return bar(2 * kKStages + 2 + kStages + stage); }
  DASH_DEVICE uint32_t do_full(int stage) const { return bar(2 * kKStages + 2 + 2 * kStages + stage); }
  DASH_DEVICE uint32_t do_empty(int stage) const { return bar(2 * kKStages + 2 + 2 * kStages + kDoStages + stage); }
};

}  // namespace bwd
