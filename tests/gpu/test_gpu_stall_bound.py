"""GPU test of the backward's bounded semaphore waits (needs an NVIDIA Hopper GPU; skipped elsewhere, see
conftest.py): a corrupted schedule table (two CTAs waiting on each other, or a rank the dQ semaphore never reaches)
makes the kernel time out and report an error naming the schedule instead of hanging the GPU; the next public call
reports a pending error; afterwards the GPU gives the same bits as before.
"""
from __future__ import annotations

import copy
import time
import types

import numpy as np
import pytest

import cupy
import cupy_dash
from cupy_dash import reference
from cupy_dash.cuda import kernels
from gpu_helpers import Case, _assert_same_bits, _case_data, _dev, _host

pytestmark = pytest.mark.gpu


def _cta_orders(visits, cta_start):
    """List (per CTA) of visit indices in execution order."""
    return [list(range(int(cta_start[c]), int(cta_start[c + 1]))) for c in range(len(cta_start) - 1)]


def _deadlocks(visits, rank, cta_start) -> bool:
    """Whether the wait graph of a table with per-tile rank permutations has a cycle (Kahn's algorithm).
    Edges: consecutive visits of a CTA, and rank r -> rank r+1 of the same dQ tile (bh, m_block)."""
    n = len(visits)
    succ = [[] for _ in range(n)]
    indeg = [0] * n
    for order in _cta_orders(visits, cta_start):
        for a, b in zip(order, order[1:]):
            succ[a].append(b)
            indeg[b] += 1
    tiles = {}
    for i in range(n):
        tiles.setdefault((int(visits[i, 1]), int(visits[i, 3])), []).append(i)
    for members in tiles.values():
        members = sorted(members, key=lambda i: int(rank[i]))
        for a, b in zip(members, members[1:]):
            succ[a].append(b)
            indeg[b] += 1
    ready = [i for i in range(n) if indeg[i] == 0]
    done = 0
    while ready:
        i = ready.pop()
        done += 1
        for j in succ[i]:
            indeg[j] -= 1
            if indeg[j] == 0:
                ready.append(j)
    return done < n


def _mutual_wait_ranks(visits, rank, cta_start):
    """Ranks (a copy) in which two CTAs wait on each other, or None if this table has no such pair.

    Looks for CTAs c0, c1 and dQ tiles A, B such that c0 visits A before B and c1 visits B before A. Then it
    swaps ranks so that on A, c1 reduces first and on B, c0 reduces first: c0 waits at A for c1, which is stuck at
    B waiting for c0. Every tile's ranks stay a permutation of 0..k-1, so only a deadlock check catches it."""
    pos = {}                                     # (cta, tile) -> (position in the CTA, visit index)
    for c, order in enumerate(_cta_orders(visits, cta_start)):
        for p, i in enumerate(order):
            pos[(c, (int(visits[i, 1]), int(visits[i, 3])))] = (p, i)
    by_cta = {}
    for (c, tile), (p, i) in pos.items():
        by_cta.setdefault(c, {})[tile] = (p, i)
    ctas = sorted(by_cta)
    for ai, c0 in enumerate(ctas):
        for c1 in ctas[ai + 1:]:
            shared = sorted(set(by_cta[c0]) & set(by_cta[c1]), key=lambda t: by_cta[c0][t][0])
            for x, tile_a in enumerate(shared):
                for tile_b in shared[x + 1:]:            # c0 visits A before B
                    if by_cta[c1][tile_b][0] >= by_cta[c1][tile_a][0]:
                        continue                         # c1 must visit B before A
                    new = np.array(rank, copy=True)
                    a0, a1 = by_cta[c0][tile_a][1], by_cta[c1][tile_a][1]
                    b0, b1 = by_cta[c0][tile_b][1], by_cta[c1][tile_b][1]
                    if new[a1] > new[a0]:
                        new[a0], new[a1] = new[a1], new[a0]
                    if new[b0] > new[b1]:
                        new[b0], new[b1] = new[b1], new[b0]
                    if _deadlocks(visits, new, cta_start):
                        return new
    return None


