"""Half-waves: each head's units dispatched in two halves by parity of k (a wave holds half the columns of twice as
many heads, so a dQ tile's ranks arrive two steps apart even where a rectangle has as many rows as columns), with
the rotations of patches/spread_rectangles.patch, in place of the tree's tables: benchmarks/hop_model.py's
``column_records(..., halves=2)`` returned by ``compact._build_compact`` for fixed-length problems with Sq = Sk, no
window and no grouping, under `shift` (full masks) and paired `symmetric_shift` (auto's choice). For an A/B in one
device run, as a wrapper or a pytest plugin (spread_shift.py's usage):

    python half_waves.py benchmarks/burst_bench.py --hdim 64 --impls dash_det ...
    PYTHONPATH=<this folder> python -m pytest -p half_waves -n 8 tests/gpu/...

Per-visit tables only: half-waves break the compact path's scan bounds (a head's columns dispatched in runs of its
lowest and highest n), so a problem large enough for compact tables fails there (none of the bench's shapes).
"""
import functools
import sys

import records_swap


def half_wave_records(build):
    """``compact._build_compact`` with half-wave records where they apply."""
    sys.path.insert(0, str(records_swap.BENCHMARKS))
    import hop_model

    @functools.lru_cache(maxsize=64)
    def wrapped(policy, seqlen_q, seqlen_k, block_m, block_n, num_heads, causal, num_sms, group_size=1,
                window=(-1, -1), head_section=0):
        args = (seqlen_q, seqlen_k, block_m, block_n, num_heads, causal, num_sms, group_size, tuple(window),
                head_section)
        plain = tuple(window) == ((-1, 0) if causal else (-1, -1))           # canonical windows
        pairs = num_heads * ((-(-seqlen_k // block_n) + 1) // 2)
        if (seqlen_q != seqlen_k or group_size != 1 or not plain
                or policy not in (("symmetric_shift",) if causal else ("shift", "symmetric_shift"))
                or (causal and pairs < num_sms)):
            return build(policy, *args)
        return hop_model.column_records(seqlen_q, block_m, block_n, num_heads, causal, halves=2, num_sms=num_sms,
                                        policy=policy)
    return wrapped


# apply(): every table built from now on in this process takes the wrapper's records (call before the first build)
apply, pytest_configure = records_swap.plugin("half_waves", half_wave_records)

if __name__ == "__main__":
    records_swap.main(__doc__, apply)
