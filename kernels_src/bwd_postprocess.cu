#include "common.cuh"
// Attention backward, postprocess: one CTA per (m_block, head, batch) converts the tile's fp32 dq_accum (the
// unscaled sum of dS K, in the fragment order of bwd/dq_accum_layout.cuh) to dq = elem_t(dq_accum *
// softmax_scale), rows < Sq (of the sequence, in varlen builds) only. Deterministic mode: a tile no visit reached
// (rows that see no key) is left unwritten by the main kernel, its semaphore is 0, and its dq rows are 0.
// Eager calls: CTA (0, 0, 0) first hands the main kernel's error record to the host (bwd/error_record.cuh).
#include "bwd/dq_accum_layout.cuh"
#include "bwd/error_record.cuh"
#include "bwd_rows.cuh"
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
static_assert(Layout::kTileGroups % kNumThreads == 0, "tile split");

// Rounds 8 fp32 values to 8 elements and stores them as one 16-byte word.
DASH_DEVICE void store8(elem_t* dst, float a0, float a1, float a2, float a3, float a4, float a5, float a6, float a7,
                        float scale) {
  *reinterpret_cast<uint4*>(dst) = make_uint4(pack_elem2(a0 * scale, a1 * scale), pack_elem2(a2 * scale, a3 * scale),
                                              pack_elem2(a4 * scale, a5 * scale), pack_elem2(a6 * scale, a7 * scale));
}

}  // namespace bwd_post

using namespace bwd_post;

// NOTES: every thread reads four consecutive float4 (a group, 64 bytes) and writes two 16-byte row segments; a warp
// writes whole 128- or 256-byte rows. dq's row and head strides must be multiples of 8 elements (the host
// allocates dq contiguous).
extern "C" __global__ void __launch_bounds__(kNumThreads) dash_bwd_postprocess(const __grid_constant__ BwdParams p) {
  error_record_publish(p);
  const int m_block = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const BwdRows<kBlockM> seq(p, b, h);
  if (m_block * kBlockM >= seq.seqlen_q) return;  // varlen grids cover the longest sequence
  const int row0 = m_block * kBlockM;
  const float4* dq_accum =
      reinterpret_cast<const float4*>(p.dq_accum + (seq.scratch_row + (int64_t)row0) * kHeadDim);
  elem_t* dq = p.dq + seq.batch * p.dq_stride.batch + (int64_t)seq.row_q * p.dq_stride.row + h * p.dq_stride.head;
  const bool reached = p.dq_semaphore == nullptr || p.dq_semaphore[seq.semaphore(m_block)] != 0;
  const float scale = reached ? p.softmax_scale : 0.f;
#pragma unroll
  for (int g = threadIdx.x; g < Layout::kTileGroups; g += kNumThreads) {
    int vec, r, col;
    Layout::locate_group(g, vec, r, col);
    float4 a[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) a[j] = reached ? dq_accum[vec + j] : make_float4(0.f, 0.f, 0.f, 0.f);
    const int64_t row = row0 + r;
    if (row < seq.seqlen_q) {
      store8(dq + row * p.dq_stride.row + col, a[0].x, a[0].y, a[1].x, a[1].y, a[2].x, a[2].y, a[3].x, a[3].y, scale);
    }
    if (row + 8 < seq.seqlen_q) {
      store8(dq + (row + 8) * p.dq_stride.row + col, a[0].z, a[0].w, a[1].z, a[1].w, a[2].z, a[2].w, a[3].z, a[3].w,
             scale);
    }
  }
}
