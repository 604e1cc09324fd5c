// Layout of the fp32 dQ accumulator (dq_accum) shared by the backward main kernel, which adds dQ partials into
// it with bulk reductions straight from the MMA fragments, and the postprocess kernel, which reads it back.
#pragma once
#include "../common.cuh"

// NOTES: tile (bh, m_block) is kBlockM * kHeadDim floats at (bh * seqlen_q_rounded + m_block * kBlockM) *
// kHeadDim. It holds kSlices contiguous slices, each a 64 x kCols piece of dQ = dS K (or of dQ^T = K^T dS^T in the
// transposed plan, see bwd/config.cuh), and a slice holds the m64 accumulator fragments
// in thread order: float4 number 128 c + t is registers 4c .. 4c + 3 of thread t, i.e. rows r, r, r + 8, r + 8
// and columns col, col + 1, col, col + 1 of the piece with r = 16 (t / 32) + (t % 32) / 4 and col = 8 c + 2 (t %
// 4). Plans: head dim 64 with kBlockM 128 (pieces are row halves: queries [64 wg, 64 wg + 64), every column);
// head dim 128 with kBlockM 64 (column halves: every query, head-dim columns [64 wg, 64 wg + 64)); head dim 128
// with kBlockM 80 (transposed: piece wg is dQ^T's head-dim rows [64 wg, 64 wg + 64) by the kBlockM queries); head
// dim 192 with kBlockM 64 (the 64 x 96 tile: column thirds, MMA warpgroup wg's slice holds head-dim columns [64 wg,
// + 64)) or, with compact tables, kBlockM 96 (transposed, three slices: MMA warpgroup wg's dQ^T rows [64 wg, + 64)
// by the 96 queries, handed over in halves of 48 queries: registers 0..23 are float4 groups c = 0..5, the first
// half); head dim 256 with kBlockM 64 (column quarters: slice i holds head-dim columns [64 i, 64 i + 64), MMA
// warpgroup wg computes slices 2 wg and 2 wg + 1).
template <int kBlockM, int kHeadDim>
struct DqAccumLayout {
  static constexpr bool kSplitRows = kBlockM == 128;
  static constexpr bool kTransposed = kBlockM % 64 != 0;  // m64 cannot tile the queries: dQ^T
  static constexpr int kCols = kSplitRows ? kHeadDim : kTransposed ? kBlockM : 64;
  static constexpr int kSliceVecs = 64 * kCols / 4;
  static constexpr int kTileVecs = kBlockM * kHeadDim / 4;
  static constexpr int kSlices = kTileVecs / kSliceVecs;
  static_assert(kTileVecs == kSlices * kSliceVecs && kSlices >= 2 && kSlices <= 4, "two to four slices per tile");

  static DASH_DEVICE int row0(int slice) { return kSplitRows ? 64 * slice : 0; }
  static DASH_DEVICE int col0(int slice) { return kSplitRows || kTransposed ? 0 : 64 * slice; }

  // Row-major pieces: the four float4 4q .. 4q + 3 of column block c (quad q of a warpgroup: the threads
  // 4q .. 4q + 3) hold 8 consecutive columns of two rows: float4 4q + j has (row, col + 2j), (row, col + 2j + 1),
  // (row + 8, col + 2j), (row + 8, col + 2j + 1), with row = 16 (q / 8) + q % 8 and col = 8 c of the piece.
  // Groups are numbered row pair by row pair, 8 columns at a time along the whole tile row, so that consecutive
  // groups write consecutive 16-byte segments of one dq row.
  static constexpr int kTileGroups = kTileVecs / 4;
  static constexpr int kGroupsPerRow = kHeadDim / 8;

  // Group g: its first float4 (vec), its first row in the tile (the second is row + 8) and first column.
  static DASH_DEVICE void locate_group(int g, int& vec, int& row, int& col) {
    const int pair = g / kGroupsPerRow, cg = g % kGroupsPerRow;
    row = 16 * (pair / 8) + pair % 8;
    const int slice = kSplitRows ? row / 64 : cg / 8, c = kSplitRows ? cg : cg % 8, r = row % 64;
    vec = slice * kSliceVecs + 128 * c + 4 * (8 * (r / 16) + r % 8);
    col = col0(slice) + 8 * c;
  }

  // Transposed pieces: the 8 float4 vec + 4 i (i = 0..7) of group g hold queries q and q + 1 by head-dim
  // columns col + i (.x: q, .y: q + 1) and col + 8 + i (.z: q, .w: q + 1), with q = 8 c + 2 j and col = 64 wg +
  // 16 w for g = ((wg kBlockM / 8 + c) 4 + w) 4 + j: each group writes 16 consecutive columns of two dq rows.
  static constexpr int kTileGroupsT = kTileVecs / 8;
  static DASH_DEVICE void locate_group_t(int g, int& vec, int& query, int& col) {
    const int j = g % 4, w = (g / 4) % 4, c = (g / 16) % (kBlockM / 8), wg = g / (2 * kBlockM);
    vec = wg * kSliceVecs + 128 * c + 32 * w + j;
    query = 8 * c + 2 * j;
    col = 64 * wg + 16 * w;
  }
};
