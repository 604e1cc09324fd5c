// PTX ISA "Parallel Synchronization and Communication: membar / fence" — the generic-to-async proxy fence for
// shared memory.
#pragma once
#include "../common.cuh"

// Orders this thread's earlier generic shared-memory writes (st.shared, stmatrix) before later async-proxy reads
// (wgmma operands, bulk copies) that a barrier makes wait for them.
DASH_DEVICE void fence_proxy_async_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