def _with_ranks(plan, rank):
    """A Schedule-like copy of ``plan`` with other ranks (public attributes only, so no cached device tables of
    the original can leak into the copy)."""
    attrs = {}
    for name in dir(plan):
        if name.startswith("_"):
            continue
        try:
            value = getattr(plan, name)
        except Exception:
            continue
        if callable(value):
            continue
        attrs[name] = copy.copy(value)
    attrs.pop("key", None)                   # a cache key of the valid plan must not name the corrupted one
    attrs["rank"] = np.ascontiguousarray(rank, dtype=np.int32)
    attrs["policy"] = str(getattr(plan, "policy", "?"))
    return types.SimpleNamespace(**attrs)


BAD_TABLE_CASE = Case("bf16", 64, False, 512, 512, batch=1, heads=2)
BAD_TABLE_CTAS = 8


@pytest.mark.parametrize("corruption", ["mutual_wait", "unreachable_rank"])
def test_corrupt_schedule_reports_error_instead_of_hanging(corruption, request):
    from cupy_dash import schedule
    from cupy_dash.core.api import _backward_with_plan

    case = BAD_TABLE_CASE
    data = _case_data(case, backward=True)
    do, q, k, v, out = (_dev(data[n]) for n in ("do", "q", "k", "v", "out_in"))
    lse = _dev(data["lse_in"])
    tile = kernels.bwd_tile(case.hdim, case.causal)
    common = dict(causal=case.causal, softmax_scale=None)

    # A normal backward first: the bits the GPU must still produce after the failure.
    normal = cupy_dash.attention_backward(do, q, k, v, out, lse, causal=case.causal, schedule="auto")
    cupy_dash.check_errors()

    plan = bad = None
    for policy in ("shift", "symmetric_shift", "descending", "fa3"):
        plan = schedule.build(policy, seqlen_q=case.seqlen_q, seqlen_k=case.seqlen_k, block_m=tile.block_m,
                              block_n=tile.block_n, num_heads=case.batch * case.heads, causal=case.causal,
                              num_sms=BAD_TABLE_CTAS)
        visits = np.asarray(plan.visits)
        rank = np.asarray(plan.rank)
        cta_start = np.asarray(plan.cta_start)
        if corruption == "mutual_wait":
            new_rank = _mutual_wait_ranks(visits, rank, cta_start)
        else:
            new_rank = np.array(rank, copy=True)
            i = int(cta_start[1] - 1) if plan.num_ctas > 1 else 0   # the last visit of CTA 0
            tile_id = (visits[:, 1] == visits[i, 1]) & (visits[:, 3] == visits[i, 3])
            new_rank[i] = int(tile_id.sum()) + 7                    # a count the semaphore never reaches
        if new_rank is not None:
            bad = _with_ranks(plan, new_rank)
            break
    assert bad is not None, "no schedule policy gave two CTAs that visit two dQ tiles in opposite orders"

    # The valid table with this small grid is correct (any valid table is).
    ok = _backward_with_plan(do, q, k, v, out, lse, plan=plan, spin_timeout_ns=2_000_000_000, **common)
    cupy_dash.check_errors()
    for name, x in zip(("dq", "dk", "dv"), ok):
        reference.assert_close_fa3(name, _host(x), data[f"{name}_ref"], data[f"{name}_lowp"])

    t0 = time.perf_counter()
    _backward_with_plan(do, q, k, v, out, lse, plan=bad, spin_timeout_ns=200_000_000, **common)
    with pytest.raises(RuntimeError) as info:
        cupy_dash.check_errors()
    elapsed = time.perf_counter() - t0
    assert "schedule" in str(info.value).lower(), f"error should mention the schedule: {info.value}"
    assert elapsed < 60, f"the timed-out backward took {elapsed:.1f} s to report"

    # Once the failed call has finished, the next public call reports it (a poll of its host record).
    _backward_with_plan(do, q, k, v, out, lse, plan=bad, spin_timeout_ns=200_000_000, **common)
    cupy.cuda.Device().synchronize()
    with pytest.raises(RuntimeError, match="in schedule"):
        cupy_dash.attention_forward(q, k, v, causal=case.causal)

    # The GPU is still usable and the error was consumed: a normal backward gives the same bits as before.
    again = cupy_dash.attention_backward(do, q, k, v, out, lse, causal=case.causal, schedule="auto")
    cupy_dash.check_errors()
    for name, x, e in zip(("dq", "dk", "dv"), again, normal):
        _assert_same_bits(name, x, e)
