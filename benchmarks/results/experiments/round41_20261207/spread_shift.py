"""The full-mask `shift` rotation spread over the shared rectangle (column k of a head's NC columns starts at Q tile
k L // NC when its L Q tiles outnumber the columns) in place of the tree's n mod L: commit 6cba5ae's schedule
change, applied to the records that ``compact._build_compact`` returns (per-visit tables are expanded from them,
ranks derived from their keys; compact tables read them). For an A/B of the two rotations in one device run:

    python spread_shift.py benchmarks/burst_bench.py --impls dash_det ...      # a script or a module
    PYTHONPATH=<this folder> python -m pytest -p spread_shift -n 8 tests/gpu/...  # a pytest plugin (xdist too)

Only problems whose visible columns all share one rectangle [lo, M) with more Q tiles than columns change, under
`shift` and `symmetric_shift` (auto's choice at full masks); their tables are 6cba5ae's exactly (checked on the CPU).
"""
import functools
import sys
from pathlib import Path

import numpy as np

LO, HI, SPLIT, ROT, N = 1, 2, 3, 4, 7      # _records.pxd's fields


def spread_rotation(build):
    """``compact._build_compact`` with the spread rotation."""
    from cupy_dash.schedule import compact

    @functools.lru_cache(maxsize=64)
    def wrapped(policy, seqlen_q, seqlen_k, block_m, block_n, num_heads, causal, num_sms, group_size=1,
                window=(-1, -1), head_section=0):
        args = (seqlen_q, seqlen_k, block_m, block_n, num_heads, causal, num_sms, group_size, tuple(window),
                head_section)
        plan = build(policy, *args)
        rec = np.array(plan.records)
        M, NC = plan.num_m_blocks, plan.columns_per_head
        L = rec[:, HI] - rec[:, LO]
        shared = (rec[:, LO] == rec[0, LO]).all() and (rec[:, HI] == M).all()
        if policy not in ("shift", "symmetric_shift") or not shared or L[0] <= NC:
            return plan
        rotated = rec[:, SPLIT] == rec[:, LO]
        rec[rotated, ROT] = (rec[rotated, N] - plan.n_first) * L[rotated] // NC
        meta = {"M": M, "N": plan.num_n_blocks, "n_first": plan.n_first, "NC": NC, "num_ctas": plan.num_ctas,
                "tie_sign": plan.tie_sign, "rank_rule": plan.rank_rule}
        return compact.CompactSchedule(plan.policy, args, rec, np.array(plan.cta_columns),
                                       np.array(plan.cta_col_start), np.array(plan._dispatch_order),
                                       np.array(plan.loads), meta).validate()
    return wrapped


def apply() -> None:
    """Every table built from now on in this process takes the spread rotation (call before the first build)."""
    from cupy_dash.schedule import auto, compact
    if not getattr(compact._build_compact, "spread", False):
        compact._build_compact = spread_rotation(compact._build_compact)
        compact._build_compact.spread = True
        auto._build.cache_clear()
        auto._auto_choice.cache_clear()


def pytest_configure(config):
    apply()


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))      # benchmarks/: with_kernels.run_target
    from with_kernels import run_target
    apply()
    run_target(sys.argv[1], sys.argv[2:])


if __name__ == "__main__":
    main()
