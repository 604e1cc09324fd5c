// The backward's error record: claimed by the main kernel's first failure (error_record_claim); for eager calls
// zeroed by preprocess and published to the host by postprocess (BwdParams::error_host), both in CTA (0, 0, 0),
// thread 0, before any early return; in a folded backward (bwd/fold.cuh) published by the main kernel's CTA 0
// once every CTA has passed its last grid barrier.
#pragma once
#include "../constants.cuh"
#include "../params.cuh"
#include "../ptx/globaltimer.cuh"

// NOTES: a record is kErrorRecordWords int32 (constants.cuh): [0..3] the failure (0 = none; codes kError*:
// bwd/dq_reduce.cuh, bwd/pipeline.cuh, bwd/fold.cuh), [4..6] the counters of a folded backward's grid barriers, [7]
// unused. Stream order makes the unfolded kernels safe without atomics: the main kernel's writes to p.error happen
// after preprocess's zeroes and are complete before postprocess starts. The host zeroes error_host[0] before the launch
// and reads the fields only after seeing error_host[0] == 1, which __threadfence_system orders after them. A folded
// backward does not zero [0..3]: a record is zero when its call starts (zeroed at allocation, untouched by a call that
// succeeds; the host never reuses a failed one) and the kernel leaves [4..6] at zero when it ends.
static_assert(kErrorFailureWords == 4, "error_record_reset zeroes the failure as one int4");
static_assert(kErrorWordBarrier1 >= kErrorFailureWords && kErrorWordBarrier2 >= kErrorFailureWords &&
                  kErrorWordExit >= kErrorFailureWords && kErrorWordExit < kErrorRecordWords,
              "the fold's counters lie after the failure, inside the record");

DASH_DEVICE bool error_record_thread() {
  return threadIdx.x == 0 && blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0;
}

DASH_DEVICE void error_record_reset(const BwdParams& p) {
  if (p.error_host != nullptr && error_record_thread()) {
    *reinterpret_cast<int4*>(p.error) = make_int4(0, 0, 0, 0);
  }
}

// Records failure ``code`` with its three details, unless another failure was recorded first (the first one
// wins: the host reports it).
DASH_DEVICE void error_record_claim(const BwdParams& p, int code, int a, int b, int c) {
  if (atomicCAS(p.error, 0, code) == 0) {
    p.error[1] = a;
    p.error[2] = b;
    p.error[3] = c;
  }
}

// Copies the failure fields to the host mirror, then marks the call finished. One thread, eager calls only.
DASH_DEVICE void error_record_publish_now(const BwdParams& p) {
  const volatile int32_t* record = p.error;
  volatile int32_t* host = p.error_host;
#pragma unroll
  for (int i = 0; i < kErrorFailureWords; ++i) host[1 + i] = record[i];
  __threadfence_system();
  host[0] = 1;
}

DASH_DEVICE void error_record_publish(const BwdParams& p) {
  if (p.error_host != nullptr && error_record_thread()) error_record_publish_now(p);
}

// Whether a wait begun at t0 (%globaltimer ns) has outlasted the stall bound of the waits that only a semaphore
// wait can hold up: kStallTimeoutFactor * spin_timeout_ns + kStallSlackNs (constants.cuh).
DASH_DEVICE bool stall_expired(const BwdParams& p, uint64_t t0) {
  return (int64_t)(globaltimer_ns() - t0) > kStallTimeoutFactor * p.spin_timeout_ns + kStallSlackNs;
}
