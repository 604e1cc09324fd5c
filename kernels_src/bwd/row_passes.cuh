// The backward's two passes over Q tiles, one tile (m_block, h, b) per call by 256 threads: before the visits,
// dpsum = rowsum(dO o O), lse_log2 = lse * log2(e), the tile's dQ semaphore (deterministic) or fp32 dq_accum
// (atomic) reset; after them, dq = elem_t(dq_accum * softmax_scale). Run by the preprocess and postprocess kernels
// (a CTA per tile), or inside the main kernel of a folded backward (bwd/fold.cuh: a CTA loops over tiles).
#pragma once
#include "../bwd_rows.cuh"
#include "../constants.cuh"
#include "../params.cuh"
#include "../ptx/cvt.cuh"
#include "../tile_tma.cuh"
#include "dq_accum_layout.cuh"

namespace bwd_rows_pass {

constexpr int kPassThreads = kAuxThreads;

DASH_DEVICE float dot_chunk(const uint4& a, const uint4& b) {
  const uint32_t wa[4] = {a.x, a.y, a.z, a.w}, wb[4] = {b.x, b.y, b.z, b.w};
  float sum = 0.f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    sum = fmaf(elem_to_float((elem_t)(wa[i] & 0xffffu)), elem_to_float((elem_t)(wb[i] & 0xffffu)), sum);
    sum = fmaf(elem_to_float((elem_t)(wa[i] >> 16)), elem_to_float((elem_t)(wb[i] >> 16)), sum);
  }
  return sum;
}

