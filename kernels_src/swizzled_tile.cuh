// wgmma operands in 128B-swizzled shared memory, laid out as TMA writes a box of a tensor map with
// CU_TENSOR_MAP_SWIZZLE_128B: kRows rows of 16-bit elements cut into 64-column panels (panel p holds columns
// [64 p, 64 p + 64) of every row, kRows x 128 bytes, at byte p * kRows * 128), the tile 1024-byte aligned.
#pragma once
#include "common.cuh"
#include "ptx/wgmma.cuh"

// NOTES: inside a panel, 16-byte chunk c of row r sits at r * 128 + ((c ^ (r % 8)) * 16): the swizzle works on
// absolute address bits, so descriptors that start 32 bytes into a row (k-steps) or at a multiple of 8 rows stay
// valid with base offset 0 (ISA "Matrix Descriptor Format"; hopper_primitives.md §1.4).
template <int kRows>
struct SwizzledTile {
  static constexpr uint32_t kPanelBytes = kRows * 128;
  static_assert(kRows % 8 == 0, "whole 8-row swizzle atoms");

  // Operand with K along the columns (K-major: A = M x K or B = N x K row-major): rows [row0, row0 + 64 / N),
  // row0 % 8 == 0; k-step ks covers columns [16 ks, 16 ks + 16).
  static DASH_DEVICE uint64_t kmajor(uint32_t tile, int row0) { return wgmma_desc_sw128(tile + row0 * 128, 16, 1024); }
  static constexpr uint32_t kmajor_step(int ks) { return (ks / 4) * kPanelBytes + (ks % 4) * 32; }

  // Operand with M or N along the columns (MN-major, imm-trans 1): columns [col0, col0 + N), col0 % 64 == 0;
  // k-step ks covers rows [16 ks, 16 ks + 16).
  static DASH_DEVICE uint64_t mnmajor(uint32_t tile, int col0) {
    return wgmma_desc_sw128(tile + (col0 / 64) * kPanelBytes, kPanelBytes, 1024);
  }
  static constexpr uint32_t mnmajor_step(int ks) { return ks * 2048; }

  // Shared address of the 16-byte chunk holding columns [8 chunk, 8 chunk + 8) of a row (chunk < kCols / 8).
  static DASH_DEVICE uint32_t chunk_addr(uint32_t tile, int row, int chunk) {
    return tile + (chunk / 8) * kPanelBytes + row * 128 + (((chunk % 8) ^ (row % 8)) * 16);
  }
};

// desc advanced by byte_offset bytes: the start-address field holds address >> 4 in its low 14 bits, and every
// operand lies below 256 KB, so the addition never carries out of the field.
DASH_DEVICE uint64_t desc_advance(uint64_t desc, uint32_t byte_offset) { return desc + (byte_offset >> 4); }

// acc (64 x kN) = A B^T over kSteps k16-steps, A and B K-major operands (TileA, TileB: their SwizzledTile types;
// a_desc, b_desc at k-step 0). Issues the wgmmas, no fence or commit.
template <int kN, int kSteps, class TileA, class TileB>
DASH_DEVICE void gemm_ss_kmajor(float (&acc)[kN / 2], uint64_t a_desc, uint64_t b_desc) {
#pragma unroll
  for (int ks = 0; ks < kSteps; ++ks) {
    wgmma_ss<kN, 0, 0>(acc, desc_advance(a_desc, TileA::kmajor_step(ks)), desc_advance(b_desc, TileB::kmajor_step(ks)),
                       ks > 0);
  }
}
