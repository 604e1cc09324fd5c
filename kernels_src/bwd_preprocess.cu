#include "common.cuh"
// Attention backward, preprocess: one CTA per (m_block, head, batch) computes, for the kBlockM query rows of the
// tile, dpsum = rowsum(dO o O) and lse_log2 = lse * log2(e) in the padded scratch layout the main kernel reads
// without predicates ((B*H, seqlen_q_rounded), or per sequence in varlen builds: bwd_rows.cuh); deterministic
// mode (dq_semaphore set): resets the tile's dQ semaphore (the first visit in rank order stores the tile);
// atomic mode: zeroes the tile's fp32 dq_accum (bwd/row_passes.cuh). Eager calls: CTA (0, 0, 0) also zeroes the
// error record. A folded backward (BwdParams::fold) does this inside the main kernel instead.
#include "bwd/error_record.cuh"
#include "bwd/row_passes.cuh"
#include "params.cuh"

#if !defined(DASH_HEAD_DIM) || !defined(DASH_BLOCK_M)
#error "bwd_preprocess.cu needs DASH_HEAD_DIM and DASH_BLOCK_M"
#endif

#ifdef DASH_NUM_THREADS
static_assert(DASH_NUM_THREADS == bwd_rows_pass::kPassThreads, "launched with 256 threads");
#endif
static_assert(supported_head_dim(DASH_HEAD_DIM), "head dim 64, 96, 128, 192 or 256");
static_assert(supported_value_head_dim(DASH_HEAD_DIM, DASH_HEAD_DIM_V), "value head dim: q's, or 128 with 192");
static_assert(DASH_BLOCK_M == 128 || DASH_BLOCK_M == 96 || DASH_BLOCK_M == 80 || DASH_BLOCK_M == 64,
              "kBlockM 128, 96, 80 or 64");

extern "C" __global__ void __launch_bounds__(bwd_rows_pass::kPassThreads)
    dash_bwd_preprocess(const __grid_constant__ BwdParams p) {
  error_record_reset(p);
  bwd_rows_pass::preprocess_tile<DASH_HEAD_DIM, DASH_BLOCK_M, DASH_HEAD_DIM_V>(p, blockIdx.x, blockIdx.y, blockIdx.z,
                                                                             threadIdx.x);
}
