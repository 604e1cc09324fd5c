// Layout of the fp32 dQ accumulator (dq_accum) shared by the backward main kernel, which adds dQ partials into
// it with bulk reductions straight from the MMA fragments, and the postprocess kernel, which reads it back.
#pragma once
#include "../common.cuh"

// NOTES: tile (bh, m_block) is kBlockM * kHeadDim floats at (bh * seqlen_q_rounded + m_block * kBlockM) *
// kHeadDim. It holds one contiguous slice per MMA warpgroup (its 64 x kCols piece of dQ = dS K, see
// bwd/config.cuh), and a slice holds the m64 accumulator fragments in thread order: float4 number 128 c + t is
// registers 4c .. 4c + 3 of thread t, i.e. rows r, r, r + 8, r + 8 and columns col, col + 1, col, col + 1 of
// the piece with r = 16 (t / 32) + (t % 32) / 4 and col = 8 c + 2 (t % 4).
template <int kBlockM, int kHeadDim>
struct DqAccumLayout {
  static constexpr bool kSplitRows = kBlockM == 128;     // pieces are row halves (hdim 64) or column halves
  static constexpr int kCols = kSplitRows ? kHeadDim : 64;
  static constexpr int kSliceVecs = 64 * kCols / 4;
  static constexpr int kTileVecs = kBlockM * kHeadDim / 4;
  static_assert(kTileVecs == 2 * kSliceVecs, "two warpgroup slices per tile");

  static DASH_DEVICE int row0(int wg) { return kSplitRows ? 64 * wg : 0; }
  static DASH_DEVICE int col0(int wg) { return kSplitRows ? 0 : 64 * wg; }

  // NOTES: the four float4 4q .. 4q + 3 of column block c (quad q of a warpgroup: the threads 4q .. 4q + 3)
  // hold 8 consecutive columns of two rows: float4 4q + j has (row, col + 2j), (row, col + 2j + 1),
  // (row + 8, col + 2j), (row + 8, col + 2j + 1), with row = 16 (q / 8) + q % 8 and col = 8 c of the piece.
  // Groups are numbered row pair by row pair, 8 columns at a time along the whole tile row, so that consecutive
  // groups write consecutive 16-byte segments of one dq row.
  static constexpr int kTileGroups = kTileVecs / 4;
  static constexpr int kGroupsPerRow = kHeadDim / 8;

  // Group g: its first float4 (vec), its first row in the tile (the second is row + 8) and first column.
  static DASH_DEVICE void locate_group(int g, int& vec, int& row, int& col) {
    const int pair = g / kGroupsPerRow, cg = g % kGroupsPerRow;
    row = 16 * (pair / 8) + pair % 8;
    const int wg = kSplitRows ? row / 64 : cg / 8, c = kSplitRows ? cg : cg % 8, r = row % 64;
    vec = wg * kSliceVecs + 128 * c + 4 * (8 * (r / 16) + r % 8);
    col = col0(wg) + 8 * c;
  }
};
