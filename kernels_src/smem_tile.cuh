// Shared-memory tiles of 16-bit elements for mma.sync kernels: a 16-byte-chunk XOR swizzle, cp.async tile loads
// with zero fill, and ldmatrix loaders that return m16n8k16 A / B fragments.
#pragma once
#include "common.cuh"
#include "ptx/cp_async.cuh"
#include "ptx/ldmatrix.cuh"

// NOTES: a tile is kRows x kCols elements, row-major, rows of kCols * 2 bytes cut into 16-byte chunks (8 elements).
// Chunk c of row r is stored at chunk position c ^ f(r), with f(r) = r % 8 for rows of >= 8 chunks and
// (r / 2) % 4 for rows of 4 chunks. Any 8 consecutive rows (first row a multiple of 8) at one logical chunk then
// fall into 8 distinct 16-byte bank groups, so every ldmatrix phase (8 row addresses) and every 8-lane phase of a
// 16-byte cp.async store is conflict-free; a warp's 32-bit stores of one mma C fragment (8 rows g, one chunk,
// 4 words each) also hit 32 distinct banks.
template <int kRows, int kCols>
struct SmemTile {
  static constexpr int kChunks = kCols / 8;
  static constexpr int kRowBytes = kCols * 2;
  static constexpr int kBytes = kRows * kRowBytes;
  static_assert(kCols % 32 == 0 && (kChunks == 4 || kChunks % 8 == 0), "unsupported tile width");

  uint32_t base;  // shared-window byte address, 128-byte aligned

  // Low bits of the byte address that the swizzle permutes: the chunk index inside one swizzle span.
  static constexpr uint32_t kSwzMask = (kChunks >= 8 ? 8 : 4) - 1;

  static DASH_DEVICE int swizzle(int row, int chunk) {
    if constexpr (kChunks >= 8) {
      return chunk ^ (row & 7);
    } else {
      return chunk ^ ((row >> 1) & 3);
    }
  }
  DASH_DEVICE uint32_t chunk_addr(int row, int chunk) const {
    return base + (uint32_t)(row * kRowBytes + swizzle(row, chunk) * 16);
  }
  // Address of the 32-bit word holding elements (row, col) and (row, col + 1); col even.
  DASH_DEVICE uint32_t word_addr(int row, int col) const { return chunk_addr(row, col >> 3) + (col & 7) * 2; }

  // The address chunk_addr(row + row_off, chunk + col_off / 8) from addr = chunk_addr(row, chunk): one LOP3 and
  // an immediate when the offsets are compile-time. Requires row_off % 8 == 0, col_off % 8 == 0 and
  // (chunk & (col_off / 8) & kSwzMask) == 0 (no carry inside a swizzle span); addr may also point inside the chunk.
  // NOTES: f(row) is unchanged by a row offset that is a multiple of 8. With c = col_off / 8 and no carry in the
  // low bits, (chunk + c) ^ f = ((chunk ^ f) ^ (c & kSwzMask)) + (c & ~kSwzMask); (chunk ^ f) & kSwzMask sits in
  // address bits [4, 4 + log2(kSwzMask + 1)) because base and row starts are multiples of the swizzle span.
  static DASH_DEVICE uint32_t offset(uint32_t addr, int row_off, int col_off) {
    const uint32_t c = (uint32_t)col_off >> 3;
    return (addr ^ ((c & kSwzMask) << 4)) + (uint32_t)(row_off * kRowBytes) + ((c & ~kSwzMask) << 4);
  }

  // Asynchronously copies rows [0, kRows) of a global tile (row r at gmem + r * row_stride, contiguous columns);
  // rows >= rows_valid are zero-filled and not read. Every thread of the CTA must call it.
  // NOTES: a thread copies one column chunk at rows tid / kChunks + i * kRowStep; kRowStep is a multiple of 8, so
  // the swizzle of all its chunks is the same and the smem address advances linearly.
  template <int kNumThreads>
  DASH_DEVICE void load_async(const elem_t* gmem, int64_t row_stride, int rows_valid, int tid) const {
    constexpr int kRowStep = kNumThreads / kChunks;
    static_assert(kNumThreads % kChunks == 0 && kRows % kRowStep == 0 && kRowStep % 8 == 0, "tile load");
    const int row0 = tid / kChunks, chunk = tid % kChunks;
    const uint32_t dst = chunk_addr(row0, chunk);
    const elem_t* src = gmem + row0 * row_stride + chunk * 8;
#pragma unroll
    for (int i = 0; i < kRows / kRowStep; ++i) {
      const bool valid = row0 + i * kRowStep < rows_valid;
      cp_async_16(dst + i * kRowStep * kRowBytes, valid ? src + i * kRowStep * row_stride : gmem, valid);
    }
  }

  // Fragment loaders. *_lane(row0, col0, lane) is this lane's ldmatrix address for the 16x16 operand whose tile
  // coordinates start at (row0, col0) (row0 a multiple of 16, col0 of 16); the fragment at (row0 + row_off,
  // col0 + col_off) is then loaded from offset(lane address, row_off, col_off).
  // NOTES: lane l supplies the address of row (l % 8) of 8x8 matrix (l / 8); the matrices are chosen so that the
  // four registers come out in mma.m16n8k16 fragment order:
  //   a_lane:        A[m][k] = tile[row0 + m][col0 + k]   (A stored M-major; matrices m0-7|k0-7, m8-15|k0-7, ...)
  //   a_trans_lane:  A[m][k] = tile[row0 + k][col0 + m]   (A stored K-major, ldmatrix .trans)
  //   b2_lane:       B[k][n] = tile[row0 + n][col0 + k]   (two n8 fragments: regs 0-1 n 0-7, regs 2-3 n 8-15)
  //   b2_trans_lane: B[k][n] = tile[row0 + k][col0 + n]   (the same two fragments from B stored K-major, .trans)
  DASH_DEVICE uint32_t a_lane(int row0, int col0, int lane) const {
    const int i = lane >> 3;
    return chunk_addr(row0 + (i & 1) * 8 + (lane & 7), (col0 >> 3) + (i >> 1));
  }
  DASH_DEVICE uint32_t a_trans_lane(int row0, int col0, int lane) const {
    const int i = lane >> 3;
    return chunk_addr(row0 + (i >> 1) * 8 + (lane & 7), (col0 >> 3) + (i & 1));
  }
  DASH_DEVICE uint32_t b2_lane(int row0, int col0, int lane) const {
    const int i = lane >> 3;
    return chunk_addr(row0 + (i >> 1) * 8 + (lane & 7), (col0 >> 3) + (i & 1));
  }
  DASH_DEVICE uint32_t b2_trans_lane(int row0, int col0, int lane) const {
    const int i = lane >> 3;
    return chunk_addr(row0 + (i & 1) * 8 + (lane & 7), (col0 >> 3) + (i >> 1));
  }
};

// Returns x unchanged but opaque to the optimizer, so that addresses derived from it inside a persistent loop are
// recomputed where they are used instead of being hoisted out of the loop and kept live (or spilled).
DASH_DEVICE uint32_t opaque(uint32_t x) {
  asm volatile("" : "+r"(x));
  return x;
}
DASH_DEVICE int64_t opaque(int64_t x) {
  asm volatile("" : "+l"(x));
  return x;
}
