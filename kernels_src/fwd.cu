#include "common.cuh"
// Attention forward, Hopper engine: one CTA per (m_block, head, batch). Warp specialized: a producer lane loads
// Q once and K, V of each KV tile by TMA (fwd/producer.cuh); two MMA warpgroups, 64 query rows each, compute
// S = Q K^T and O += P V with wgmma and an online softmax, overlapped inside and across warpgroups
// (fwd/mainloop.cuh), and store O and lse (fwd/epilogue.cuh).
#include "fwd/config.cuh"
#include "fwd/epilogue.cuh"
#include "fwd/mainloop.cuh"
#include "fwd/producer.cuh"
#include "params.cuh"
#include "ptx/mbarrier.cuh"
#include "ptx/setmaxnreg.cuh"

using namespace fwd;

extern "C" __global__ void __launch_bounds__(kNumThreads, 1) dash_fwd(const __grid_constant__ FwdParams p) {
  extern __shared__ __align__(kSmemAlign) char smem_raw[];
  const uint32_t raw = smem_u32(smem_raw);
  const Smem s{(raw + (kSmemAlign - 1u)) & ~(kSmemAlign - 1u)};
  const Tile t(p);
  if (t.outside()) return;  // uniform over the CTA, before any barrier
  if (threadIdx.x == 0) {
    mbar_init(s.q_full(), 1);
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

  // NOTES: role branches are warp-uniform (the shuffle tells the compiler so), as setmaxnreg and wgmma need.
  const int wg = __shfl_sync(0xffffffffu, (int)threadIdx.x / kWgThreads, 0);
  if (wg == 0) {
    setmaxnreg_dec<kProducerRegs>();
    if (threadIdx.x == 0) produce(p, s, t);
  } else {
    setmaxnreg_inc<kMmaRegs>();
    const int tid = (int)threadIdx.x % kWgThreads;
    float O[kORegs];
    RowStats st;
    if (t.n_blocks > 0) {
      consume(p, s, t, O, st, wg - 1, tid);
    } else {
#pragma unroll
      for (int i = 0; i < kORegs; ++i) O[i] = 0.f;
      st.max[0] = st.max[1] = neg_inf();
      st.sum[0] = st.sum[1] = 0.f;
    }
    store_output(p, s, t, O, st, wg - 1, tid);
  }
}
