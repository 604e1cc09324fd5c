#include "common.cuh"
// Attention backward, main kernel, Hopper engine: a persistent CTA walks its visits (bh, n_block, m_block) of
// the schedule table in order. Warp specialized: a producer warp loads tiles by TMA (bwd/producer.cuh), two MMA
// warpgroups (three at head dim 192) compute S^T, P^T, dP^T, dS^T, dV, dK and the dQ partial with wgmma
// (bwd/mainloop.cuh; head dims 192 and 256: bwd/split_step.cuh; head dim 192's 64 x 96 tile: bwd/keys_step.cuh,
// S and dP not transposed) and write dK, dV once per KV tile, and two writer
// warps (alternate visits) add the dQ partials into dq_accum (bwd/dq_reduce.cuh), in each tile's rank order when the
// launch is deterministic. The kernel applies no policy: the table decides everything. A folded backward (p.fold,
// fixed-length batches) also runs the preprocess and postprocess passes (bwd/fold.cuh).
#include "bwd/config.cuh"
#include "bwd/dq_reduce.cuh"
#include "bwd/fold.cuh"
#include "bwd/pipeline.cuh"
#include "bwd/producer.cuh"
#if DASH_HEAD_DIM == 192 && DASH_BLOCK_N == 96
#include "bwd/keys_step.cuh"
#elif DASH_HEAD_DIM == 192 || DASH_HEAD_DIM == 256
#include "bwd/split_step.cuh"
#else
#include "bwd/mainloop.cuh"
#endif
#include "bwd/consume.cuh"
#include "params.cuh"
#include "ptx/setmaxnreg.cuh"
#include "schedule_view.cuh"

using namespace bwd;

extern "C" __global__ void __launch_bounds__(kNumThreads, 1) dash_bwd_main(const __grid_constant__ BwdParams p) {
  extern __shared__ __align__(kSmemAlign) char smem_raw[];
  const bool fold = p.fold != 0;  // NOTES: never with varlen (the host folds fixed-length problems only)
  if (fold) fold_prologue(p);
#if DASH_COMPACT
  const ScheduleView sched(p, blockIdx.x);
#else
  const ScheduleView sched(p.visits, p.rank, p.cta_start, blockIdx.x, (int)(p.num_heads / p.num_heads_kv));
#endif
  if (sched.begin >= sched.end) {
    // NOTES: a CTA without visits still takes part in a folded backward's barrier 2 and postprocess pass.
    if (fold && threadIdx.x >= kWgThreads) fold_epilogue<false>(p, (int)threadIdx.x - kWgThreads);
    return;
  }

  const uint32_t raw = smem_u32(smem_raw);
  const Smem s{(raw + (kSmemAlign - 1u)) & ~(kSmemAlign - 1u)};
  char* smem_generic = smem_raw + (s.base - raw);
  if (threadIdx.x == 0) init_pipeline_barriers(s);
  __syncthreads();

  // NOTES: role branches are warp-uniform (the shuffle tells the compiler so), as setmaxnreg and wgmma need.
  const int wg = __shfl_sync(0xffffffffu, (int)threadIdx.x / kWgThreads, 0);
  const int warp = __shfl_sync(0xffffffffu, (int)threadIdx.x / 32, 0);
  if (wg == 0) {
    setmaxnreg_dec<kProducerRegs>();
    if (warp == 0) {
      if (threadIdx.x == 0) produce(p, sched, s);
    } else if (warp == 1 || (kDqWriters == 2 && warp == 2)) {
      // NOTES: this form, not warp <= kDqWriters: the SASS measured on the H200 (the other compiles differently)
      write_dq(p, sched, s, kDqWriters == 1 ? 0 : warp - 1, threadIdx.x % 32);
      if (fold) fold_writer_done(threadIdx.x % 32);
    }
  } else {
    setmaxnreg_inc<kMmaRegs>();
    consume(p, sched, s, smem_generic, wg - 1, threadIdx.x % kWgThreads);
    if (fold) fold_epilogue<true>(p, (int)threadIdx.x - kWgThreads);
  }
}
