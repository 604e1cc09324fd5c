"""benchmarks/hop_model.py: its Python engine model is the Cython one when nothing is jittered, its records are the
tree's (and the plain rotations differ from them only in their rotations), and its half-wave tables validate and
run."""
import sys
from pathlib import Path

import numpy as np
import pytest

from cupy_dash import schedule

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import hop_model  # noqa: E402

# (seqlen, block_m, heads, causal, CTAs): 128-query tiles (nothing to spread) and 80-query ones (full masks spread)
SMALL = [(1536, 128, 6, False, 12), (2048, 128, 6, True, 16), (1280, 80, 5, False, 10), (1000, 80, 4, False, 13)]


@pytest.mark.parametrize("seqlen,block_m,heads,causal,ctas", SMALL, ids=lambda v: str(v))
@pytest.mark.parametrize("r", [0.8, 1.3])
def test_unjittered_model_is_the_cython_engine_model(seqlen, block_m, heads, causal, ctas, r):
    plan = schedule.build("auto", seqlen_q=seqlen, seqlen_k=seqlen, block_m=block_m, block_n=128, num_heads=heads,
                          causal=causal, num_sms=ctas)
    ours = hop_model.makespan(np.asarray(plan.visits), np.asarray(plan.rank), np.asarray(plan.cta_start), r=r)
    assert ours == pytest.approx(schedule.simulate(plan, 1.0, r, model="engine", writers=2), rel=1e-12)


@pytest.mark.parametrize("seqlen,block_m,heads,causal,ctas", SMALL + [(8192, 80, 4, True, 7)], ids=lambda v: str(v))
def test_whole_records_are_the_trees(seqlen, block_m, heads, causal, ctas):
    tree = schedule.build_compact("symmetric_shift", seqlen_q=seqlen, seqlen_k=seqlen, block_m=block_m, block_n=128,
                                  num_heads=heads, causal=causal, num_sms=ctas)
    mine = hop_model.column_records(seqlen, block_m, 128, heads, causal, num_sms=ctas)
    for name in ("records", "cta_columns", "cta_col_start", "loads", "_dispatch_order"):
        assert np.array_equal(getattr(mine, name), getattr(tree, name)), name
    plain = hop_model.column_records(seqlen, block_m, 128, heads, causal, num_sms=ctas, spread=False)
    rot = 4                                                    # _records.pxd's rotation field
    others = [f for f in range(plain.records.shape[1]) if f != rot]
    assert np.array_equal(plain.records[:, others], tree.records[:, others])
    spreadable = block_m == 80                                 # more Q tiles than KV tiles in a rectangle
    assert (not np.array_equal(plain.records[:, rot], tree.records[:, rot])) == spreadable
    plain.to_schedule().validate()


@pytest.mark.parametrize("seqlen,block_m,heads,causal,ctas", SMALL, ids=lambda v: str(v))
def test_half_wave_tables_validate_and_run(seqlen, block_m, heads, causal, ctas):
    """Their per-visit tables validate (every tile once, ranked, no deadlock); each head's units go out even k first."""
    plan = hop_model.column_records(seqlen, block_m, 128, heads, causal, halves=2, num_sms=ctas)
    num_units = (plan.num_n_blocks + 1) // 2 if causal else plan.num_n_blocks
    rec = plan.records[plan._dispatch_order]
    for h in range(heads):
        k = rec[(rec[:, 6] == h) & (rec[:, 7] < num_units), 7].tolist()
        assert k == list(range(0, num_units, 2)) + list(range(1, num_units, 2))
    table = plan.to_schedule().validate()
    assert hop_model.makespan(np.asarray(table.visits), np.asarray(table.rank), np.asarray(table.cta_start), r=1.2,
                              sigma=0.05) > 0
