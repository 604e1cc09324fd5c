"""Compact (per-column) schedule tables on the host: record bytes, build time, check time, and (``--expand``) the
per-visit view compared with schedule.build's table plus the dQ writer's rank loop on sampled visits.
Run it under ``/usr/bin/time -v`` for the process's peak memory (CPU only, no GPU)::

    /usr/bin/time -v python benchmarks/compact_tables.py --seqlen 131072 --heads 32 --causal
    python benchmarks/compact_tables.py --seqlen 131072 --heads 32 --causal --policy symmetric_shift --expand
    /usr/bin/time -v python benchmarks/compact_tables.py --seqlen 256 --heads 1024 --block-m 64 --all-policies
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from cupy_dash import schedule  # noqa: E402
from cupy_dash.cli import compact as cli_compact  # noqa: E402
from cupy_dash.schedule import auto, compact  # noqa: E402


def clear_caches():
    compact._build_compact.cache_clear()
    auto._auto_choice.cache_clear()
    auto._build.cache_clear()


def timed_build(policy, kw, repeat):
    """(first call's seconds, best of ``repeat`` cache-cleared calls, plan)."""
    times = []
    for _ in range(repeat):
        clear_caches()
        t0 = time.perf_counter()
        plan = schedule.build_compact(policy, **kw)
        times.append(time.perf_counter() - t0)
    return times[0], min(times), plan


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seqlen", type=int, required=True)
    p.add_argument("--seqlen-k", type=int, default=None)
    p.add_argument("--heads", type=int, required=True, help="(batch, query head) pairs")
    p.add_argument("--group-size", type=int, default=1)
    p.add_argument("--block-m", type=int, default=64)
    p.add_argument("--block-n", type=int, default=128)
    p.add_argument("--causal", action="store_true")
    p.add_argument("--num-sms", type=int, default=132)
    p.add_argument("--policy", default="auto")
    p.add_argument("--all-policies", action="store_true")
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--expand", action="store_true", help="also expand, compare with schedule.build and sample "
                   "rank_of (needs the per-visit memory)")
    p.add_argument("--samples", type=int, default=200_000)
    args = p.parse_args(argv)
    kw = dict(seqlen_q=args.seqlen, seqlen_k=args.seqlen_k or args.seqlen, block_m=args.block_m,
              block_n=args.block_n, num_heads=args.heads, group_size=args.group_size, causal=args.causal,
              num_sms=args.num_sms)
    policies = ("auto",) + cli_compact.POLICY_ORDER if args.all_policies else (args.policy,)
    for policy in policies:
        first, best, plan = timed_build(policy, kw, args.repeat)
        t0 = time.perf_counter()
        bounds = plan.scan_bounds if plan.rank_rule == 0 else None
        bounded = time.perf_counter() - t0
        t0 = time.perf_counter()
        plan.validate()
        checked = time.perf_counter() - t0
        scan = cli_compact.scan_figures(plan, max_visits=1 << 62)     # every visit
        how = f" ({plan.auto_method})" if policy == "auto" else ""
        ranks = ("rank rule: closed form" if scan is None else
                 f"records compared per visit: window mean {scan[1][0]:.0f} max {scan[1][1]}, full count mean "
                 f"{scan[0][0]:.0f} max {scan[0][1]}")
        print(f"{policy}{how} -> {plan.policy}: {plan.num_columns} columns, {plan.num_visits} visits, "
              f"{plan.num_ctas} CTAs; tables {plan.nbytes} B ({plan.nbytes / plan.num_columns:.1f} B/column; "
              f"per-visit table {plan.num_visits * cli_compact.ROW_BYTES / 1e6:.1f} MB); build first "
              f"{first * 1e3:.3f} ms, best of {args.repeat} {best * 1e3:.3f} ms"
              f"{'' if bounds is None else f' + scan bounds {bounded * 1e3:.3f} ms'}; record check "
              f"{checked * 1e3:.3f} ms; {ranks}", flush=True)
    if args.expand:
        t0 = time.perf_counter()
        visits, rank, cta_start = schedule.expand(plan)
        expanded = time.perf_counter() - t0
        t0 = time.perf_counter()
        ref = schedule.build(plan.policy, **kw)
        built = time.perf_counter() - t0
        same = (np.array_equal(visits, ref.visits) and np.array_equal(rank, ref.rank)
                and np.array_equal(cta_start, ref.cta_start))
        print(f"expand {expanded:.2f} s, schedule.build {built:.2f} s (per visit), equal: {same}", flush=True)
        rng = np.random.default_rng(0)
        sample = rng.integers(0, len(rank), args.samples)
        for mode in ("count", "window"):
            scanned = np.empty(len(sample), dtype=np.int64)
            t0 = time.perf_counter()
            for j, v in enumerate(sample):
                head, n, m = (int(x) for x in visits[v, 1:])
                r, scanned[j] = plan.rank_of(head, m, n, mode=mode)
                assert r == rank[v], (v, r, rank[v])
            took = time.perf_counter() - t0
            print(f"rank_of ({mode}) on {len(sample)} sampled visits: all equal to the table; records compared per "
                  f"visit mean {scanned.mean():.0f}, max {scanned.max()}; {took / len(sample) * 1e6:.1f} us per call",
                  flush=True)
        if not same:
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
