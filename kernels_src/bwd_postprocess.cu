#include "common.cuh"
// Attention backward, postprocess: one CTA per (m_block, head, batch) converts the tile's fp32 dq_accum (the
// unscaled sum of dS K, in the fragment order of bwd/dq_accum_layout.cuh) to dq = elem_t(dq_accum *
// softmax_scale), rows < Sq (of the sequence, in varlen builds) only (bwd/row_passes.cuh). Eager calls: CTA
// (0, 0, 0) first hands the main kernel's error record to the host (bwd/error_record.cuh). A folded backward
// (BwdParams::fold) does this inside the main kernel instead.
#include "bwd/error_record.cuh"
#include "bwd/row_passes.cuh"
#include "params.cuh"

#if !defined(DASH_HEAD_DIM) || !defined(DASH_BLOCK_M)
#error "bwd_postprocess.cu needs DASH_HEAD_DIM and DASH_BLOCK_M"
#endif

#ifdef DASH_NUM_THREADS
static_assert(DASH_NUM_THREADS == bwd_rows_pass::kPassThreads, "launched with 256 threads");
#endif
static_assert(supported_head_dim(DASH_HEAD_DIM), "head dim 64, 96, 128, 192 or 256");

extern "C" __global__ void __launch_bounds__(bwd_rows_pass::kPassThreads)
    dash_bwd_postprocess(const __grid_constant__ BwdParams p) {
  error_record_publish(p);
  bwd_rows_pass::postprocess_tile<DASH_HEAD_DIM, DASH_BLOCK_M>(p, blockIdx.x, blockIdx.y, blockIdx.z, threadIdx.x);
}
