// Thread roles shared by the Hopper forward and backward kernels: one producer warpgroup and kNumMmaWg MMA
// warpgroups per CTA, with the register budgets that setmaxnreg hands between them.
#pragma once
#include "common.cuh"
#include "constants.cuh"

namespace roles {

constexpr int kNumMmaWg = 2;
constexpr int kWgThreads = 128;
constexpr int kNumThreads = kWgThreads * (1 + kNumMmaWg);
static_assert(kNumThreads == kMainThreads, "constants.cuh: kMainThreads is a producer and kNumMmaWg MMA warpgroups");
constexpr int kEntryRegs = 168;  // what __launch_bounds__(384, 1) gives every thread at entry
#if DASH_COMPACT
// NOTES: compact-table backward builds: the dQ writer counts ranks (compact_view.cuh) and the producer looks one
// visit ahead through the records, which does not fit in 24 registers (52 bytes of spills), nor in 40 under
// NVRTC 13.0 (fp16 d64 det: 68 bytes), nor with two dQ writer warps in 48 (20 bytes); the MMA warpgroups give up
// 16 each, which uses the whole pool.
constexpr int kProducerRegs = 56, kMmaRegs = 224;
#else
constexpr int kProducerRegs = 24, kMmaRegs = 240;
#endif
static_assert(kProducerRegs * kWgThreads + kMmaRegs * kWgThreads * kNumMmaWg <= kEntryRegs * kNumThreads,
              "setmaxnreg budgets exceed the CTA's register pool");

}  // namespace roles
