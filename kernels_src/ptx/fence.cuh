// PTX ISA "Parallel Synchronization and Communication: membar / fence" — the generic-to-async proxy fences for
// shared and global memory.
#pragma once
#include "../common.cuh"

// Orders this thread's earlier generic shared-memory writes (st.shared, stmatrix) before later async-proxy reads
// (wgmma operands, bulk copies) that a barrier makes wait for them.
DASH_DEVICE void fence_proxy_async_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// The same for global memory, both ways: generic writes before later TMA / bulk reads and adds, and completed
// bulk writes before later generic reads (a folded backward's phases, bwd/fold.cuh).
DASH_DEVICE void fence_proxy_async_global() { asm volatile("fence.proxy.async.global;\n" ::: "memory"); }

// PTX ISA "membar / fence": fence.acq_rel at gpu scope; after a relaxed read that saw a released value, the
// acquire half of that synchronization (ptx/semaphore.cuh ld_relaxed_gpu).
DASH_DEVICE void fence_acq_rel_gpu() { asm volatile("fence.acq_rel.gpu;\n" ::: "memory"); }
