// Forward kernel, MMA warpgroups: warpgroup wg owns query rows [64 wg, 64 wg + 64) of the Q tile and walks the
// KV tiles from the last visible one down to the first with an online softmax in the log2 domain. S = Q K^T is
// an SS wgmma, O += P V an RS wgmma with P straight from the registers of S.
// NOTES: overlap. Inside a warpgroup, step i issues S_n = Q K_n^T and O += P_{n+1} V_{n+1} together and computes
// the softmax of S_n while the P V wgmma runs (FA3's intra-warpgroup overlap). Across the two warpgroups, the
// GEMM issues alternate (ping-pong on the kBarTurn barriers), so one warpgroup's softmax runs under the other's
// GEMMs.
#pragma once
#include "../ptx/exp2.cuh"
#include "../ptx/ld_shared.cuh"
#include "../ptx/mbarrier.cuh"
#include "../ptx/named_barrier.cuh"
#include "../ptx/tanh.cuh"
#include "../ptx/wgmma.cuh"
#include "../swizzled_tile.cuh"
#include "../wgmma_fragment.cuh"
#include "config.cuh"

namespace fwd {

using TileQ = SwizzledTile<kBlockM>;   // Q (and the O staging): queries x head dim
using TileKV = SwizzledTile<kBlockN>;  // K, V: keys x head dim

DASH_DEVICE float neg_inf() { return __int_as_float(0xff800000); }

// Max and sum over the four lanes of a quad, which together hold whole rows of an m64 accumulator.
DASH_DEVICE float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
DASH_DEVICE float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// The ping-pong turn of MMA warpgroup wg: wait for it before issuing GEMMs, pass it on after.
DASH_DEVICE void turn_wait(int wg) {
  if (wg == 0) {
    named_barrier_sync<kBarTurn, kTurnThreads>();
  } else {
    named_barrier_sync<kBarTurn + 1, kTurnThreads>();
  }
}
DASH_DEVICE void turn_pass(int wg) {
  if (wg == 0) {
    named_barrier_arrive<kBarTurn + 1, kTurnThreads>();
  } else {
    named_barrier_arrive<kBarTurn, kTurnThreads>();
  }
}

// Row state of the online softmax for this thread's two rows (r = 0: fragment row f.row0, r = 1: f.row0 + 8):
// the running max of the raw scores and this thread's partial sum of P (its columns; quad-reduced at the end).
struct RowStats {
  float max[2], sum[2];
};

// S (64 x kBlockN raw scores) -> P = 2^(S scale_log2 - max scale_log2) in place, with the new row max; corr gets
// the factor 2^((max_old - max_new) scale_log2) by which O and the sums are rescaled. Register i of S is row
// r = (i / 2) % 2 (Fragment::row).
// NOTES: -inf guard. While a row has seen only masked keys its max is -inf; it then subtracts 0 instead, so
// P = 2^-inf = 0 and corr = 2^-inf = 0 rather than NaN from (-inf) - (-inf).
template <bool kFirst>
DASH_DEVICE void online_softmax(float (&S)[kSRegs], RowStats& st, float (&corr)[2], float scale_log2) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float m = kFirst ? neg_inf() : st.max[r];
#pragma unroll
    for (int c = 0; c < kSRegs / 4; ++c) m = fmaxf(m, fmaxf(S[4 * c + 2 * r], S[4 * c + 2 * r + 1]));
    m = quad_max(m);
    const float m_scaled = m == neg_inf() ? 0.f : m * scale_log2;
    corr[r] = kFirst ? 0.f : exp2_approx(st.max[r] * scale_log2 - m_scaled);
    st.max[r] = m;
    float sum = 0.f;
#pragma unroll
    for (int c = 0; c < kSRegs / 4; ++c) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int i = 4 * c + 2 * r + e;
        const float x = fmaf(S[i], scale_log2, -m_scaled);
        S[i] = exp2_approx(x);
        sum += S[i];
      }
    }
    st.sum[r] = kFirst ? sum : fmaf(st.sum[r], corr[r], sum);
  }
}

// This thread's rows r = 0, 1 see keys [lo[r], hi[r]) (config.cuh Tile: the window and causal masks, and
// keys < Sk); everything else becomes -inf.
struct KeyRange {
  int lo[2], hi[2];
};

