// Constants that the kernels and the host both depend on, each defined here once. cupy_dash/cuda/params.py parses
// this file into cupy_dash.cuda.params.CONSTANTS under the same names, so every declaration is one line
// `constexpr int kName = <integer literal>;` (comments aside): no expressions, no other declarations.
#pragma once

// The backward's error record (bwd/error_record.cuh, cupy_dash/cuda/errors.py): kErrorRecordWords int32, [0] the
// failure code (0 = none), [1..3] its details, [4..6] the CTA counters of a folded backward's grid barriers
// (bwd/fold.cuh). The host mirror of an eager call's record is as long: [0] = 1 once the call finished, then the
// record's first kErrorFailureWords words.
constexpr int kErrorRecordWords = 8;
constexpr int kErrorFailureWords = 4;
constexpr int kErrorWordBarrier1 = 4;  // CTAs past grid barrier 1
constexpr int kErrorWordBarrier2 = 5;  // CTAs at grid barrier 2
constexpr int kErrorWordExit = 6;      // CTAs past grid barrier 2

// Failure codes (record word 0) and their details (words 1..3).
constexpr int kErrorSemaphoreTimeout = 1;  // a dQ semaphore wait (bwd/dq_reduce.cuh): visit, rank awaited, value seen
constexpr int kErrorPipelineStall = 2;     // a load-pipeline wait (bwd/pipeline.cuh): cta, barrier offset, parity
constexpr int kErrorGridBarrier = 3;       // a folded backward's grid barrier (bwd/fold.cuh): cta, word, count seen

// A wait that only a semaphore wait can hold up (an mbarrier of the load pipelines, a grid barrier) gives up after
// kStallTimeoutFactor * spin_timeout_ns + kStallSlackNs.
constexpr int kStallTimeoutFactor = 2;
constexpr int kStallSlackNs = 1000000000;

// Threads per CTA: the Hopper kernels (warp_roles.cuh: a producer and two MMA warpgroups), and the backward's row
// passes and table expansion (bwd/row_passes.cuh, bwd_expand.cu).
constexpr int kMainThreads = 384;
constexpr int kMainThreads3Mma = 512;  // the head-dim-192 backward: a producer and three MMA warpgroups
constexpr int kAuxThreads = 256;

// Dynamic shared memory of the Hopper kernels (SmemLayout of fwd/config.cuh and bwd/config.cuh; the same sums in
// cupy_dash/cuda/kernels.py, which the kernels static_assert through DASH_SMEM_BYTES).
constexpr int kSmemAlign = 1024;      // tiles start on 1024-byte boundaries (128B swizzle); as much slack is added
constexpr int kSmemMaxBytes = 232448;  // 227 KB: the most a CTA can have on sm_90
constexpr int kMbarrierBytes = 8;
constexpr int kVisitSlotBytes = 16;    // bwd::VisitSlot, one per Q stage
constexpr int kFwdKvStages = 2;        // forward K and V buffers (DASH_KV_STAGES overrides it for tile sweeps)
constexpr int kBwdStages = 2;          // backward Q (+ lse_log2), dO (+ dpsum) and dS buffers
constexpr int kBwdKStages = 2;         // backward K buffers

// The backward's debug timeline (bwd/timeline.cuh): int64 stamps per visit, 4 of the CTA, 10 per MMA warpgroup and
// 2 of the producer.
constexpr int kTimelineCols = 26;
