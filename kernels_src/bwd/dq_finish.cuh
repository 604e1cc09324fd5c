// Backward main kernel, dQ finisher warp (warp 3 of the producer warpgroup; deterministic launches whose tables count
// each dQ tile's visits, BwdParams::dq_ranks, and give each CTA its list of tiles to convert): for each tile of its
// list, waits until the tile's semaphore counts all of the tile's visits (the last add complete), then writes dq =
// elem_t(dq_accum * softmax_scale) for the tile's rows, as the postprocess pass would (bwd/row_passes.cuh), while
// the CTA's visits go on. The postprocess launch is then not made: the last CTA to end hands the error record to
// the host instead (finish_exit).
#pragma once
#include "../params.cuh"
#include "../ptx/cvt.cuh"
#include "../ptx/fence.cuh"
#include "../ptx/globaltimer.cuh"
#include "../ptx/semaphore.cuh"
#include "config.cuh"
#include "error_record.cuh"
#include "fold.cuh"
#include "row_passes.cuh"

namespace bwd {

// Deterministic mode, one thread: waits until all `count` dQ partials of a tile have been added (its semaphore,
// released by the dQ writer after the add completed, reads count). Returns false (the failure recorded, first
// failure only) once another CTA has failed, on an impossible value, or past the stall bound.
// NOTES: the wait may start long before the tile completes (the finisher waits for its next tile from the start),
// so its bound is the stall bound of waits that only semaphore waits can hold up, as the fold's grid barriers: every
// other wait of the kernel is bounded and records a failure, which ends this one at once. The warp polls nearly all
// the time, so its reads are relaxed (an acquire read invalidates the SM's L1 at every poll, CCTL.IVALL) and it
// sleeps ~0.5 µs between them; the fence after the value is seen is the acquire.
DASH_DEVICE bool wait_for_tile(const BwdParams& p, const int* sem, int tile, int count) {
  // NOTES: time in units of 1024 ns, 32 bits (wraps after 73 minutes; a longer bound is clamped to that): the warp
  // has 24 registers
  const uint64_t units = (kStallTimeoutFactor * p.spin_timeout_ns + kStallSlackNs) >> 10;
  const uint32_t bound = units > 0xffffffffull ? 0xffffffffu : (uint32_t)units;
  const uint32_t t0 = (uint32_t)(globaltimer_ns() >> 10);
  while (true) {
    const int seen = ld_relaxed_gpu(sem);
    if (seen == count) {
      fence_acq_rel_gpu();
      return true;
    }
    const bool other_failed = ld_relaxed_gpu(p.error) != 0;
    if (other_failed || seen > count || (uint32_t)(globaltimer_ns() >> 10) - t0 > bound) {
      error_record_claim(p, kErrorDqFinish, tile, count, seen);
      return false;
    }
    __nanosleep(512);
  }
}

// One dQ tile by the 32 lanes: dq rows [0, rows) of the tile (rows of the sequence from the tile's first; dq row
// stride `stride` elements) from the tile's fp32 sums `acc`. Float4 f of the tile is registers 4c .. 4c + 3 of MMA
// thread t of slice f / kSliceVecs (bwd/dq_accum_layout.cuh: c = f % kSliceVecs / 128, t = f % 128): rows r, r + 8
// by columns x, x + 1 of its piece, r = 16 (t / 32) + t % 32 / 4, x = 8 c + 2 (t % 4); in the transposed plans
// the piece's rows are head-dim columns and its columns queries. A warp's loads read 512 contiguous bytes.
// NOTES: the rounding is postprocess_tile's (pack_elem2 of the scaled fp32 sum), so the bits are the same. 32-bit
// offsets within the tile's rows: the host finishes only where kBlockM rows of dq span less than 2^31 elements. One
// load in flight per lane: unrolled further the loop spilled under NVRTC 13.5 (24 registers).
DASH_DEVICE void finish_tile(const float4* acc, elem_t* dq, int stride, int rows, float scale, int lane) {
#pragma unroll 1
  for (int f = lane; f < DqLayout::kTileVecs; f += 32) {
    const float4 a = __ldcg(acc + f);
    const int slice = f / DqLayout::kSliceVecs, c = f % DqLayout::kSliceVecs / 128, t = f % 128;
    const int r = 16 * (t / 32) + t % 32 / 4, x = 8 * c + 2 * (t % 4);
    if constexpr (DqLayout::kTransposed) {
      const int col = 64 * slice + r;  // head-dim column; queries x (.x, .z) and x + 1 (.y, .w)
      const uint32_t lo = pack_elem2(a.x * scale, a.y * scale), hi = pack_elem2(a.z * scale, a.w * scale);
      if (x < rows) {
        if (col < kHeadDimIO) dq[x * stride + col] = (elem_t)(lo & 0xffffu);
        if (col + 8 < kHeadDimIO) dq[x * stride + col + 8] = (elem_t)(hi & 0xffffu);
      }
      if (x + 1 < rows) {
        if (col < kHeadDimIO) dq[(x + 1) * stride + col] = (elem_t)(lo >> 16);
        if (col + 8 < kHeadDimIO) dq[(x + 1) * stride + col + 8] = (elem_t)(hi >> 16);
      }
    } else {
      const int row = DqLayout::row0(slice) + r, col = DqLayout::col0(slice) + x;
      if (col < kHeadDimIO) {
        if (row < rows) *reinterpret_cast<uint32_t*>(dq + row * stride + col) = pack_elem2(a.x * scale, a.y * scale);
        if (row + 8 < rows) {
          *reinterpret_cast<uint32_t*>(dq + (row + 8) * stride + col) = pack_elem2(a.z * scale, a.w * scale);
        }
      }
    }
  }
}

// NOTES: fixed-length launches only (the host's choice): tile t = bh num_m_blocks + m_block has semaphore and count
// at t and scratch rows from bh seqlen_q_rounded (bwd_rows.cuh). The CTA converts the tiles of its finish list (the
// host's, cupy_dash/cuda/device_tables.py finish_lists: the tiles dealt evenly over the CTAs in the order they
// complete), each once it is complete, whichever CTA added last. The fence after the semaphore's value is seen
// orders the reads after the writer's completed bulk adds (bulk_wait, then the release), the proxy fence the async
// proxy's writes before them as fold.cuh does, and the loads bypass L1 (ld.global.cg).
DASH_DEVICE void finish_dq(const BwdParams& p, int lane) {
  const int64_t end = __ldg(p.finish_start + 2 * blockIdx.x + 1);
  for (int64_t i = __ldg(p.finish_start + 2 * blockIdx.x); i < end; ++i) {
    const int t = __ldg(p.finish_tiles + i);
    bool ok = true;
    if (lane == 0) ok = wait_for_tile(p, p.dq_semaphore + t, t, __ldg(p.dq_ranks + t));
    if (!__shfl_sync(0xffffffffu, ok, 0)) return;
    __syncwarp();  // orders the other lanes' loads after lane 0's acquire (a shuffle orders no memory)
    fence_proxy_async_global();
    const int m_blocks = (int)p.num_m_blocks, bh = t / m_blocks, row0 = (t - bh * m_blocks) * kBlockM;
    const int b = bh / (int)p.num_heads, h = bh - b * (int)p.num_heads;
    finish_tile(reinterpret_cast<const float4*>(p.dq_accum + (bh * p.seqlen_q_rounded + row0) * kHeadDim),
                p.dq + b * p.dq_stride.batch + row0 * p.dq_stride.row + h * p.dq_stride.head, (int)p.dq_stride.row,
                (int)p.seqlen_q - row0, p.softmax_scale, lane);
  }
}

// The MMA warpgroups (tid 0 .. kMmaThreads - 1), after their CTA's last visit: the tiles of the CTA's list that
// complete last (finish_tiles[finish_start[2 cta + 1] .. finish_start[2 cta + 2]), the host's tail), each converted
// by the postprocess pass's 256 threads once thread 0 has seen it complete, instead of by the one warp with one load
// in flight that the CTA's earlier tiles have (the tail is what the kernel's end waits for).
// NOTES: kBarFold is free (a launch finishes or folds, never both). After a failed wait the tile is converted all
// the same: the call's result is discarded (the host raises), and no wait is left unbounded.
DASH_DEVICE void finish_tail(const BwdParams& p, int tid) {
  const int64_t end = __ldg(p.finish_start + 2 * blockIdx.x + 2);
  for (int64_t i = __ldg(p.finish_start + 2 * blockIdx.x + 1); i < end; ++i) {
    const int t = __ldg(p.finish_tiles + i);
    if (tid == 0) {
      wait_for_tile(p, p.dq_semaphore + t, t, __ldg(p.dq_ranks + t));
      fence_proxy_async_global();
    }
    named_barrier_sync<kBarFold, kMmaThreads>();
    const int m_blocks = (int)p.num_m_blocks, bh = t / m_blocks, b = bh / (int)p.num_heads;
    if (runs_passes(tid)) {
      bwd_rows_pass::postprocess_tile<kHeadDimIO, kBlockM>(p, t - bh * m_blocks, bh - b * (int)p.num_heads, b, tid);
    }
  }
}

// One thread of every CTA of a finishing launch, after its CTA's last work (the finisher's kBarFinish, or at once in
// a CTA without visits, which has no tiles to convert): counts the CTA out; the last one zeroes the count and
// publishes the error record to the host (as postprocess does otherwise). A call without a host mirror (captured in
// a CUDA graph) publishes nothing and counts nothing.
// NOTES: the count is the fold's exit word (bwd/error_record.cuh; a launch either folds or finishes, never both),
// zero when a call starts and left zero when it ends. The fences around the add order every CTA's record writes
// before the last CTA's reads. Captured calls beyond errors.GRAPH_RECORDS share a record, and kernels that share
// one may run at once: they must not count on its exit word.
DASH_DEVICE void finish_exit(const BwdParams& p) {
  if (p.error_host == nullptr) return;
  __threadfence();
  if (atomicAdd(p.error + kErrorWordExit, 1) == (int)gridDim.x - 1) {
    __threadfence();
    p.error[kErrorWordExit] = 0;
    error_record_publish_now(p);
  }
}

}  // namespace bwd
