// Forward kernel, epilogue of an MMA warpgroup: O / rowsum through its 64 rows of the Q tile to global memory by
// TMA store (rows past Sq are clipped by the tensor map; with varlen, a box that would reach into the next
// sequence is stored row by row instead), and lse = max * scale + ln(rowsum) per row.
#pragma once
#include "../ptx/bulk_reduce.cuh"
#include "../ptx/cvt.cuh"
#include "../ptx/fence.cuh"
#include "../ptx/named_barrier.cuh"
#include "../ptx/stmatrix.cuh"
#include "../ptx/tma.cuh"
#include "../swizzled_tile.cuh"
#include "../wgmma_fragment.cuh"
#include "config.cuh"
#include "mainloop.cuh"

namespace fwd {

// Varlen, the last (partial) tile of a sequence: the warpgroup's staged rows [row_first, seqlen_q) of out go to
// global memory as 16-byte chunks, one per thread in turn (out is contiguous: (total_q, H, D)); the chunks of
// columns < kHeadDimVIO only.
DASH_DEVICE void store_rows_to_global(const FwdParams& p, const Smem& s, const Tile& t, int row_first, int wg,
                                      int tid) {
  constexpr int kChunks = kHeadDimVIO / 8;
  const int rows = min(t.seqlen_q - row_first, 64);
  for (int c = tid; c < rows * kChunks; c += kWgThreads) {
    const int r = c / kChunks, chunk = c % kChunks;
    uint32_t w0, w1, w2, w3;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(w0), "=r"(w1), "=r"(w2), "=r"(w3)
                 : "r"(TileQ::chunk_addr(s.q(), 64 * wg + r, chunk)));
    elem_t* dst = p.out + ((int64_t)(t.row_q + row_first + r) * p.num_heads + t.h) * kHeadDimVIO + 8 * chunk;
    *reinterpret_cast<uint4*>(dst) = make_uint4(w0, w1, w2, w3);
  }
}

// NOTES: a row that saw no key has rowsum 0 (every P was 2^-inf): it gets O = 0 and lse = -inf, never NaN. Any
// row that saw a key has rowsum >= 1 (its max contributes 2^0). The warpgroup's rows of the Q tile are free: its
// last S wgmma has completed, and the other warpgroup reads only its own rows. A tile without KV tiles loaded Q
// only in persistent launches, and fwd.cu waits for that load (q_full) first, so nothing is in flight there either.
DASH_DEVICE void store_output(const FwdParams& p, const Smem& s, const Tile& t, float (&O)[kORegs],
                              const RowStats& st, int wg, int tid) {
  const Fragment f(tid);
  const int row_first = t.m_block * kBlockM + 64 * wg;
  float inv_sum[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float sum = quad_sum(st.sum[r]);
    inv_sum[r] = sum == 0.f ? 0.f : __fdividef(1.f, sum);
    const int row = row_first + f.row0 + 8 * r;
    // lse is (B, H, Sq), or (H, total_q) with varlen
    const int64_t lse_row0 = t.varlen ? (int64_t)t.h * p.seqlen_q + t.row_q
                                     : ((int64_t)t.b * p.num_heads + t.h) * p.seqlen_q;
    if (tid % 4 == 0 && row < t.seqlen_q) {
      p.lse[lse_row0 + row] = sum == 0.f ? neg_inf() : st.max[r] * p.softmax_scale + logf(sum);
    }
  }
#pragma unroll
  for (int i = 0; i < kORegs; ++i) O[i] *= inv_sum[(i / 2) % 2];
  uint32_t Oa[kORegs / 8][4];   // head dim 96: columns 96..127 of the staged tile are left as they are (not stored)
  pack_fragments<kORegs>(Oa, O);
  store_rows<kBlockM>(s.q(), Oa, 64 * wg, tid);
  fence_proxy_async_smem();
  if (wg == 0) {
    named_barrier_sync<kBarOStaged, kWgThreads>();
  } else {
    named_barrier_sync<kBarOStaged + 1, kWgThreads>();
  }
  if (t.varlen && row_first + 64 > t.seqlen_q) {
    store_rows_to_global(p, s, t, row_first, wg, tid);
  } else if (tid == 0) {
    // one box {64 columns, 64 rows} per 64-column panel of the head dim; head dim 96 (the map {96, S, 1, H, B}:
    // tile_tma.cuh): the box at column 64 is clipped at column 96
#pragma unroll
    for (int panel = 0; panel < kHeadDimV / 64; ++panel) {
      tma_store_5d(&p.tma_o, s.q() + panel * TileQ::kPanelBytes + 64 * wg * 128, MapPanel<kHeadDimVIO>::col(panel),
                   t.row_q + row_first, MapPanel<kHeadDimVIO>::index(panel), t.h, t.batch);
    }
    bulk_commit();
    bulk_wait_read<0>();  // the shared memory must outlive the reads of the store
  }
}

}  // namespace fwd
