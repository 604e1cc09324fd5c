#include "common.cuh"
// Attention backward, main kernel: FlashAttention-2 style on mma.sync m16n8k16 + cp.async, persistent over a
// schedule table. Each CTA walks its visits (bh, n_block, m_block) in table order; a run of visits with the same
// KV tile keeps K_j, V_j in shared memory and dK_j, dV_j in registers, and every visit adds its dQ partial
// dS_ij K_j into the fp32 dq_accum tile of m_block, in the tile's rank order when deterministic.
// Each of the 8 warps owns 16 keys of the KV tile; S and dP are computed transposed (keys x queries), so P^T and
// dS^T come out of the accumulators directly as A operands of dV += P^T dO and dK += dS^T Q.
#include "params.cuh"
#include "ptx/cp_async.cuh"
#include "ptx/cvt.cuh"
#include "ptx/exp2.cuh"
#include "ptx/fence.cuh"
#include "ptx/globaltimer.cuh"
#include "ptx/ldmatrix.cuh"
#include "ptx/mma.cuh"
#include "ptx/semaphore.cuh"
#include "schedule_view.cuh"
#include "smem_tile.cuh"

#if !defined(DASH_HEAD_DIM) || !defined(DASH_CAUSAL) || !defined(DASH_DETERMINISTIC) || !defined(DASH_BLOCK_M) || \
    !defined(DASH_BLOCK_N) || !defined(DASH_NUM_THREADS) || !defined(DASH_SMEM_BYTES)
#error "bwd_main.cu needs DASH_HEAD_DIM, DASH_CAUSAL, DASH_DETERMINISTIC, DASH_BLOCK_M, DASH_BLOCK_N, " \
       "DASH_NUM_THREADS, DASH_SMEM_BYTES"
#endif

