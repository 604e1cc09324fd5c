// Unit kernel for the Hopper primitives of the backward engine, one warpgroup (thread 0 also issues the TMA):
//   C = A B^T        TMA 5-D loads into 128B-swizzled tiles, SS wgmma with both operands K-major
//   E = bf16(C) B    RS wgmma: A from registers (packed accumulator fragments), B MN-major
//   G = bf16(C)^T[0:64] A   stmatrix.trans of fragments, then SS wgmma with that tile K-major and B MN-major
// A is 64 x UNIT_D (rows of a (B, S, H, UNIT_D) tensor), B is UNIT_N x UNIT_D (rows 0.. of a (1, S, 1, UNIT_D)
// tensor); tests/gpu/test_gpu_hopper_units.py compares the three products with numpy.
#include "common.cuh"
#include "ptx/fence.cuh"
#include "ptx/mbarrier.cuh"
#include "ptx/tma.cuh"
#include "ptx/wgmma.cuh"
#include "swizzled_tile.cuh"
#include "wgmma_fragment.cuh"

constexpr int kN = UNIT_N, kD = UNIT_D;
using TileA = SwizzledTile<64>;
using TileB = SwizzledTile<kN>;

struct UnitParams {
  TmaDesc a, b;
  float* c;  // 64 x kN
  float* e;  // 64 x kD
  float* g;  // 64 x kD
  int a_row, a_head, a_batch;  // where A starts in its (B, S, H, kD) tensor (rows past S read as zeros)
};

template <int kRegs>
DASH_DEVICE void store_acc(float* out, int ld, const float (&acc)[kRegs], const Fragment& f) {
#pragma unroll
  for (int i = 0; i < kRegs; ++i) out[(f.row0 + Fragment::row(i)) * ld + f.col0 + Fragment::col(i)] = acc[i];
}

extern "C" __global__ void __launch_bounds__(128, 1) hopper_units(const __grid_constant__ UnitParams p) {
  extern __shared__ __align__(1024) char smem_raw[];
  const uint32_t base = (smem_u32(smem_raw) + 1023u) & ~1023u;
  const uint32_t a_tile = base, b_tile = a_tile + 64 * kD * 2, t_tile = b_tile + kN * kD * 2;
  const uint32_t bar = t_tile + kN * 64 * 2;
  const int tid = threadIdx.x;
  const Fragment f(tid);
  if (tid == 0) {
    mbar_init(bar, 1);
    mbar_fence_init();
  }
  __syncthreads();
  if (tid == 0) {
    mbar_arrive_expect_tx(bar, (64 + kN) * kD * 2);
    tma_load_5d(a_tile, &p.a, bar, 0, p.a_row, 0, p.a_head, p.a_batch);
    tma_load_5d(b_tile, &p.b, bar, 0, 0, 0, 0, 0);
  }
  while (!mbar_try_wait(bar, 0)) {
  }

  float c[kN / 2];
  wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < kD / 16; ++ks) {
    wgmma_ss<kN, 0, 0>(c, desc_advance(TileA::kmajor(a_tile, 0), TileA::kmajor_step(ks)),
                       desc_advance(TileB::kmajor(b_tile, 0), TileB::kmajor_step(ks)), ks > 0);
  }
  wgmma_commit();
  wgmma_wait<0>();
  wgmma_fence_operand(c);
  store_acc(p.c, kN, c, f);

  uint32_t ca[kN / 16][4];
  pack_fragments<kN / 2>(ca, c);
  float e[kD / 2];
  wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < kN / 16; ++ks) {
    wgmma_rs<kD, 1>(e, ca[ks], desc_advance(TileB::mnmajor(b_tile, 0), TileB::mnmajor_step(ks)), ks > 0);
  }
  wgmma_commit();
  wgmma_wait<0>();
  wgmma_fence_operand(e);
  store_acc(p.e, kD, e, f);

  store_transposed<kN>(t_tile, ca, 0, tid);
  fence_proxy_async_smem();
  __syncthreads();
  float g[kD / 2];
  wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < 64 / 16; ++ks) {
    wgmma_ss<kD, 0, 1>(g, desc_advance(TileB::kmajor(t_tile, 0), TileB::kmajor_step(ks)),
                       desc_advance(TileA::mnmajor(a_tile, 0), TileA::mnmajor_step(ks)), ks > 0);
  }
  wgmma_commit();
  wgmma_wait<0>();
  wgmma_fence_operand(g);
  store_acc(p.g, kD, g, f);
}
