"""How many bytes per second the dQ path's bulk copies can move from shared memory into fp32 global memory on this
GPU: one CTA per SM, one thread issuing ``cp.reduce.async.bulk ... add.f32`` (``--op add``, the backward's dQ adds)
or ``cp.async.bulk`` stores (``--op store``, its first visit of a tile) of ``--chunk-kb`` each from ``--in-flight``
staging slots (a slot is reissued once ``wait_group.read`` says it was read, as the dQ writer does), into a region of
``--region-mb`` (inside L2, or beyond it), every CTA on its own chunks. Reported per second (CUDA events) and per SM
clock cycle of the whole GPU (``clock64`` in each CTA), because this kernel runs alone near the boost clock while
the backward runs at the 700 W limit's lower clock, and L2 moves bytes per cycle. An upper bound for the backward's
dQ adds: there its Q and dO loads cross L2 too (as many bytes per visit as the adds at head dim 256). Per visit a 64
x 64 tile at head dim 256 adds 64 KB for 10.5 MFLOP, head dim 128's 80-query tile 40 KB for 13.1 MFLOP
(docs/decisions/head-dim-plans.md, "What bounds head dim 256").

    python benchmarks/dq_reduce_bw.py [--op add store] [--chunk-kb 8 16 32] [--in-flight 1 2 4]
                                      [--region-mb 8 32 512] [--json out.json]
"""
from __future__ import annotations

import argparse
import itertools

SOURCE = r"""
#include "ptx/bulk_reduce.cuh"
#include "ptx/bulk_store.cuh"
#include "ptx/clock.cuh"
#include "ptx/fence.cuh"

template <int kInFlight>
DASH_DEVICE void issue(float* buf, long long slots, int chunk_bytes, int iters, bool add, uint32_t base) {
  const long long chunk_floats = chunk_bytes / 4;
  for (int it = 0; it < iters; ++it) {
    if (it >= kInFlight) bulk_wait_read<kInFlight - 1>();
    const long long slot = ((long long)blockIdx.x + (long long)it * gridDim.x) % slots;
    const uint32_t src = base + (uint32_t)((it % kInFlight) * chunk_bytes);
    if (add) {
      bulk_reduce_add_f32(buf + slot * chunk_floats, src, chunk_bytes);
    } else {
      bulk_store(buf + slot * chunk_floats, src, chunk_bytes);
    }
    bulk_commit();
  }
  bulk_wait<0>();
}

extern "C" __global__ void dq_reduce_bw(float* buf, long long slots, int chunk_bytes, int iters, int in_flight,
                                        int add, long long* cycles) {
  extern __shared__ __align__(128) float staging[];
  for (int i = threadIdx.x; i < chunk_bytes / 4 * in_flight; i += blockDim.x) staging[i] = 1.f / 1024.f;
  fence_proxy_async_smem();
  __syncthreads();
  if (threadIdx.x != 0) return;
  const uint32_t base = (uint32_t)__cvta_generic_to_shared(staging);
  const int64_t t0 = clock64_cycles();
  if (in_flight == 1) issue<1>(buf, slots, chunk_bytes, iters, add != 0, base);
  if (in_flight == 2) issue<2>(buf, slots, chunk_bytes, iters, add != 0, base);
  if (in_flight == 4) issue<4>(buf, slots, chunk_bytes, iters, add != 0, base);
  cycles[blockIdx.x] = clock64_cycles() - t0;
}
"""


# NOTES: at least this much dynamic shared memory per CTA, so that no SM holds two CTAs (half of the 227 KB an SM
# gives a CTA, plus a little) and every SM issues its own stream of copies.
ONE_CTA_PER_SM = 116 * 1024
MAX_SMEM = 227 * 1024


def smem_bytes(chunk_bytes: int, in_flight: int) -> int:
    """A CTA's dynamic shared memory: its staging slots, and at least ONE_CTA_PER_SM."""
    return max(chunk_bytes * in_flight, ONE_CTA_PER_SM)


