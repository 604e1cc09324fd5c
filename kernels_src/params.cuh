// Kernel parameter blocks, passed by value as one __grid_constant__ struct.
// NOTES: cupy_dash/cuda/params.py reads FwdParams, BwdParams and Strides from this file and lays them out with C's
// rules; it understands data members of pointer type, int64_t, float, Strides and TmaDesc only.
// Layouts: q, out, dout, dq are (B, Sq, H, D); k, v, dk, dv are (B, Sk, Hkv, D); strides are in elements and the
// last dimension is contiguous. lse is (B, H, Sq) fp32. "bh" indexes (batch, head) pairs: bh = b * H + h.
#pragma once
#include "common.cuh"
#include "ptx/tma.cuh"

struct Strides {             // element strides of a (B, S, H, D) tensor
  int64_t batch, row, head;
};

struct FwdParams {
  TmaDesc tma_q, tma_k, tma_v;  // 5-D TMA maps {64, S, D / 64, H, B}; boxes of BLOCK_M (q) or BLOCK_N (k, v) rows
  TmaDesc tma_o;                // the same map of out (B, Sq, H, D), box {64, 64, 1}: one panel of 64 rows
  float* lse;                   // (B, H, Sq), natural-log units; -inf for a row that sees no key
  int64_t batch, seqlen_q, seqlen_k, num_heads, num_heads_kv;
  int64_t window_left, window_right;  // query i sees keys [i + Sk - Sq - left, i + Sk - Sq + right]; -1: unbounded
  float softmax_scale, softmax_scale_log2;
  // Varlen launches only (is_varlen, varlen_span.cuh), null otherwise: q, out are (total_q, H, D) and k, v
  // (total_k, Hkv, D) packed (seqlen_q, seqlen_k above are total_q, total_k; batch is the number of sequences);
  // sequence b is rows [cu_seqlens[b], cu_seqlens[b + 1]); lse is (H, total_q); out (contiguous) takes the partial
  // last tiles.
  const int32_t* cu_seqlens_q; const int32_t* cu_seqlens_k;  // (batch + 1,) int32
  elem_t* out;
  // Logit soft-capping (0: none; every forward build takes both): the scores become cap * tanh(s * softcap_prescale)
  // with softcap_prescale = softmax_scale / cap (the caller's scale); softmax_scale and softmax_scale_log2 above
  // are then cap and cap * log2(e), the factors from tanh units to logits (lse = max * softmax_scale + log sum).
  float softcap_prescale;
  // Causal builds (0: the per-pair order): (b, h) pairs per section of the launch order (fwd/config.cuh's Tile),
  // about one wave of tiles whose K and V fit a share of the L2 (the host's launchers.fwd_head_section).
  int64_t head_section;
  // Persistent launches (null: one CTA per tile): a zeroed counter from which the CTAs claim tiles 0 .. num_tiles - 1
  // in launch order (fwd/config.cuh Tile), num_m_blocks query tiles per (b, h); fixed length only.
  int32_t* tile_counter;
  int64_t num_tiles, num_m_blocks;
};