DASH_DEVICE void mask_scores(float (&S)[kSRegs], int key0, const KeyRange& keys, const Fragment& f) {
#pragma unroll
  for (int i = 0; i < kSRegs; ++i) {
    const int key = key0 + f.col0 + Fragment::col(i), r = (i / 2) % 2;
    if (key >= keys.hi[r] || key < keys.lo[r]) S[i] = neg_inf();
  }
}

// S = Q_wg K^T over the head dim (both K-major). Issues the wgmmas, no commit. Head dim 96: the k-steps of the
// zero columns 96..127 are skipped.
DASH_DEVICE void gemm_qk(float (&S)[kSRegs], uint64_t q_desc, uint32_t k_tile) {
  gemm_ss_kmajor<kBlockN, kHeadDimIO / 16, TileQ, TileKV>(S, q_desc, TileKV::kmajor(k_tile, 0));
}

// O += P V over the keys, P as register A fragments, V the MN-major B operand. Issues the wgmmas, no commit.
// NOTES: the head dim in chunks of at most 128 columns (the wgmma wrappers' N): registers 64 ch .. of O are columns
// 128 ch .. of the m64 accumulator, so each chunk is a contiguous slice of O (one chunk at head dims 64, 96 and
// 128; head dim 96: N = 96 across one and a half panels of V, its zero columns not computed).
DASH_DEVICE void gemm_pv(float (&O)[kORegs], const uint32_t (&Pa)[kBlockN / 16][4], uint32_t v_tile) {
  constexpr int kCols = 2 * kORegs;
  constexpr int kChunk = kCols % 128 == 0 ? 128 : kCols == 96 ? 96 : 64;
#pragma unroll
  for (int ch = 0; ch < kCols / kChunk; ++ch) {
    const uint64_t v_desc = TileKV::mnmajor(v_tile, ch * kChunk);
    float(&o)[kChunk / 2] = *reinterpret_cast<float(*)[kChunk / 2]>(&O[ch * (kChunk / 2)]);
#pragma unroll
    for (int ks = 0; ks < kBlockN / 16; ++ks) {
      wgmma_rs<kChunk, 1>(o, Pa[ks], desc_advance(v_desc, TileKV::mnmajor_step(ks)), 1);
    }
  }
}

// Scores of KV tile n_block into P. NOTES: a tile needs the element mask only if it reaches past Sk, or past the
// right edge of the window of the warpgroup's first row, or before the left edge of its last row's. Soft-capping
// (a launch with softcap_prescale != 0: the same build serves both) maps the raw scores to tanh units first, so
// that the mask's -inf stays -inf.
template <bool kFirst>
DASH_DEVICE void scores_to_probs(float (&S)[kSRegs], RowStats& st, float (&corr)[2], int n_block, int row_first,
                                 const KeyRange& keys, const FwdParams& p, const Tile& t, const Fragment& f) {
  const int key0 = n_block * kBlockN, diag = t.seqlen_k - t.seqlen_q;
  const bool need_mask = key0 + kBlockN > t.seqlen_k ||
                         (p.window_right >= 0 && key0 + kBlockN - 1 > row_first + diag + (int)p.window_right) ||
                         (p.window_left >= 0 && key0 < row_first + 63 + diag - (int)p.window_left);
  if (p.softcap_prescale != 0.f) {
#pragma unroll
    for (int i = 0; i < kSRegs; ++i) S[i] = tanh_approx(S[i] * p.softcap_prescale);
  }
  if (need_mask) mask_scores(S, key0, keys, f);
  online_softmax<kFirst>(S, st, corr, p.softmax_scale_log2);
}

// Keeps the softmax of S ahead of the P V wait: a volatile shared load at addr (+ 0 or 4) whose address depends on
// the row sums, which depend on every exp2 of the step.
// NOTES: ptxas keeps a wgmma wait after the shared-memory loads that precede it in program order but moves
// arithmetic across it freely; without this load it placed both waits of a step before the whole softmax, so that
// the softmax of S_n never ran under the warpgroup's own P V wgmma (docs/decisions/softmax-before-wait.md). The
// caller passes its own warpgroup's first Q row: no other warpgroup writes there (the epilogue stages O in its own
// rows) while this one is in its mainloop.
DASH_DEVICE void order_probs_before_wait(const RowStats& st, uint32_t addr) {
  ld_volatile_shared_u32(addr + (((__float_as_uint(st.sum[0]) | __float_as_uint(st.sum[1])) >> 31) << 2));
}

