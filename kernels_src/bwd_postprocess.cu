#include "common.cuh"
// Attention backward, postprocess: one CTA per (m_block, head, batch) converts the tile's fp32 dq_accum (the
// unscaled sum of dS K, in the fragment order of bwd/dq_accum_layout.cuh) to dq = elem_t(dq_accum *
// softmax_scale), rows < Sq only.
#include "bwd/dq_accum_layout.cuh"
#include "params.cuh"
#include "ptx/cvt.cuh"

#if !defined(DASH_HEAD_DIM) || !defined(DASH_BLOCK_M)
#error "bwd_postprocess.cu needs DASH_HEAD_DIM and DASH_BLOCK_M"
#endif

namespace bwd_post {

constexpr int kHeadDim = DASH_HEAD_DIM;
constexpr int kBlockM = DASH_BLOCK_M;
constexpr int kNumThreads = 256;
#ifdef DASH_NUM_THREADS
static_assert(DASH_NUM_THREADS == kNumThreads, "launched with 256 threads");
#endif
static_assert(kHeadDim == 64 || kHeadDim == 128, "head dim 64 or 128");
using Layout = DqAccumLayout<kBlockM, kHeadDim>;
static_assert(Layout::kTileVecs % kNumThreads == 0, "tile split");

}  // namespace bwd_post

using namespace bwd_post;

// NOTES: dq rows are written 2 elements (4 bytes) at a time, so dq's row and head strides must be even (the host
// allocates dq contiguous).
extern "C" __global__ void __launch_bounds__(kNumThreads) dash_bwd_postprocess(const __grid_constant__ BwdParams p) {
  const int m_block = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int64_t bh = (int64_t)b * p.num_heads + h;
  const int64_t row0 = (int64_t)m_block * kBlockM;
  const float4* dq_accum = reinterpret_cast<const float4*>(p.dq_accum + (bh * p.seqlen_q_rounded + row0) * kHeadDim);
  elem_t* dq = p.dq + b * p.dq_stride.batch + h * p.dq_stride.head;
  const float scale = p.softmax_scale;
#pragma unroll
  for (int vec = threadIdx.x; vec < Layout::kTileVecs; vec += kNumThreads) {
    int r, col;
    Layout::locate(vec, r, col);
    const float4 a = dq_accum[vec];
    const int64_t row = row0 + r;
    if (row < p.seqlen_q) {
      *reinterpret_cast<uint32_t*>(dq + row * p.dq_stride.row + col) = pack_elem2(a.x * scale, a.y * scale);
    }
    if (row + 8 < p.seqlen_q) {
      *reinterpret_cast<uint32_t*>(dq + (row + 8) * p.dq_stride.row + col) = pack_elem2(a.z * scale, a.w * scale);
    }
  }
}
