// The eager backward's error record around the main kernel: zeroed by preprocess, published to the host by
// postprocess (BwdParams::error_host). Both run in CTA (0, 0, 0), thread 0, before any early return.
#pragma once
#include "../params.cuh"

// NOTES: stream order makes this safe without atomics: the main kernel's writes to p.error (bwd/dq_reduce.cuh,
// bwd/pipeline.cuh) happen after preprocess's zeroes and are complete before postprocess starts. The host zeroes
// error_host[0] before the launch and reads the fields only after seeing error_host[0] == 1, which
// __threadfence_system orders after them.
DASH_DEVICE bool error_record_thread() {
  return threadIdx.x == 0 && blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0;
}

DASH_DEVICE void error_record_reset(const BwdParams& p) {
  if (p.error_host != nullptr && error_record_thread()) {
    *reinterpret_cast<int4*>(p.error) = make_int4(0, 0, 0, 0);
  }
}

DASH_DEVICE void error_record_publish(const BwdParams& p) {
  if (p.error_host != nullptr && error_record_thread()) {
    const volatile int32_t* record = p.error;
    volatile int32_t* host = p.error_host;
#pragma unroll
    for (int i = 0; i < 4; ++i) host[1 + i] = record[i];
    __threadfence_system();
    host[0] = 1;
  }
}