// The mainloop of MMA warpgroup wg (thread tid of it): O (unnormalised) and the row statistics of its 64 rows, for
// the CTA's tile after `kv` ring loads and `loads` Q loads of its earlier tiles (persistent launches, fwd.cu).
// NOTES: K stage g % kStages holds K of step i = g - kv (KV tile n_block_min + n_blocks - 1 - i), V likewise; each
// warpgroup arrives once on an empty barrier (count kNumMmaWg) when its wgmmas reading that stage have
// completed. Every warpgroup takes the turn n_blocks + 1 times; warpgroup 1 passes it to warpgroup 0 once up
// front (so 0 goes first) and not after its last GEMMs, so every arrive is matched by a sync.
DASH_DEVICE void consume(const FwdParams& p, const Smem& s, const Tile& t, float (&O)[kORegs], RowStats& st, int wg,
                         int tid, int kv, int loads) {
  const Fragment f(tid);
#pragma unroll
  for (int i = 0; i < kORegs; ++i) O[i] = 0.f;
  const int n_blocks = t.n_blocks, n_block_last = t.n_block_min + n_blocks - 1;
  const int row_first = t.m_block * kBlockM + 64 * wg;  // first query row of this warpgroup
  KeyRange keys;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int sees = row_first + f.row0 + 8 * r + t.seqlen_k - t.seqlen_q;  // the diagonal key of the row
    keys.hi[r] = p.window_right >= 0 ? min(t.seqlen_k, sees + (int)p.window_right + 1) : t.seqlen_k;
    keys.lo[r] = p.window_left >= 0 ? sees - (int)p.window_left : 0;
  }
  if (wg == 1) turn_pass(wg);

  const uint64_t q_desc = TileQ::kmajor(s.q(), 64 * wg);
  float S[kSRegs], corr[2];
  uint32_t Pa[kBlockN / 16][4];
  mbar_wait(s.q_full(), loads & 1);

  // Step 0: S of the last KV tile alone.
  const int k0 = kv % kStages;
  mbar_wait(s.k_full(k0), (kv / kStages) & 1);
  turn_wait(wg);
  wgmma_fence();
  gemm_qk(S, q_desc, s.k(k0));
  wgmma_commit();
  turn_pass(wg);
  wgmma_wait<0>();
  wgmma_fence_operand(S);
  if (tid == 0) mbar_arrive(s.k_empty(k0));
  scores_to_probs<true>(S, st, corr, n_block_last, row_first, keys, p, t, f);
  pack_fragments<kSRegs>(Pa, S);

  // Step i: S of KV tile n_block_last - i with O += P V of the tile before it.
  for (int i = 1; i < n_blocks; ++i) {
    const int g = kv + i, ks = g % kStages, vs = (g - 1) % kStages;
    mbar_wait(s.k_full(ks), (g / kStages) & 1);
    turn_wait(wg);
    wgmma_fence();
    gemm_qk(S, q_desc, s.k(ks));
    wgmma_commit();
    mbar_wait(s.v_full(vs), ((g - 1) / kStages) & 1);
    wgmma_fence();  // NOTES: not required by the ISA here, but ptxas 13.0 injects one after a wait loop (C7519)
    gemm_pv(O, Pa, s.v(vs));
    wgmma_commit();
    turn_pass(wg);

    wgmma_wait<1>();
    wgmma_fence_operand(S);
    if (tid == 0) mbar_arrive(s.k_empty(ks));
    scores_to_probs<false>(S, st, corr, n_block_last - i, row_first, keys, p, t, f);
    order_probs_before_wait(st, TileQ::chunk_addr(s.q(), 64 * wg, 0));
    wgmma_wait<0>();
    wgmma_fence_operand(O);
    wgmma_fence_operand(Pa);
    if (tid == 0) mbar_arrive(s.v_empty(vs));
#pragma unroll
    for (int j = 0; j < kORegs; ++j) O[j] *= corr[(j / 2) % 2];
    pack_fragments<kSRegs>(Pa, S);
  }

  // Last step: O += P V of KV tile n_block_min.
  const int vs = (kv + n_blocks - 1) % kStages;
  mbar_wait(s.v_full(vs), ((kv + n_blocks - 1) / kStages) & 1);
  turn_wait(wg);
  wgmma_fence();
  gemm_pv(O, Pa, s.v(vs));
  wgmma_commit();
  if (wg == 0) turn_pass(wg);
  wgmma_wait<0>();
  wgmma_fence_operand(O);
  if (tid == 0) mbar_arrive(s.v_empty(vs));
}

}  // namespace fwd
