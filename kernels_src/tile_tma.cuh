// Head dims in global memory and in the kernels, and the TMA loads of whole SwizzledTiles (swizzled_tile.cuh) of a
// (B, S, H, D) tensor that bridge the two (tensor maps: cupy_dash/cuda/tensormap.py).
#pragma once
#include "common.cuh"
#include "ptx/tma.cuh"

// NOTES: head dim 96 runs the head-dim-128 kernels padded (docs/decisions/head-dim-plans.md "Head dim 96"): every
// shared-memory tile, the dQ accumulator and dq_accum rows are 128 columns wide, columns 96..127 are zero in Q,
// K, V and dO, so they add nothing to S, dP or dQ; O, dV and dK are computed 96 wide (m64n96k16); global memory is
// 96 columns wide.
constexpr int padded_head_dim(int head_dim) { return head_dim == 96 ? 128 : head_dim; }

// NOTES: the value head dim (columns of v, out, dout, dv; DASH_HEAD_DIM_V, default DASH_HEAD_DIM) differs from the
// query / key head dim only as (192, 128) (docs/decisions/head-dim-plans.md "Value head dim 128"). Tiles stay 192
// columns wide; v and dout fill the first two panels of theirs (their maps are plain 128-column ones), and no result
// depends on the third: O and dP contract or span 128 columns, and dV^T's rows past 128 are not stored.
// The compute width of v / dout tiles: equal head dims share the padding (96 -> 128).
constexpr int value_compute_dim(int head_dim, int head_dim_v) {
  return head_dim_v == head_dim ? padded_head_dim(head_dim) : head_dim_v;
}
#if defined(DASH_HEAD_DIM) && !defined(DASH_HEAD_DIM_V)
#define DASH_HEAD_DIM_V DASH_HEAD_DIM
#endif

// The head dims the kernels are built for, and the value head dims beside them (cupy_dash/cuda/kernels.py's
// SUPPORTED_HEAD_DIMS and VALUE_HEAD_DIMS).
constexpr bool supported_head_dim(int head_dim) {
  return head_dim == 64 || head_dim == 96 || head_dim == 128 || head_dim == 192 || head_dim == 256;
}
constexpr bool supported_value_head_dim(int head_dim, int head_dim_v) {
  return head_dim_v == head_dim || (head_dim == 192 && head_dim_v == 128);
}

// NOTES: maps of head dim 64 or 128 are {64, S, D / 64, H, B} with a box of every panel: one copy per tile. Maps of
// head dim 96 are {96, S, 1, H, B} with a box of one 64-column panel, copied once per panel at column 64 p: the
// box at column 64 reads columns 96..127 out of bounds, which TMA writes as zeros and counts in the transaction
// bytes, so the expected bytes stay the whole tile's. Rows past S are zero-filled either way.
// Where 64-column panel p of a tile sits in the map of a tensor of head dim kHeadDimIO: (column, panel index).
template <int kHeadDimIO>
struct MapPanel {
  static constexpr bool kByColumn = padded_head_dim(kHeadDimIO) != kHeadDimIO;  // the {96, S, 1, H, B} map
  static constexpr int col(int panel) { return kByColumn ? 64 * panel : 0; }
  static constexpr int index(int panel) { return kByColumn ? 0 : panel; }
};

// One tile of kRows rows from row `row` of head `head`, batch `batch` into dst, completing on bar; kHeadDimIO: the
// tensor's head dim.
template <int kRows, int kHeadDimIO>
DASH_DEVICE void tma_load_tile(uint32_t dst, const TmaDesc* map, uint32_t bar, int row, int head, int batch) {
  using Panel = MapPanel<kHeadDimIO>;
  if constexpr (Panel::kByColumn) {
#pragma unroll
    for (int panel = 0; panel < padded_head_dim(kHeadDimIO) / 64; ++panel) {
      tma_load_5d(dst + panel * kRows * 128, map, bar, Panel::col(panel), row, Panel::index(panel), head, batch);
    }
  } else {
    tma_load_5d(dst, map, bar, 0, row, 0, head, batch);
  }
}