def time_config(kernel, op, chunk_kb, in_flight, region_mb, iters, repeats) -> dict:
    """GB/s and bytes per SM clock cycle (the whole GPU's) of one configuration: medians of ``repeats`` timed
    launches (CUDA events; the slowest CTA's ``clock64`` cycles) after one warm-up."""
    import cupy
    sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
    chunk = chunk_kb * 1024
    slots = region_mb * 1024 * 1024 // chunk
    buf = cupy.zeros(slots * chunk // 4, dtype=cupy.float32)
    cycles = cupy.zeros(sms, dtype=cupy.int64)
    args = (buf, cupy.int64(slots), cupy.int32(chunk), cupy.int32(iters), cupy.int32(in_flight),
            cupy.int32(op == "add"), cycles)
    times, clocks = [], []
    for r in range(repeats + 1):
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        kernel((sms,), (128,), args, shared_mem=smem_bytes(chunk, in_flight))
        end.record()
        end.synchronize()
        if r:
            times.append(cupy.cuda.get_elapsed_time(start, end) * 1e-3)
            clocks.append(int(cycles.max()))
    seconds, cycles_max = sorted(times)[len(times) // 2], sorted(clocks)[len(clocks) // 2]
    moved = sms * iters * chunk
    return dict(op=op, chunk_kb=chunk_kb, in_flight=in_flight, region_mb=region_mb, ctas=sms, iters=iters,
                ms=seconds * 1e3, gb_per_s=moved / seconds / 1e9, cycles=cycles_max,
                bytes_per_cycle=moved / cycles_max, mhz=cycles_max / seconds / 1e6)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--op", nargs="+", default=["add", "store"], choices=["add", "store"])
    ap.add_argument("--chunk-kb", nargs="+", type=int, default=[8, 16, 32],
                    help="bytes per copy (head dim 256's writer copies 8 KB halves, head dim 128's 20 KB slices)")
    ap.add_argument("--in-flight", nargs="+", type=int, default=[1, 2, 4], choices=[1, 2, 4])
    ap.add_argument("--region-mb", nargs="+", type=int, default=[8, 32, 512])
    ap.add_argument("--iters", type=int, default=400, help="chunks per CTA per launch")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--compile-only", action="store_true", help="compile the kernel (no GPU) and stop")
    ap.add_argument("--json", default=None)
    opts = ap.parse_args(argv)
    if max(opts.chunk_kb) * 1024 * max(opts.in_flight) > MAX_SMEM or min(opts.chunk_kb) < 1:
        ap.error(f"--chunk-kb x --in-flight: the staging must fit {MAX_SMEM // 1024} KB of shared memory")
    from measure import compile_probe, load_probe, write_rows
    cubin = compile_probe(SOURCE, "dq_reduce_bw")
    if opts.compile_only:
        print(f"dq_reduce_bw: compiled, {len(cubin)} bytes, no spills")
        return
    kernel, _module, gpu_name = load_probe(cubin, "dq_reduce_bw", smem_bytes(max(opts.chunk_kb) * 1024,
                                                                             max(opts.in_flight)))
    rows = []
    for op, chunk_kb, in_flight, region_mb in itertools.product(opts.op, opts.chunk_kb, opts.in_flight,
                                                                 opts.region_mb):
        row = time_config(kernel, op, chunk_kb, in_flight, region_mb, opts.iters, opts.repeats)
        rows.append(row)
        print(f"{op:5s} chunk {chunk_kb:3d} KB  in flight {in_flight}  region {region_mb:4d} MB  "
              f"{row['gb_per_s']:8.0f} GB/s  {row['bytes_per_cycle']:7.0f} B per SM clock ({row['mhz']:.0f} MHz)",
              flush=True)
    if opts.json:
        write_rows(opts.json, rows, gpu_name)


if __name__ == "__main__":
    main()
