// m64 accumulator fragments of wgmma (ISA "WGMMA .m64nNk16 register fragment layout for accumulator matrix D"):
// where a thread's registers sit in the tile, how they become RS A operands, and how they are stored (as they
// are or transposed) into a SwizzledTile for a later SS wgmma or a TMA store.
#pragma once
#include "common.cuh"
#include "ptx/cvt.cuh"
#include "ptx/stmatrix.cuh"
#include "swizzled_tile.cuh"

// Register i of thread tid (of the warpgroup) holds row row0 + row(i), column col0 + col(i).
struct Fragment {
  int row0;  // 16 * warp + lane / 4
  int col0;  // 2 * (lane % 4)
  DASH_DEVICE explicit Fragment(int tid) : row0(16 * (tid / 32) + (tid % 32) / 4), col0(2 * (tid % 4)) {}
  static constexpr int row(int i) { return 8 * ((i / 2) % 2); }
  static constexpr int col(int i) { return 8 * (i / 4) + i % 2; }
};

// Rounds an m64nN fp32 accumulator (N = kRegs * 2) into RS wgmma A fragments of the next GEMM, whose K is this
// N: the A registers of k-step ks are the pairs (8 ks + 2 j, 8 ks + 2 j + 1), j = 0..3 (ISA "Register
// Fragments: matrix A" has the same strides as the accumulator; hopper_primitives.md §1.6).
template <int kRegs>
DASH_DEVICE void pack_fragments(uint32_t (&a)[kRegs / 8][4], const float (&acc)[kRegs]) {
#pragma unroll
  for (int ks = 0; ks < kRegs / 8; ++ks) {
#pragma unroll
    for (int j = 0; j < 4; ++j) a[ks][j] = pack_elem2(acc[8 * ks + 2 * j], acc[8 * ks + 2 * j + 1]);
  }
}

// Stores the 64 x (16 kSteps) matrix X held as A fragments transposed: X(m, k) goes to row row0 + k, column col0 + m
// of a SwizzledTile<kRows> (col0 % 64 == 0, row0 % 8 == 0). stmatrix matrix j of k-step ks holds rows m = 16 warp +
// 8 (j % 2) + [0, 8) and columns k = 16 ks + 8 (j / 2) + [0, 8) of X; lane l addresses row l % 8 of stored matrix
// l / 8.
template <int kRows, int kSteps>
DASH_DEVICE void store_transposed(uint32_t tile, const uint32_t (&a)[kSteps][4], int col0, int tid, int row0 = 0) {
  static_assert(16 * kSteps <= kRows, "tile too short");
  const int warp = tid / 32, lane = tid % 32, j = lane / 8;
  const uint32_t addr =
      SwizzledTile<kRows>::chunk_addr(tile, row0 + 8 * (j / 2) + lane % 8, col0 / 8 + 2 * warp + j % 2);
#pragma unroll
  for (int ks = 0; ks < kSteps; ++ks) stmatrix_x4_trans(addr + ks * 16 * 128, a[ks]);
}

// Stores the 64 x (16 kSteps) matrix X held as A fragments as it is: X(m, k) goes to row row0 + m, column col0 + k
// of a SwizzledTile<kRows> (row0 % 8 == 0, col0 % 8 == 0). stmatrix matrix j of k-step ks holds rows 16 warp + 8
// (j % 2) + [0, 8) and columns 16 ks + 8 (j / 2) + [0, 8); lane l addresses row l % 8 of stored matrix l / 8.
template <int kRows, int kSteps>
DASH_DEVICE void store_rows(uint32_t tile, const uint32_t (&a)[kSteps][4], int row0, int tid, int col0 = 0) {
  const int warp = tid / 32, lane = tid % 32, j = lane / 8;
  const int row = row0 + 16 * warp + 8 * (j % 2) + lane % 8;
#pragma unroll
  for (int ks = 0; ks < kSteps; ++ks) {
    stmatrix_x4(SwizzledTile<kRows>::chunk_addr(tile, row, col0 / 8 + 2 * ks + j / 2), a[ks]);
  }
}

// N x N transpose (N = 4 or 8) across the N lanes of a warp whose index idx = (lane / kStride) % N differs and whose
// other lane bits agree: afterwards x[c] of lane idx is what x[idx] of lane c was. log2 N exchange steps (lanes
// differing in idx bit b), each swapping the words whose index bit b differs from the lane's. Every lane of the warp
// takes part.
template <int kStride, class T, int N>
DASH_DEVICE void lane_transpose(T (&x)[N], int idx) {
  static_assert(N == 4 || N == 8, "4 x 4 or 8 x 8");
#pragma unroll
  for (int bit = 1; bit < N; bit *= 2) {
    const bool upper = (idx & bit) != 0;
#pragma unroll
    for (int lo = 0; lo < N; ++lo) {
      if (lo & bit) continue;  // the word pair (lo, lo + bit)
      const T got = __shfl_xor_sync(0xffffffffu, upper ? x[lo] : x[lo + bit], kStride * bit);
      if (upper) {
        x[lo] = got;
      } else {
        x[lo + bit] = got;
      }
    }
  }
}

// Accumulators of a run of visits set to zero (one or two dimensions).
template <int N>
DASH_DEVICE void fill_zero(float (&a)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) a[i] = 0.f;
}
template <int M, int N>
DASH_DEVICE void fill_zero(float (&a)[M][N]) {
#pragma unroll
  for (int i = 0; i < M; ++i) fill_zero(a[i]);
}
