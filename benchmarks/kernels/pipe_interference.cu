// Probe: does other work on the SM slow one warpgroup's chain of wgmmas? Warpgroup 0 runs `reps` GEMMs, each
// committed and waited for: GEMM 0: 64 x 80 x 128 as eight SS m64n80k16 k-steps, both operands K-major in
// 128B-swizzled tiles (the backward's S^T and dP^T); GEMM 1: 64 x 128 x 80 as five RS m64n128k16 k-steps, A from
// registers, B N-major (dV and dK). Warpgroup 1 meanwhile runs OTHER for `other_iters` iterations:
//   0 nothing; 1 ex2 (MUFU.EX2, eight chains); 2 FFMA (eight chains); 3 shared loads (eight 16-byte loads in flight);
//   4 the SS GEMM on its own tiles; 5 ex2 and FFMA mixed, 8 MUFU to 16 FFMA; 6 FFMA in two chains (half the rate);
//   7 FMUL and FADD; 8 LOP3; 9 IMAD; 10 cvt.rn.bf16x2.f32 (F2FP); 11 mbarrier try_wait on a phase that never
//   completes (a producer's spin); 12 shared stores (16 bytes, eight per iteration, into warpgroup 1's own tiles);
//   13 the bulk add of a 20 KB slice of those tiles into gbuf (the dQ writer's cp.reduce.async.bulk: one thread
//   issues it and waits for its reads, once per iteration).
// Each warpgroup's clock64 span goes to cycles[2 * cta + wg]; sink keeps every result alive (never read); gbuf holds
// kBulkBytes per CTA for OTHER 13's adds.
// NOTES: every k-step accumulates (the accumulators start at zero): a GEMM that restarts its accumulators is dead
// code when the next one restarts them too, and ptxas replaces all but the last of an unrolled loop's GEMMs by
// empty m64n8k16 wgmmas (seen in the SASS of a first version, which then timed 132 cycles per 320-cycle GEMM).
// Built by benchmarks/pipe_interference.py with NVRTC (GEMM and OTHER defined ahead of this text), one CTA per SM.
#include "common.cuh"
#include "ptx/bulk_reduce.cuh"
#include "ptx/clock.cuh"
#include "ptx/cvt.cuh"
#include "ptx/exp2.cuh"
#include "ptx/fence.cuh"
#include "ptx/mbarrier.cuh"
#include "ptx/wgmma.cuh"
#include "swizzled_tile.cuh"

using TileA = SwizzledTile<64>;
using TileB = SwizzledTile<80>;
constexpr uint32_t kTileA = 64 * 128 * 2, kTileB = 80 * 128 * 2;
constexpr uint32_t kBulkBytes = 20480;  // OTHER 13: one MMA warpgroup's dQ slice of the 80-query tile

DASH_DEVICE void gemm_ss(float (&acc)[40], uint32_t a, uint32_t b) {
  wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < 8; ++ks) {
    wgmma_ss<80, 0, 0>(acc, desc_advance(TileA::kmajor(a, 0), TileA::kmajor_step(ks)),
                       desc_advance(TileB::kmajor(b, 0), TileB::kmajor_step(ks)), 1);
  }
  wgmma_commit();
  wgmma_wait<0>();
  wgmma_fence_operand(acc);
}

DASH_DEVICE void gemm_rs(float (&acc)[64], uint32_t (&pa)[5][4], uint32_t b) {
  wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < 5; ++ks) {
    wgmma_rs<128, 1>(acc, pa[ks], desc_advance(TileB::mnmajor(b, 0), TileB::mnmajor_step(ks)), 1);
  }
  wgmma_commit();
  wgmma_wait<0>();
  wgmma_fence_operand(acc);
}

