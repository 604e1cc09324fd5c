"""benchmarks/with_split_tail.py's timing-only tables: the last partial round of full-mask columns cut into pieces
of their Q range, every tile once, ranks in the visits' order, and the busiest CTA lighter. CPU only."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
if str(BENCHMARKS) not in sys.path:
    sys.path.insert(0, str(BENCHMARKS))

import with_split_tail  # noqa: E402


def _base(S, heads, ctas):
    from cupy_dash.schedule import auto
    return auto.build("auto", seqlen_q=S, seqlen_k=S, block_m=80, block_n=128, num_heads=heads, causal=False,
                      num_sms=ctas)


def test_full_3840_tail_in_thirds_takes_the_busiest_cta_from_720_to_704_visits():
    base = _base(3840, 64, 132)
    split = with_split_tail.split_tail(base, 3)
    loads = np.diff(split.cta_start)
    assert np.diff(base.cta_start).max() == 720 and loads.max() == 704 and loads.min() == 688
    assert split.num_visits == base.num_visits


def test_concurrent_pieces_of_a_head_and_range_visit_distinct_q_tiles():
    split = with_split_tail.split_tail(_base(3840, 64, 132), 3)
    v, cs = np.asarray(split.visits), np.asarray(split.cta_start)
    for step in (672, 680, 687):                      # the first round of pieces: one visit per CTA at each step
        rows = v[cs[:-1] + step]
        pairs = {(int(bh), int(m)) for _, bh, _, m in rows}
        assert len(pairs) == len(rows)


def test_a_corrupted_rank_is_refused():
    split = with_split_tail.split_tail(_base(1280, 16, 24), 3)
    rank = np.array(split.rank)
    rank[[0, 1]] = rank[[1, 0]] if rank[0] != rank[1] else (rank[0] + 1, rank[1])
    split.rank = rank
    with pytest.raises(ValueError, match="ranks"):
        with_split_tail._check(split, _base(1280, 16, 24))


def test_load_model_counts_switches_and_rank_waits():
    base = _base(3840, 64, 132)
    assert with_split_tail.makespan(base) == 720 + 14          # 15 columns of 48 visits, 14 switches
    assert with_split_tail.makespan(with_split_tail.split_tail(base, 3)) == 704 + 15


def test_trim_tail_keeps_every_tile_and_evens_the_loads_of_a_causal_table():
    from cupy_dash.schedule import auto
    base = auto.build("auto", seqlen_q=2048, seqlen_k=2048, block_m=80, block_n=128, num_heads=4, causal=True,
                      num_sms=12)
    trimmed = with_split_tail.product.trim_tail(base)
    before, after = np.diff(base.cta_start), np.diff(trimmed.cta_start)
    assert trimmed.num_visits == base.num_visits
    assert after.max() - after.min() < before.max() - before.min()
    assert with_split_tail.makespan(trimmed) > 0                # live: the model ran every visit


@pytest.mark.parametrize("causal, window, group, trim, replaced", [
    (False, (-1, -1), 1, False, True), (True, (-1, 0), 1, True, True), (True, (-1, 0), 1, False, False),
    (False, (-1, -1), 1, True, False), (False, (64, 64), 1, False, False), (False, (-1, -1), 4, False, False)],
    ids=["full", "causal-canonical", "causal-without-trim", "full-with-trim", "window", "gqa"])
def test_the_wrapper_replaces_mha_tables_without_a_window_in_canonical_form(causal, window, group, trim, replaced):
    args = dict(seqlen_q=1024, seqlen_k=1024, causal=causal, window=window, group_size=group)
    assert with_split_tail.replaces(args, trim) is replaced
