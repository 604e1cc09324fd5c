// Backward main kernel: bounded waits on the mbarriers of the load pipelines.
#pragma once
#include "../params.cuh"
#include "../ptx/globaltimer.cuh"
#include "../ptx/mbarrier.cuh"
#include "error_record.cuh"

namespace bwd {

// Error code in p.error[0] for a pipeline wait that never ended (the semaphore timeout is 1).
constexpr int kErrorPipelineStall = 2;

// Waits until the phase of the given parity of bar has completed (stage s of a ring is used for the n-th time
// at parity n & 1; producers wait on "empty" barriers with the opposite parity, which a fresh barrier grants).
// NOTES: every such wait ends within a CTA: a stage is held up at most by the dQ writer, whose semaphore waits
// give up after spin_timeout_ns. A wait longer than twice that plus a second is a kernel bug; it is recorded as
// [2, cta, barrier offset, parity] and abandoned (results invalid, the host raises) rather than hanging the GPU.
// __trap() here would be simpler, but ptxas then serializes every wgmma of the kernel and spills (measured).
DASH_DEVICE void wait_phase(const BwdParams& p, uint32_t bar, uint32_t parity) {
  if (mbar_try_wait(bar, parity)) return;
  const uint64_t t0 = globaltimer_ns();
  while (!mbar_try_wait(bar, parity)) {
    if ((int64_t)(globaltimer_ns() - t0) > 2 * p.spin_timeout_ns + 1000000000ll) {
      error_record_claim(p, kErrorPipelineStall, (int)blockIdx.x, (int)(bar % 1024u), (int)parity);
      return;
    }
  }
}

}  // namespace bwd
