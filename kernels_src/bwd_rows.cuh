// Where the rows of one (batch, head) pair of the backward live, for the three backward kernels: fixed-length
// batches (B, S, H, D) or, when the launch passes cu_seqlens (varlen), packed sequences.
#pragma once
#include "common.cuh"
#include "params.cuh"
#include "varlen_span.cuh"

// NOTES: varlen: sequence b is the SeqSpan of varlen_span.cuh (clamped, as in the forward). Its padded
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
    if (is_varlen(p)) {
      const SeqSpan s(p.cu_seqlens_q, p.cu_seqlens_k, (int)p.seqlen_q, (int)p.seqlen_k, b);
      row_q = s.row_q, row_k = s.row_k, seqlen_q = s.seqlen_q, seqlen_k = s.seqlen_k;
      batch = 0;
      scratch_row = (int64_t)h * p.seqlen_q_rounded + (int64_t)((row_q + b * kBlockM) / kBlockM) * kBlockM;
    } else {
      seqlen_q = (int)p.seqlen_q;
      seqlen_k = (int)p.seqlen_k;
      row_q = row_k = 0;
      batch = b;
      scratch_row = ((int64_t)b * p.num_heads + h) * p.seqlen_q_rounded;
    }
  }

  // lse of query row (sequence-local) of head h: (B, H, Sq), or (H, total_q) for varlen (the forward's layouts).
  DASH_DEVICE int64_t lse_index(const BwdParams& p, int b, int h, int row) const {
    return is_varlen(p) ? (int64_t)h * p.seqlen_q + row_q + row : ((int64_t)b * p.num_heads + h) * p.seqlen_q + row;
  }

  DASH_DEVICE int64_t semaphore(int m_block) const { return scratch_row / kBlockM + m_block; }
};
