// Backward main kernel, dK / dV epilogue: after the last visit of a KV tile each MMA warpgroup writes its 64 rows
// of dK (scaled by softmax_scale) and dV from the accumulators, rows < Sk (of the sequence, in varlen builds)
// only: a varlen sequence's last KV tile must not write into the next sequence's rows.
#pragma once
#include "../bwd_rows.cuh"
#include "../params.cuh"
#include "../ptx/cvt.cuh"
#include "../schedule_view.cuh"
#include "config.cuh"

namespace bwd {

// NOTES: register i of the m64 fragment is key 16 warp + lane / 4 + 8 ((i / 2) % 2), head-dim column
// 8 (i / 4) + 2 (lane % 4) + i % 2: pairs (i, i + 1) are adjacent columns, one 32-bit store each.
DASH_DEVICE void store_dkv(const BwdParams& p, const Visit& w, const float (&dK)[kDkvRegs],
                           const float (&dV)[kDkvRegs], int wg, int tid) {
  const Head hd(p, w.bh);
  const BwdRows<kBlockM> seq(p, hd.b, hd.h);
  const int lane = tid % 32;
  const int key0 = w.n_block * kBlockN + 64 * wg + 16 * (tid / 32) + lane / 4;
  const int col0 = 2 * (lane % 4);
  const float scale = p.softmax_scale;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int key = key0 + 8 * half;
    if (key < seq.seqlen_k) {
      const int64_t row = seq.row_k + key;
      elem_t* dk_row = p.dk + seq.batch * p.dk_stride.batch + row * p.dk_stride.row + hd.hk * p.dk_stride.head + col0;
      elem_t* dv_row = p.dv + seq.batch * p.dv_stride.batch + row * p.dv_stride.row + hd.hk * p.dv_stride.head + col0;
#pragma unroll
      for (int c = 0; c < kHeadDimIO / 8; ++c) {  // head dim 96: columns 96..127 (all zero) are not stored
        const int i = 4 * c + 2 * half;
        *reinterpret_cast<uint32_t*>(dk_row + 8 * c) = pack_elem2(dK[i] * scale, dK[i + 1] * scale);
        *reinterpret_cast<uint32_t*>(dv_row + 8 * c) = pack_elem2(dV[i], dV[i + 1]);
      }
    }
  }
}

}  // namespace bwd
