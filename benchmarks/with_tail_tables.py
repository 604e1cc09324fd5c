"""Runs a script or a module with `symmetric_shift`'s tables replaced by the causal-tail prototype of
benchmarks/tail_balance_model.py (its last partial round of pairs and the R rounds before it dispatched as single
columns, longest first, each descending): the GPU leg of that A/B, in a process of its own (tables are cached per
process by the problem, not by this change). Tables that are not all pairs (an odd number of KV tiles, a band, a
full mask's shift form) stay as built; the replaced ones are validated first (coverage, ranks, no deadlock, the
dQ writer's scan bounds). Only MHA tables (group size 1) are replaced. The bits differ from the tree's wherever a
table is replaced. `auto` compares the replaced table with its other candidates: name the schedule
(`--schedules symmetric_shift`) to be sure a leg runs it.

    python benchmarks/with_tail_tables.py 1 benchmarks/steady_bench.py --schedules symmetric_shift ...

The first argument is R; the second a script (ending in .py) or a module, as benchmarks/with_kernels.py takes them.
"""
import functools
import os
import sys


def main():
    if len(sys.argv) < 3 or not sys.argv[1].isdigit():
        sys.exit(__doc__)
    rounds, target = int(sys.argv[1]), sys.argv[2]
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import tail_balance_model as model
    import with_kernels
    from cupy_dash.schedule import compact
    built = compact._build_compact

    @functools.lru_cache(maxsize=64)
    def with_tail(policy, *args):
        plan = built(policy, *args)
        if policy != "symmetric_shift" or not plan.causal or plan.group_size != 1:
            return plan
        try:
            tail = model.retail(plan, rounds, "descending")
        except ValueError:
            return plan
        print(f"with_tail_tables: {plan!r}: busiest CTA {plan.loads.max()} -> {tail.loads.max()} visits",
              file=sys.stderr)
        return tail

    compact._build_compact = with_tail
    with_kernels.run_target(target, sys.argv[3:])


if __name__ == "__main__":
    main()
