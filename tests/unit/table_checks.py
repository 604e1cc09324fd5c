"""Checks of schedule tables recomputed with numpy, independently of the Cython validator (shared by the GQA and
window schedule tests)."""
from __future__ import annotations

import numpy as np


def steps(plan):
    """Position of every visit in its CTA's list."""
    counts = np.diff(plan.cta_start)
    return np.arange(plan.num_visits) - np.repeat(plan.cta_start[:-1], counts)


def assert_ranks_follow_time(plan, tile):
    """``tile``: the dQ tile of every visit (an int per visit). Ranks are 0..k-1 per tile, and every rank edge
    goes forward in (wait-free) time: the visit of rank i + 1 is at the same or a later step than rank i's."""
    order = np.lexsort((plan.rank, tile))
    t, r = tile[order], plan.rank[order].astype(np.int64)
    first = np.r_[True, t[1:] != t[:-1]]
    group_start = np.maximum.accumulate(np.where(first, np.arange(len(t)), 0))
    assert np.array_equal(r, np.arange(len(t)) - group_start), "ranks are not 0..k-1 per dQ tile"
    s = steps(plan)[order]
    assert np.all((s[1:] >= s[:-1]) | first[1:]), "a rank edge points back in time"
