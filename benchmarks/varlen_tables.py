"""Build time of compact varlen schedules (cupy_dash.schedule.varlen): 16k tokens in B random-length sequences
(lengths summing to --tokens), every policy and auto, causal and full, for each GQA group size; median of
--repeat calls after one warm-up, of the build, the validator, expand (the per-visit table of auto's plan, which
the per-visit varlen backward reads) and the packing of the compact arrays as they are uploaded (records plus
per-Q-tile column table, cupy_dash.schedule.varlen_pack) with their bytes. Host only (the upload, one pinned copy,
needs a GPU).

    python benchmarks/varlen_tables.py [--tokens 16384] [--heads 16] [--batches 1 4 16 64] [--groups 1 4]
                                       [--repeat 50]
"""
import argparse
import itertools
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from cupy_dash import schedule  # noqa: E402
from cupy_dash.schedule import varlen_pack  # noqa: E402


def lengths(tokens, batch, rng):
    cuts = np.sort(rng.choice(np.arange(1, tokens), batch - 1, replace=False))
    return np.diff(np.concatenate([[0], cuts, [tokens]]))


def median_ms(fn, repeat):
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * float(np.median(times))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16, 64])
    ap.add_argument("--groups", type=int, nargs="+", default=[1, 4], help="query heads per KV head")
    ap.add_argument("--block-m", type=int, default=64)
    ap.add_argument("--block-n", type=int, default=128)
    ap.add_argument("--num-sms", type=int, default=132)
    ap.add_argument("--repeat", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    print("| B | g | mask | columns | visits | " + " | ".join(("auto",) + schedule.AUTO_CANDIDATES)
          + " | auto picks | validate | expand | tables | packed arrays | compact upload |")
    print("|---" * (12 + len(schedule.AUTO_CANDIDATES)) + "|")
    for batch in a.batches:
        lens = lengths(a.tokens, batch, rng)
        for group, causal in itertools.product(a.groups, (True, False)):
            kw = dict(block_m=a.block_m, block_n=a.block_n, heads=a.heads, causal=causal, num_sms=a.num_sms,
                      group_size=group)
            cells = []
            for policy in ("auto",) + schedule.AUTO_CANDIDATES:
                cells.append(median_ms(lambda: schedule.build_varlen(policy, lens, lens, **kw), a.repeat))
            plan = schedule.build_varlen("auto", lens, lens, **kw)
            check = median_ms(plan.validate, a.repeat)
            expand = median_ms(plan.expand, a.repeat)
            pack = lambda: varlen_pack.pack(  # noqa: E731
                plan.records, plan.cta_columns, plan.cta_col_start, plan.seg_col_start, plan.n_first,
                plan.num_m_blocks, plan.seqlens_q, plan.seqlens_k, a.heads // group, group, False)
            arrays = median_ms(pack, a.repeat)
            upload = pack()[0].nbytes
            print(f"| {batch} | {group} | {'causal' if causal else 'full'} | {plan.num_columns} | {plan.num_visits} | "
                  + " | ".join(f"{t:.3f}" for t in cells)
                  + f" | {plan.policy} | {check:.3f} | {expand:.3f} | {plan.nbytes / 1024:.0f} KB | {arrays:.3f} | "
                  f"{upload / 1024:.0f} KB |")


if __name__ == "__main__":
    main()
