// The GEMMs of one visit of head dim 192's 64 x 96 tile (FA3's; docs/decisions/head-dim-plans.md "Head dim 192:
// FA3's 64 x 96 tile"), as MMA warpgroup wg of three issues them: the backward main kernel's (bwd/keys_step.cuh) and
// the unit kernel's that checks their operand layouts against numpy (tests/gpu/kernels/bwd192_keys_visit.cu).
//   S = Q K^T, dP = dO V^T: split by keys, warpgroup wg keys [32 wg, + 32) (m64n32k16; A the K-major Q / dO tile,
//     B the K-major K / V tile from row 32 wg);
//   dV^T += dO^T P, dK^T += Q^T dS: split by head-dim rows (m64n96k16 over the queries; A the MN-major dO / Q tile,
//     B the P^T / dS^T tile, keys x queries in one 64-column panel, K-major);
//   dQ = dS K: split by head-dim columns (m64n64k16 over the keys; A the dS^T tile read MN-major, B the MN-major K
//     tile).
// Each issues its wgmmas only: no fence, commit or wait.
#pragma once
#include "../ptx/wgmma.cuh"
#include "../swizzled_tile.cuh"

// acc (the tile's queries x keys [32 wg, + 32)) = A B^T over kSteps k16-steps: S = Q K^T (a_tile Q, b_tile K) or
// dP = dO V^T (dO, V); TileA, TileB: the tiles' SwizzledTile types.
template <int kSteps, class TileA, class TileB>
DASH_DEVICE void gemm_scores_by_keys(float (&acc)[16], uint32_t a_tile, uint32_t b_tile, int wg) {
  gemm_ss_kmajor<32, kSteps, TileA, TileB>(acc, TileA::kmajor(a_tile, 0), TileB::kmajor(b_tile, 32 * wg));
}

// acc (head-dim rows [d0, d0 + 64) x kKeys keys) (+)= A^T B over kQueries queries: dV^T += dO^T P (a_tile dO,
// bt_tile P^T) or dK^T += Q^T dS (Q, dS^T). accumulate false: the first k-step overwrites acc (a new KV tile).
template <int kQueries, int kKeys, class TileA, class TileT>
DASH_DEVICE void gemm_head_rows_by_keys(float (&acc)[kKeys / 2], uint32_t a_tile, int d0, uint32_t bt_tile,
                                        bool accumulate) {
  const uint64_t a_desc = TileA::mnmajor(a_tile, d0), b_desc = TileT::kmajor(bt_tile, 0);
#pragma unroll
  for (int ks = 0; ks < kQueries / 16; ++ks) {
    wgmma_ss<kKeys, 1, 0>(acc, desc_advance(a_desc, TileA::mnmajor_step(ks)),
                          desc_advance(b_desc, TileT::kmajor_step(ks)), accumulate || ks > 0);
  }
}

// acc (the tile's queries x head-dim columns [c0, c0 + 64)) = dS K over kKeys keys: A the dS^T tile (keys x queries)
// read MN-major, B the K tile read MN-major from column c0; TileT: their SwizzledTile type (kKeys rows).
template <int kKeys, class TileT>
DASH_DEVICE void gemm_dq_by_keys(float (&acc)[32], uint32_t dst_tile, uint32_t k_tile, int c0) {
  const uint64_t a_desc = TileT::mnmajor(dst_tile, 0), b_desc = TileT::mnmajor(k_tile, c0);
#pragma unroll
  for (int ks = 0; ks < kKeys / 16; ++ks) {
    wgmma_ss<64, 1, 1>(acc, desc_advance(a_desc, TileT::mnmajor_step(ks)),
                       desc_advance(b_desc, TileT::mnmajor_step(ks)), ks > 0);
  }
}
