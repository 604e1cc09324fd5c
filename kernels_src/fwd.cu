#include "common.cuh"
// Attention forward, FlashAttention-2 style on mma.sync m16n8k16 + cp.async: one CTA per (m_block, head, batch),
// each warp owns 16 query rows; K and V tiles are double-buffered in shared memory and walked from the last
// visible KV tile down to the first, with an online softmax in the log2 domain.
#include "params.cuh"
#include "ptx/cp_async.cuh"
#include "ptx/cvt.cuh"
#include "ptx/exp2.cuh"
#include "ptx/ldmatrix.cuh"
#include "ptx/mma.cuh"
#include "smem_tile.cuh"

#if !defined(DASH_HEAD_DIM) || !defined(DASH_CAUSAL) || !defined(DASH_BLOCK_M) || !defined(DASH_BLOCK_N) || \
    !defined(DASH_NUM_THREADS) || !defined(DASH_SMEM_BYTES)
#error "fwd.cu needs DASH_HEAD_DIM, DASH_CAUSAL, DASH_BLOCK_M, DASH_BLOCK_N, DASH_NUM_THREADS, DASH_SMEM_BYTES"
#endif

namespace fwd {

constexpr int kHeadDim = DASH_HEAD_DIM;
constexpr bool kCausal = DASH_CAUSAL != 0;
constexpr int kBlockM = DASH_BLOCK_M;
constexpr int kBlockN = DASH_BLOCK_N;
constexpr int kNumThreads = DASH_NUM_THREADS;
constexpr int kNumWarps = kNumThreads / 32;

using TileQ = SmemTile<kBlockM, kHeadDim>;    // Q_i (reused for the O epilogue): queries x head dim
using TileKV = SmemTile<kBlockN, kHeadDim>;   // K_j, V_j: keys x head dim
constexpr int kTileQBytes = TileQ::kBytes;
constexpr int kTileKVBytes = TileKV::kBytes;
constexpr int kChunksPerRow = TileQ::kChunks;
// NOTES: smem = [Q (reused for the O epilogue)] [K buffer 0] [K buffer 1] [V buffer 0] [V buffer 1].
constexpr int kSmemBytes = kTileQBytes + 4 * kTileKVBytes;

constexpr int kQSteps = kHeadDim / 16;   // k16 steps of S = Q K^T (over the head dim)
constexpr int kSTiles = kBlockN / 8;     // n8 tiles of S per warp (over keys)
constexpr int kPSteps = kBlockN / 16;    // k16 steps of O += P V (over keys)
constexpr int kOTiles = kHeadDim / 8;    // n8 tiles of O per warp (over the head dim)

// NOTES: occupancy. hdim 128 keeps Q as A fragments in registers for the whole loop (~220 registers, one CTA per
// SM). hdim 64 re-reads Q from shared memory each KV tile (4 ldmatrix), which fits 128 registers without spills,
// so two CTAs (16 warps, 2 x 48 KB smem) share an SM and one CTA's math hides the other's barrier and load waits.
constexpr bool kQInRegs = kHeadDim == 128;
constexpr int kMinBlocksPerSm = kQInRegs ? 1 : 2;

static_assert(DASH_FP16 == 0 || DASH_FP16 == 1, "DASH_FP16 must be 0 (bf16) or 1 (fp16)");
static_assert(kHeadDim == 64 || kHeadDim == 128, "head dim must be 64 or 128");
static_assert(kBlockM == 64 || kBlockM == 128, "BLOCK_M must be 64 or 128");
static_assert(kBlockN == 32 || kBlockN == 64, "BLOCK_N must be 32 or 64 (128 spills registers)");
static_assert(kBlockM == 16 * kNumWarps, "one warp per 16 query rows: NUM_THREADS must be 2 * BLOCK_M");
static_assert(kSmemBytes == DASH_SMEM_BYTES, "host smem size must be (BLOCK_M + 4 * BLOCK_N) * HEAD_DIM * 2");
static_assert(kSmemBytes * kMinBlocksPerSm <= 227 * 1024, "shared memory per SM exceeded");

DASH_DEVICE float neg_inf() { return __int_as_float(0xff800000); }

DASH_DEVICE float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

DASH_DEVICE float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

}  // namespace fwd

