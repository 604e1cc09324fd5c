// One sequence of a packed varlen batch: where its rows start in the packed q- and k-side tensors, and its
// lengths (FwdParams / BwdParams cu_seqlens_q, cu_seqlens_k).
#pragma once
#include "common.cuh"

// NOTES: sequence b is rows [cu_seqlens[b], cu_seqlens[b + 1]) of the packed tensors, clamped to the packed lengths
// total_q, total_k, so that a corrupt cu_seqlens cannot send a load or store outside the buffers (TMA clips at the
// packed length too).
// NOTES: one build serves fixed-length and varlen launches: a launch is varlen when it passes cu_seqlens_q (the
// host sets both cu_seqlens pointers or neither), a kernel parameter, so the branch is uniform over the grid.
template <typename Params>
DASH_DEVICE bool is_varlen(const Params& p) {
  return p.cu_seqlens_q != nullptr;
}

struct SeqSpan {
  int row_q, row_k;        // first row in the packed q / out (/ dout / dq) and k / v (/ dk / dv)
  int seqlen_q, seqlen_k;  // this sequence's lengths

  DASH_DEVICE SeqSpan(const int32_t* cu_q, const int32_t* cu_k, int total_q, int total_k, int b) {
    row_q = min(max(__ldg(cu_q + b), 0), total_q);
    row_k = min(max(__ldg(cu_k + b), 0), total_k);
    seqlen_q = min(max(__ldg(cu_q + b + 1), row_q), total_q) - row_q;
    seqlen_k = min(max(__ldg(cu_k + b + 1), row_k), total_k) - row_k;
  }
};
