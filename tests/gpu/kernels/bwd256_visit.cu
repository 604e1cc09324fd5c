// One visit of the head-dim-256 backward plan (docs/decisions/head-dim-plans.md "Head dims 192 and 256: a backward
// plan"), as a unit kernel: the operand layouts of its five GEMMs, checked before the kernel that chains them.
// Two MMA warpgroups share one KV tile of 64 keys and one Q tile of 64 queries; the head dim is split between them.
//   S^T = K Q^T and dP^T = V dO^T: warpgroup w computes queries [32 w, 32 w + 32) (m64n32k16, both K-major);
//   P^T = 2^(S^T scale_log2 - lse_log2), dS^T = P^T (dP^T - dpsum): rounded to bf16 into the P^T and dS^T tiles
//     (keys x queries, one 64-column panel), each warpgroup its 32 columns;
//   dV^T = dO^T P and dK^T = Q^T dS: warpgroup w's head-dim rows [128 w, 128 w + 128) as two m64 halves, A the
//     MN-major dO / Q tile, B the K-major P^T / dS^T tile (m64n64k16);
//   dQ = dS K: warpgroup w's head-dim columns [128 w, 128 w + 128) as two m64n64 chunks, A the dS^T tile read
//     MN-major, B the MN-major K tile.
// Inputs row-major bf16 (64 x 256 each), lse_log2 and dpsum per query (split_visit.cuh fills the tiles).
// tests/gpu/test_gpu_bwd256_visit.py compares with numpy.
#include "split_visit.cuh"

using Tile = SwizzledTile<64>;  // Q, K, V, dO: 64 rows x 256 columns (4 panels); P^T, dS^T: 64 x 64 (one panel)
constexpr int kD = 256;

extern "C" __global__ void __launch_bounds__(256, 1)
    bwd256_visit(const uint16_t* q, const uint16_t* k, const uint16_t* v, const uint16_t* dout,
                 const float* lse_log2, const float* dpsum, float scale_log2, float* pt_out, float* dst_out,
                 float* dvt_out, float* dkt_out, float* dq_out) {
  extern __shared__ __align__(1024) char smem_raw[];
  const int tid = threadIdx.x, wg = tid / 128, t = tid % 128;
  const Fragment f(t);
  const VisitTiles tiles = fill_visit_tiles<64, 64, kD, 64, 256>(smem_raw, q, k, v, dout, tid);
  const uint32_t q_tile = tiles.q, k_tile = tiles.k, v_tile = tiles.v, do_tile = tiles.dout, pt_tile = tiles.p,
                 dst_tile = tiles.ds;

  // S^T, dP^T: 64 keys x this warpgroup's 32 queries, over the whole head dim; P^T, dS^T
  float S[16], dP[16];
  uint32_t Pa[2][4], dSa[2][4];
  visit_probs_and_grads<kD, Tile, Tile>(S, dP, Pa, dSa, k_tile, v_tile, q_tile, do_tile, lse_log2, dpsum, scale_log2,
                                        wg, f);
  store_rows<64>(pt_tile, Pa, 0, t, 32 * wg);   // this warpgroup's 32 query columns of the one-panel tiles
  store_rows<64>(dst_tile, dSa, 0, t, 32 * wg);
  fence_proxy_async_smem();
  __syncthreads();

  // dV^T = dO^T P, dK^T = Q^T dS: head-dim rows [128 wg + 64 h, + 64) by 64 keys, K = the 64 queries
  float dVt[2][32], dKt[2][32];
  wgmma_fence();
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int d0 = 128 * wg + 64 * h;
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      const uint64_t p_desc = desc_advance(Tile::kmajor(pt_tile, 0), Tile::kmajor_step(ks));
      const uint64_t ds_desc = desc_advance(Tile::kmajor(dst_tile, 0), Tile::kmajor_step(ks));
      wgmma_ss<64, 1, 0>(dVt[h], desc_advance(Tile::mnmajor(do_tile, d0), Tile::mnmajor_step(ks)), p_desc, ks > 0);
      wgmma_ss<64, 1, 0>(dKt[h], desc_advance(Tile::mnmajor(q_tile, d0), Tile::mnmajor_step(ks)), ds_desc, ks > 0);
    }
  }
  // dQ = dS K: the 64 queries by head-dim columns [128 wg + 64 c, + 64), K = the 64 keys
  float dQ[2][32];
#pragma unroll
  for (int c = 0; c < 2; ++c) {
    const int col0 = 128 * wg + 64 * c;
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      wgmma_ss<64, 1, 1>(dQ[c], desc_advance(Tile::mnmajor(dst_tile, 0), Tile::mnmajor_step(ks)),
                         desc_advance(Tile::mnmajor(k_tile, col0), Tile::mnmajor_step(ks)), ks > 0);
    }
  }
  wgmma_commit();
  wgmma_wait<0>();
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    wgmma_fence_operand(dVt[h]);
    wgmma_fence_operand(dKt[h]);
    wgmma_fence_operand(dQ[h]);
  }

  store_acc(pt_out, 64, 0, 32 * wg, S, f);
  store_acc(dst_out, 64, 0, 32 * wg, dP, f);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    store_acc(dvt_out, 64, 128 * wg + 64 * h, 0, dVt[h], f);
    store_acc(dkt_out, 64, 128 * wg + 64 * h, 0, dKt[h], f);
    store_acc(dq_out, kD, 0, 128 * wg + 64 * h, dQ[h], f);
  }
}
