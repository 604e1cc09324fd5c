// Probe for head dim 96 (docs/decisions/head-dim-plans.md): does wgmma read an MN-major B operand of N = 96 that
// spans one and a half 64-column panels of a 128B-swizzled tile (columns 96-127 zero, as TMA's zero fill would leave
// them), or must it be issued as N = 64 on the first panel plus N = 32 on the second? One warpgroup:
//   E96 = A B      one m64n96k16 per k-step, B's descriptor on panel 0 with LBO = one panel
//   E64_32 = A B   m64n64k16 on panel 0 and m64n32k16 on panel 1
// A: 64 x 128 bf16 (K-major: rows are M), B: 128 x 96 bf16 (rows are K, the keys of a V tile); the threads copy
// them into the swizzled tiles with plain stores (no TMA), fenced for the async proxy.
// tests/gpu/test_gpu_wgmma_n96.py compares both with numpy.
#include "common.cuh"
#include "ptx/fence.cuh"
#include "ptx/wgmma.cuh"
#include "swizzled_tile.cuh"
#include "wgmma_fragment.cuh"

using TileA = SwizzledTile<64>;
using TileB = SwizzledTile<128>;

// Copies a rows x cols row-major bf16 matrix (cols <= 128) into a two-panel SwizzledTile<kRows>, zeros beyond cols.
template <int kRows>
DASH_DEVICE void fill(uint32_t tile, const uint16_t* src, int cols, int tid) {
  for (int idx = tid; idx < kRows * 16; idx += 128) {
    const int row = idx / 16, chunk = idx % 16;
    uint32_t w[4] = {0u, 0u, 0u, 0u};
    if (8 * chunk < cols) {
      const uint4 v = *reinterpret_cast<const uint4*>(src + row * cols + 8 * chunk);
      w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
    }
    const uint32_t dst = SwizzledTile<kRows>::chunk_addr(tile, row, chunk);
    asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(dst), "r"(w[0]), "r"(w[1]), "r"(w[2]), "r"(w[3])
                 : "memory");
  }
}

template <int kRegs>
DASH_DEVICE void store_acc(float* out, int ld, int col_base, const float (&acc)[kRegs], const Fragment& f) {
#pragma unroll
  for (int i = 0; i < kRegs; ++i) {
    out[(f.row0 + Fragment::row(i)) * ld + col_base + f.col0 + Fragment::col(i)] = acc[i];
  }
}

extern "C" __global__ void __launch_bounds__(128, 1)
    wgmma_n96(const uint16_t* a, const uint16_t* b, float* e96, float* e64_32) {
  extern __shared__ __align__(1024) char smem_raw[];
  const uint32_t base = (smem_u32(smem_raw) + 1023u) & ~1023u;
  const uint32_t a_tile = base, b_tile = a_tile + 2 * TileA::kPanelBytes;
  const int tid = threadIdx.x;
  const Fragment f(tid);
  fill<64>(a_tile, a, 128, tid);
  fill<128>(b_tile, b, 96, tid);
  fence_proxy_async_smem();
  __syncthreads();

  float d96[48], d64[32], d32[16];
  wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < 8; ++ks) {
    const uint64_t a_desc = desc_advance(TileA::kmajor(a_tile, 0), TileA::kmajor_step(ks));
    wgmma_ss<96, 0, 1>(d96, a_desc, desc_advance(TileB::mnmajor(b_tile, 0), TileB::mnmajor_step(ks)), ks > 0);
    wgmma_ss<64, 0, 1>(d64, a_desc, desc_advance(TileB::mnmajor(b_tile, 0), TileB::mnmajor_step(ks)), ks > 0);
    wgmma_ss<32, 0, 1>(d32, a_desc, desc_advance(TileB::mnmajor(b_tile, 64), TileB::mnmajor_step(ks)), ks > 0);
  }
  wgmma_commit();
  wgmma_wait<0>();
  wgmma_fence_operand(d96);
  wgmma_fence_operand(d64);
  wgmma_fence_operand(d32);
  store_acc(e96, 96, 0, d96, f);
  store_acc(e64_32, 96, 0, d64, f);
  store_acc(e64_32, 96, 64, d32, f);
}