using namespace fwd;

extern "C" __global__ void __launch_bounds__(kNumThreads, kMinBlocksPerSm)
    dash_fwd(const __grid_constant__ FwdParams p) {
  extern __shared__ __align__(128) unsigned char smem[];

  const int m_block = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int tid = threadIdx.x, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  // NOTES: fragment ownership (PTX ISA m16n8k16). A lane owns rows g and g + 8 of its warp's 16 rows and, in every
  // n8 tile of an accumulator, columns 2t and 2t + 1: acc[j][0..1] = (row g, col 8j + 2t + {0,1}),
  // acc[j][2..3] = (row g + 8, same cols). The four lanes of a quad (same g) together own whole rows.
  const int g = lane / 4, t = lane % 4;

  const int seqlen_q = (int)p.seqlen_q, seqlen_k = (int)p.seqlen_k;
  const int h_kv = h / ((int)p.num_heads / (int)p.num_heads_kv);
  const int row0 = m_block * kBlockM;
  // NOTES: causal, bottom-right aligned: query i sees key j iff j <= i + causal_shift.
  const int causal_shift = seqlen_k - seqlen_q;

  const elem_t* gQ = p.q + b * p.q_stride.batch + h * p.q_stride.head;
  const elem_t* gK = p.k + b * p.k_stride.batch + h_kv * p.k_stride.head;
  const elem_t* gV = p.v + b * p.v_stride.batch + h_kv * p.v_stride.head;

  const uint32_t smem_base = smem_u32(smem);
  const TileQ sQ{smem_base};
  const uint32_t sK0 = smem_base + kTileQBytes;
  const uint32_t sV0 = sK0 + 2 * kTileKVBytes;
  // Keys [row_begin, row_begin + kBlockN) of K or V into a tile; keys >= Sk are zero-filled by cp.async, never read.
  // NOTES: the stride goes through opaque() so the per-row 64-bit offsets are derived at each load instead of
  // being hoisted out of the KV loop and kept live (that spills at hdim 64, two CTAs per SM).
  const auto load_kv = [&](uint32_t tile, const elem_t* gmem, int64_t row_stride, int row_begin) {
    row_stride = opaque(row_stride);
    TileKV{tile}.load_async<kNumThreads>(gmem + row_begin * row_stride, row_stride, seqlen_k - row_begin, tid);
  };

  // KV tiles this CTA visits: [0, n_block_max). Causal: the last key seen by the block's last valid row.
  int n_block_max = (seqlen_k + kBlockN - 1) / kBlockN;
  if (kCausal) {
    const int last_key = min(row0 + kBlockM, seqlen_q) - 1 + causal_shift;
    n_block_max = min(n_block_max, last_key < 0 ? 0 : last_key / kBlockN + 1);
  }

  // Exclusive key limit of this lane's rows g and g + 8: keys >= limit are masked.
  int key_limit[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row0 + 16 * warp + g + 8 * r;
    key_limit[r] = kCausal ? min(seqlen_k, row + 1 + causal_shift) : seqlen_k;
  }

  // NOTES: ldmatrix lane addresses (SmemTile's fragment loaders): Q as the A operand of Q K^T (its own 16 rows),
  // K as B of Q K^T (b2: two n8 key tiles per x4), V as B of P V (b2_trans: two n8 head-dim tiles per x4, .trans
  // hands lane (g, t) the pair (key 2t, 2t + 1; d g)). Further fragments come from TileQ/TileKV::offset.
  const uint32_t q_lane = sQ.a_lane(16 * warp, 0, lane);
  const uint32_t k_lane = TileKV{0}.b2_lane(0, 0, lane), v_lane = TileKV{0}.b2_trans_lane(0, 0, lane);

  float O[kOTiles][4];
#pragma unroll
  for (int j = 0; j < kOTiles; ++j) O[j][0] = O[j][1] = O[j][2] = O[j][3] = 0.f;
  float row_max[2] = {neg_inf(), neg_inf()};  // running max of the raw scores of rows g, g + 8
  float row_sum[2] = {0.f, 0.f};              // this lane's partial sum of P (its columns); quad-reduced at the end
  uint32_t Qa[kQSteps][4];                    // Q as A fragments, one per k16 step over the head dim
  const auto load_Q = [&]() {
#pragma unroll
    for (int s = 0; s < kQSteps; ++s) ldmatrix_x4(Qa[s], TileQ::offset(q_lane, 0, 16 * s));
  };

  if (n_block_max > 0) {
    sQ.load_async<kNumThreads>(gQ + row0 * p.q_stride.row, p.q_stride.row, seqlen_q - row0, tid);
    load_kv(sK0, gK, p.k_stride.row, (n_block_max - 1) * kBlockN);
    load_kv(sV0, gV, p.v_stride.row, (n_block_max - 1) * kBlockN);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    if constexpr (kQInRegs) load_Q();
  }

  // NOTES: pipeline. Each iteration computes on KV buffer `buf` (0 for the first, n_block_max - 1) and prefetches
  // the next lower tile into the other buffer. The barrier at its top (after each thread's wait) both publishes
  // this tile to every warp and proves every warp has finished reading the other buffer in the previous
  // iteration before it is overwritten.
  for (int n_block = n_block_max - 1, buf = 0; n_block >= 0; --n_block, buf ^= kTileKVBytes) {
    const uint32_t sK = sK0 + buf, sV = sV0 + buf;
    if (n_block < n_block_max - 1) {
      cp_async_wait<0>();
      __syncthreads();
    }
    if (n_block > 0) {
      load_kv(sK0 + (buf ^ kTileKVBytes), gK, p.k_stride.row, (n_block - 1) * kBlockN);
      load_kv(sV0 + (buf ^ kTileKVBytes), gV, p.v_stride.row, (n_block - 1) * kBlockN);
      cp_async_commit();
    }
    if constexpr (!kQInRegs) load_Q();

    // S = Q K^T (raw scores, fp32).
    float S[kSTiles][4];
#pragma unroll
    for (int j = 0; j < kSTiles; ++j) S[j][0] = S[j][1] = S[j][2] = S[j][3] = 0.f;
#pragma unroll
    for (int s = 0; s < kQSteps; ++s) {
#pragma unroll
      for (int i = 0; i < kSTiles / 2; ++i) {
        uint32_t Kb[4];
        ldmatrix_x4(Kb, TileKV::offset(sK + k_lane, 16 * i, 16 * s));
        const uint32_t b_lo[2] = {Kb[0], Kb[1]}, b_hi[2] = {Kb[2], Kb[3]};
        mma_m16n8k16(S[2 * i], Qa[s], b_lo);
        mma_m16n8k16(S[2 * i + 1], Qa[s], b_hi);
      }
    }

    // NOTES: masking. Only tiles that reach past Sk, or (causal) past the diagonal of the block's first row, need
    // the element mask; S[j][e] is (row g + 8 (e / 2), key n_block * kBlockN + 8j + 2t + e % 2).
    const int tile_end = (n_block + 1) * kBlockN;
    const bool need_mask = tile_end > seqlen_k || (kCausal && tile_end - 1 > row0 + causal_shift);
    if (need_mask) {
      const int key0 = n_block * kBlockN + 2 * t;
#pragma unroll
      for (int j = 0; j < kSTiles; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (key0 + 8 * j + (e & 1) >= key_limit[e >> 1]) S[j][e] = neg_inf();
    }

    // Online softmax, log2 domain: P = 2^(S * scale_log2 - max * scale_log2); O and row_sum are rescaled by
    // 2^((max_old - max_new) * scale_log2).
    // NOTES: -inf guard. While a row has seen only masked keys its max is -inf; it then uses 0 as the subtracted
    // max, so P = 2^-inf = 0 and the correction 2^(-inf) = 0 instead of NaN from (-inf) - (-inf).
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float m = row_max[r];
#pragma unroll
      for (int j = 0; j < kSTiles; ++j) m = fmaxf(m, fmaxf(S[j][2 * r], S[j][2 * r + 1]));
      m = quad_max(m);
      const float m_scaled = m == neg_inf() ? 0.f : m * p.softmax_scale_log2;
      const float correction = exp2_approx(row_max[r] * p.softmax_scale_log2 - m_scaled);
      row_max[r] = m;
      row_sum[r] *= correction;
#pragma unroll
      for (int j = 0; j < kOTiles; ++j) {
        O[j][2 * r] *= correction;
        O[j][2 * r + 1] *= correction;
      }
#pragma unroll
      for (int j = 0; j < kSTiles; ++j)
#pragma unroll
        for (int e = 2 * r; e < 2 * r + 2; ++e) {
          S[j][e] = exp2_approx(fmaf(S[j][e], p.softmax_scale_log2, -m_scaled));
          row_sum[r] += S[j][e];
        }
    }

    // O += P V. NOTES: P to A fragments without shuffles: the C layout of S tiles 2s, 2s + 1 (keys 16s..16s+15) is
    // the A layout of k-step s: a0 = (row g, k 2t..), a1 = (row g + 8, k 2t..), a2/a3 the same at k 2t + 8.
#pragma unroll
    for (int s = 0; s < kPSteps; ++s) {
      const uint32_t Pa[4] = {pack_elem2(S[2 * s][0], S[2 * s][1]), pack_elem2(S[2 * s][2], S[2 * s][3]),
                              pack_elem2(S[2 * s + 1][0], S[2 * s + 1][1]),
                              pack_elem2(S[2 * s + 1][2], S[2 * s + 1][3])};
#pragma unroll
      for (int i = 0; i < kOTiles / 2; ++i) {
        uint32_t Vb[4];
        ldmatrix_x4_trans(Vb, TileKV::offset(sV + v_lane, 16 * s, 16 * i));
        const uint32_t b_lo[2] = {Vb[0], Vb[1]}, b_hi[2] = {Vb[2], Vb[3]};
        mma_m16n8k16(O[2 * i], Pa, b_lo);
        mma_m16n8k16(O[2 * i + 1], Pa, b_hi);
      }
    }
  }

  // Epilogue: O / rowsum and lse = max * scale + ln(rowsum).
  // NOTES: a row that saw no key has rowsum 0 (every P was 2^-inf): it gets O = 0 and lse = -inf, never NaN.
  // Any row that saw a key has rowsum >= 1 (its max contributes 2^0).
  float inv_sum[2], lse[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float sum = quad_sum(row_sum[r]);
    inv_sum[r] = sum == 0.f ? 0.f : __fdividef(1.f, sum);
    lse[r] = sum == 0.f ? neg_inf() : row_max[r] * p.softmax_scale + logf(sum);
  }
  if (t == 0) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = row0 + 16 * warp + g + 8 * r;
      if (row < seqlen_q) p.lse[((int64_t)b * p.num_heads + h) * seqlen_q + row] = lse[r];
    }
  }

  // NOTES: O goes through this warp's own 16 rows of the Q tile (same swizzle) so global stores are 16-byte and
  // row-contiguous. Only this warp ever reads those rows (its Q fragments), and no cp.async is in flight: the last
  // iteration prefetches nothing and a CTA without KV tiles issues no load, so __syncwarp suffices.
  __syncwarp();
#pragma unroll
  for (int j = 0; j < kOTiles; ++j)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = 16 * warp + g + 8 * r;
      const uint32_t packed = pack_elem2(O[j][2 * r] * inv_sum[r], O[j][2 * r + 1] * inv_sum[r]);
      *reinterpret_cast<uint32_t*>(smem + (sQ.word_addr(row, 8 * j + 2 * t) - smem_base)) = packed;
    }
  __syncwarp();

  elem_t* gO = p.out + b * p.o_stride.batch + h * p.o_stride.head;
#pragma unroll
  for (int i = 0; i < 16 * kChunksPerRow / 32; ++i) {
    const int c = lane + 32 * i;
    const int r = 16 * warp + c / kChunksPerRow, chunk = c % kChunksPerRow;
    const int row = row0 + r;
    if (row < seqlen_q) {
      const uint4 v = *reinterpret_cast<const uint4*>(smem + (sQ.chunk_addr(r, chunk) - smem_base));
      *reinterpret_cast<uint4*>(gO + row * p.o_stride.row + chunk * 8) = v;
    }
  }
}
