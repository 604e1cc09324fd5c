"""What it costs two CTAs of a cluster to swap a tile of fp32 partials through distributed shared memory once per
step, as a head-dim split of one tile across a CTA pair would for S and dP every visit
(docs/decisions/head-dim-plans.md, "What bounds head dim 256", the design after it). Each CTA of a pair
(``__cluster_dims__(2, 1, 1)``, one pair per two SMs, the whole GPU) sends ``--kb`` of its shared memory into the
other's with one bulk copy (``cp.async.bulk.shared::cluster.shared::cta``, completing on the receiver's mbarrier),
waits for the other's, in one of two runs per size reads what it received (every thread sums its share, as a softmax
would add the partial to its own), then both meet at a cluster barrier before the next step reuses the buffers.
Reported: SM cycles per step (``clock64``, the slowest CTA) and bytes received per cycle per SM. A step of the design
moves 2 x 32 KB per CTA (S and dP partials of a 64 x 128 tile) inside a visit of ~9,000 cycles.

    python benchmarks/dsmem_exchange.py [--kb 16 32 64] [--steps 400] [--json out.json]
"""
from __future__ import annotations

import argparse

# NOTES: the cluster primitives live here, not in kernels_src/ptx/, until a kernel of the package uses them.
SOURCE = r"""
#include "ptx/clock.cuh"
#include "ptx/fence.cuh"
#include "ptx/globaltimer.cuh"
#include "ptx/mbarrier.cuh"

// PTX ISA "Special registers: %cluster_ctarank"; "Data Movement: mapa"; "barrier.cluster"; "cp.async.bulk".
DASH_DEVICE uint32_t cluster_ctarank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}

DASH_DEVICE uint32_t map_to_cta(uint32_t addr, uint32_t rank) {
  uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(addr), "r"(rank));
  return r;
}

DASH_DEVICE void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}

DASH_DEVICE void bulk_copy_to_cta(uint32_t dst, uint32_t src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
               ::"r"(dst), "r"(src), "r"(bytes), "r"(bar) : "memory");
}

// NOTES: no hang: every wait gives up 1 s (globaltimer) after the first step began, sets *error and the CTA's
// failed flag; a failed CTA skips the rest of its steps but still meets every cluster barrier, so its peer (which
// times out alike) is never left waiting there.
extern "C" __global__ void __cluster_dims__(2, 1, 1) dsmem_exchange(int bytes, int steps, int read,
                                                                    long long* cycles, float* sink, int* error) {
  extern __shared__ __align__(128) float smem[];
  __shared__ int failed;
  float* send = smem;
  float* recv = smem + bytes / 4;
  const uint32_t send_addr = (uint32_t)__cvta_generic_to_shared(send);
  const uint32_t recv_addr = (uint32_t)__cvta_generic_to_shared(recv);
  const uint32_t bar = (uint32_t)__cvta_generic_to_shared(recv + bytes / 4);
  for (int i = threadIdx.x; i < bytes / 4; i += blockDim.x) send[i] = 1.f / 1024.f;
  if (threadIdx.x == 0) {
    failed = 0;
    mbar_init(bar, 1);
    mbar_fence_init();
  }
  fence_proxy_async_smem();
  cluster_sync();
  const uint32_t peer = cluster_ctarank() ^ 1u;
  const uint32_t peer_recv = map_to_cta(recv_addr, peer), peer_bar = map_to_cta(bar, peer);
  float acc = 0.f;
  const long long t0 = clock64_cycles();
  const uint64_t deadline = globaltimer_ns() + 1000000000ull;
  for (int step = 0; step < steps; ++step) {
    if (failed) {   // read after a cluster barrier: the same value in every thread of the CTA
      cluster_sync();
      continue;
    }
    if (threadIdx.x == 0) {
      mbar_arrive_expect_tx(bar, (uint32_t)bytes);
      bulk_copy_to_cta(peer_recv, send_addr, (uint32_t)bytes, peer_bar);
    }
    while (!mbar_try_wait(bar, step & 1)) {
      if (globaltimer_ns() > deadline) {
        failed = 1;
        atomicExch(error, 1);
        break;
      }
    }
    if (read) {
      for (int i = threadIdx.x; i < bytes / 4; i += blockDim.x) acc += recv[i];
    }
    cluster_sync();
  }
  if (threadIdx.x == 0) cycles[blockIdx.x] = clock64_cycles() - t0;
  sink[blockIdx.x * blockDim.x + threadIdx.x] = acc;
}
"""


def time_config(kernel, kb, read, steps, repeats) -> dict:
    """Cycles per step (the slowest CTA's, median of ``repeats`` launches after one warm-up) of one configuration."""
    import cupy
    sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
    ctas = sms - sms % 2
    bytes_ = kb * 1024
    cycles = cupy.zeros(ctas, dtype=cupy.int64)
    sink = cupy.zeros(ctas * 128, dtype=cupy.float32)
    error = cupy.zeros(1, dtype=cupy.int32)
    per_step = []
    for r in range(repeats + 1):
        kernel((ctas,), (128,), (cupy.int32(bytes_), cupy.int32(steps), cupy.int32(read), cycles, sink, error),
               shared_mem=2 * bytes_ + 16)
        cupy.cuda.Device().synchronize()
        if int(error[0]):
            raise RuntimeError(f"dsmem_exchange: a copy did not arrive ({kb} KB, read {read})")
        if r:
            per_step.append(int(cycles.max()) / steps)
    step = sorted(per_step)[len(per_step) // 2]
    return dict(kb=kb, read=bool(read), ctas=ctas, steps=steps, cycles_per_step=step,
                bytes_per_cycle_per_sm=bytes_ / step)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kb", nargs="+", type=int, default=[16, 32, 64], help="bytes each CTA sends per step (KB)")
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--compile-only", action="store_true", help="compile the kernel (no GPU) and stop")
    ap.add_argument("--json", default=None)
    opts = ap.parse_args(argv)
    if max(opts.kb) > 112 or min(opts.kb) < 1 or any(kb * 1024 % 16 for kb in opts.kb):
        ap.error("--kb: 1 to 112 (a send and a receive buffer must fit 227 KB of shared memory)")
    from measure import compile_probe, load_probe, write_rows
    cubin = compile_probe(SOURCE, "dsmem_exchange")
    if opts.compile_only:
        print(f"dsmem_exchange: compiled, {len(cubin)} bytes, no spills")
        return
    kernel, _module, gpu_name = load_probe(cubin, "dsmem_exchange", 2 * max(opts.kb) * 1024 + 16)
    rows = []
    for kb in opts.kb:
        for read in (0, 1):
            row = time_config(kernel, kb, read, opts.steps, opts.repeats)
            rows.append(row)
            print(f"{kb:4d} KB each way, read {'yes' if read else 'no ':3s}  {row['cycles_per_step']:8.0f} cycles "
                  f"per step  {row['bytes_per_cycle_per_sm']:6.1f} bytes per cycle and SM", flush=True)
    if opts.json:
        write_rows(opts.json, rows, gpu_name)


if __name__ == "__main__":
    main()
