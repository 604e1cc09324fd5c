// The part of a split-head-dim visit that the head-dim-192 and 256 unit kernels share (bwd192_visit.cu,
// bwd192_keys_visit.cu, bwd256_visit.cu): the tiles filled by the threads with plain stores (no TMA), fenced for the
// async proxy; S and dP (or S^T and dP^T) of the warpgroup's 32 keys (queries) over the whole head dim, P and dS from
// them, rounded into A fragments.
#pragma once
#include "common.cuh"
#include "ptx/exp2.cuh"
#include "ptx/fence.cuh"
#include "bwd/keys_gemms.cuh"
#include "ptx/wgmma.cuh"
#include "swizzled_tile.cuh"
#include "wgmma_fragment.cuh"

// Copies a kRows x kD row-major bf16 matrix into a tile of kD / 64 panels, kThreads threads taking turns.
template <class Tile, int kRows, int kD, int kThreads>
DASH_DEVICE void fill(uint32_t tile, const uint16_t* src, int tid) {
  for (int idx = tid; idx < kRows * kD / 8; idx += kThreads) {
    const int row = idx / (kD / 8), chunk = idx % (kD / 8);
    const uint4 v = *reinterpret_cast<const uint4*>(src + row * kD + 8 * chunk);
    asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(Tile::chunk_addr(tile, row, chunk)), "r"(v.x),
                 "r"(v.y), "r"(v.z), "r"(v.w)
                 : "memory");
  }
}

// Q and dO (kM rows), K and V (kN rows), kD / 64 panels each, then the P and dS tiles (one panel of kPRows rows
// each), from the 1024-byte aligned start of dynamic shared memory: the first four filled from the row-major bf16
// inputs and fenced for the async proxy, every thread synchronized.
struct VisitTiles {
  uint32_t q, dout, k, v, p, ds;
};
template <int kM, int kN, int kD, int kPRows, int kThreads>
DASH_DEVICE VisitTiles fill_visit_tiles(char* smem_raw, const uint16_t* q, const uint16_t* k, const uint16_t* v,
                                        const uint16_t* dout, int tid) {
  using TileM = SwizzledTile<kM>;
  using TileN = SwizzledTile<kN>;
  VisitTiles t;
  t.q = (smem_u32(smem_raw) + 1023u) & ~1023u;
  t.dout = t.q + kD / 64 * TileM::kPanelBytes;
  t.k = t.dout + kD / 64 * TileM::kPanelBytes;
  t.v = t.k + kD / 64 * TileN::kPanelBytes;
  t.p = t.v + kD / 64 * TileN::kPanelBytes;
  t.ds = t.p + SwizzledTile<kPRows>::kPanelBytes;
  fill<TileM, kM, kD, kThreads>(t.q, q, tid);
  fill<TileM, kM, kD, kThreads>(t.dout, dout, tid);
  fill<TileN, kN, kD, kThreads>(t.k, k, tid);
  fill<TileN, kN, kD, kThreads>(t.v, v, tid);
  fence_proxy_async_smem();
  __syncthreads();
  return t;
}

// The warpgroup's share of S and dP over the whole head dim, and P = 2^(S scale_log2 - lse_log2), dS = P (dP - dpsum)
// from them in place in fp32, both also rounded into A fragments (Pa, dSa). kByKeys false: S^T = K Q^T and dP^T =
// V dO^T for queries [32 wg, + 32) (keys x queries: A the K / V tile, B the Q / dO tile from row 32 wg); true: S =
// Q K^T and dP = dO V^T for keys [32 wg, + 32) (queries x keys: A the Q / dO tile, B the K / V tile from row 32 wg).
template <int kD, class TileK, class TileQ, bool kByKeys = false>
DASH_DEVICE void visit_probs_and_grads(float (&S)[16], float (&dP)[16], uint32_t (&Pa)[2][4], uint32_t (&dSa)[2][4],
                                       uint32_t k_tile, uint32_t v_tile, uint32_t q_tile, uint32_t do_tile,
                                       const float* lse_log2, const float* dpsum, float scale_log2, int wg,
                                       const Fragment& f) {
  wgmma_fence();
  if constexpr (kByKeys) {
    gemm_scores_by_keys<kD / 16, TileQ, TileK>(S, q_tile, k_tile, wg);  // the main kernel's (bwd/keys_gemms.cuh)
    gemm_scores_by_keys<kD / 16, TileQ, TileK>(dP, do_tile, v_tile, wg);
  } else {
    gemm_ss_kmajor<32, kD / 16, TileK, TileQ>(S, TileK::kmajor(k_tile, 0), TileQ::kmajor(q_tile, 32 * wg));
    gemm_ss_kmajor<32, kD / 16, TileK, TileQ>(dP, TileK::kmajor(v_tile, 0), TileQ::kmajor(do_tile, 32 * wg));
  }
  wgmma_commit();
  wgmma_wait<0>();
  wgmma_fence_operand(S);
  wgmma_fence_operand(dP);
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    const int query = kByKeys ? f.row0 + Fragment::row(i) : 32 * wg + f.col0 + Fragment::col(i);
    S[i] = exp2_approx(fmaf(S[i], scale_log2, -lse_log2[query]));
    dP[i] = S[i] * (dP[i] - dpsum[query]);
  }
  pack_fragments<16>(Pa, S);
  pack_fragments<16>(dSa, dP);
}

// acc of an m64 fragment (rows row_base + fragment row, columns col_base + fragment column) into out (ld columns);
// kTransposed: out[column][row] instead.
template <int kRegs, bool kTransposed = false>
DASH_DEVICE void store_acc(float* out, int ld, int row_base, int col_base, const float (&acc)[kRegs],
                           const Fragment& f) {
#pragma unroll
  for (int i = 0; i < kRegs; ++i) {
    const int r = row_base + f.row0 + Fragment::row(i), c = col_base + f.col0 + Fragment::col(i);
    out[kTransposed ? c * ld + r : r * ld + c] = acc[i];
  }
}