namespace bwd {

constexpr int kHeadDim = DASH_HEAD_DIM;
constexpr bool kCausal = DASH_CAUSAL != 0;
constexpr bool kDeterministic = DASH_DETERMINISTIC != 0;
constexpr int kBlockM = DASH_BLOCK_M;
constexpr int kBlockN = DASH_BLOCK_N;
constexpr int kNumThreads = DASH_NUM_THREADS;
constexpr int kNumWarps = kNumThreads / 32;

static_assert(kHeadDim == 64 || kHeadDim == 128, "head dim 64 or 128");
static_assert(kBlockN == 128 && kNumThreads == 256 && kBlockN == 16 * kNumWarps, "8 warps, 16 keys each");
static_assert(kBlockM == 64 || kBlockM == 32, "kBlockM 64 (or 32)");

using TileKV = SmemTile<kBlockN, kHeadDim>;  // K_j, V_j: keys x head dim
using TileQ = SmemTile<kBlockM, kHeadDim>;   // Q_i, dO_i: queries x head dim
using TileDS = SmemTile<kBlockN, kBlockM>;   // dS_ij^T: keys x queries

// NOTES: smem = [K] [V] [Q x2] [dO x2] [dS^T] [lse_log2 x2] [dpsum x2]; Q, dO, lse_log2, dpsum are double-buffered
// by visit parity, K and V are single-buffered and reloaded only at a KV-group start.
constexpr int kOffK = 0;
constexpr int kOffV = kOffK + TileKV::kBytes;
constexpr int kOffQ = kOffV + TileKV::kBytes;
constexpr int kOffDO = kOffQ + 2 * TileQ::kBytes;
constexpr int kOffDS = kOffDO + 2 * TileQ::kBytes;
constexpr int kOffLse = kOffDS + TileDS::kBytes;
constexpr int kOffDpsum = kOffLse + 2 * kBlockM * 4;
constexpr int kSmemBytes = kOffDpsum + 2 * kBlockM * 4;
static_assert(kSmemBytes == DASH_SMEM_BYTES, "host smem formula out of sync with the kernel layout");

// NOTES: S^T, P^T, dP^T, dS^T of a warp are computed for kSubM queries at a time (the whole Q tile for hdim 64,
// halves of it for hdim 128): with dK, dV (hdim/2 fp32 each per thread) resident, 16 x kSubM fp32 for each of P
// and dP is what still fits in 255 registers without spilling. The dK, dV accumulation order is unchanged.
constexpr int kSubM = kHeadDim == 128 || kBlockM == 32 ? 32 : 64;
constexpr int kSubTiles = kSubM / 8;            // n8 tiles of S^T and dP^T per warp (over queries)
static_assert(kBlockM % kSubM == 0, "Q tile must split into sub-tiles");
constexpr int kDTiles = kHeadDim / 8;           // n8 tiles of dK and dV per warp (over the head dim)
constexpr int kDqWarpsM = kBlockM / 16;         // dQ = dS K: warps along queries ...
constexpr int kDqWarpsN = kNumWarps / kDqWarpsM;  // ... and along the head dim
constexpr int kDqCols = kHeadDim / kDqWarpsN;
constexpr int kDqTiles = kDqCols / 8;
static_assert(kDqCols % 16 == 0, "dQ warp tile must hold whole n16 pairs");

// NOTES: buffers are addressed arithmetically from the visit parity: an array of tiles indexed at run time would
// put the whole struct in local memory.
struct Smem {
  char* raw;      // generic pointer to the dynamic smem, for 32-bit and fp32 accesses
  uint32_t base;  // the same bytes as a shared-window address, for cp.async and ldmatrix
  DASH_DEVICE TileKV k() const { return TileKV{base + kOffK}; }
  DASH_DEVICE TileKV v() const { return TileKV{base + kOffV}; }
  DASH_DEVICE TileQ q(int buf) const { return TileQ{base + kOffQ + buf * TileQ::kBytes}; }
  DASH_DEVICE TileQ dout(int buf) const { return TileQ{base + kOffDO + buf * TileQ::kBytes}; }
  DASH_DEVICE TileDS ds() const { return TileDS{base + kOffDS}; }
  DASH_DEVICE uint32_t lse_addr(int buf) const { return base + kOffLse + buf * kBlockM * 4; }
  DASH_DEVICE uint32_t dpsum_addr(int buf) const { return base + kOffDpsum + buf * kBlockM * 4; }
  DASH_DEVICE const float* lse_log2(int buf) const {
    return reinterpret_cast<const float*>(raw + kOffLse) + buf * kBlockM;
  }
  DASH_DEVICE const float* dpsum(int buf) const {
    return reinterpret_cast<const float*>(raw + kOffDpsum) + buf * kBlockM;
  }
  DASH_DEVICE uint32_t* word(uint32_t addr) const { return reinterpret_cast<uint32_t*>(raw + (addr - base)); }
};

DASH_DEVICE void load_kv_async(const BwdParams& p, const Smem& s, const Visit& w, int tid) {
  const Head hd(p, w.bh);
  const int64_t row0 = (int64_t)w.n_block * kBlockN;
  const int rows_valid = (int)(p.seqlen_k - row0);
  s.k().load_async<kNumThreads>(p.k + hd.b * p.k_stride.batch + hd.hk * p.k_stride.head + row0 * p.k_stride.row,
                              p.k_stride.row, rows_valid, tid);
  s.v().load_async<kNumThreads>(p.v + hd.b * p.v_stride.batch + hd.hk * p.v_stride.head + row0 * p.v_stride.row,
                              p.v_stride.row, rows_valid, tid);
}

// NOTES: lse_log2 and dpsum rows are padded to seqlen_q_rounded (a multiple of kBlockM) by preprocess, which
// also wrote +inf / 0 for rows >= Sq, so they are copied without predicates.
DASH_DEVICE void load_q_async(const BwdParams& p, const Smem& s, const Visit& w, int buf, int tid) {
  const Head hd(p, w.bh);
  const int64_t row0 = (int64_t)w.m_block * kBlockM;
  const int rows_valid = (int)(p.seqlen_q - row0);
  s.q(buf).load_async<kNumThreads>(p.q + hd.b * p.q_stride.batch + hd.h * p.q_stride.head + row0 * p.q_stride.row,
                                   p.q_stride.row, rows_valid, tid);
  s.dout(buf).load_async<kNumThreads>(
      p.dout + hd.b * p.do_stride.batch + hd.h * p.do_stride.head + row0 * p.do_stride.row, p.do_stride.row,
      rows_valid, tid);
  constexpr int kChunks = kBlockM / 4;  // 16-byte chunks of one row vector
  if (tid < 2 * kChunks) {
    const bool is_lse = tid < kChunks;
    const int chunk = is_lse ? tid : tid - kChunks;
    const float* src = (is_lse ? p.lse_log2 : p.dpsum) + w.bh * p.seqlen_q_rounded + row0 + chunk * 4;
    cp_async_16((is_lse ? s.lse_addr(buf) : s.dpsum_addr(buf)) + chunk * 16, src, true);
  }
}

// acc (16 x kSubM) = A B^T over the whole head dim, A = 16 rows of K or V (a_lane: a_lane() of that tile at this
// warp's first key), B = rows [b_row0, +kSubM) of Q or dO (b_lane: b2_lane(0, 0)): S^T = K Q^T, dP^T = V dO^T.
// NOTES: the k-step loops here and in mma_dq are only unrolled by 2: kk indexes smem addresses, never a register
// array, and a fully unrolled loop lets ptxas hoist every fragment load of this GEMM and of the next one, which
// costs more registers than hdim 128 has left.
DASH_DEVICE void mma_keys_by_queries(float (&acc)[kSubTiles][4], uint32_t a_lane, uint32_t b_lane, int b_row0) {
#pragma unroll
  for (int nt = 0; nt < kSubTiles; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[nt][e] = 0.f;
  }
#pragma unroll 2
  for (int kk = 0; kk < kHeadDim / 16; ++kk) {
    uint32_t af[4];
    ldmatrix_x4(af, TileKV::offset(a_lane, 0, kk * 16));
#pragma unroll
    for (int np = 0; np < kSubTiles / 2; ++np) {
      uint32_t bf[4];
      ldmatrix_x4(bf, TileQ::offset(b_lane, b_row0 + np * 16, kk * 16));
      const uint32_t b0[2] = {bf[0], bf[1]}, b1[2] = {bf[2], bf[3]};
      mma_m16n8k16(acc[2 * np], af, b0);
      mma_m16n8k16(acc[2 * np + 1], af, b1);
    }
  }
}

// acc (16 x kHeadDim) += A B, A (16 keys x kSubM queries) = fp32 accumulator fragments rounded to elem_t, B = rows
// [b_row0, +kSubM) of dO or Q (b_lane: b2_trans_lane(0, 0)): dV += P^T dO and dK += dS^T Q.
// NOTES: the C fragments of n8 tiles 2kk and 2kk+1 are exactly the A fragment of k16 step kk (rows g / g+8,
// columns 2t, 2t+1 and 8+2t, 8+2t+1), so no data moves between lanes.
DASH_DEVICE void mma_acc_a(float (&acc)[kDTiles][4], const float (&a)[kSubTiles][4], uint32_t b_lane, int b_row0) {
#pragma unroll
  for (int kk = 0; kk < kSubM / 16; ++kk) {
    const uint32_t af[4] = {pack_elem2(a[2 * kk][0], a[2 * kk][1]), pack_elem2(a[2 * kk][2], a[2 * kk][3]),
                            pack_elem2(a[2 * kk + 1][0], a[2 * kk + 1][1]),
                            pack_elem2(a[2 * kk + 1][2], a[2 * kk + 1][3])};
#pragma unroll
    for (int np = 0; np < kDTiles / 2; ++np) {
      uint32_t bf[4];
      ldmatrix_x4_trans(bf, TileQ::offset(b_lane, b_row0 + kk * 16, np * 16));
      const uint32_t b0[2] = {bf[0], bf[1]}, b1[2] = {bf[2], bf[3]};
      mma_m16n8k16(acc[2 * np], af, b0);
      mma_m16n8k16(acc[2 * np + 1], af, b1);
    }
  }
}

// This warp's dQ partial (16 queries x kDqCols head-dim columns) = dS K over the kBlockN keys, A from the dS^T
// tile (ds_lane: a_trans_lane(0, first query)) and B from K (k_lane: b2_trans_lane(0, first column)).
DASH_DEVICE void mma_dq(float (&acc)[kDqTiles][4], uint32_t ds_lane, uint32_t k_lane) {
#pragma unroll
  for (int nt = 0; nt < kDqTiles; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[nt][e] = 0.f;
  }
#pragma unroll 2
  for (int kk = 0; kk < kBlockN / 16; ++kk) {
    uint32_t af[4];
    ldmatrix_x4_trans(af, TileDS::offset(ds_lane, kk * 16, 0));
#pragma unroll
    for (int np = 0; np < kDqTiles / 2; ++np) {
      uint32_t bf[4];
      ldmatrix_x4_trans(bf, TileKV::offset(k_lane, kk * 16, np * 16));
      const uint32_t b0[2] = {bf[0], bf[1]}, b1[2] = {bf[2], bf[3]};
      mma_m16n8k16(acc[2 * np], af, b0);
      mma_m16n8k16(acc[2 * np + 1], af, b1);
    }
  }
}

// Deterministic mode: waits until rank[v] dQ partials have been added to the visit's dQ tile. Returns false
// (after recording the failure in p.error, first failure only) on timeout, on an impossible semaphore value, or
// when another CTA has already failed. Called by one thread.
DASH_DEVICE bool wait_for_turn(const BwdParams& p, const int* sem, int64_t v, int rank) {
  const uint64_t t0 = globaltimer_ns();
  while (true) {
    const int seen = ld_acquire_gpu(sem);
    if (seen == rank) return true;
    const bool other_failed = *reinterpret_cast<volatile int*>(p.error) != 0;
    if (other_failed || seen > rank || (int64_t)(globaltimer_ns() - t0) > p.spin_timeout_ns) {
      if (atomicCAS(p.error, 0, 1) == 0) {
        p.error[1] = (int)v;
        p.error[2] = rank;
        p.error[3] = seen;
      }
      return false;
    }
  }
}

// dK (scaled by softmax_scale) and dV of this warp's 16 keys to global memory, rows < Sk only.
DASH_DEVICE void store_dkv(const BwdParams& p, const Visit& w, const float (&dK)[kDTiles][4],
                           const float (&dV)[kDTiles][4], int warp, int lane) {
  const Head hd(p, w.bh);
  const int key0 = w.n_block * kBlockN + warp * 16 + lane / 4;
  const int col = 2 * (lane % 4);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int key = key0 + 8 * half;
    if (key < p.seqlen_k) {
      elem_t* dk_row = p.dk + hd.b * p.dk_stride.batch + key * p.dk_stride.row + hd.hk * p.dk_stride.head + col;
      elem_t* dv_row = p.dv + hd.b * p.dv_stride.batch + key * p.dv_stride.row + hd.hk * p.dv_stride.head + col;
#pragma unroll
      for (int nt = 0; nt < kDTiles; ++nt) {
        *reinterpret_cast<uint32_t*>(dk_row + nt * 8) =
            pack_elem2(dK[nt][2 * half] * p.softmax_scale, dK[nt][2 * half + 1] * p.softmax_scale);
        *reinterpret_cast<uint32_t*>(dv_row + nt * 8) = pack_elem2(dV[nt][2 * half], dV[nt][2 * half + 1]);
      }
    }
  }
}

}  // namespace bwd

