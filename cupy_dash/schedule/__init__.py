"""Schedules for the deterministic dQ reduction (the DASH paper), usable without a GPU (the tables on the GPU:
:mod:`cupy_dash.cuda.device_tables`).

The deterministic backward adds the dQ partial of every (KV tile n, Q tile m) visit into an fp32 accumulator
in a fixed order per dQ tile.  A schedule says which CTA runs which KV tile, in which order each KV tile visits
its Q tiles, and the rank of every visit in its dQ tile's reduction order.  ``build`` makes the table, the GPU
kernel only reads it::

    plan = schedule.build("shift", seqlen_q=8192, seqlen_k=8192, block_m=64, block_n=128,
                          num_heads=16, causal=False, num_sms=132)
    plan.visits      # int32 (V, 4): cta, head, n_block, m_block, in each CTA's execution order
    plan.rank        # int32 (V,): position of the visit in its dQ tile's reduction order
    plan.cta_start   # int64 (num_ctas + 1,): the visits of cta c are rows cta_start[c]:cta_start[c+1]
    plan.validate()  # ValueError unless ranks are permutations, coverage is exact and nothing can deadlock
    schedule.simulate(plan, c=1.0, r=0.25)   # makespan in the paper's DAG model
    schedule.simulate(plan, c=1.0, r=0.8, model="engine")   # ... in the model of our Hopper kernel

Sliding windows: ``build(..., window=(left, right))`` with FlashAttention's semantics (query i sees key j iff
i + Sk - Sq - left <= j <= i + Sk - Sq + right; -1 unbounded; causal means right = 0). KV tile n then sees the
contiguous Q tiles [lo[n], hi[n]) of :meth:`Schedule.column_ranges`; tiles outside the band are not in the
table, and a KV tile that no query sees has no visits at all (the backward writes zeros for its dK, dV).

Grouped-query attention (GQA, MQA): ``build(..., num_heads=B * H, group_size=H // Hkv)``. Heads stay (batch,
query head) pairs; a KV column is (head // group_size, n_block) and covers the group_size query heads of its KV
head on one CTA, so dK and dV need no cross-CTA reduction. Inside a column the order is Q-tile-major: each Q
tile of the policy's order is visited for every query head of the group (ascending) before the next Q tile, so
a grouped table is the table of the B * Hkv KV heads with every visit (and its rank) repeated group_size times
and time running group_size times slower: every policy keeps its wait-free behaviour (the NOTES of
``_units.pxd`` say why head-major columns would not).

Policies (ranks are always derived from the wait-free timeline, see the NOTES of ``_units.pxd``):

``fa3``
    FlashAttention-3's deterministic backward: every KV tile visits its Q tiles in ascending order.  Full mask:
    KV tiles dispatched head by head in ascending n, ties broken by ascending n (rank = n).  Causal: upstream's
    shortest-processing-time-first launch (high n first) and ranks in descending n, as upstream since PR #1893;
    likewise with any sliding window bounded on the right (the ranges then start higher as n rises, and only
    this order keeps the ranks independent of the CTA count, see "Portable bits"). Those rounds run over
    sections of ``head_section`` KV heads, one section after the other (0: every head at once, upstream's
    order): the backward passes :func:`l2_head_section`, so that the heads in flight keep their Q, dO and dQ in
    L2 (over every head at once a causal backward ran from DRAM: 1.2-1.4x slower). A dQ tile's partials stay in
    one section and add in descending n, so the section size never changes the bits.
``descending``
    DASH's descending Q-tile iteration: every KV tile visits its Q tiles from the last one down; KV tiles are
    dispatched head by head in ascending n (longest causal column first) to the CTA that frees up first.
``shift``
    DASH's shift scheduling for the full mask: KV tile n starts at Q tile ``n mod M`` and wraps around, so
    concurrent KV tiles of a head never meet on a dQ tile.  It degrades gracefully: with more KV tiles than Q
    tiles (seqlen_k > seqlen_q) some tiles do meet and the later one waits; with a causal mask each column
    rotates over its own range of Q tiles.  With a sliding window whose left side cuts the columns from above
    (a band), the rotation is measured along the band and on the CTA's clock (column n visits
    lo[n] + (tau + n + M - hi[n]) mod L at step tau of its CTA), so that the equally long interior columns,
    whose ranges move up by block_n / block_m tiles per column, never meet on a dQ tile, whenever the dispatch
    starts them; the shorter columns at the band's ends can.
``symmetric_shift``
    DASH's symmetric shift for the causal mask: a CTA takes the pair of KV tiles (k, N-1-k), so every CTA gets
    the same work; the long column cycles over the rectangle of Q tiles shared by the long columns dispatched
    with it, then walks its own triangle; the short column goes in descending order.  With an odd number of KV
    tiles the middle column runs alone.  A right-bounded sliding window without a left bound has the same
    triangular shape and is paired the same way.  With a full mask all columns have the same length, nothing
    needs pairing, and it builds the ``shift`` schedule; likewise when there are fewer pairs than CTAs, every
    column runs alone (the longest column bounds the makespan anyway).  A band (a left window bound) has equally
    long interior columns and two clipped triangles at its ends, treated mirror-wise without pairing: the
    columns whose range start rises with n walk up and are dispatched from the highest n down (upstream's
    shortest-first order; a dQ tile then receives them one step apart whatever the dispatch timing), the
    columns clipped at the first Q tile walk down and are dispatched first, in ascending n.
``auto``
    The policy with the lowest simulated makespan in the *engine* model (below) with costs calibrated on our
    H200 (``AUTO_COSTS``), among all four policies; a policy within ``AUTO_TOLERANCE`` of the best counts as a
    tie, and ties go to the first of ``AUTO_CANDIDATES`` (symmetric_shift, shift, descending, fa3). The choice
    depends only on the shape, never on timing, so it is reproducible. Above ``AUTO_MAX_SIMULATED_VISITS``
    visits the per-visit simulation is replaced by the column model of :mod:`cupy_dash.schedule.compact` (busiest
    CTA's load plus the paper's start-up staircase), with the same costs, tolerance and tie order. One measured
    exception comes first: grouped columns (GQA, g > 1) with at most ``AUTO_FEW_GROUPED`` columns per CTA take
    ``descending``, which the engine model misjudges there.

Compact tables (long contexts): :func:`build_compact` gives the same schedule as one record per KV column,
built in O(columns); :func:`expand` turns it back into these arrays (see :mod:`cupy_dash.schedule.compact`).
One builder makes every schedule: the records of packed batches (:func:`build_varlen`), of which a fixed-length
problem is one sequence of ``num_heads`` query heads (:func:`build_compact`); :func:`build`'s table is those
records expanded. The direct builders of earlier versions are the tests' oracles (``testing.pyx``).

Portable bits. The bits of dq, dk and dv depend on the table only through the order of the additions: the
order in which each KV column visits its Q tiles (dK and dV accumulate in registers in that order) and the rank
order of the partials of each dQ tile. :func:`reduction_order` extracts both. For ``fa3`` and ``descending``
they do not depend on ``num_sms`` (both orders follow from the tile indices alone, also with sliding windows:
fa3's dQ tiles add in ascending n, or in descending n when the mask has a right bound; descending's in
ascending n), so a job gets the same bits on an H100 PCIe (114 SMs), an H100 SXM or an H200 (132):
:data:`PORTABLE_POLICIES`. ``shift`` and ``symmetric_shift`` derive their ranks from the wait-free timeline of
the given CTA count (and ``symmetric_shift`` pairs columns per CTA), so their bits, and ``auto``'s, follow the GPU
model; they are still bitwise reproducible on one GPU model.

Models (``simulate``). The paper's DAG model: each visit computes for ``c``, waits for its rank, reduces for
``r``; the CTA then starts its next visit. The engine model follows the Hopper kernel: a CTA's MMA warpgroups
and its dQ writer are two serial resources with one dQ buffer between them, so the next visit computes while
the writer waits for its turn, and the MMA stalls only when a second dQ partial is ready before the writer took
the first. Calibration (docs/schedules.md): r = 0.8 c fits the measured speed ratios of the four
policies on 16 shapes (d64, d128, full, causal, S = 1k..16k) with 0.13 rms log error, against 0.16-0.28 for the
DAG model at any r. Neither models caches: the ``fa3`` policy's rounds over every head at once ran from DRAM under
a causal mask, 1.2-1.6x slower than ``symmetric_shift`` where both models predict a tie; in L2 sections
(``head_section``) 0.92-1.06x.
"""
from .auto import build, build_compact
from .compact import CompactSchedule, expand
from .per_visit import (AUTO_CANDIDATES, AUTO_COSTS, AUTO_FEW_GROUPED, AUTO_MAX_SIMULATED_VISITS, AUTO_TOLERANCE,
                        AUTO_VISITS, L2_SECTION_SHARE, MODELS, POLICIES, PORTABLE_POLICIES, ROW_BYTES, Schedule,
                        canonical_window, check_plan, check_window, critical_path, l2_head_section, lower_bound,
                        simulate, timeline, unseen_keys)
from .portable import reduction_order, same_reduction_order
from .varlen import VarlenSchedule, build_varlen

__all__ = ["AUTO_CANDIDATES", "AUTO_COSTS", "AUTO_FEW_GROUPED", "AUTO_MAX_SIMULATED_VISITS", "AUTO_TOLERANCE",
           "AUTO_VISITS", "L2_SECTION_SHARE", "MODELS", "POLICIES", "PORTABLE_POLICIES", "ROW_BYTES",
           "CompactSchedule", "Schedule", "VarlenSchedule", "build", "build_compact", "build_varlen",
           "canonical_window", "check_plan", "check_window", "critical_path", "expand", "l2_head_section",
           "lower_bound", "reduction_order", "same_reduction_order", "simulate", "timeline", "unseen_keys"]
