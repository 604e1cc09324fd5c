#include "common.cuh"
// Attention backward, preprocess: one CTA per (m_block, head, batch) computes, for the kBlockM query rows of the
// tile, dpsum = rowsum(dO o O) and lse_log2 = lse * log2(e) in the padded scratch layout the main kernel reads
// without predicates ((B*H, seqlen_q_rounded), or per sequence in varlen builds: bwd_rows.cuh); deterministic
// mode (dq_semaphore set): resets the tile's dQ semaphore (the first visit in rank order stores the tile);
// atomic mode: zeroes the tile's fp32 dq_accum. Eager calls: CTA (0, 0, 0) also zeroes the error record.
#include "bwd/error_record.cuh"
#include "bwd_rows.cuh"
#include "params.cuh"
#include "ptx/cvt.cuh"

#if !defined(DASH_HEAD_DIM) || !defined(DASH_BLOCK_M)
#error "bwd_preprocess.cu needs DASH_HEAD_DIM and DASH_BLOCK_M"
#endif

namespace bwd_pre {

constexpr int kHeadDim = DASH_HEAD_DIM;
constexpr int kBlockM = DASH_BLOCK_M;
constexpr int kNumThreads = 256;
#ifdef DASH_NUM_THREADS
static_assert(DASH_NUM_THREADS == kNumThreads, "launched with 256 threads");
#endif
static_assert(kHeadDim == 64 || kHeadDim == 128, "head dim 64 or 128");
static_assert(kBlockM == 128 || kBlockM == 64, "kBlockM 128 or 64");

// NOTES: kThreadsPerRow consecutive lanes share one row; lane `part` of a row reads the 16-byte chunks part,
// part + kThreadsPerRow, ... so that a warp's loads cover whole contiguous rows. The row sum is then reduced by
// a fixed xor-shuffle tree: the result is bitwise reproducible.
constexpr int kThreadsPerRow = kNumThreads / kBlockM;
constexpr int kChunksPerRow = kHeadDim / 8;
constexpr int kChunksPerThread = kChunksPerRow / kThreadsPerRow;
static_assert(kChunksPerRow % kThreadsPerRow == 0 && 32 % kThreadsPerRow == 0, "row split");

DASH_DEVICE float dot_chunk(const uint4& a, const uint4& b) {
  const uint32_t wa[4] = {a.x, a.y, a.z, a.w}, wb[4] = {b.x, b.y, b.z, b.w};
  float sum = 0.f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    sum = fmaf(elem_to_float((elem_t)(wa[i] & 0xffffu)), elem_to_float((elem_t)(wb[i] & 0xffffu)), sum);
    sum = fmaf(elem_to_float((elem_t)(wa[i] >> 16)), elem_to_float((elem_t)(wb[i] >> 16)), sum);
  }
  return sum;
}

}  // namespace bwd_pre

using namespace bwd_pre;

extern "C" __global__ void __launch_bounds__(kNumThreads) dash_bwd_preprocess(const __grid_constant__ BwdParams p) {
  error_record_reset(p);
  const int m_block = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const BwdRows<kBlockM> seq(p, b, h);
  if (m_block * kBlockM >= seq.seqlen_q) return;  // varlen grids cover the longest sequence
  const int tid = threadIdx.x;
  const int r = tid / kThreadsPerRow, part = tid % kThreadsPerRow;
  const int row = m_block * kBlockM + r;  // within the sequence
  const int64_t scratch = seq.scratch_row + row;

  float dpsum = 0.f;
  if (row < seq.seqlen_q) {
    const int64_t packed_row = seq.row_q + row;
    const uint4* o = reinterpret_cast<const uint4*>(p.out + seq.batch * p.o_stride.batch +
                                                    packed_row * p.o_stride.row + h * p.o_stride.head);
    const uint4* dout = reinterpret_cast<const uint4*>(p.dout + seq.batch * p.do_stride.batch +
                                                       packed_row * p.do_stride.row + h * p.do_stride.head);
#pragma unroll
    for (int i = 0; i < kChunksPerThread; ++i) {
      const int chunk = part + i * kThreadsPerRow;
      dpsum += dot_chunk(o[chunk], dout[chunk]);
    }
  }
#pragma unroll
  for (int offset = kThreadsPerRow / 2; offset > 0; offset /= 2) {
    dpsum += __shfl_xor_sync(0xffffffffu, dpsum, offset);
  }

  // NOTES: rows >= Sq (of the sequence), and rows that see no key (lse == -inf), get lse_log2 = +inf so that the
  // main kernel's P = exp2(S * scale_log2 - lse_log2) is exactly 0 there; their dpsum is 0. In varlen builds the
  // rows past a sequence's end in its last Q tile are the next sequence's queries: this +inf is their only mask.
  if (part == 0) {
    const float inf = __int_as_float(0x7f800000);
    float lse_log2 = inf;
    if (row < seq.seqlen_q) {
      const float lse = p.lse[seq.lse_index(p, b, h, row)];
      lse_log2 = lse == -inf ? inf : lse * kLog2e;
    }
    p.lse_log2[scratch] = lse_log2;
    p.dpsum[scratch] = dpsum;
  }

  if (p.dq_semaphore != nullptr) {
    if (tid == 0) p.dq_semaphore[seq.semaphore(m_block)] = 0;
  } else {
    float4* dq_accum =
        reinterpret_cast<float4*>(p.dq_accum + (seq.scratch_row + (int64_t)m_block * kBlockM) * kHeadDim);
#pragma unroll
    for (int i = tid; i < kBlockM * kHeadDim / 4; i += kNumThreads) dq_accum[i] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
}
