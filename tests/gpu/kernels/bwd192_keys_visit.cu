// One visit of the candidate head-dim-192 backward tile, 64 queries x 96 keys (FA3's; docs/decisions/head-dim-plans.md
// "Head dim 192: FA3's 64 x 96 tile, a candidate"), as a unit kernel: its operand layouts, checked before any kernel
// is built on them. Three MMA warpgroups share one Q tile of 64 queries and one KV tile of 96 keys.
//   S = Q K^T and dP = dO V^T: warpgroup w computes keys [32 w, 32 w + 32) (m64n32k16, A the K-major Q / dO tile,
//     B the K-major K / V tile from row 32 w);
//   P = 2^(S scale_log2 - lse_log2), dS = P (dP - dpsum): rounded to bf16 and stored transposed into the P^T and dS^T
//     tiles (keys x queries, one 64-column panel of 96 rows), each warpgroup its 32 key rows;
//   dV^T = dO^T P and dK^T = Q^T dS: warpgroup w's head-dim rows [64 w, 64 w + 64) by the 96 keys (m64n96k16, 4
//     k-steps over the queries), A the MN-major dO / Q tile, B the K-major P^T / dS^T tile;
//   dQ = dS K: warpgroup w's head-dim columns [64 w, 64 w + 64) (m64n64k16, 6 k-steps over the keys), A the dS^T tile
//     read MN-major, B the MN-major K tile.
// Inputs row-major bf16 (Q, dO 64 x 192; K, V 96 x 192), lse_log2 and dpsum per query (split_visit.cuh fills the
// tiles). tests/gpu/test_gpu_bwd192_visit.py compares with numpy.
#include "split_visit.cuh"

using TileQ = SwizzledTile<64>;  // Q, dO: 64 rows x 192 columns (3 panels)
using TileK = SwizzledTile<96>;  // K, V: 96 rows x 192 columns (3 panels); P^T, dS^T: 96 x 64 (one panel)
constexpr int kD = 192, kN = 96, kThreads = 384;

extern "C" __global__ void __launch_bounds__(kThreads, 1)
    bwd192_keys_visit(const uint16_t* q, const uint16_t* k, const uint16_t* v, const uint16_t* dout,
                      const float* lse_log2, const float* dpsum, float scale_log2, float* p_out, float* ds_out,
                      float* dvt_out, float* dkt_out, float* dq_out) {
  extern __shared__ __align__(1024) char smem_raw[];
  const int tid = threadIdx.x, wg = tid / 128, t = tid % 128;
  const Fragment f(t);
  const VisitTiles tiles = fill_visit_tiles<64, kN, kD, kN, kThreads>(smem_raw, q, k, v, dout, tid);
  const uint32_t q_tile = tiles.q, do_tile = tiles.dout, k_tile = tiles.k, pt_tile = tiles.p, dst_tile = tiles.ds;

  // S, dP: the 64 queries x this warpgroup's 32 keys, over the whole head dim; P, dS, rounded
  float S[16], dP[16];
  uint32_t Pa[2][4], dSa[2][4];
  visit_probs_and_grads<kD, TileK, TileQ, true>(S, dP, Pa, dSa, k_tile, tiles.v, q_tile, do_tile, lse_log2, dpsum,
                                                scale_log2, wg, f);
  store_acc(p_out, kN, 0, 32 * wg, S, f);  // P, dS (queries x keys) before they are rounded
  store_acc(ds_out, kN, 0, 32 * wg, dP, f);
  store_transposed<kN>(pt_tile, Pa, 0, t, 32 * wg);  // this warpgroup's 32 key rows of the keys x queries tiles
  store_transposed<kN>(dst_tile, dSa, 0, t, 32 * wg);
  fence_proxy_async_smem();
  __syncthreads();

  // dV^T = dO^T P, dK^T = Q^T dS: head-dim rows [64 wg, + 64) by the 96 keys, K = the 64 queries; dQ = dS K: the 64
  // queries by head-dim columns [64 wg, + 64), K = the 96 keys (the main kernel's GEMMs, bwd/keys_gemms.cuh)
  float dVt[48], dKt[48], dQ[32];
  wgmma_fence();
  gemm_head_rows_by_keys<64, kN, TileQ, TileK>(dVt, do_tile, 64 * wg, pt_tile, false);
  gemm_head_rows_by_keys<64, kN, TileQ, TileK>(dKt, q_tile, 64 * wg, dst_tile, false);
  gemm_dq_by_keys<kN, TileK>(dQ, dst_tile, k_tile, 64 * wg);
  wgmma_commit();
  wgmma_wait<0>();
  wgmma_fence_operand(dVt);
  wgmma_fence_operand(dKt);
  wgmma_fence_operand(dQ);

  store_acc(dvt_out, kN, 64 * wg, 0, dVt, f);
  store_acc(dkt_out, kN, 64 * wg, 0, dKt, f);
  store_acc(dq_out, kD, 0, 64 * wg, dQ, f);
}
