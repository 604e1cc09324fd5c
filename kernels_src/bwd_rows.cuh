// Where the rows of one (batch, head) pair of the backward live, for the three backward kernels: fixed-length
// batches (B, S, H, D) or, in varlen builds (DASH_VARLEN), packed sequences with cu_seqlens.
#pragma once
#include "common.cuh"
#include "params.cuh"

#ifndef DASH_VARLEN
#define DASH_VARLEN 0
#endif

// NOTES: varlen: sequence b is rows [cu_seqlens[b], cu_seqlens[b + 1]) of the packed tensors, clamped to them
// (as the forward does), so a corrupt cu_seqlens cannot send a load or store outside the buffers. Its padded
// scratch rows (lse_log2, dpsum, dq_accum; one dQ semaphore per kBlockM rows) start at
// h * seqlen_q_rounded + floor((cu_seqlens_q[b] + b kBlockM) / kBlockM) kBlockM: a multiple of kBlockM, and
// sequence b + 1 starts at least ceil(Sq_b / kBlockM) tiles later, so no tile holds rows of two sequences; the
// last row is below h * seqlen_q_rounded + total_q + B kBlockM, hence seqlen_q_rounded >= total_q + B kBlockM.
// Fixed length: bh * seqlen_q_rounded, with seqlen_q_rounded = num_m_blocks kBlockM.
template <int kBlockM>
struct BwdRows {
  int seqlen_q, seqlen_k;  // this sequence's lengths
  int row_q, row_k;        // its first row in q / out / dout / dq and in k / v / dk / dv (0 without varlen)
  int batch;               // batch index of the strided tensors and TMA boxes: b, or 0 for the packed batch
  int64_t scratch_row;     // padded scratch row of (bh, m_block 0); its dQ semaphores start at scratch_row / kBlockM

  DASH_DEVICE BwdRows(const BwdParams& p, int b, int h) {
#if DASH_VARLEN
    const int total_q = (int)p.seqlen_q, total_k = (int)p.seqlen_k;
    row_q = min(max(__ldg(p.cu_seqlens_q + b), 0), total_q);
    row_k = min(max(__ldg(p.cu_seqlens_k + b), 0), total_k);
    seqlen_q = min(max(__ldg(p.cu_seqlens_q + b + 1), row_q), total_q) - row_q;
    seqlen_k = min(max(__ldg(p.cu_seqlens_k + b + 1), row_k), total_k) - row_k;
    batch = 0;
    scratch_row = (int64_t)h * p.seqlen_q_rounded + (int64_t)((row_q + b * kBlockM) / kBlockM) * kBlockM;
#else
    seqlen_q = (int)p.seqlen_q;
    seqlen_k = (int)p.seqlen_k;
    row_q = row_k = 0;
    batch = b;
    scratch_row = ((int64_t)b * p.num_heads + h) * p.seqlen_q_rounded;
#endif
  }

  // lse of query row (sequence-local) of head h: (B, H, Sq), or (H, total_q) for varlen (the forward's layouts).
  DASH_DEVICE int64_t lse_index(const BwdParams& p, int b, int h, int row) const {
#if DASH_VARLEN
    return (int64_t)h * p.seqlen_q + row_q + row;
#else
    return ((int64_t)b * p.num_heads + h) * p.seqlen_q + row;
#endif
  }

  DASH_DEVICE int64_t semaphore(int m_block) const { return scratch_row / kBlockM + m_block; }
};