using namespace bwd;

extern "C" __global__ void __launch_bounds__(kNumThreads, 1) dash_bwd_main(const __grid_constant__ BwdParams p) {
  extern __shared__ __align__(128) char smem_raw[];
  const ScheduleView sched(p.visits, p.rank, p.cta_start, blockIdx.x);
  if (sched.begin >= sched.end) return;

  const uint32_t smem_base = smem_u32(smem_raw);
  const int seqlen_q = (int)p.seqlen_q, seqlen_k = (int)p.seqlen_k;
  const float scale_log2 = p.softmax_scale_log2;

  Visit cur = sched.visit(sched.begin);
  load_q_async(p, Smem{smem_raw, smem_base}, cur, 0, threadIdx.x);
  cp_async_commit();

  float dK[kDTiles][4], dV[kDTiles][4];
  bool group_start = true;
  int buf = 0;
  for (int64_t v = sched.begin; v < sched.end; ++v, buf ^= 1) {
    const bool has_next = v + 1 < sched.end;
    const Visit next = has_next ? sched.visit(v + 1) : cur;
    const bool group_end = !has_next || !same_kv_tile(cur, next);
    // NOTES: the thread index and smem base are re-read through opaque() every visit, so the compiler derives
    // the ~10 per-lane fragment addresses inside the visit, where they are used, instead of hoisting them out of
    // the loop and keeping them live across it (which spills at hdim 128).
    const Smem s{smem_raw, opaque(smem_base)};
    const int tid = (int)opaque(threadIdx.x), warp = tid / 32, lane = tid % 32;
    const int g = lane / 4, t = lane % 4;                            // accumulator row group and column pair
    const int warp_m = warp % kDqWarpsM, warp_n = warp / kDqWarpsM;  // this warp's piece of dQ

    // NOTES: barrier (A) ends visit v-1 for every warp: its last smem reads (dS^T and K in dQ = dS K; Q, dO of
    // buffer buf^1 and K, V before barrier (C)) are done, so K/V may be reloaded and buffer buf^1 refilled.
    // cp.async groups: [Q/dO/lse/dpsum of v, committed in the previous iteration (or the prologue)],
    // [K/V of this group, maybe empty], [prefetch of v+1, maybe empty]; wait_group 1 completes all but the last.
    __syncthreads();  // (A)
    if (group_start) load_kv_async(p, s, cur, tid);
    cp_async_commit();
    if (has_next) load_q_async(p, s, next, buf ^ 1, tid);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();  // (B): K, V, Q_i, dO_i, lse_log2_i, dpsum_i visible to every warp

    if (group_start) {
#pragma unroll
      for (int nt = 0; nt < kDTiles; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) dK[nt][e] = dV[nt][e] = 0.f;
      }
    }

    const uint32_t k_a = s.k().a_lane(warp * 16, 0, lane), v_a = s.v().a_lane(warp * 16, 0, lane);
    const uint32_t q_b = s.q(buf).b2_lane(0, 0, lane), do_b = s.dout(buf).b2_lane(0, 0, lane);
    const uint32_t q_bt = s.q(buf).b2_trans_lane(0, 0, lane), do_bt = s.dout(buf).b2_trans_lane(0, 0, lane);
    const uint32_t ds_word = s.ds().word_addr(warp * 16 + g, 2 * t);

    // Per query sub-tile: S^T = K Q^T; P^T = exp2(S^T * scale_log2 - lse_log2[q]) with the masks; dV += P^T dO;
    // dP^T = V dO^T; dS^T = P^T o (dP^T - dpsum[q]); dS^T to smem (elem_t) for dQ; dK += dS^T Q, from the same
    // rounded dS values as dQ.
    // NOTES: accumulator element (nt, e) of this lane is key n_block*kBlockN + warp*16 + g + 8*(e/2) and query
    // m_block*kBlockM + qs + nt*8 + 2t + e%2. Keys >= Sk and, causal, keys beyond q + Sk - Sq (bottom-right
    // aligned) get P = 0 by select; queries >= Sq, and rows whose lse is -inf, have lse_log2 = +inf, so
    // P = 2^-inf = 0 (their Q and dO rows are zero-filled, so S and dP stay finite). dS = 0 wherever P = 0.
#pragma unroll
    for (int qs = 0; qs < kBlockM; qs += kSubM) {
      float P[kSubTiles][4];
      mma_keys_by_queries(P, k_a, q_b, qs);
      const int key0 = cur.n_block * kBlockN + warp * 16 + g;
      const int q0 = cur.m_block * kBlockM + qs + 2 * t;
      const float* lse = s.lse_log2(buf) + qs + 2 * t;
#pragma unroll
      for (int nt = 0; nt < kSubTiles; ++nt) {
        const float2 l = *reinterpret_cast<const float2*>(lse + nt * 8);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = key0 + 8 * (e / 2), q = q0 + nt * 8 + e % 2;
          bool visible = key < seqlen_k;
          if constexpr (kCausal) visible = visible && key - q <= seqlen_k - seqlen_q;
          P[nt][e] = visible ? exp2_approx(fmaf(P[nt][e], scale_log2, -(e % 2 ? l.y : l.x))) : 0.f;
        }
      }

      mma_acc_a(dV, P, do_bt, qs);

      float dS[kSubTiles][4];
      mma_keys_by_queries(dS, v_a, do_b, qs);
      const float* dpsum = s.dpsum(buf) + qs + 2 * t;
#pragma unroll
      for (int nt = 0; nt < kSubTiles; ++nt) {
        const float2 d = *reinterpret_cast<const float2*>(dpsum + nt * 8);
#pragma unroll
        for (int e = 0; e < 4; ++e) dS[nt][e] = P[nt][e] * (dS[nt][e] - (e % 2 ? d.y : d.x));
      }

#pragma unroll
      for (int nt = 0; nt < kSubTiles; ++nt) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          *s.word(TileDS::offset(ds_word, 8 * half, qs + nt * 8)) =
              pack_elem2(dS[nt][2 * half], dS[nt][2 * half + 1]);
        }
      }
      mma_acc_a(dK, dS, q_bt, qs);
    }
    __syncthreads();  // (C): the whole dS^T tile is in smem

    // dQ partial = dS K (unscaled), this warp's 16 x kDqCols piece, then added into dq_accum.
    float dQ[kDqTiles][4];
    mma_dq(dQ, s.ds().a_trans_lane(0, warp_m * 16, lane), s.k().b2_trans_lane(0, warp_n * kDqCols, lane));
    float* dq_accum = p.dq_accum +
                      ((int64_t)cur.bh * p.seqlen_q_rounded + cur.m_block * kBlockM + warp_m * 16 + g) * kHeadDim +
                      warp_n * kDqCols + 2 * t;

    // NOTES: deterministic order of the dQ adds. Within one visit every element of the tile receives exactly one
    // add. Across visits, thread 0 waits (acquire) until the tile's semaphore equals this visit's rank, barrier,
    // adds, then every thread fences (acq_rel, gpu) and after a barrier thread 0 increments the semaphore
    // (release): the adds of rank r happen-before those of rank r+1, so each element's fp32 sum order is the rank
    // order, fixed by the table. A failed wait makes the whole CTA leave; other CTAs see p.error and follow.
    int* sem = p.dq_semaphore + (int64_t)cur.bh * p.num_m_blocks + cur.m_block;
    if constexpr (kDeterministic) {
      const bool failed = tid == 0 && !wait_for_turn(p, sem, v, sched.rank_of(v));
      if (__syncthreads_or(failed)) {
        cp_async_wait<0>();
        return;
      }
    }
#pragma unroll
    for (int nt = 0; nt < kDqTiles; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) atomicAdd(dq_accum + (e / 2) * 8 * kHeadDim + nt * 8 + e % 2, dQ[nt][e]);
    }
    if constexpr (kDeterministic) {
      fence_acq_rel_gpu();
      __syncthreads();
      if (tid == 0) red_release_gpu_add(sem, 1);
    }

    if (group_end) store_dkv(p, cur, dK, dV, warp, lane);
    group_start = group_end;
    cur = next;
  }
}
