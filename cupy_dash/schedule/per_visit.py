"""Per-visit schedule tables: argument checks and sliding windows, :class:`Schedule`, the two models
(``simulate``, ``timeline``, ``lower_bound``) and the check of a table before its upload; built by
:mod:`cupy_dash.schedule.auto`. Policies, models and calibration: docs/schedules.md.
"""
from __future__ import annotations

import math
import numbers

import numpy as np

from . import _schedule

POLICIES = ("auto", "fa3", "descending", "shift", "symmetric_shift")
PORTABLE_POLICIES = ("fa3", "descending")   # bits independent of the CTA count (docs/schedules.md, "Portable bits")
AUTO_CANDIDATES = ("symmetric_shift", "shift", "descending", "fa3")
AUTO_COSTS = (1.0, 0.8)      # (c, r) of the engine model, calibrated on the H200 (docs/schedules.md)
AUTO_TOLERANCE = 0.03
# NOTES: measured override of the engine model: grouped KV columns (g > 1) with at most AUTO_FEW_GROUPED per CTA
# take ``descending``, which the model ranks last (docs/schedules.md, "What auto means", the GQA exception).
AUTO_FEW_GROUPED = 2
AUTO_MAX_SIMULATED_VISITS = 1 << 21   # above: auto decides by the column model (compact.py), not per visit
# The share of the L2 that fa3's head sections fill with their heads' Q, dO and fp32 dQ (docs/schedules.md,
# "L2 sections"; 25 MB of the H200's 60 MB, where sections of 1-8 heads measured fastest).
L2_SECTION_SHARE = 0.4
MODELS = ("dag", "engine")
ROW_BYTES = 20          # a visit in a per-visit table: its int32 row (cta, head, n_block, m_block) and int32 rank
# Above this many visits a backward uses compact (per-column) tables unless told otherwise (compact_device), and
# build() refuses a per-visit table: 2^24 visits, 335 MB of rows and ranks.
AUTO_VISITS = 1 << 24


