"""benchmarks/hop_model.py: its Python engine model is the Cython one when nothing is jittered, and its Python tables
are the tree's where round 41's spread changes nothing; the half-wave tables cover every tile once and run."""
import sys
from pathlib import Path

import numpy as np
import pytest

from cupy_dash import schedule

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import hop_model  # noqa: E402

# (seqlen, block_m, heads, causal, CTAs): 128-query tiles, and CTA counts that waves fill with whole heads or pairs
# of heads, where the spread rotations equal the tree's
SMALL = [(1536, 128, 6, False, 12), (2048, 128, 6, True, 16), (1280, 80, 5, False, 10), (1000, 80, 4, False, 13)]


@pytest.mark.parametrize("seqlen,block_m,heads,causal,ctas", SMALL, ids=lambda v: str(v))
@pytest.mark.parametrize("r", [0.8, 1.3])
def test_unjittered_model_is_the_cython_engine_model(seqlen, block_m, heads, causal, ctas, r):
    plan = schedule.build("auto", seqlen_q=seqlen, seqlen_k=seqlen, block_m=block_m, block_n=128, num_heads=heads,
                          causal=causal, num_sms=ctas)
    ours = hop_model.makespan(np.asarray(plan.visits), np.asarray(plan.rank), np.asarray(plan.cta_start), r=r)
    assert ours == pytest.approx(schedule.simulate(plan, 1.0, r, model="engine", writers=2), rel=1e-12)


@pytest.mark.parametrize("seqlen,block_m,heads,causal,ctas", SMALL[:2], ids=lambda v: str(v))
def test_whole_tables_are_the_trees(seqlen, block_m, heads, causal, ctas):
    plan = schedule.build("auto", seqlen_q=seqlen, seqlen_k=seqlen, block_m=block_m, block_n=128, num_heads=heads,
                          causal=causal, num_sms=ctas)
    visits, cta_start = hop_model.python_table(seqlen, block_m, 128, heads, causal, num_sms=ctas)
    assert np.array_equal(visits, plan.visits) and np.array_equal(cta_start, plan.cta_start)
    assert plan.policy == "symmetric_shift"                         # ties in descending n
    assert np.array_equal(hop_model.derived_ranks(visits, cta_start, -1), plan.rank)


@pytest.mark.parametrize("seqlen,block_m,heads,causal,ctas", SMALL, ids=lambda v: str(v))
def test_half_wave_tables_cover_every_tile_once_and_run(seqlen, block_m, heads, causal, ctas):
    visits, cta_start = hop_model.python_table(seqlen, block_m, 128, heads, causal, halves=2, num_sms=ctas)
    plan = schedule.build("shift", seqlen_q=seqlen, seqlen_k=seqlen, block_m=block_m, block_n=128, num_heads=heads,
                          causal=causal, num_sms=ctas)
    assert sorted(map(tuple, visits[:, 1:].tolist())) == sorted(map(tuple, np.asarray(plan.visits)[:, 1:].tolist()))
    assert (np.diff(visits[:, 0]) >= 0).all() and cta_start[-1] == len(visits)
    rank = hop_model.derived_ranks(visits, cta_start, -1 if causal else 1)
    assert hop_model.makespan(visits, rank, cta_start, r=1.2, sigma=0.05) > 0      # raises on a deadlock
