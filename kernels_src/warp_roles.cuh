// Thread roles shared by the Hopper forward and backward kernels: one producer warpgroup and kNumMmaWg MMA
// warpgroups per CTA, with the register budgets that setmaxnreg hands between them.
#pragma once
#include "common.cuh"
#include "constants.cuh"

#ifndef DASH_NUM_MMA_WG
#define DASH_NUM_MMA_WG 2
#endif

namespace roles {

// NOTES: two MMA warpgroups everywhere but the head-dim-192 backward's three (DASH_NUM_MMA_WG=3, 512 threads).
constexpr int kNumMmaWg = DASH_NUM_MMA_WG;
constexpr int kWgThreads = 128;
constexpr int kNumThreads = kWgThreads * (1 + kNumMmaWg);
static_assert(kNumThreads == (kNumMmaWg == 2 ? kMainThreads : kMainThreads3Mma),
              "constants.cuh: kMainThreads (kMainThreads3Mma) is a producer and two (three) MMA warpgroups");
constexpr int kEntryRegs = 65536 / kNumThreads / 8 * 8;  // what __launch_bounds__(kNumThreads, 1) gives at entry
#if DASH_COMPACT
// NOTES: compact-table backward builds: the dQ writer counts ranks (compact_view.cuh) and the producer looks one
// visit ahead through the records, which does not fit in 24 registers (52 bytes of spills), nor in 40 under
// NVRTC 13.0 (fp16 d64 det: 68 bytes), nor with two dQ writer warps in 48 (20 bytes); the MMA warpgroups give up
// 16 each, which uses the whole pool (three MMA warpgroups: 152 each).
constexpr int kProducerRegs = 56, kMmaRegs = kNumMmaWg == 2 ? 224 : 152;
#else
// NOTES: three MMA warpgroups leave the producer warpgroup 32, the pool's rest.
constexpr int kProducerRegs = kNumMmaWg == 2 ? 24 : 32, kMmaRegs = kNumMmaWg == 2 ? 240 : 160;
#endif
static_assert(kProducerRegs * kWgThreads + kMmaRegs * kWgThreads * kNumMmaWg <= kEntryRegs * kNumThreads,
              "setmaxnreg budgets exceed the CTA's register pool");

}  // namespace roles
