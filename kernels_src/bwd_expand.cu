#include "common.cuh"
// Backward schedule expansion on the GPU: the per-visit table (visits, rank) of a schedule given as compact
// per-column records (DASH_COMPACT view, compact_view.cuh), so that the host builds and uploads only the records
// (O(columns)) and the main kernel still reads per-visit rows (its fast path: no rank counting in the dQ writer).
// Grid (schedule CTAs, chunks): the warps of the chunks of CTA c split its KV-head visits round-robin; each warp
// walks them in increasing order with its own cursor and writes rows cta_start[c] + v (c, bh, n_block, m_block)
// and rank[cta_start[c] + v], the same values as the compact main kernel computes per visit.
#include "constants.cuh"
#include "params.cuh"
#include "schedule_view.cuh"

#if !DASH_COMPACT
#error "bwd_expand reads compact records: build it with DASH_COMPACT=1"
#endif

constexpr int kExpandThreads = kAuxThreads;
#ifdef DASH_NUM_THREADS
static_assert(DASH_NUM_THREADS == kExpandThreads, "launched with 256 threads");
#endif

// NOTES: the compact view's rank_of is a warp reduction: the 32 lanes of a warp walk the same visits together and
// lane 0 stores. p.visits and p.rank are the outputs here (the main kernel's inputs, hence const in BwdParams);
// p.cta_start (num_ctas + 1,) is the host's prefix sum of the CTAs' visit counts.
extern "C" __global__ void __launch_bounds__(kExpandThreads, 1) dash_bwd_expand(const __grid_constant__ BwdParams p) {
  const int cta = blockIdx.x;
  const ScheduleView sched(p, cta);
  const int g = sched.group_size;
  const int64_t kv_visits = sched.end / g;
  const int warps = kExpandThreads / 32;
  const int64_t stride = (int64_t)gridDim.y * warps;
  const int lane = threadIdx.x % 32;
  int4* visits = reinterpret_cast<int4*>(const_cast<int32_t*>(p.visits));
  int32_t* rank = const_cast<int32_t*>(p.rank);
  const int64_t row0 = p.cta_start[cta];
  for (int64_t iv = (int64_t)blockIdx.y * warps + threadIdx.x / 32; iv < kv_visits; iv += stride) {
    for (int j = 0; j < g; ++j) {
      const int64_t v = iv * g + j;
      const Visit w = sched.visit(v);
      const int r = sched.rank_of(v);
      if (lane == 0) {
        visits[row0 + v] = make_int4(cta, w.bh, w.n_block, w.m_block);
        rank[row0 + v] = r;
      }
    }
  }
}