DASH_DEVICE float other_work(int iters, uint32_t smem, int tid, float* gbuf) {
  constexpr int kChains = OTHER == 6 ? 2 : 8;
  float x[8];
  uint32_t u[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    x[j] = -0.25f - 0.01f * (float)((tid + j) % 16);
    u[j] = 0x9e3779b9u * (uint32_t)(tid + j);
  }
  uint32_t bits = 0;
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int j = 0; j < kChains; ++j) {
      if constexpr (OTHER == 1 || OTHER == 5) x[j] = -exp2_approx(x[j]);  // stays in [-1, -0.5)
      if constexpr (OTHER == 2 || OTHER == 5 || OTHER == 6) x[j] = fmaf(x[j], 0.999f, -0.0004f);
      if constexpr (OTHER == 2 || OTHER == 5 || OTHER == 6) x[j] = fmaf(x[j], 0.999f, -0.0004f);
      if constexpr (OTHER == 7) x[j] = __fmul_rn(x[j], 0.999f);
      if constexpr (OTHER == 7) x[j] = __fadd_rn(x[j], -0.0004f);
      if constexpr (OTHER == 8) u[j] ^= u[(j + 1) % 8] ^ (uint32_t)tid;  // one LOP3
      if constexpr (OTHER == 9) u[j] = u[j] * 0x9e3779b9u + (uint32_t)tid;
      if constexpr (OTHER == 10) u[j] ^= pack_elem2(x[j], __uint_as_float(u[(j + 1) % 8]));
    }
    if constexpr (OTHER == 3) {
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        uint32_t v0, v1, v2, v3;
        const uint32_t addr = smem + ((uint32_t)(it * 8 + j) * 4096u + (uint32_t)tid * 16u) % (2 * (kTileA + kTileB));
        asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(v0), "=r"(v1), "=r"(v2), "=r"(v3)
                     : "r"(addr));
        bits ^= v0 ^ v1 ^ v2 ^ v3;
      }
    }
    if constexpr (OTHER == 11) bits += mbar_try_wait(smem + 2 * (kTileA + kTileB), 0);  // a producer's spin
    if constexpr (OTHER == 12) {
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const uint32_t addr = smem + kTileA + kTileB + ((uint32_t)(j * 128 + tid % 128) * 16u) % (kTileA + kTileB);
        asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(u[j]), "r"(bits), "r"(u[j]),
                     "r"((uint32_t)it)
                     : "memory");
      }
    }
    if constexpr (OTHER == 13) {
      if (tid % 128 == 0) {
        bulk_reduce_add_f32(gbuf, smem + kTileA + kTileB, kBulkBytes);
        bulk_commit();
        bulk_wait_read<0>();
      }
      __syncwarp();
    }
  }
  float s = __int_as_float(bits & 0x7fffffu);
#pragma unroll
  for (int j = 0; j < 8; ++j) s += x[j] + __int_as_float(u[j] & 0x7fffffu);
  return s;
}

extern "C" __global__ void __launch_bounds__(256, 1)
    pipe_interference(long long* cycles, float* sink, float* gbuf, int reps, int other_iters) {
  extern __shared__ __align__(1024) char smem_raw[];
  const uint32_t base = (smem_u32(smem_raw) + 1023u) & ~1023u;
  char* generic = smem_raw + (base - smem_u32(smem_raw));
  const int tid = threadIdx.x, wg = tid / 128;
  for (uint32_t i = tid; i < 2 * (kTileA + kTileB) / 16; i += blockDim.x) {
    reinterpret_cast<uint4*>(generic)[i] = make_uint4(0x3c003c00u ^ i, 0x3c00u, 0u, 0x3c003c00u);
  }
  if (tid == 0) mbar_init(base + 2 * (kTileA + kTileB), 1);  // OTHER 11's barrier: its phase 0 never completes
  fence_proxy_async_smem();
  __syncthreads();
  float result = 0.f;
  const long long t0 = clock64_cycles();
  if (wg == 0) {
    if constexpr (GEMM == 0) {
      float acc[40];
#pragma unroll
      for (int i = 0; i < 40; ++i) acc[i] = 0.f;
      for (int r = 0; r < reps; ++r) gemm_ss(acc, base, base + kTileA);
#pragma unroll
      for (int i = 0; i < 40; ++i) result += acc[i];
    } else {
      float acc[64];
      uint32_t pa[5][4];
#pragma unroll
      for (int i = 0; i < 64; ++i) acc[i] = 0.f;
#pragma unroll
      for (int i = 0; i < 20; ++i) pa[i / 4][i % 4] = 0x3c003c00u + (uint32_t)tid;
      for (int r = 0; r < reps; ++r) gemm_rs(acc, pa, base + kTileA);
#pragma unroll
      for (int i = 0; i < 64; ++i) result += acc[i];
    }
  } else if constexpr (OTHER == 4) {
    float acc[40];
#pragma unroll
    for (int i = 0; i < 40; ++i) acc[i] = 0.f;
    for (int r = 0; r < other_iters; ++r) gemm_ss(acc, base + kTileA + kTileB, base + 2 * kTileA + kTileB);
#pragma unroll
    for (int i = 0; i < 40; ++i) result += acc[i];
  } else if constexpr (OTHER != 0) {
    result = other_work(other_iters, base, tid, gbuf + (size_t)blockIdx.x * (kBulkBytes / 4));
  }
  const long long t1 = clock64_cycles();
  if (tid % 128 == 0) cycles[2 * blockIdx.x + wg] = t1 - t0;
  sink[blockIdx.x * blockDim.x + tid] = result;
}