class Schedule:
    """One schedule table and the problem it was built for.  Arrays are read-only (tables are cached). ``pieces``:
    the split KV columns of a table from :func:`cupy_dash.schedule.pieces.split_tail`, else None."""
    pieces = None

    def __init__(self, policy, seqlen_q, seqlen_k, block_m, block_n, num_heads, causal, num_sms,
                 visits, rank, cta_start, group_size=1, window=(-1, -1), head_section=0):
        self.policy = policy
        self.seqlen_q, self.seqlen_k = seqlen_q, seqlen_k
        self.block_m, self.block_n = block_m, block_n
        self.num_heads, self.causal, self.num_sms = num_heads, causal, num_sms
        self.group_size = group_size          # query heads per KV head (1: MHA)
        self.window = tuple(window)           # (left, right), canonical: see canonical_window
        self.head_section = head_section      # KV heads per section of fa3's shortest-first rounds (0: all)
        self.num_m_blocks = -(-seqlen_q // block_m)
        self.num_n_blocks = -(-seqlen_k // block_n)
        self.visits, self.rank, self.cta_start = visits, rank, cta_start
        for a in (visits, rank, cta_start):
            a.flags.writeable = False
        self.num_ctas = len(cta_start) - 1
        self.key = (policy, seqlen_q, seqlen_k, block_m, block_n, num_heads, causal, num_sms, group_size,
                    self.window, head_section)
        self._validated = False

    @property
    def num_visits(self) -> int:
        return len(self.rank)

    def column_ranges(self) -> tuple:
        """(lo, hi), int64 (num_n_blocks,) each: KV tile n sees Q tiles [lo[n], hi[n]) (empty: no query sees
        it)."""
        return _schedule.column_ranges(self.seqlen_q, self.seqlen_k, self.block_m, self.block_n, self.causal,
                                       *self.window)

    def column_starts(self) -> np.ndarray:
        """int64 (num_n_blocks,): first unmasked Q tile of every KV tile (``column_ranges()[0]``)."""
        return self.column_ranges()[0]

    def validate(self) -> "Schedule":
        """Raise ValueError (naming the first offending tile) unless the table is complete, ranked and live."""
        if not self._validated and self.pieces is not None:
            self.pieces.validate(self)
            self._validated = True
        if not self._validated:
            lo, hi = self.column_ranges()
            _schedule.analyze_table(self.visits, self.rank, self.cta_start, self.num_heads, self.num_m_blocks,
                                    lo, group_size=self.group_size, hi_arr=hi)
            self._validated = True
        return self

    def simulate(self, c: float = 1.0, r: float = 0.25, model: str = "dag") -> float:
        return simulate(self, c, r, model)

    def lower_bound(self, c: float = 1.0, r: float = 0.25, model: str = "dag") -> float:
        return lower_bound(self, c, r, model)

    def __repr__(self):
        group = f", group_size={self.group_size}" if self.group_size != 1 else ""
        window = f", window={self.window}" if self.window != (-1, -1) else ""
        return (f"Schedule({self.policy!r}, seqlen_q={self.seqlen_q}, seqlen_k={self.seqlen_k}, "
                f"block_m={self.block_m}, block_n={self.block_n}, num_heads={self.num_heads}{group}, "
                f"causal={self.causal}{window}, num_sms={self.num_sms}: {self.num_visits} visits on "
                f"{self.num_ctas} CTAs)")


def l2_head_section(tokens_q: int, head_dim: int, group_size: int, l2_bytes: int,
                    head_dim_v: int | None = None) -> int:
    """KV heads per section of the ``fa3`` policy's shortest-first rounds (build's ``head_section``): as many as
    keep their Q and dO (16-bit: 2 bytes each) and fp32 dQ accumulators, ``tokens_q`` query tokens per head (a
    packed batch: all of them) and ``group_size`` query heads per KV head, within L2_SECTION_SHARE of ``l2_bytes``;
    at least 1. The section size changes the speed, never the bits."""
    dv = head_dim if head_dim_v is None else head_dim_v
    per_kv_head = max(1, tokens_q) * group_size * (2 * (head_dim + dv) + 4 * head_dim)
    return max(1, int(L2_SECTION_SHARE * l2_bytes) // per_kv_head)


MAX_SMS = 1 << 20        # num_sms: far above any GPU's, and the builders size scratch by it
MAX_HEADS = 1 << 24      # num_heads (B * H) / heads: the column counts stay far from overflow


def _positive_int(name, value, minimum=1, maximum=None):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {value}")
    return int(value)


def _flag(name, value) -> bool:
    """A real bool (``bool`` or ``numpy.bool_``): a string such as ``"no"`` would otherwise count as True."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__} {value!r}")
    return bool(value)


def _cost(name, value, *, zero_ok: bool) -> float:
    """A model cost as a float: finite, and > 0 (or >= 0 with ``zero_ok``); raises naming ``name``."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__} {value!r}")
    value = float(value)
    if not math.isfinite(value) or value < 0 or (value == 0 and not zero_ok):
        raise ValueError(f"{name} must be a finite number {'>=' if zero_ok else '>'} 0, got {value!r}")
    return value


def _costs(c, r) -> tuple:
    """(c, r) checked: a visit's compute c > 0 and its reduction r >= 0, both finite."""
    return _cost("c", c, zero_ok=False), _cost("r", r, zero_ok=True)


def check_window(window, causal: bool) -> tuple:
    """``window`` = (left, right) as FlashAttention defines it: query ``i`` sees keys ``j`` with
    ``i + Sk - Sq - left <= j <= i + Sk - Sq + right``; -1 leaves a side unbounded. Returns (left, right) as ints,
    with ``causal`` the right side 0 (a positive right with causal is a contradiction and raises). Raises
    TypeError / ValueError naming ``window`` for anything but a pair of ints in [-1, 2^31)."""
    try:
        left, right = window
    except (TypeError, ValueError):
        raise TypeError(f"window: expected a pair (left, right) of ints >= -1, got {window!r}") from None
    for side, x in (("left", left), ("right", right)):
        # NOTES: torch.SymInt (torch.compile's dynamic shapes) counts as an int by name: this layer imports no
        # framework; the op checks the concrete value when it runs
        if isinstance(x, (bool, np.bool_)) or not (isinstance(x, (int, np.integer)) or type(x).__name__ == "SymInt"):
            raise TypeError(f"window: {side} must be an int >= -1, got {type(x).__name__} {x!r}")
        if x < -1 or x >= 1 << 31:
            raise ValueError(f"window: {side} must be -1 (unbounded) or in [0, 2^31), got {x}")
    left, right = int(left), int(right)
    if causal:
        if right > 0:
            raise ValueError(f"window: right={right} contradicts causal=True (causal means right = 0)")
        right = 0
    return left, right


def canonical_window(window, seqlen_q: int, seqlen_k: int, causal: bool) -> tuple:
    """``window`` checked by :func:`check_window`, in the canonical form that the kernels and the table caches
    get: a side that bounds nothing for these lengths becomes -1 (left >= Sk - 1: every query's window starts at
    or before key 0; right >= Sq - 1: every query's window ends at or after key Sk - 1), and with ``causal``
    right is 0. The visible set is unchanged."""
    left, right = check_window(window, causal)
    if not causal and right >= seqlen_q - 1:
        right = -1
    if left >= seqlen_k - 1:
        left = -1
    return left, right


def unseen_keys(seqlen_q: int, seqlen_k: int, causal: bool, window) -> int:
    """How many keys no query sees, for ``window`` in :func:`canonical_window` form: they are always the leading
    keys 0 .. Sk - Sq - left - 1 (query i's window ends at or after key i + Sk - Sq, so the last query sees the
    last key and every key after the first one seen), and there are none without a left bound. KV tiles made of
    such keys only have an empty Q-tile range (:meth:`Schedule.column_ranges`) and no visits."""
    left = window[0]
    return max(0, seqlen_k - seqlen_q - left) if left >= 0 else 0


def _checked_args(policy, seqlen_q, seqlen_k, block_m, block_n, num_heads, causal, num_sms, group_size, window,
                  head_section=0):
    """build()'s argument checks; the problem as a tuple of plain ints, a bool, the canonical window and the head
    section (0: none)."""
    if policy not in POLICIES:
        raise ValueError(f"unknown schedule {policy!r}; expected one of {', '.join(POLICIES)}")
    heads, group = _positive_int("num_heads", num_heads, maximum=MAX_HEADS), _positive_int("group_size", group_size)
    if heads % group:
        raise ValueError(f"group_size ({group}) must divide num_heads ({heads})")
    sq, sk, causal = _positive_int("seqlen_q", seqlen_q), _positive_int("seqlen_k", seqlen_k), _flag("causal", causal)
    return (sq, sk, _positive_int("block_m", block_m), _positive_int("block_n", block_n),
            heads, causal, _positive_int("num_sms", num_sms, maximum=MAX_SMS), group,
            canonical_window(window, sq, sk, causal),
            _positive_int("head_section", head_section, minimum=0))


_PER_VISIT = ("visits", "rank", "cta_start", "num_heads", "num_m_blocks", "column_ranges|column_starts")
_PER_VISIT_WHAT = ("a per-visit schedule table (a Schedule from schedule.build(...), or an object with visits, rank, "
                   "cta_start, num_heads, num_m_blocks and column_ranges())")


def _table_arg(plan, needs=_PER_VISIT, what=_PER_VISIT_WHAT, name="plan"):
    """``plan`` if it has every attribute in ``needs`` ("a|b": either); else TypeError naming ``name``, saying
    ``what`` it must be and, for the usual mix-ups (a policy name, compact records where a per-visit table is
    needed, or the reverse), what to call instead."""
    missing = [n for n in needs if not any(hasattr(plan, a) for a in n.split("|"))]
    if not missing:
        return plan
    per_visit, compact = "visits" in needs, "records" in needs
    if isinstance(plan, str):
        got = f"str {plan!r}"
        hint = (f" (a policy name: build its table first, schedule.build{'_compact' if compact else ''}({plan!r}, "
                f"seqlen_q=..., ...))" if plan in POLICIES else "")
    else:
        scalar = plan is None or isinstance(plan, (bool, numbers.Number))
        got = f"{type(plan).__name__} {plan!r}" if scalar else type(plan).__name__
        hint = ""
        if per_visit and hasattr(plan, "to_schedule"):
            hint = (" (compact records: plan.to_schedule() is their per-visit table; plan.model_makespan() and "
                    "plan.lower_bound() evaluate the column model)")
        elif per_visit and hasattr(plan, "records"):
            hint = " (compact records: their expand() gives the per-visit arrays)"
        elif compact and hasattr(plan, "visits"):
            hint = " (a per-visit table already: its visits, rank and cta_start are what expand returns)"
    raise TypeError(f"{name}: expected {what}, got {got}{hint}")


def _engine(model: str) -> bool:
    if model not in MODELS:
        raise ValueError(f"model must be one of {MODELS}, got {model!r}")
    return model == "engine"


def _writers(writers) -> int:
    if isinstance(writers, bool) or writers not in (1, 2):
        raise ValueError(f"writers must be 1 or 2 (dQ writer warps of the engine model), got {writers!r}")
    return int(writers)


def simulate(plan: Schedule, c: float = 1.0, r: float = 0.25, model: str = "dag", writers: int = 1) -> float:
    """Makespan of ``plan``. ``model="dag"``: the paper's DAG model, each visit computes for ``c`` then reduces
    for ``r`` on its CTA, serially; a reduction starts only after every lower-ranked visit of the same dQ tile
    has reduced. ``model="engine"``: the Hopper kernel's pipeline, with ``writers`` dQ writer warps (2: the
    deterministic kernel's, visits alternating; ``auto`` still decides with 1; docs/schedules.md, "The two
    models").

    ``c`` must be finite and > 0, ``r`` finite and >= 0 (ValueError naming the argument otherwise)."""
    return _analyze(plan, c, r, model, writers, False)[0]


def timeline(plan: Schedule, c: float = 1.0, r: float = 0.25, model: str = "dag", writers: int = 1) -> dict:
    """Per-visit simulated timeline: float64 arrays (V,) ``compute_start``, ``reduce_start`` (in the DAG model
    the wait of a visit is reduce_start - compute_start - c) and (num_ctas,) ``finish``; plus ``makespan``.
    ``c``, ``r`` and ``writers`` are checked as in :func:`simulate`."""
    makespan, finish, comp, red = _analyze(plan, c, r, model, writers, True)
    return {"makespan": makespan, "finish": finish, "compute_start": comp, "reduce_start": red}


def _analyze(plan, c, r, model, writers, with_timeline) -> tuple:
    """The simulation of :func:`simulate` and :func:`timeline` (their checks, in order): analyze_table's
    (makespan, finish, compute_start, reduce_start), the arrays None unless ``with_timeline``."""
    _table_arg(plan)
    c, r = _costs(c, r)
    lo, hi = _ranges(plan)
    return _schedule.analyze_table(plan.visits, plan.rank, plan.cta_start, plan.num_heads, plan.num_m_blocks, lo,
                                   True, c, r, with_timeline, _engine(model), _group_size(plan), hi,
                                   _writers(writers))


def _group_size(plan) -> int:
    return int(getattr(plan, "group_size", 1))


def _ranges(plan) -> tuple:
    """(lo, hi) of a Schedule, or of a schedule-like object with ``column_starts()`` only (ranges end at M)."""
    if hasattr(plan, "column_ranges"):
        return plan.column_ranges()
    lo = plan.column_starts()
    return lo, np.full(len(lo), plan.num_m_blocks, dtype=np.int64)


def lower_bound(plan: Schedule, c: float = 1.0, r: float = 0.25, model: str = "dag") -> float:
    """No schedule beats max(total work / num_sms, the longest KV column's chain: group_size times the most
    unmasked Q tiles of a KV tile), where a visit costs c + r in the DAG model and max(c, r) in the engine model
    (compute and reduction overlap). ``c`` and ``r`` are checked as in :func:`simulate`."""
    _table_arg(plan, ("num_visits", "num_sms", "column_ranges|column_starts"), "a schedule table (a Schedule from "
               "schedule.build(...) or a CompactSchedule from schedule.build_compact(...))")
    c, r = _costs(c, r)
    lo, hi = _ranges(plan)
    longest = _group_size(plan) * int((hi - lo).max())
    step = max(c, r) if _engine(model) else c + r
    return max(plan.num_visits * step / plan.num_sms, longest * step)


def critical_path(policy: str, *, n: int, m: int, c: float = 1.0, r: float = 0.25, causal: bool = False) -> float:
    """The paper's closed forms: n KV tiles on n SMs, square tiles (n Q tiles), m heads.

    full fa3 / descending: m·n(c+r) + (n−1)r; full shift / symmetric_shift: m·n(c+r);
    causal descending: m(n+1)(c+r)/2 + (n−1)r; causal symmetric_shift: m(n+1)(c+r)/2 (m even).
    Other (policy, mask) pairs have no closed form in the paper and raise ValueError, as do costs that
    :func:`simulate` rejects.
    """
    n, m = _positive_int("n", n), _positive_int("m", m)
    c, r = _costs(c, r)
    causal = _flag("causal", causal)
    if not causal:
        if policy in ("fa3", "descending"):
            return m * n * (c + r) + (n - 1) * r
        if policy in ("shift", "symmetric_shift"):
            return m * n * (c + r)
    else:
        if policy == "descending":
            return m * (n + 1) * (c + r) / 2 + (n - 1) * r
        if policy == "symmetric_shift":
            return m * (n + 1) * (c + r) / 2
    mask = "causal" if causal else "full"
    raise ValueError(f"no closed form for policy {policy!r} with a {mask} mask; closed forms exist for full "
                     f"fa3/descending/shift/symmetric_shift and causal descending/symmetric_shift")


def check_plan(plan, num_heads: int, n_blocks: int, m_blocks: int) -> tuple:
    """A schedule-like object's arrays in kernel dtypes ``(visits, rank, cta_start, num_ctas)``, after bounds
    checks that keep a corrupted table from touching memory outside the kernel's buffers (a bad *rank* is
    allowed: the kernel reports it through the semaphore timeout). Raises ValueError naming ``plan``."""
    visits = np.ascontiguousarray(plan.visits, dtype=np.int32)
    rank = np.ascontiguousarray(plan.rank, dtype=np.int32)
    cta_start = np.ascontiguousarray(plan.cta_start, dtype=np.int64)
    num_ctas = int(plan.num_ctas)
    if num_ctas < 1:
        raise ValueError(f"plan: num_ctas must be >= 1, got {num_ctas}")
    if visits.ndim != 2 or visits.shape[1] != 4:
        raise ValueError(f"plan: visits must be (V, 4) rows (cta, bh, n_block, m_block), got shape {visits.shape}")
    V = visits.shape[0]
    if rank.shape != (V,):
        raise ValueError(f"plan: rank must have shape ({V},), got {rank.shape}")
    if cta_start.shape != (num_ctas + 1,):
        raise ValueError(f"plan: cta_start must have shape ({num_ctas + 1},), got {cta_start.shape}")
    counts = np.diff(cta_start)
    if cta_start[0] != 0 or cta_start[-1] != V or (counts < 0).any():
        raise ValueError("plan: cta_start must rise from 0 to the number of visits")
    if V:
        if not np.array_equal(visits[:, 0], np.repeat(np.arange(num_ctas, dtype=np.int32), counts)):
            raise ValueError("plan: visits[:, 0] (cta) does not match cta_start")
        for col, name, limit in ((1, "bh", num_heads), (2, "n_block", n_blocks), (3, "m_block", m_blocks)):
            c = visits[:, col]
            if c.min() < 0 or c.max() >= limit:
                raise ValueError(f"plan: visits[:, {col}] ({name}) must lie in [0, {limit}), "
                                 f"got [{c.min()}, {c.max()}]")
    return visits, rank, cta_start, num_ctas

