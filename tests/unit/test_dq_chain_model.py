"""benchmarks/dq_chain_model.py: the ordered dQ reduction's rank chain across CTAs holds under random tables and
interleavings, with one turn per tile (the tree) and a turn per slice (round 40's turn_slices.patch), and the model
catches a slice put without its own turn."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import dq_chain_model as model  # noqa: E402


@pytest.mark.parametrize("slices", [1, 2], ids=["turn_per_tile", "turn_per_slice"])
def test_the_rank_chain_keeps_the_order_of_the_adds(slices):
    for seed in range(120):
        lists, ranks = model.random_table(seed)
        model.run(lists, ranks, seed, slices=slices)
    model.run([[0, 0, 0], [0, 0]], [[0, 2, 4], [1, 3]], 3, slices=slices)   # one tile, two CTAs taking turns


def test_a_slice_put_without_its_turn_breaks_the_order():
    with pytest.raises(AssertionError, match="put before rank"):
        for seed in range(200):
            lists, ranks = model.random_table(seed)
            model.run(lists, ranks, seed, slices=2, second_wait=False)
