#include "common.cuh"
// Attention forward, Hopper engine: one CTA per (m_block, head, batch), or (persistent launches: causal masks,
// docs/decisions/fwd-launch-order.md) one per SM claiming tiles. Warp specialized: a producer lane loads Q once per
// tile and K, V of each KV tile by TMA (fwd/producer.cuh); two MMA warpgroups, 64 query rows each, compute
// S = Q K^T and O += P V with wgmma and an online softmax, overlapped inside and across warpgroups
// (fwd/mainloop.cuh), and store O and lse (fwd/epilogue.cuh).
#include "fwd/config.cuh"
#include "fwd/epilogue.cuh"
#include "fwd/mainloop.cuh"
#include "fwd/producer.cuh"
#include "params.cuh"
#include "ptx/ld_shared.cuh"
#include "ptx/mbarrier.cuh"
#include "ptx/setmaxnreg.cuh"
#include "ptx/st_shared.cuh"

using namespace fwd;

// Persistent launches: the producer lane claims the CTA's j-th tile (atomically, in launch order) and hands it to
// the MMA warpgroups through slot j % 2 (sched_full / sched_empty); a value >= num_tiles ends every role's loop.
DASH_DEVICE int claim_tile(const FwdParams& p) { return atomicAdd(p.tile_counter, 1); }

DASH_DEVICE void publish_tile(const Smem& s, int j, int linear) {
  mbar_wait(s.sched_empty(j % 2), ((j / 2) & 1) ^ 1);
  st_shared_u32(s.slot(j % 2), (uint32_t)linear);
  mbar_arrive(s.sched_full(j % 2));
}

DASH_DEVICE int read_tile(const Smem& s, int j) {
  mbar_wait(s.sched_full(j % 2), (j / 2) & 1);
  const int linear = (int)ld_volatile_shared_u32(s.slot(j % 2));
  mbar_arrive(s.sched_empty(j % 2));
  return linear;
}

extern "C" __global__ void __launch_bounds__(kNumThreads, 1) dash_fwd(const __grid_constant__ FwdParams p) {
  extern __shared__ __align__(kSmemAlign) char smem_raw[];
  const uint32_t raw = smem_u32(smem_raw);
  const Smem s{(raw + (kSmemAlign - 1u)) & ~(kSmemAlign - 1u)};
  constexpr bool persistent = kPersistent;  // NOTES: the launch sets p.tile_counter (zeroed) and num_tiles
  if (!persistent && Tile(p).outside()) return;  // uniform over the CTA, before any barrier
  if (threadIdx.x == 0) {
    mbar_init(s.q_full(), 1);
    mbar_init(s.q_empty(), kNumMmaWg * kWgThreads);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      mbar_init(s.sched_full(i), 1);
      mbar_init(s.sched_empty(i), kNumMmaWg * kWgThreads);
    }
#pragma unroll
    for (int stage = 0; stage < kStages; ++stage) {
      mbar_init(s.k_full(stage), 1);
      mbar_init(s.k_empty(stage), kNumMmaWg);
      mbar_init(s.v_full(stage), 1);
      mbar_init(s.v_empty(stage), kNumMmaWg);
    }
    mbar_fence_init();
  }
  __syncthreads();

  // NOTES: role branches are warp-uniform (the shuffle tells the compiler so), as setmaxnreg and wgmma need. A CTA
  // runs one tile, or in a persistent launch the tiles it claims; every role counts the same things: the K / V ring
  // continues across tiles (kv: KV tiles loaded before this tile), Q is loaded once per tile with KV tiles (every
  // tile when persistent; loads: its q_full phase), and each tile's epilogue completes one q_empty phase (done),
  // which the next Q load waits for: the O staging shares Q's shared memory. A parity wait tells apart only two
  // phases, so a persistent CTA loads Q for every tile, also one without KV tiles: then the producer, before its Q
  // load of tile d, has seen phase d - 2 complete and the MMA warpgroups cannot complete phase d before that load,
  // so q_empty stands at phase d - 1 or d (without it, tiles without KV tiles let the producer run two phases ahead
  // of the epilogues; a protocol model with random interleavings found that).
  const int wg = __shfl_sync(0xffffffffu, (int)threadIdx.x / kWgThreads, 0);
  int kv = 0, loads = 0, done = 0;
  if (wg == 0) {
    setmaxnreg_dec<kProducerRegs>();
    if (threadIdx.x != 0) return;
    int linear = persistent ? claim_tile(p) : 0;
    for (int j = 0;; ++j) {
      if (persistent) publish_tile(s, j, linear);
      if (persistent ? linear >= (int)p.num_tiles : j > 0) break;
      const Tile t = persistent ? Tile(p, linear) : Tile(p);
      if (!t.outside()) {
        if (persistent || t.n_blocks > 0) produce(p, s, t, kv, done);
        kv += t.n_blocks;
        ++done;
      }
      if (persistent) linear = claim_tile(p);
    }
  } else {
    setmaxnreg_inc<kMmaRegs>();
    const int tid = (int)threadIdx.x % kWgThreads;
    for (int j = 0;; ++j) {
      const int linear = persistent ? read_tile(s, j) : 0;
      if (persistent ? linear >= (int)p.num_tiles : j > 0) break;
      const Tile t = persistent ? Tile(p, linear) : Tile(p);
      if (t.outside()) continue;
      float O[kORegs];
      RowStats st;
      if (t.n_blocks > 0) {
        consume(p, s, t, O, st, wg - 1, tid, kv, loads);
        kv += t.n_blocks;
        ++loads;
      } else {
        if (persistent) mbar_wait(s.q_full(), loads++ & 1);   // the Q load that keeps q_empty's phases per tile
#pragma unroll
        for (int i = 0; i < kORegs; ++i) O[i] = 0.f;
        st.max[0] = st.max[1] = neg_inf();
        st.sum[0] = st.sum[1] = 0.f;
      }
      store_output(p, s, t, O, st, wg - 1, tid);
      mbar_arrive(s.q_empty());
    }
  }
}
