"""Rotations spread over a shared rectangle (docs/schedules.md, "Why the rules hold"). Full masks: column k of a
head's NC columns starts at Q tile k L // NC when its L Q tiles outnumber them. Causal `symmetric_shift`: the
wave's k long columns of a head rotate by i W // k over their W-row rectangle. Either way a dQ tile's consecutive
ranks arrive one or two steps apart, and in the engine model a hop longer than a visit costs no waits."""
import numpy as np
import pytest

from cupy_dash import schedule

FULL = [(3840, 3840, 80, 128, 64), (1280, 1280, 80, 128, 48), (1000, 1333, 80, 128, 6), (2048, 1024, 64, 128, 8)]
SPLIT, ROT, HEAD, N = 3, 4, 6, 7        # _records.pxd's fields


def first_tiles(plan):
    """{(head, n_block): Q tile of the column's first visit}."""
    v = plan.visits
    new = np.ones(len(v), dtype=bool)
    new[1:] = np.any(v[1:, :3] != v[:-1, :3], axis=1)
    return {(int(h), int(n)): int(m) for _, h, n, m in v[new]}


@pytest.mark.parametrize("policy", ["shift", "symmetric_shift", "auto"])
@pytest.mark.parametrize("sq,sk,bm,bn,heads", FULL, ids=lambda v: str(v))
def test_full_mask_columns_start_spread(sq, sk, bm, bn, heads, policy):
    plan = schedule.build(policy, seqlen_q=sq, seqlen_k=sk, block_m=bm, block_n=bn, num_heads=heads, causal=False,
                          num_sms=132).validate()
    M, NC = plan.num_m_blocks, plan.num_n_blocks
    assert M > NC
    starts = first_tiles(plan)
    assert len(starts) == heads * NC
    for (h, n), m in starts.items():
        assert m == n * M // NC
    gaps = np.diff([n * M // NC for n in range(NC)] + [M])
    assert gaps.min() >= 1 and gaps.max() <= -(-M // NC)


def test_square_full_mask_keeps_the_plain_rotation():
    plan = schedule.build("shift", seqlen_q=1024, seqlen_k=1024, block_m=128, block_n=128, num_heads=4, causal=False,
                          num_sms=16).validate()
    assert all(m == n for (_, n), m in first_tiles(plan).items())


@pytest.mark.parametrize("seqlen,heads,num_sms", [(8192, 32, 132), (16384, 16, 132), (4000, 6, 13)],
                         ids=lambda v: str(v))
def test_causal_long_columns_rotate_spread(seqlen, heads, num_sms):
    """Every wave's long columns of a head (one rectangle start) rotate by i W // k, i their index in the wave."""
    plan = schedule.build_compact("symmetric_shift", seqlen_q=seqlen, seqlen_k=seqlen, block_m=80, block_n=128,
                                  num_heads=heads, causal=True, num_sms=num_sms).validate()
    rec, M = plan.records, plan.num_m_blocks
    long = rec[:, N] - plan.n_first < (plan.columns_per_head + 1) // 2      # column k of the pair (k, NC - 1 - k)
    waves = {}
    for i in np.flatnonzero(long):
        waves.setdefault((int(rec[i, HEAD]), int(rec[i, SPLIT])), []).append(int(rec[i, ROT]))
    assert waves
    spread = 0
    for (_, rs), rots in waves.items():
        W, k = M - rs, len(rots)
        want = [i * W // k for i in range(k)] if W > k else [i % W for i in range(k)]
        assert sorted(rots) == want
        spread += W > k + 1
    assert spread > 0


@pytest.mark.parametrize("seqlen,causal", [(1280, False), (3840, False), (8192, True), (16384, True)],
                         ids=["full1280", "full3840", "causal8k", "causal16k"])
def test_a_hop_longer_than_a_visit_costs_no_waits(seqlen, causal):
    """Engine model, two writers, auto's tables (80-query tiles): with the reduction hop at 1.2 visits the makespan
    stays within 0.4 % of a 0.8-visit hop's (the plain rotations lost 1.6-4.2 % there: consecutive ranks one step
    apart)."""
    plan = schedule.build("auto", seqlen_q=seqlen, seqlen_k=seqlen, block_m=80, block_n=128,
                          num_heads=16 * 16384 // seqlen, causal=causal, num_sms=132)
    short = schedule.simulate(plan, 1.0, 0.8, model="engine", writers=2)
    long = schedule.simulate(plan, 1.0, 1.2, model="engine", writers=2)
    assert long <= short * 1.004
