// The part of a split-head-dim visit that the head-dim-192 and 256 unit kernels share (bwd192_visit.cu,
// bwd256_visit.cu): S^T = K Q^T and dP^T = V dO^T for this warpgroup's 32 queries over the whole head dim (both
// K-major), P^T = 2^(S^T scale_log2 - lse_log2) and dS^T = P^T (dP^T - dpsum) in place in fp32, and both rounded
// into A fragments. Tiles are filled by the threads with plain stores (no TMA), fenced for the async proxy.
#pragma once
#include "common.cuh"
#include "ptx/exp2.cuh"
#include "ptx/fence.cuh"
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

// S, dP: the fp32 P^T and dS^T of keys x queries [32 wg, + 32) on return; Pa, dSa: the same rounded.
template <int kD, class TileK, class TileQ>
DASH_DEVICE void visit_probs_and_grads(float (&S)[16], float (&dP)[16], uint32_t (&Pa)[2][4], uint32_t (&dSa)[2][4],
                                       uint32_t k_tile, uint32_t v_tile, uint32_t q_tile, uint32_t do_tile,
                                       const float* lse_log2, const float* dpsum, float scale_log2, int wg,
                                       const Fragment& f) {
  wgmma_fence();
  gemm_ss_kmajor<32, kD / 16, TileK, TileQ>(S, TileK::kmajor(k_tile, 0), TileQ::kmajor(q_tile, 32 * wg));
  gemm_ss_kmajor<32, kD / 16, TileK, TileQ>(dP, TileK::kmajor(v_tile, 0), TileQ::kmajor(do_tile, 32 * wg));
  wgmma_commit();
  wgmma_wait<0>();
  wgmma_fence_operand(S);
  wgmma_fence_operand(dP);
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    const int query = 32 * wg + f.col0 + Fragment::col(i);
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
