// Backward main kernel: KV columns split into pieces. A per-visit table may cut a KV tile's visits into
// p.num_pieces runs on different CTAs (cupy_dash/schedule/pieces.py: the last wave's columns, so that every CTA ends
// at about the same time). Each piece run ends with its fp32 dK (unscaled) and dV partial sums in the registers;
// it stores them into the column's slot for its piece and counts itself in, and the CTA whose piece arrives last
// adds the column's pieces in piece order and writes dK, dV as an unsplit run would.
// NOTES: the sum is ((piece 0 + piece 1) + piece 2) ..., read from the slots whichever CTA arrives last, so the bits
// do not depend on the arrival order.
// NOTES: no CTA waits for another: a piece that is not last stores and goes on with its next run.
#pragma once
#include "../params.cuh"
#include "../ptx/fence.cuh"
#include "../ptx/named_barrier.cuh"
#include "../ptx/semaphore.cuh"
#include "config.cuh"

namespace bwd {

// The builds that take split columns: the loop per run (not the soft-capping builds' flat loop, whose registers
// have no room for the sums: they spilled), per-visit tables, head dims 64, 96 and 128 (192 and 256 keep dK^T / dV^T
// in halves, DkvAccOf<true>). The host gives no other build a table with pieces (kernels.pieces_built).
constexpr bool kPiecesBuilt = kRunLoop && !DASH_COMPACT && !kSplitHeadDim;
constexpr int kPieceGroups = kDkvRegs / 4;  // float4 groups of one accumulator per thread
// NOTES: a slot holds one piece of one column: per MMA warpgroup wg, dK then dV, float4 group i of thread tid at
// float4 index (wg * 2 + which) * kPieceGroups * 128 + i * 128 + tid: a warp's stores and loads are 512 contiguous
// bytes. The host sizes slots by kernels.piece_slot_bytes (the same formula).
constexpr int64_t kPieceSlotFloat4 = (int64_t)kNumMmaWg * 2 * kPieceGroups * 128;

// acc's float4 group i to `base` + i * 128 + tid.
template <int kGroups>
DASH_DEVICE void store_piece_groups(float4* base, const float (&acc)[4 * kGroups], int tid) {
#pragma unroll
  for (int i = 0; i < kGroups; ++i) {
    base[i * 128 + tid] = make_float4(acc[4 * i], acc[4 * i + 1], acc[4 * i + 2], acc[4 * i + 3]);
  }
}

// acc = the sum of the column's pieces 0 .. num_pieces - 1 in order, read back from their slots (this CTA's own
// piece too: each thread reads the words it stored itself).
// NOTES: the first piece is assigned, not added to zero (which would turn -0 into +0). The loop over the slots is
// not unrolled, so that only one slot's loads are in flight: a form that added the own piece from the registers
// beside the others' loads spilled (the accumulators' registers are the kernel's limit). Loads through L2 (ld.cg):
// other SMs wrote the slots.
template <int kGroups>
DASH_DEVICE void add_pieces_in_order(float (&acc)[4 * kGroups], const float4* column, int64_t offset, int num_pieces,
                                     int tid) {
#pragma unroll 1
  for (int k = 0; k < num_pieces; ++k) {
    const float4* piece = column + k * kPieceSlotFloat4 + offset + tid;
#pragma unroll
    for (int i = 0; i < kGroups; ++i) {
      const float4 x = __ldcg(piece + i * 128);
      acc[4 * i] = k == 0 ? x.x : acc[4 * i] + x.x;
      acc[4 * i + 1] = k == 0 ? x.y : acc[4 * i + 1] + x.y;
      acc[4 * i + 2] = k == 0 ? x.z : acc[4 * i + 2] + x.z;
      acc[4 * i + 3] = k == 0 ? x.w : acc[4 * i + 3] + x.w;
    }
  }
}

// The piece run `code` (split column code / num_pieces, piece code % num_pieces) of this CTA has ended with its
// partial sums in dK, dV: every MMA thread stores them and the column counts the piece in. Returns true on the CTA
// whose piece completed the column, with the column's sums in dK, dV (to be stored as an unsplit run's); false
// elsewhere (nothing to store).
// NOTES: a template so that the plans whose DkvAcc is not a flat array (head dims 192, 256) never instantiate it.
template <typename Acc>
DASH_DEVICE bool complete_piece(const BwdParams& p, int code, Acc& dK, Acc& dV, int wg, int tid) {
  if constexpr (!kPiecesBuilt) {
    return true;
  } else {
    const int num_pieces = (int)p.num_pieces, col = code / num_pieces;
    float4* slots = reinterpret_cast<float4*>(p.dkv_pieces);
    const float4* column = slots + (int64_t)col * num_pieces * kPieceSlotFloat4;
    float4* slot = slots + (int64_t)code * kPieceSlotFloat4;
    const int64_t dk_offset = (int64_t)(2 * wg) * kPieceGroups * 128, dv_offset = dk_offset + kPieceGroups * 128;
    store_piece_groups<kPieceGroups>(slot + dk_offset, dK, tid);
    store_piece_groups<kPieceGroups>(slot + dv_offset, dV, tid);
    fence_acq_rel_gpu();
    named_barrier_sync<kBarDkv, kPdSThreads>();
    bool last = false;
    if (wg == 0 && tid == 0) last = atom_acq_rel_gpu_add(p.piece_count + col, 1) == num_pieces - 1;
    if (!named_barrier_or<kBarDkv, kPdSThreads>(last)) return false;
    fence_acq_rel_gpu();
    add_pieces_in_order<kPieceGroups>(dK, column, dk_offset, num_pieces, tid);
    add_pieces_in_order<kPieceGroups>(dV, column, dv_offset, num_pieces, tid);
    return true;
  }
}

}  // namespace bwd
