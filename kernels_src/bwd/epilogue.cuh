// Backward main kernel, dK / dV epilogue: after the last visit of a KV tile each MMA warpgroup writes its 64 rows
// of dK (scaled by softmax_scale) and dV from the accumulators, rows < Sk (of the sequence, in varlen builds)
// only: a varlen sequence's last KV tile must not write into the next sequence's rows. dK and dV are contiguous
// (the host allocates them): rows and 8-column groups start on 16-byte boundaries.
#pragma once
#include "../bwd_rows.cuh"
#include "../params.cuh"
#include "../ptx/cvt.cuh"
#include "../ptx/st_global.cuh"
#include "../schedule_view.cuh"
#include "../wgmma_fragment.cuh"
#include "config.cuh"

namespace bwd {

// NOTES: register i of the m64 fragment is key 16 warp + lane / 4 + 8 ((i / 2) % 2), head-dim column
// 8 (i / 4) + 2 (lane % 4) + i % 2: the four lanes of a quad hold a key row's 8-column group c as four element
// pairs. A 4 x 4 transpose within the quad (lane_transpose<1>) gives each lane all 8 columns of one group of a run
// of four, stored as one 16-byte word: a warp writes 8 rows x 64 bytes per store instead of 8 rows x 16 bytes
// (the 4-byte stores left the MMA warpgroups waiting on the store queue: decision record bwd-engine).
static_assert(kHeadDimIO / 8 % 4 == 0, "runs of four 8-column groups");

DASH_DEVICE void store_dkv(const BwdParams& p, const Visit& w, const DkvAcc& dK, const DkvAcc& dV, int wg, int tid) {
  const Head hd(p, w.bh);
  const BwdRows<kBlockM> seq(p, hd.b, hd.h);
  const int lane = tid % 32, q = lane % 4;
  const int key0 = w.n_block * kBlockN + 64 * wg + 16 * (tid / 32) + lane / 4;
  const float scale = p.softmax_scale;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int key = key0 + 8 * half;
    const int64_t row = seq.row_k + key;
    elem_t* dk_row = p.dk + seq.batch * p.dk_stride.batch + row * p.dk_stride.row + hd.hk * p.dk_stride.head;
    elem_t* dv_row = p.dv + seq.batch * p.dv_stride.batch + row * p.dv_stride.row + hd.hk * p.dv_stride.head;
#pragma unroll
    for (int c0 = 0; c0 < kHeadDimIO / 8; c0 += 4) {  // head dim 96: columns 96..127 (all zero) are not stored
      uint32_t k4[4], v4[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const int i = 4 * (c0 + k) + 2 * half;
        k4[k] = pack_elem2(dK[i] * scale, dK[i + 1] * scale);
        v4[k] = pack_elem2(dV[i], dV[i + 1]);
      }
      lane_transpose<1>(k4, q);
      lane_transpose<1>(v4, q);
      if (key < seq.seqlen_k) {  // after the shuffles, which every lane of the warp takes part in
        st_global_v4(dk_row + 8 * (c0 + q), k4[0], k4[1], k4[2], k4[3]);
        st_global_v4(dv_row + 8 * (c0 + q), v4[0], v4[1], v4[2], v4[3]);
      }
    }
  }
}

}  // namespace bwd
