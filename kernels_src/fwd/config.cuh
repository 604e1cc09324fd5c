// Forward kernel (Hopper engine): compile-time configuration, thread roles, named barriers, the shared-memory
// layout and the tile a CTA computes. The DASH_* defines come from cupy_dash/cuda/kernels.py (one cubin per variant).
#pragma once
#include "../common.cuh"
#include "../constants.cuh"
#include "../params.cuh"
#include "../tile_tma.cuh"
#include "../varlen_span.cuh"
#include "../warp_roles.cuh"

#if !defined(DASH_HEAD_DIM) || !defined(DASH_CAUSAL) || !defined(DASH_BLOCK_M) || !defined(DASH_BLOCK_N) || \
    !defined(DASH_NUM_THREADS) || !defined(DASH_SMEM_BYTES)
#error "the forward kernel needs DASH_HEAD_DIM, DASH_CAUSAL, DASH_BLOCK_M, DASH_BLOCK_N, DASH_NUM_THREADS, " \
       "DASH_SMEM_BYTES"
#endif

namespace fwd {

constexpr int kHeadDimIO = DASH_HEAD_DIM;                // columns of q and k (v, out: kHeadDimVIO) in global memory
constexpr int kHeadDim = padded_head_dim(kHeadDimIO);  // compute width: 96 runs as 128 (tile_tma.cuh)
constexpr int kHeadDimVIO = DASH_HEAD_DIM_V;  // columns of v and out (tile_tma.cuh: value head dim)
constexpr int kHeadDimV = value_compute_dim(kHeadDimIO, kHeadDimVIO);  // columns of v a tile load fills
constexpr bool kCausal = DASH_CAUSAL != 0;
#ifndef DASH_PERSISTENT
#define DASH_PERSISTENT 0
#endif
constexpr bool kPersistent = DASH_PERSISTENT != 0;  // one CTA per SM claiming tiles (fwd.cu; causal masks)
constexpr int kBlockM = DASH_BLOCK_M;  // queries per Q tile (m_block)
constexpr int kBlockN = DASH_BLOCK_N;  // keys per KV tile (n_block)

// Thread roles: warpgroup 0 is the producer (one lane of warp 0 issues the TMA loads; the rest leave at once);
// warpgroups 1..kNumMmaWg compute, each for 64 query rows of the Q tile.
using namespace roles;  // kNumMmaWg, kWgThreads, kNumThreads, kProducerRegs, kMmaRegs (warp_roles.cuh)
static_assert(DASH_NUM_THREADS == kNumThreads, "launched with 384 threads");

static_assert(supported_head_dim(kHeadDimIO), "head dim 64, 96, 128, 192 or 256");
static_assert(supported_value_head_dim(kHeadDimIO, kHeadDimVIO), "value head dim: q's, or 128 with 192");
static_assert(kBlockM == 64 * kNumMmaWg, "each MMA warpgroup owns 64 query rows");
static_assert(kBlockN == 64 || kBlockN == 80 || kBlockN == 112 || kBlockN == 128 || kBlockN == 176,
              "the wgmma wrappers have N = 64, 80, 112, 128 or 176 (multiples of P V's 16 keys a k-step)");

// Accumulator registers per thread (m64nN fp32: N / 2).
constexpr int kSRegs = kBlockN / 2;   // S = Q K^T, then P: 64 queries x kBlockN keys
constexpr int kORegs = kHeadDimVIO / 2;  // O: 64 queries x the value head dim (96: N = 96, not padded)

// K and V buffers (separate pipelines); DASH_KV_STAGES overrides the default for tile sweeps
// (benchmarks/fwd_tiles.py).
#ifdef DASH_KV_STAGES
constexpr int kStages = DASH_KV_STAGES;
#else
constexpr int kStages = kFwdKvStages;
#endif
static_assert(kStages >= 2, "two or more K / V stages");

// Named barriers (id 0 is __syncthreads): the GEMM turn of MMA warpgroup wg (ping-pong: a warpgroup syncs on its
// own id before issuing its GEMMs, the other one arrives on it after issuing its own), and the O tile of
// warpgroup wg written to shared memory before the TMA store.
constexpr int kBarTurn = 1;                         // + wg
constexpr int kBarOStaged = kBarTurn + kNumMmaWg;  // + wg
static_assert(kBarOStaged + kNumMmaWg <= 16, "16 named barriers per CTA");
constexpr int kTurnThreads = kNumMmaWg * kWgThreads;

// NOTES: shared memory, from a 1024-byte-aligned base (the 128B swizzle pattern of TMA and wgmma starts on
// 1024-byte boundaries): Q | K x kStages | V x kStages | mbarriers. Q is K-major for S = Q K^T (queries x head
// dim, 64-column panels of kBlockM x 128 B), K K-major (keys x head dim) as B of S, V the same bytes as the
// MN-major B operand of O += P V. After its last S GEMM, a warpgroup's 64 rows of the Q tile hold its O tile
// for the TMA store (only that warpgroup ever reads those rows). The host computes the same size
// (cupy_dash/cuda/kernels.py) from the constants.cuh values used here.
struct SmemLayout {
  static constexpr int kQ = kBlockM * kHeadDim * 2;
  static constexpr int kKV = kBlockN * kHeadDim * 2;
  static constexpr int kVLoad = kBlockN * kHeadDimV * 2;  // bytes a V load fills (kKV but with the value head dim)
  static constexpr int kQs = 0;
  static constexpr int kK = kQs + kQ;
  static constexpr int kV = kK + kStages * kKV;
  static constexpr int kBars = kV + kStages * kKV;
  // q_full, k_full[], k_empty[], v_full[], v_empty[], q_empty, sched_full[2], sched_empty[2]; then the two tile
  // slots of a persistent launch
  static constexpr int kNumBars = 6 + 4 * kStages;
  static constexpr int kSlots = kBars + kMbarrierBytes * kNumBars;
  static constexpr int kBytes = kSlots + 2 * 8;
  static constexpr int kDynamicBytes = kBytes + kSmemAlign;  // slack to align the base
};
static_assert(SmemLayout::kQ % kSmemAlign == 0 && SmemLayout::kKV % kSmemAlign == 0,
              "tiles keep 1024-byte alignment");
static_assert(SmemLayout::kDynamicBytes == DASH_SMEM_BYTES, "host smem formula out of sync with the layout");
static_assert(SmemLayout::kDynamicBytes <= kSmemMaxBytes, "more than the 227 KB a CTA can have");

struct Smem {
  uint32_t base;  // shared-window address, 1024-byte aligned
  DASH_DEVICE uint32_t q() const { return base + SmemLayout::kQs; }
  DASH_DEVICE uint32_t k(int stage) const { return base + SmemLayout::kK + stage * SmemLayout::kKV; }
  DASH_DEVICE uint32_t v(int stage) const { return base + SmemLayout::kV + stage * SmemLayout::kKV; }
  DASH_DEVICE uint32_t bar(int i) const { return base + SmemLayout::kBars + kMbarrierBytes * i; }
  DASH_DEVICE uint32_t q_full() const { return bar(0); }
  DASH_DEVICE uint32_t k_full(int stage) const { return bar(1 + stage); }
  DASH_DEVICE uint32_t k_empty(int stage) const { return bar(1 + kStages + stage); }
  DASH_DEVICE uint32_t v_full(int stage) const { return bar(1 + 2 * kStages + stage); }
  DASH_DEVICE uint32_t v_empty(int stage) const { return bar(1 + 3 * kStages + stage); }
  DASH_DEVICE uint32_t q_empty() const { return bar(1 + 4 * kStages); }
  DASH_DEVICE uint32_t sched_full(int i) const { return bar(2 + 4 * kStages + i); }
  DASH_DEVICE uint32_t sched_empty(int i) const { return bar(4 + 4 * kStages + i); }
  DASH_DEVICE uint32_t slot(int i) const { return base + SmemLayout::kSlots + 8 * i; }
};

// The tile of one CTA: query rows [m_block kBlockM, +kBlockM) of head h (kv head hk) of sequence b, against KV
// tiles n_block_min + n_blocks - 1 down to n_block_min. Rows and keys count from the sequence's first row.
// NOTES: masks, bottom-right aligned per sequence: query i sees key j iff i + diag - left <= j <= i + diag + right
// with diag = Sk - Sq; causal is right = 0 (the host sets it), -1 leaves a side unbounded; keys >= Sk are never
// seen. Varlen: sequence b is the SeqSpan of varlen_span.cuh (rows of the packed tensors, clamped to them).
struct Tile {
  int m_block, h, hk, b;
  int seqlen_q, seqlen_k;     // this sequence's lengths
  int row_q, row_k;           // its first row in q / out and in k / v (0 without varlen)
  int batch;                  // batch coordinate of the TMA boxes: b, or 0 for the one packed batch of varlen
  int n_block_min, n_blocks;  // n_blocks 0: no row of the tile sees a key
  bool varlen;                // packed variable-length sequences (FwdParams::cu_seqlens_q/k, is_varlen)
  // One CTA per tile: the tile of this block of the grid (num_m_blocks, H, B).
  DASH_DEVICE Tile(const FwdParams& p) : varlen(is_varlen(p)) {
    place(p, (int)(blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z)), (int)gridDim.x);
    locate(p);
  }
  // Persistent launches: tile `linear` of the launch order (fixed length).
  DASH_DEVICE Tile(const FwdParams& p, int linear) : varlen(false) {
    place(p, linear, (int)p.num_m_blocks);
    locate(p);
  }
  // m_block, h, b of tile `linear` in launch order, num_m_blocks query tiles per (b, h), (b, h) pairs in order.
  // NOTES: causal tiles get shorter as m_block falls; launching the longest first shortens the tail. With a head
  // section the tiles, in launch order, walk sections of head_section (b, h) pairs, and within one every pair's
  // tile m_block before any pair's m_block - 1: the longest of every head come first, as in a longest-first list
  // over the whole grid, while the K and V of one section stay in L2.
  DASH_DEVICE void place(const FwdParams& p, int linear, int num_m_blocks) {
    const int heads = (int)p.num_heads, pairs = heads * (int)p.batch;
    int pair = linear / num_m_blocks;
    m_block = linear % num_m_blocks;
    if (kCausal) m_block = num_m_blocks - 1 - m_block;
    if (kCausal && p.head_section > 0) {
      const int section = (int)min(p.head_section, (int64_t)pairs);
      const int first = linear / (section * num_m_blocks) * section, width = min(section, pairs - first);
      const int within = linear - first * num_m_blocks;
      pair = first + within % width;
      m_block = num_m_blocks - 1 - within / width;
    }
    h = pair % heads;
    b = pair / heads;
  }
  DASH_DEVICE void locate(const FwdParams& p) {
    hk = h / ((int)p.num_heads / (int)p.num_heads_kv);
    if (varlen) {
      const SeqSpan s(p.cu_seqlens_q, p.cu_seqlens_k, (int)p.seqlen_q, (int)p.seqlen_k, b);
      row_q = s.row_q, row_k = s.row_k, seqlen_q = s.seqlen_q, seqlen_k = s.seqlen_k;
      batch = 0;
    } else {
      seqlen_q = (int)p.seqlen_q;
      seqlen_k = (int)p.seqlen_k;
      row_q = row_k = 0;
      batch = b;
    }
    const int diag = seqlen_k - seqlen_q;
    int n_block_max = (seqlen_k + kBlockN - 1) / kBlockN;
    if (p.window_right >= 0) {  // the tile's last valid row sees the furthest key
      const int last_key = min((m_block + 1) * kBlockM, seqlen_q) - 1 + diag + (int)p.window_right;
      n_block_max = min(n_block_max, last_key < 0 ? 0 : last_key / kBlockN + 1);
    }
    n_block_min = 0;
    if (p.window_left >= 0) {  // the tile's first row sees the nearest key
      const int first_key = m_block * kBlockM + diag - (int)p.window_left;
      n_block_min = first_key <= 0 ? 0 : first_key / kBlockN;
    }
    n_blocks = max(n_block_max - n_block_min, 0);
  }
  // Varlen grids cover the longest sequence: a tile past the end of its sequence has nothing to do.
  DASH_DEVICE bool outside() const { return varlen && m_block * kBlockM >= seqlen_q; }
};

}  // namespace fwd
