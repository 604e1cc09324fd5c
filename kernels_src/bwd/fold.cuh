// Backward main kernel, folded build (BwdParams::fold, fixed-length batches): the preprocess and postprocess
// passes (bwd/row_passes.cuh) run inside the persistent grid, before and after the visits, so that a backward is
// one launch: the host time of two launches saved on small problems. Grid-wide barriers separate the phases:
//   phase 1  every CTA, all threads: preprocess of Q tiles blockIdx.x, + gridDim.x, ...; barrier 1;
//   phase 2  the visits (producer, MMA warpgroups, dQ writer), unchanged;
//   phase 3  the MMA warpgroups, once their CTA's dQ adds are complete: barrier 2; postprocess of the CTA's tiles.
#pragma once
#include "../bwd_rows.cuh"
#include "../params.cuh"
#include "../ptx/fence.cuh"
#include "../ptx/globaltimer.cuh"
#include "../ptx/named_barrier.cuh"
#include "../ptx/semaphore.cuh"
#include "config.cuh"
#include "error_record.cuh"
#include "row_passes.cuh"

namespace bwd {

// A grid barrier that does not fill in time records [kErrorGridBarrier, cta, counter word, count seen]; the
// counters are words kErrorWordBarrier1, kErrorWordBarrier2, kErrorWordExit of the error record (constants.cuh).
// Its named barriers are kBarDqDone and kBarFold (config.cuh).
constexpr int kMmaThreads = kNumMmaWg * kWgThreads;
static_assert(kMmaThreads >= bwd_rows_pass::kPassThreads, "the MMA warpgroups run the postprocess pass");
// NOTES: with three MMA warpgroups (head dim 192) the passes run on the first kPassThreads of them (tid >= 0).
DASH_DEVICE bool runs_passes(int tid) {
  return kMmaThreads == bwd_rows_pass::kPassThreads || tid < bwd_rows_pass::kPassThreads;
}

// NOTES: co-residency: the persistent grid is at most the co-resident CTAs (the dQ semaphores rely on it too), so
// every CTA reaches each barrier. A wait is abandoned at once once any failure is recorded, and bounded by the
// stall bound (stall_expired: longer than any semaphore wait), so that a semaphore wait that never ends (which
// holds up barrier 2) is the failure reported; the result is then invalid and the host raises. The counters start
// at zero (bwd/error_record.cuh) and count to gridDim.x; CTA 0 zeroes them once all CTAs have counted themselves
// past barrier 2.
DASH_DEVICE void wait_count(const BwdParams& p, int word, int expected) {
  const int* counter = p.error + word;
  const uint64_t t0 = globaltimer_ns();
  while (true) {
    const int seen = ld_acquire_gpu(counter);
    if (seen >= expected) return;
    const bool other_failed = *reinterpret_cast<volatile int*>(p.error) != 0;
    if (other_failed || stall_expired(p, t0)) {
      error_record_claim(p, kErrorGridBarrier, (int)blockIdx.x, word, seen);
      return;
    }
  }
}

// One thread per CTA, after a CTA barrier that orders its CTA's writes before: arrive, then wait for every CTA.
DASH_DEVICE void grid_barrier(const BwdParams& p, int word) {
  __threadfence();
  red_release_gpu_add(p.error + word, 1);
  wait_count(p, word, (int)gridDim.x);
}

// Visits the Q tiles (m_block, h, b) of this CTA: blockIdx.x, + gridDim.x, ...
template <typename F>
DASH_DEVICE void for_my_tiles(const BwdParams& p, F&& f) {
  const int m_blocks = (int)p.num_m_blocks, heads = (int)p.num_heads;
  const int tiles = m_blocks * heads * (int)p.batch;
  for (int t = blockIdx.x; t < tiles; t += gridDim.x) f(t % m_blocks, (t / m_blocks) % heads, t / (m_blocks * heads));
}

// Phase 1, by every thread of the CTA (before the role split): the preprocess pass on 256 of them, then barrier 1.
// NOTES: the proxy fences order phase 1's generic writes (lse_log2, dpsum, dq_accum zeroes) before the TMA loads
// and bulk adds of phase 2, on both sides of the barrier.
DASH_DEVICE void fold_prologue(const BwdParams& p) {
  const int tid = (int)threadIdx.x - kWgThreads;
  if (tid >= 0 && runs_passes(tid)) {
    for_my_tiles(p, [&](int m_block, int h, int b) {
      bwd_rows_pass::preprocess_tile<kHeadDimIO, kBlockM, kHeadDimVIO>(p, m_block, h, b, tid);
    });
  }
  fence_proxy_async_global();
  __syncthreads();
  if (threadIdx.x == 0) grid_barrier(p, kErrorWordBarrier1);
  __syncthreads();
  fence_proxy_async_global();
}

// Each dQ writer warp, after its last add: the CTA's dq_accum writes are complete (bulk_wait), made visible to
// generic reads and released to phase 3 (fold_epilogue's kBarDqDone).
DASH_DEVICE void fold_writer_done(int lane) {
  if (lane == 0) {
    fence_proxy_async_global();
    __threadfence();
  }
  __syncwarp();
  named_barrier_arrive<kBarDqDone, kMmaThreads + 32 * kDqWriters>();
}

// Phase 3, by the MMA warpgroups (tid 0..255); kWithWriter: the CTA had visits, whose dQ writer signals its end.
// CTA 0 then waits until every CTA is past barrier 2, zeroes the counters and, for an eager call, publishes the
// record to the host.
template <bool kWithWriter>
DASH_DEVICE void fold_epilogue(const BwdParams& p, int tid) {
  if constexpr (kWithWriter) named_barrier_sync<kBarDqDone, kMmaThreads + 32 * kDqWriters>();
  if (tid == 0) {
    grid_barrier(p, kErrorWordBarrier2);
    atomicAdd(p.error + kErrorWordExit, 1);
  }
  named_barrier_sync<kBarFold, kMmaThreads>();
  if (runs_passes(tid)) {
    for_my_tiles(p, [&](int m_block, int h, int b) {
      bwd_rows_pass::postprocess_tile<kHeadDimIO, kBlockM>(p, m_block, h, b, tid);
    });
  }
  if (blockIdx.x == 0 && tid == 0) {
    wait_count(p, kErrorWordExit, (int)gridDim.x);
    p.error[kErrorWordBarrier1] = p.error[kErrorWordBarrier2] = p.error[kErrorWordExit] = 0;
    __threadfence();
    if (p.error_host != nullptr) error_record_publish_now(p);
  }
}

}  // namespace bwd
