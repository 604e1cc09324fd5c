// Thread roles shared by the Hopper forward and backward kernels: one producer warpgroup and kNumMmaWg MMA
// warpgroups per CTA, with the register budgets that setmaxnreg hands between them.
#pragma once
#include "common.cuh"

namespace roles {

constexpr int kNumMmaWg = 2;
constexpr int kWgThreads = 128;
constexpr int kNumThreads = kWgThreads * (1 + kNumMmaWg);
constexpr int kEntryRegs = 168;  // what __launch_bounds__(384, 1) gives every thread at entry
constexpr int kProducerRegs = 24, kMmaRegs = 240;
static_assert(kProducerRegs * kWgThreads + kMmaRegs * kWgThreads * kNumMmaWg <= kEntryRegs * kNumThreads,
              "setmaxnreg budgets exceed the CTA's register pool");

}  // namespace roles
