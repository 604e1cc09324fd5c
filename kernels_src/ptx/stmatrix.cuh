// PTX ISA "Warp-level matrix store instruction: stmatrix" — four 8x8 b16 matrices, stored as is or transposed.
#pragma once
#include "../common.cuh"

// Register r[i] holds this lane's pair of matrix i in the mma fragment order (row lane / 4, columns 2 (lane % 4)
// and +1); lane l supplies the shared address of row (l % 8) of stored matrix (l / 8), 16-byte aligned. With
// .trans, fragment element (row, col) lands in stored row col, column row.
DASH_DEVICE void stmatrix_x4_trans(uint32_t smem_addr, const uint32_t (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(smem_addr),
               "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3])
               : "memory");
}

// As stmatrix_x4_trans without .trans: fragment element (row, col) lands in stored row row, column col.
DASH_DEVICE void stmatrix_x4(uint32_t smem_addr, const uint32_t (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(smem_addr), "r"(r[0]),
               "r"(r[1]), "r"(r[2]), "r"(r[3])
               : "memory");
}
