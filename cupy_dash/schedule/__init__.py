"""Schedules for the deterministic dQ reduction (the DASH paper), usable without a GPU (the tables on the GPU:
:mod:`cupy_dash.cuda.device_tables`). A schedule says which CTA runs which KV tile, in which order each KV tile
visits its Q tiles, and the rank of every visit in its dQ tile's reduction order; ``build`` makes the table, the
kernel only reads it::

    plan = schedule.build("shift", seqlen_q=8192, seqlen_k=8192, block_m=64, block_n=128,
                          num_heads=16, causal=False, num_sms=132)
    plan.visits      # int32 (V, 4): cta, head, n_block, m_block, in each CTA's execution order
    plan.rank        # int32 (V,): position of the visit in its dQ tile's reduction order
    plan.cta_start   # int64 (num_ctas + 1,): the visits of cta c are rows cta_start[c]:cta_start[c+1]
    plan.validate()  # ValueError unless ranks are permutations, coverage is exact and nothing can deadlock
    schedule.simulate(plan, c=1.0, r=0.8, model="engine")   # makespan in the model of our Hopper kernel

Policies (ranks are derived from the wait-free timeline; docs/schedules.md, "The policies"):

- ``fa3``: FlashAttention-3's order: ascending Q tiles; causal or right-bounded: shortest column first, in L2
  sections of ``head_section`` KV heads.
- ``descending``: DASH's descending Q-tile iteration.
- ``shift``: DASH's shift: concurrent KV tiles of a head start on different Q tiles.
- ``symmetric_shift``: DASH's symmetric shift: a CTA takes the pair of KV tiles (k, N-1-k).
- ``auto``: the lowest makespan in the engine model among the four, but for one measured exception (GQA)
  (docs/schedules.md, "What auto means").

Also: sliding windows and GQA (``window``, ``group_size``), compact records (:func:`build_compact`,
:func:`expand`), packed batches (:func:`build_varlen`), portable bits (:func:`reduction_order`,
:data:`PORTABLE_POLICIES`) and the two models: all in docs/schedules.md.
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