struct BwdParams {
  TmaDesc tma_q, tma_k, tma_v, tma_do;  // 5-D TMA maps {64, S, D / 64, H, B} of q, k, v, dout (Hopper engine)
  const elem_t* q; const elem_t* k; const elem_t* v;
  const elem_t* out; const elem_t* dout;
  const float* lse;          // (B, H, Sq) from the forward
  float* lse_log2;           // (B*H, seqlen_q_rounded): lse * log2(e); +inf for rows >= Sq or lse == -inf
  float* dpsum;              // (B*H, seqlen_q_rounded): D = rowsum(dO * O); 0 for rows >= Sq
  float* dq_accum;           // (B*H, seqlen_q_rounded, D) fp32, unscaled sum of dS·K, bwd/dq_accum_layout.cuh order
  elem_t* dq; elem_t* dk; elem_t* dv;
  int32_t* dq_semaphore;     // (B*H, num_m_blocks): dQ partials already added to tile (bh, m_block); null: atomic
  const int32_t* visits;     // (V, 4): cta, bh, n_block, m_block, grouped by cta in execution order
  const int32_t* rank;       // (V,): position of the visit in its dQ tile's reduction order
  const int64_t* cta_start;  // (num_ctas + 1,): visits of cta c are [cta_start[c], cta_start[c+1])
  int32_t* error;            // (8,): [0] = failure code, [1..3] its details; [4..6] fold (bwd/error_record.cuh)
  int64_t* timeline;         // (V, 24) stamps per visit, DASH_TIMELINE builds only (bwd/timeline.cuh)
  Strides q_stride, k_stride, v_stride, o_stride, do_stride, dq_stride, dk_stride, dv_stride;
  int64_t batch, seqlen_q, seqlen_k, num_heads, num_heads_kv;
  int64_t window_left, window_right;  // as in FwdParams; the host sets right = 0 for causal
  int64_t num_m_blocks, seqlen_q_rounded;
  int64_t spin_timeout_ns;   // a semaphore wait longer than this sets error[] and abandons the kernel
  float softmax_scale, softmax_scale_log2;
  // Compact-table builds (DASH_COMPACT) only, null / 0 otherwise; appended last so that the fields above keep
  // their offsets. One record per KV column instead of a row per visit (format: cupy_dash/schedule/compact.py);
  // visits, rank and cta_start above are then null.
  const int32_t* col_records;    // (columns, 8): step, lo, hi, split, rot, cta, kv_head, n_block; 32-byte rows
  const int32_t* cta_columns;    // (columns,): record indices in each CTA's execution order
  const int64_t* cta_col_start;  // (num_ctas + 1,): CTA c runs cta_columns[cta_col_start[c] .. cta_col_start[c+1])
  const int32_t* scan_bounds;    // (columns, 4): x, y, x2, y2 per record; rank_rule 0 only, else null
  int64_t n_first, columns_per_head;  // the visible KV tiles of every head: n_first .. n_first + columns_per_head - 1
  int64_t tie_sign, rank_rule;   // +1 / -1: equal steps add in ascending / descending n; 0 count, 1 / 2 closed form
  // Varlen launches only (is_varlen), null otherwise (bwd_rows.cuh): q, out, dout, dq are (total_q, H, D) and k, v,
  // dk, dv (total_k, Hkv, D) packed, one batch; seqlen_q, seqlen_k above are total_q, total_k and batch the number
  // of sequences; lse is (H, total_q); the scratch rows are padded per sequence (seqlen_q_rounded per head).
  const int32_t* cu_seqlens_q; const int32_t* cu_seqlens_k;  // (batch + 1,) int32
  // Compact-table builds only: (num_m_blocks, 2) int32, for Q tile m the first column (n_block - n_first) whose
  // range [lo, hi) ends after m and the first that starts after m: the columns visiting m, the same for every head.
  const int32_t* tile_columns;
  // Compact varlen launches (DASH_COMPACT; seg_col_start set: records of cupy_dash/schedule/varlen.py, whose kv_head
  // field is the segment b * Hkv + kv head and n_block is local to the sequence): segment s owns the records
  // seg_col_start[s] .. seg_col_start[s + 1] - 1, sequence b's first visible KV tile is seq_n_first[b], and its
  // tile_columns rows start at seq_tile_start[b] (one per Q tile of the sequence).
  const int32_t* seg_col_start; const int32_t* seq_n_first; const int32_t* seq_tile_start;
  // Eager calls only, null otherwise (graph-captured and jax-traced calls keep a sticky device record): the
  // device address of the call's 32-byte host record in mapped pinned memory. Preprocess zeroes error[] first;
  // postprocess, after the main kernel, copies error[0..3] to error_host[1..4] and then sets error_host[0] = 1
  // (bwd/error_record.cuh): the host learns that the call finished, and how, without a copy or an event.
  int32_t* error_host;
  // Nonzero: a folded backward (fixed-length batches only; bwd/fold.cuh): the main kernel alone, launched without
  // preprocess and postprocess, runs their passes itself; its error record's words [4..6] count its grid barriers.
  int64_t fold;
  // Logit soft-capping (DASH_SOFTCAP builds; 0 otherwise): P = exp2(tanh(s * softcap_prescale) *
  // softmax_scale_log2 - lse_log2) with softmax_scale_log2 = cap * log2(e), and dS gets the factor 1 - tanh^2;
  // softmax_scale stays the caller's scale (dK, dQ are scaled by it).
  float softcap_prescale;
  // The maps of dk and dv as tma_k and tma_v above, with boxes of 64 rows: one MMA warpgroup's keys (the TMA stores
  // of bwd/epilogue.cuh), appended last as the fields above.
  TmaDesc tma_dk, tma_dv;
  // Split KV columns (per-visit tables only; null / 0 otherwise; bwd/pieces.cuh, cupy_dash/schedule/pieces.py),
  // appended last as the fields above. A split column's visits are num_pieces runs on different CTAs, which come
  // last in each CTA's list: CTA c's first piece visit is cta_start[c] + cta_pieces[2 c], and its piece runs take
  // the codes piece_code[cta_pieces[2 c + 1]], ... in order (code = split column * num_pieces + piece).
  const int32_t* cta_pieces;  // (num_ctas, 2) int32
  const int32_t* piece_code;  // (piece runs,) int32
  float* dkv_pieces;          // (split columns * num_pieces) slots of fp32 partial dK (unscaled), dV (pieces.cuh)
  int32_t* piece_count;       // (split columns,): the pieces of each column stored so far; preprocess zeroes them
  int64_t num_pieces, num_split_columns;
};

// The (batch, head) pair of a bh index and its kv head (32-bit division: bh < B * H < 2^31).
struct Head {
  int b, h, hk;
  DASH_DEVICE Head(const BwdParams& p, int bh) {
    const int num_heads = (int)p.num_heads;
    b = bh / num_heads;
    h = bh - b * num_heads;
    hk = h / (num_heads / (int)p.num_heads_kv);
  }
};