// NOTES: kThreadsPerRow consecutive lanes share one row; lane `part` of a row reads the 16-byte chunks part,
// part + kThreadsPerRow, ... so that a warp's loads cover whole contiguous rows. The row sum is then reduced by
// a fixed xor-shuffle tree: the result is bitwise reproducible. Rows >= Sq (of the sequence), and rows that see
// no key (lse == -inf), get lse_log2 = +inf so that the main kernel's P = exp2(S * scale_log2 - lse_log2) is
// exactly 0 there; their dpsum is 0. In varlen builds the rows past a sequence's end in its last Q tile are the
// next sequence's queries: this +inf is their only mask.
// kHeadDimIO: the head dim of q (dq_accum rows are padded_head_dim of it); kHeadDimVIO: of out and dout (dpsum reads
// their columns).
template <int kHeadDimIO, int kBlockM, int kHeadDimVIO = kHeadDimIO>
DASH_DEVICE void preprocess_tile(const BwdParams& p, int m_block, int h, int b, int tid) {
  constexpr int kHeadDim = padded_head_dim(kHeadDimIO);
  constexpr int kThreadsPerRow = kPassThreads / kBlockM >= 2 ? 2 * (kPassThreads / kBlockM / 2) : 1;
  constexpr int kChunksPerThread = kHeadDimVIO / 8 / kThreadsPerRow;
  static_assert((kHeadDimVIO / 8) % kThreadsPerRow == 0 && 32 % kThreadsPerRow == 0, "row split");
  static_assert(kThreadsPerRow * kBlockM % 32 == 0, "whole warps take the rows (the shuffles below), the rest idle");
  const BwdRows<kBlockM> seq(p, b, h);
  // NOTES: the split columns' counters (bwd/pieces.cuh), one per tile of the grid: the host splits no more columns
  // than B * H * num_m_blocks (fixed-length problems only).
  if (tid == 0 && p.piece_count != nullptr) {
    const int64_t tile = ((int64_t)b * p.num_heads + h) * p.num_m_blocks + m_block;
    if (tile < p.num_split_columns) p.piece_count[tile] = 0;
  }
  if (m_block * kBlockM >= seq.seqlen_q) return;  // varlen grids cover the longest sequence
  const int r = tid / kThreadsPerRow, part = tid % kThreadsPerRow;
  const int row = m_block * kBlockM + r;  // within the sequence
  const int64_t scratch = seq.scratch_row + row;

  if (kThreadsPerRow * kBlockM == kPassThreads || r < kBlockM) {  // kBlockM 80: 160 threads take the rows
    float dpsum = 0.f;
    if (row < seq.seqlen_q) {
      const int64_t packed_row = seq.row_q + row;
      const uint4* o = reinterpret_cast<const uint4*>(p.out + seq.batch * p.o_stride.batch +
                                                      packed_row * p.o_stride.row + h * p.o_stride.head);
      const uint4* dout = reinterpret_cast<const uint4*>(p.dout + seq.batch * p.do_stride.batch +
                                                         packed_row * p.do_stride.row + h * p.do_stride.head);
#pragma unroll
      for (int i = 0; i < kChunksPerThread; ++i) {
        const int chunk = part + i * kThreadsPerRow;
        dpsum += dot_chunk(o[chunk], dout[chunk]);
      }
    }
#pragma unroll
    for (int offset = kThreadsPerRow / 2; offset > 0; offset /= 2) {
      dpsum += __shfl_xor_sync(0xffffffffu, dpsum, offset);
    }
    if (part == 0) {
      const float inf = __int_as_float(0x7f800000);
      float lse_log2 = inf;
      if (row < seq.seqlen_q) {
        const float lse = p.lse[seq.lse_index(p, b, h, row)];
        lse_log2 = lse == -inf ? inf : lse * kLog2e;
      }
      p.lse_log2[scratch] = lse_log2;
      p.dpsum[scratch] = dpsum;
    }
  }

  if (p.dq_semaphore != nullptr) {
    if (tid == 0) p.dq_semaphore[seq.semaphore(m_block)] = 0;
  } else {
    float4* dq_accum =
        reinterpret_cast<float4*>(p.dq_accum + (seq.scratch_row + (int64_t)m_block * kBlockM) * kHeadDim);
#pragma unroll
    for (int i = tid; i < kBlockM * kHeadDim / 4; i += kPassThreads) dq_accum[i] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
}

// Rounds 8 fp32 values to 8 elements and stores them as one 16-byte word.
DASH_DEVICE void store8(elem_t* dst, float a0, float a1, float a2, float a3, float a4, float a5, float a6, float a7,
                        float scale) {
  *reinterpret_cast<uint4*>(dst) = make_uint4(pack_elem2(a0 * scale, a1 * scale), pack_elem2(a2 * scale, a3 * scale),
                                              pack_elem2(a4 * scale, a5 * scale), pack_elem2(a6 * scale, a7 * scale));
}

// NOTES: every thread reads four consecutive float4 (a group, 64 bytes) and writes two 16-byte row segments; a warp
// writes whole 128- or 256-byte rows (transposed pieces: eight float4 and two 32-byte segments). dq's row and head
// strides must be multiples of 8 elements (the host allocates dq contiguous). dq_accum and the semaphore are read
// with ld.global.cg (L2): in a folded backward other CTAs of the same kernel wrote them. Deterministic mode: a tile
// no visit reached (rows that see no key) was never written, its semaphore is 0, and its dq rows are 0.
// kHeadDimIO: dq's head dim; dq_accum rows are padded_head_dim of it, and the padding columns (zero) are not
// stored (a group's 8 or 16 columns lie all below 96 or all above).
template <int kHeadDimIO, int kBlockM>
DASH_DEVICE void postprocess_tile(const BwdParams& p, int m_block, int h, int b, int tid) {
  constexpr int kHeadDim = padded_head_dim(kHeadDimIO);
  using Layout = DqAccumLayout<kBlockM, kHeadDim>;
  static_assert(Layout::kTransposed || Layout::kTileGroups % kPassThreads == 0, "tile split");
  const BwdRows<kBlockM> seq(p, b, h);
  if (m_block * kBlockM >= seq.seqlen_q) return;  // varlen grids cover the longest sequence
  const int row0 = m_block * kBlockM;
  const float4* dq_accum =
      reinterpret_cast<const float4*>(p.dq_accum + (seq.scratch_row + (int64_t)row0) * kHeadDim);
  elem_t* dq = p.dq + seq.batch * p.dq_stride.batch + (int64_t)seq.row_q * p.dq_stride.row + h * p.dq_stride.head;
  const bool reached = p.dq_semaphore == nullptr || __ldcg(p.dq_semaphore + seq.semaphore(m_block)) != 0;
  const float scale = reached ? p.softmax_scale : 0.f;
  if constexpr (Layout::kTransposed) {
    for (int g = tid; g < Layout::kTileGroupsT; g += kPassThreads) {
      int vec, q, col;
      Layout::locate_group_t(g, vec, q, col);
      float4 a[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) a[i] = reached ? __ldcg(dq_accum + vec + 4 * i) : make_float4(0.f, 0.f, 0.f, 0.f);
      const int64_t row = row0 + q;
      if (kHeadDimIO != kHeadDim && col >= kHeadDimIO) continue;
      if (row < seq.seqlen_q) {
        elem_t* dst = dq + row * p.dq_stride.row + col;
        store8(dst, a[0].x, a[1].x, a[2].x, a[3].x, a[4].x, a[5].x, a[6].x, a[7].x, scale);
        store8(dst + 8, a[0].z, a[1].z, a[2].z, a[3].z, a[4].z, a[5].z, a[6].z, a[7].z, scale);
      }
      if (row + 1 < seq.seqlen_q) {
        elem_t* dst = dq + (row + 1) * p.dq_stride.row + col;
        store8(dst, a[0].y, a[1].y, a[2].y, a[3].y, a[4].y, a[5].y, a[6].y, a[7].y, scale);
        store8(dst + 8, a[0].w, a[1].w, a[2].w, a[3].w, a[4].w, a[5].w, a[6].w, a[7].w, scale);
      }
    }
  } else {
#pragma unroll
    for (int g = tid; g < Layout::kTileGroups; g += kPassThreads) {
      int vec, r, col;
      Layout::locate_group(g, vec, r, col);
      float4 a[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) a[j] = reached ? __ldcg(dq_accum + vec + j) : make_float4(0.f, 0.f, 0.f, 0.f);
      const int64_t row = row0 + r;
      if (kHeadDimIO != kHeadDim && col >= kHeadDimIO) continue;
      if (row < seq.seqlen_q) {
        store8(dq + row * p.dq_stride.row + col, a[0].x, a[0].y, a[1].x, a[1].y, a[2].x, a[2].y, a[3].x, a[3].y,
               scale);
      }
      if (row + 8 < seq.seqlen_q) {
        store8(dq + (row + 8) * p.dq_stride.row + col, a[0].z, a[0].w, a[1].z, a[1].w, a[2].z, a[2].w, a[3].z, a[3].w,
               scale);
      }
    }
  }
}

}  // namespace bwd_rows_pass
