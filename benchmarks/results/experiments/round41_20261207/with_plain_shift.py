"""Runs a script or a module with the full-mask `shift` rotation of the tree before round 41 (column n starts at Q
tile n mod M) in place of the spread one (column k of a head starts at Q tile k M / NC): an A/B of the two
rotations in one device run. It rewrites the rotation of every shift column in the records that
``compact._build_compact`` returns (per-visit tables are expanded from them, ranks derived from their keys), for
full-mask problems of `shift` and `symmetric_shift` (auto's choice there); everything else is the tree's.

    python with_plain_shift.py benchmarks/burst_bench.py --impls dash_det ...
    python with_plain_shift.py pytest -q tests/gpu/test_gpu_pieces.py
"""
import functools
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))      # benchmarks/: with_kernels.run_target
from with_kernels import run_target  # noqa: E402

from cupy_dash.schedule import compact  # noqa: E402

LO, HI, SPLIT, ROT, N = 1, 2, 3, 4, 7      # _records.pxd's fields


def plain_rotation(build):
    @functools.lru_cache(maxsize=64)
    def wrapped(policy, seqlen_q, seqlen_k, block_m, block_n, num_heads, causal, num_sms, group_size=1,
                window=(-1, -1), head_section=0):
        args = (seqlen_q, seqlen_k, block_m, block_n, num_heads, causal, num_sms, group_size, tuple(window),
                head_section)
        plan = build(policy, *args)
        if policy not in ("shift", "symmetric_shift") or causal or tuple(window) != (-1, -1):
            return plan
        rec = np.array(plan.records)
        rotated = rec[:, SPLIT] == rec[:, LO]
        rec[rotated, ROT] = rec[rotated, N] % (rec[rotated, HI] - rec[rotated, LO])
        meta = {"M": plan.num_m_blocks, "N": plan.num_n_blocks, "n_first": plan.n_first,
                "NC": plan.columns_per_head, "num_ctas": plan.num_ctas, "tie_sign": plan.tie_sign,
                "rank_rule": plan.rank_rule}
        return compact.CompactSchedule(plan.policy, args, rec, np.array(plan.cta_columns),
                                       np.array(plan.cta_col_start), np.array(plan._dispatch_order),
                                       np.array(plan.loads), meta).validate()
    return wrapped


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    compact._build_compact = plain_rotation(compact._build_compact)
    run_target(sys.argv[1], sys.argv[2:])


if __name__ == "__main__":
    main()
