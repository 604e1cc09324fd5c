// One visit of the head-dim-192 backward plan (docs/decisions/head-dim-plans.md, "Head dim 192 on the same
// family"), as a unit kernel: the operand layouts where it differs from head dim 256's visit (bwd256_visit.cu), checked before
// the kernel that chains them. Three MMA warpgroups share one KV tile of 64 keys and one Q tile of 96 queries; the
// head dim is split between them (64 rows each).
//   S^T = K Q^T and dP^T = V dO^T: warpgroup w computes queries [32 w, 32 w + 32) (m64n32k16, both K-major);
//   P = 2^(S scale_log2 - lse_log2), dS = P (dP - dpsum): rounded to bf16 and stored transposed into the P and dS
//     tiles (queries x keys, one 64-column panel of 96 rows), each warpgroup its 32 rows;
//   dV^T = dO^T P and dK^T = Q^T dS: warpgroup w's head-dim rows [64 w, 64 w + 64) (m64n64k16, 6 k-steps over the
//     queries), A the MN-major dO / Q tile, B the MN-major P / dS tile;
//   dQ^T = K^T dS^T: warpgroup w's head-dim rows [64 w, 64 w + 64) by the 96 queries in two chunks of 48
//     (m64n48k16), A the MN-major K tile, B the K-major dS tile from row 48 c.
// Inputs row-major bf16 (Q, dO 96 x 192; K, V 64 x 192), lse_log2 and dpsum per query (split_visit.cuh fills the
// tiles). tests/gpu/test_gpu_bwd192_visit.py compares with numpy.
#include "split_visit.cuh"

using TileQ = SwizzledTile<96>;  // Q, dO: 96 rows x 192 columns (3 panels); P, dS: 96 x 64 (one panel)
using TileK = SwizzledTile<64>;  // K, V: 64 rows x 192 columns (3 panels)
constexpr int kD = 192, kM = 96, kThreads = 384;

extern "C" __global__ void __launch_bounds__(kThreads, 1)
    bwd192_visit(const uint16_t* q, const uint16_t* k, const uint16_t* v, const uint16_t* dout,
                 const float* lse_log2, const float* dpsum, float scale_log2, float* p_out, float* ds_out,
                 float* dvt_out, float* dkt_out, float* dqt_out) {
  extern __shared__ __align__(1024) char smem_raw[];
  const int tid = threadIdx.x, wg = tid / 128, t = tid % 128;
  const Fragment f(t);
  const VisitTiles tiles = fill_visit_tiles<kM, 64, kD, kM, kThreads>(smem_raw, q, k, v, dout, tid);
  const uint32_t q_tile = tiles.q, do_tile = tiles.dout, k_tile = tiles.k, v_tile = tiles.v, p_tile = tiles.p,
                 ds_tile = tiles.ds;

  // S^T, dP^T: 64 keys x this warpgroup's 32 queries, over the whole head dim; P^T, dS^T
  float S[16], dP[16];
  uint32_t Pa[2][4], dSa[2][4];
  visit_probs_and_grads<kD, TileK, TileQ>(S, dP, Pa, dSa, k_tile, v_tile, q_tile, do_tile, lse_log2, dpsum,
                                          scale_log2, wg, f);
  store_transposed<kM>(p_tile, Pa, 0, t, 32 * wg);   // this warpgroup's 32 query rows of the queries x keys tiles
  store_transposed<kM>(ds_tile, dSa, 0, t, 32 * wg);
  fence_proxy_async_smem();
  __syncthreads();

  // dV^T = dO^T P, dK^T = Q^T dS: head-dim rows [64 wg, + 64) by 64 keys, K = the 96 queries
  float dVt[32], dKt[32];
  wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < kM / 16; ++ks) {
    const uint64_t p_desc = desc_advance(TileQ::mnmajor(p_tile, 0), TileQ::mnmajor_step(ks));
    const uint64_t ds_desc = desc_advance(TileQ::mnmajor(ds_tile, 0), TileQ::mnmajor_step(ks));
    wgmma_ss<64, 1, 1>(dVt, desc_advance(TileQ::mnmajor(do_tile, 64 * wg), TileQ::mnmajor_step(ks)), p_desc, ks > 0);
    wgmma_ss<64, 1, 1>(dKt, desc_advance(TileQ::mnmajor(q_tile, 64 * wg), TileQ::mnmajor_step(ks)), ds_desc, ks > 0);
  }
  // dQ^T = K^T dS^T: head-dim rows [64 wg, + 64) by queries [48 c, + 48), K = the 64 keys
  float dQt[2][24];
#pragma unroll
  for (int c = 0; c < 2; ++c) {
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      wgmma_ss<48, 1, 0>(dQt[c], desc_advance(TileK::mnmajor(k_tile, 64 * wg), TileK::mnmajor_step(ks)),
                         desc_advance(TileQ::kmajor(ds_tile, 48 * c), TileQ::kmajor_step(ks)), ks > 0);
    }
  }
  wgmma_commit();
  wgmma_wait<0>();
  wgmma_fence_operand(dVt);
  wgmma_fence_operand(dKt);
  wgmma_fence_operand(dQt[0]);
  wgmma_fence_operand(dQt[1]);

  store_acc<16, true>(p_out, 64, 0, 32 * wg, S, f);    // P (queries x keys) from S^T's registers
  store_acc<16, true>(ds_out, 64, 0, 32 * wg, dP, f);
  store_acc(dvt_out, 64, 64 * wg, 0, dVt, f);
  store_acc(dkt_out, 64, 64 * wg, 0, dKt, f);
  store_acc(dqt_out, kM, 64 * wg, 0, dQt[0], f);
  store_acc(dqt_out, kM, 64 * wg, 48, dQt[1], f);
}
