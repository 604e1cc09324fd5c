"""benchmarks/tail_balance_model.py: the load-only model of a causal backward's last round. No GPU needed."""
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
if str(BENCHMARKS) not in sys.path:
    sys.path.insert(0, str(BENCHMARKS))
import tail_balance_model as model  # noqa: E402

from cupy_dash import schedule  # noqa: E402


@pytest.mark.parametrize("seqlen,block_m,block_n", [(2048, 64, 128), (16384, 80, 128), (1000, 128, 128)],
                         ids=["s2048-64x128", "s16384-80x128", "s1000-128x128"])
def test_column_visits_are_the_causal_tables(seqlen, block_m, block_n):
    plan = schedule.build("descending", seqlen_q=seqlen, seqlen_k=seqlen, block_m=block_m, block_n=block_n,
                          num_heads=1, causal=True, num_sms=4)
    lo, hi = plan.column_ranges()
    assert model.column_visits(seqlen, block_m, block_n) == [int(h - l) for l, h in zip(lo, hi)]


def test_equal_pairs_leave_the_last_round_partly_empty():
    # 64 pairs of one length over 132 CTAs: every CTA one pair, the ideal 64/132 of one
    assert model.busiest([7] * 64, 132) == 7
    # 1024 equal units over 132 CTAs: the busiest takes 8, the mean is 7.76 (3.1 % above)
    assert model.busiest([1] * 1024, 132) == 8


@pytest.mark.parametrize("seqlen,block_m,heads", [(4096, 64, 64), (16384, 80, 16)], ids=["s4096", "s16384"])
def test_singles_at_the_end_balance_better_than_pairs(seqlen, block_m, heads):
    m = model.makespans(seqlen, block_m, 128, heads, 132, single_rounds=1)
    assert m["pairs"] > 1.03
    assert m["pairs, singles at the end"] < 1.01
    assert 1.0 <= m["every column alone, longest first"] <= m["pairs, singles at the end"]


@pytest.mark.parametrize("tail_order", ["rotated", "descending"])
@pytest.mark.parametrize("rounds", [0, 1, 3])
def test_the_prototype_tables_are_valid_and_better_balanced(tail_order, rounds):
    # 40 heads of 8 pairs over 13 CTAs: a partial last round (320 = 24 x 13 + 8); validate() runs inside
    base, plan = model.tail_plan(2048, 64, 128, 40, 13, rounds, tail_order)
    assert plan.num_visits == base.num_visits
    assert plan.loads.max() <= base.loads.max()
    assert plan.to_schedule().validate() is not None


def test_with_tail_tables_replaces_the_causal_symmetric_shift_tables(tmp_path):
    import subprocess
    probe = tmp_path / "probe.py"
    probe.write_text("from cupy_dash import schedule\n"
                     "args = dict(seqlen_q=2048, seqlen_k=2048, block_m=64, block_n=128, num_heads=40, num_sms=13)\n"
                     "p = schedule.build('symmetric_shift', causal=True, **args).validate()\n"
                     "f = schedule.build('symmetric_shift', causal=False, **args)\n"
                     "import hashlib\n"
                     "full = hashlib.sha256(f.visits.tobytes() + f.rank.tobytes()).hexdigest()\n"
                     "print(p.num_visits, p.simulate(1.0, 0.0) / p.lower_bound(1.0, 0.0), full)\n")
    runs = [subprocess.run([sys.executable, *pre, str(probe)], capture_output=True, text=True, check=True)
            for pre in ([], [str(BENCHMARKS / "with_tail_tables.py"), "1"])]
    (visits, tree, full), (visits_tail, tail, full_tail) = (r.stdout.split() for r in runs)
    assert visits == visits_tail and full == full_tail      # the full mask's table is left as built
    assert float(tail) < float(tree)
    assert "with_tail_tables:" in runs[1].stderr and "with_tail_tables:" not in runs[0].stderr
