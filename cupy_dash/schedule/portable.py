"""The addition orders that fix the bits of a backward run with a table (docs/schedules.md, "Portable bits")."""
from __future__ import annotations

import numpy as np

from .per_visit import _table_arg


def reduction_order(plan) -> tuple:
    """The two addition orders that fix the bits of a backward run with ``plan`` (a
    :class:`cupy_dash.schedule.Schedule` or any object with ``visits``, ``rank``, ``cta_start`` and optionally
    ``group_size``):

    * ``columns``: int64 (V, 4) rows (kv_head, n_block, head, m_block), the visits of each KV column (kv_head =
      head // group_size) in execution order, columns in ascending (kv_head, n_block);
    * ``dq``: int64 (V, 3) rows (head, m_block, n_block), the partials of each dQ tile in rank order, tiles in
      ascending (head, m_block).

    Two tables with equal orders give bitwise equal dq, dk, dv (the kernel's arithmetic per visit does not
    depend on the CTA that runs it). Raises TypeError naming ``plan`` for anything else."""
    _table_arg(plan, ("visits", "rank"), "a per-visit schedule table (a Schedule from schedule.build(...), or an "
               "object with visits, rank and optionally group_size)")
    visits = np.asarray(plan.visits, dtype=np.int64)
    rank = np.asarray(plan.rank, dtype=np.int64)
    g = int(getattr(plan, "group_size", 1))
    head, n_block, m_block = visits[:, 1], visits[:, 2], visits[:, 3]
    kv_head = head // g
    col = np.lexsort((np.arange(len(rank)), n_block, kv_head))       # stable: execution order inside a column
    columns = np.stack([kv_head[col], n_block[col], head[col], m_block[col]], axis=1)
    tile = np.lexsort((rank, m_block, head))
    dq = np.stack([head[tile], m_block[tile], n_block[tile]], axis=1)
    return columns, dq


def same_reduction_order(a, b) -> bool:
    """Whether tables ``a`` and ``b`` add in the same orders (:func:`reduction_order`): then their backward
    results are bitwise identical, whatever CTA counts they were built for."""
    ca, qa = reduction_order(a)
    cb, qb = reduction_order(b)
    return ca.shape == cb.shape and bool((ca == cb).all()) and bool((qa == qb).all())
