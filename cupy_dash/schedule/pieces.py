"""Per-visit tables whose last wave is cut into pieces of KV columns (kernels_src/bwd/pieces.cuh).

At full 3840 (16k tokens, 16 heads of 128), 1,920 columns of 48 visits go to 132 CTAs: 72 CTAs run 15 columns and
60 run 14, and the SMs idle ~3 % of a steady backward (docs/decisions/bwd-engine.md, "The clock read from the
kernel, and the last wave"). :func:`split_tail` keeps each CTA's columns up to the least-loaded CTA's load and cuts
every column left over into ``num_pieces`` runs of its Q range, each run to the CTA with the least load so far. A
piece run's fp32 dK / dV partial sums go to the column's slot for that piece; the CTA whose piece arrives last adds
the slots in piece order and writes dK, dV (the bits do not depend on which CTA that is). :func:`trim_tail` is the
other cut: each CTA's list cut at the mean load, two pieces per cut run (measured for causal tables: no gain).

The table: a :class:`~cupy_dash.schedule.Schedule` whose ``pieces`` is a :class:`Pieces`. From
``cta_start[c] + cta_pieces[c, 0]`` on, every run of CTA c has a code in ``piece_code`` (from index ``cta_pieces[c,
1]`` on, in order): ``split column * num_pieces + piece``, or -1 for a whole KV tile. Every dQ tile adds in the order
of its visits' positions in their CTA's list, ties by CTA: the unfinished visit with the smallest (position, CTA)
can always run, so the table cannot deadlock. Only MHA tables are cut (split_tail: full masks without a window);
the bits depend on the CTA count, so portable policies are never cut.
"""
from __future__ import annotations

import heapq
import typing

import numpy as np

from . import per_visit


# `auto`'s split (rounds 39-40, docs/decisions/bwd-engine.md "Split KV columns"): thirds of each column left over
# (sixths for long tables of 128-query tiles, below), for full-mask MHA tables of at least AUTO_MIN_M_BLOCKS[block_m]
# Q tiles (else 30). Measured against the uncut tables on an H100 (ms in bursts): 80-query tiles (head dim 128)
# +1.5 % at 16 Q tiles, -0.2 % at 32 and 39, -0.8 / -1.0 % at 48 / 192; 128-query tiles (head dim 64, a sixth of the
# split columns) -0.1 / -0.5 / -1.0 / -0.9 / -1.6 / -2.2 % at 10 / 12 / 15 / 20 / 30 / 120.
AUTO_NUM_PIECES = 3
AUTO_MIN_M_BLOCKS = {128: 12}
# 128-query tiles take sixths from this many Q tiles on (pieces of ten visits or more): against thirds -0.6 / -1.4 %
# in bursts at 120 Q tiles, even at 60 and 30 (rounds 39 and 40)
AUTO_LONG_NUM_PIECES = 6
AUTO_SIXTHS_MIN_M_BLOCKS = {128: 60}


def num_pieces_for(policy: str, num_m_blocks: int, block_m: int, causal: bool, group_size: int, window,
                   forced=None, num_pieces=None) -> int:
    """Pieces per split column for a backward's per-visit tables of ``policy`` (0: left uncut) with
    ``num_m_blocks`` Q tiles of ``block_m`` queries; ``window`` in canonical form, ``forced`` config.SPLIT_COLUMNS's
    value (None: the rule, False: never, True: every table :func:`split_tail` takes), ``num_pieces``
    config.SPLIT_PIECES's (None: AUTO_NUM_PIECES, or AUTO_LONG_NUM_PIECES from AUTO_SIXTHS_MIN_M_BLOCKS Q
    tiles). The rule: ``auto`` tables of full-mask MHA problems without a window and at least AUTO_MIN_M_BLOCKS Q
    tiles. A table built for a portable policy is never cut (the caller checks the policy that ``auto`` chose)."""
    pieces = num_pieces
    if pieces is None:
        long = num_m_blocks >= AUTO_SIXTHS_MIN_M_BLOCKS.get(block_m, 1 << 62)
        pieces = AUTO_LONG_NUM_PIECES if long else AUTO_NUM_PIECES
    if forced is False or causal or group_size != 1 or tuple(window) != (-1, -1):
        return 0
    if policy in per_visit.PORTABLE_POLICIES or num_m_blocks < pieces:
        return 0
    if forced or (policy == "auto" and num_m_blocks >= AUTO_MIN_M_BLOCKS.get(block_m, 30)):
        return pieces
    return 0


def split_for_kernel(plan, num_pieces: int):
    """:func:`split_tail` of ``plan`` with ``num_pieces`` (0: ``plan``), or ``plan`` itself where it already has
    pieces, its policy is portable, or the split would have more columns than Q tiles (the preprocess pass zeroes
    one split column's counter per Q tile: kernels_src/bwd/pieces.cuh)."""
    if not num_pieces or plan.pieces is not None or plan.policy in per_visit.PORTABLE_POLICIES:
        return plan
    split = split_tail(plan, num_pieces)
    if split.pieces is not None and split.pieces.num_split > plan.num_heads * plan.num_m_blocks:
        return plan
    return split


class Pieces(typing.NamedTuple):
    """A table's split columns: ``cta_pieces`` int32 (num_ctas, 2), ``piece_code`` int32 (runs,), ``num_pieces`` per
    split column, ``num_split`` columns."""
    cta_pieces: np.ndarray
    piece_code: np.ndarray
    num_pieces: int
    num_split: int

    def validate(self, plan) -> None:
        """:func:`validate` (Schedule.validate's way here: per_visit does not import this module)."""
        validate(plan)


class Rows:
    """One CTA's list of (bh, n_block, m_block) rows, held as int32 (k, 3) chunks: ``len`` and ``extend`` as a
    list's (:func:`keep_to` makes them, :func:`hand_out` extends them, :func:`ranked` reads them)."""
    __slots__ = ("chunks", "count")

    def __init__(self, rows=()):
        self.chunks, self.count = [], 0
        self.extend(rows)

    def __len__(self) -> int:
        return self.count

    def extend(self, rows) -> None:
        a = np.asarray(rows, dtype=np.int32).reshape(-1, 3)
        if len(a):
            self.chunks.append(a)
            self.count += len(a)

    def array(self) -> np.ndarray:
        return np.concatenate(self.chunks) if self.chunks else np.zeros((0, 3), dtype=np.int32)


def _run_bounds(visits: np.ndarray, begin: int, end: int) -> list:
    """[((bh, n_block), a, b), ...]: the runs of a KV tile among rows [begin, end) of a per-visit table, each rows
    [a, b)."""
    v = visits[begin:end]
    if not len(v):
        return []
    cut = np.concatenate([[0], np.flatnonzero(np.any(v[1:, 1:3] != v[:-1, 1:3], axis=1)) + 1, [len(v)]]) + begin
    return [((int(visits[a, 1]), int(visits[a, 2])), int(a), int(b)) for a, b in zip(cut[:-1], cut[1:])]


def _runs(visits: np.ndarray, begin: int, end: int) -> list:
    """[((bh, n_block), [m_block, ...]), ...] of rows [begin, end) of a per-visit table, one per run of a KV tile."""
    return [(col, visits[a:b, 3].tolist()) for col, a, b in _run_bounds(visits, begin, end)]


def keep_to(base, floor: int) -> tuple:
    """``(lists, tail)``: per CTA of ``base`` a :class:`Rows` of the (bh, n_block, m_block) rows of its runs kept
    while its load stays within ``floor`` visits, and every run left over, as ((bh, n_block), [m_block, ...]), in
    CTA order. O(visits) in numpy; Python only over the runs left over."""
    visits, cta_start = np.asarray(base.visits), np.asarray(base.cta_start)
    if not len(visits):
        return [Rows() for _ in range(base.num_ctas)], []
    new = np.ones(len(visits), dtype=bool)
    new[1:] = np.any(visits[1:, :3] != visits[:-1, :3], axis=1)        # a run starts: CTA, head or KV tile changes
    starts = np.flatnonzero(new)
    ends = np.append(starts[1:], len(visits))
    run_cta = visits[starts, 0].astype(np.int64)
    ends_in_cta = ends - cta_start[run_cta]
    # NOTES: a CTA's runs end ever later, so those ending within floor are a prefix of its list
    kept = ends_in_cta <= floor
    kept_len = np.zeros(base.num_ctas, dtype=np.int64)
    np.maximum.at(kept_len, run_cta[kept], ends_in_cta[kept])
    lists = [Rows(visits[cta_start[c]:cta_start[c] + kept_len[c], 1:]) for c in range(base.num_ctas)]
    tail = [((int(visits[a, 1]), int(visits[a, 2])), visits[a:b, 3].tolist())
            for a, b in zip(starts[~kept], ends[~kept])]
    return lists, tail


def split_tail(base, num_pieces: int = 3):
    """``base`` (a per-visit Schedule, MHA, no window, not a portable policy) with its last wave cut: each CTA keeps
    its runs while its load stays within the least-loaded CTA's; every run left over (a whole KV column) is cut into
    ``num_pieces`` ranges of its Q tiles (near-equal, in the run's own order) and each range goes to the CTA with the
    least load so far that does not end with a piece of the same column (two would run as one), the heads' pieces
    interleaved. Returns ``base`` itself when nothing is left over, a column is shorter than ``num_pieces`` or no
    CTA can take a piece apart from its column's others (a table of a few CTAs); else a validated Schedule with
    ``pieces`` set."""
    if isinstance(num_pieces, bool) or not isinstance(num_pieces, (int, np.integer)) or not 2 <= num_pieces <= 16:
        raise ValueError(f"num_pieces must be an int in [2, 16], got {num_pieces!r}")
    if base.group_size != 1 or base.window != (-1, -1) or base.causal:
        raise ValueError("split_tail: full-mask MHA tables only (no GQA, window or causal mask)")
    if base.policy in per_visit.PORTABLE_POLICIES:
        raise ValueError(f"split_tail: {base.policy!r} is portable (bits independent of the CTA count)")
    lists, tail = keep_to(base, int(np.diff(base.cta_start).min()))
    if not tail or min(len(t) for _, t in tail) < num_pieces:
        return base
    by_head: dict = {}
    for s, (col, tiles) in enumerate(tail):
        bounds = [len(tiles) * k // num_pieces for k in range(num_pieces + 1)]
        by_head.setdefault(col[0], []).extend(
            (s * num_pieces + k, col, tiles[bounds[k]:bounds[k + 1]]) for k in range(num_pieces))
    order, queues = [], list(by_head.values())
    while any(queues):                                     # the heads interleaved
        for q in queues:
            if q:
                order.append(q.pop(0))
    piece_from, codes = [len(lst) for lst in lists], [[] for _ in lists]
    segments = [np.column_stack([np.full(len(tiles), bh), np.full(len(tiles), n), tiles])
                for _, (bh, n), tiles in order]
    try:
        handed = hand_out(lists, segments, [col for _, col, _ in order])
    except NoRoom:                                         # a CTA or two: no cut keeps the pieces apart
        return base
    for c, (code, _, _) in zip(handed, order):
        codes[c].append(code)
    return _with_pieces(ranked(base, lists), base, _pieces(piece_from, codes, int(num_pieces), len(tail)), "pieces")


def trim_tail(base):
    """``base`` (a per-visit Schedule, MHA, not a portable policy; any mask) with every CTA's list cut at the mean
    load (rounded up): a run that the cut falls inside becomes two pieces, its head kept and its remainder moved,
    and the whole runs after the cut move whole; what is moved goes, earliest cut first, to the CTA with the least
    load so far that does not end with the same column. Two pieces per split column. Returns ``base`` itself when no
    run is cut or no CTA can take a remainder apart from its head; else a validated Schedule with ``pieces`` set
    (round 37's load model: -0.6 % / -1.9 % at causal 8k / 16k)."""
    if base.group_size != 1:
        raise ValueError("trim_tail: MHA tables only (a GQA run holds several query heads)")
    if base.policy in per_visit.PORTABLE_POLICIES:
        raise ValueError(f"trim_tail: {base.policy!r} is portable (bits independent of the CTA count)")
    visits, cta_start = np.asarray(base.visits), np.asarray(base.cta_start)
    floor = int(np.ceil(np.diff(cta_start).mean()))
    lists, moved, piece_from, codes, num_split = [], [], [], [[] for _ in range(base.num_ctas)], 0
    for c in range(base.num_ctas):
        kept, split_at, pos = [], None, 0          # pos: where the run starts in the CTA's list
        for col, tiles in _runs(visits, int(cta_start[c]), int(cta_start[c + 1])):
            room = floor - pos
            if room >= len(tiles):
                kept.extend((col[0], col[1], m) for m in tiles)
            elif room > 0:
                split_at = pos
                kept.extend((col[0], col[1], m) for m in tiles[:room])
                codes[c].append(2 * num_split)
                moved.append((floor, c, 2 * num_split + 1, [(col[0], col[1], m) for m in tiles[room:]]))
                num_split += 1
            else:
                moved.append((pos, c, -1, [(col[0], col[1], m) for m in tiles]))
            pos += len(tiles)
        lists.append(kept)
        piece_from.append(len(kept) if split_at is None else split_at)
    if not num_split:
        return base
    moved.sort(key=lambda x: (x[0], x[1]))
    try:
        handed = hand_out(lists, [rows for *_, rows in moved], [tuple(rows[0][:2]) for *_, rows in moved])
    except NoRoom:
        return base
    for c, (_, _, code, _) in zip(handed, moved):
        codes[c].append(code)
    return _with_pieces(ranked(base, lists), base, _pieces(piece_from, codes, 2, num_split), "trim")


class NoRoom(ValueError):
    """:func:`hand_out` found no CTA for a segment without merging it into a run of its own KV tile."""


def _last_column(lst):
    """(bh, n_block) of the last row of ``lst`` (a :class:`Rows` or a list of triples), or None when empty."""
    if isinstance(lst, Rows):
        return tuple(int(x) for x in lst.chunks[-1][-1, :2]) if lst.chunks else None
    return tuple(int(x) for x in lst[-1][:2]) if len(lst) else None


def hand_out(lists, segments, columns=None) -> list:
    """Appends each of ``segments`` (rows, in order) to the shortest of ``lists`` at that point (ties: the lower
    CTA); returns the CTA each segment went to. ``columns``: each segment's (bh, n_block); a CTA whose list ends
    with the segment's column is passed over for the next shortest, since the two would run as one run (the
    pieces of a split column must be separate runs). Raises :class:`NoRoom` when every CTA ends with it."""
    heap = [(len(lst), c) for c, lst in enumerate(lists)]
    heapq.heapify(heap)
    last = [_last_column(lst) for lst in lists] if columns is not None else None
    ctas = []
    for i, rows in enumerate(segments):
        passed = []
        load, c = heapq.heappop(heap)
        while last is not None and last[c] == columns[i]:
            passed.append((load, c))
            if not heap:
                raise NoRoom(f"hand_out: every CTA's list ends with KV tile {columns[i]}")
            load, c = heapq.heappop(heap)
        for item in passed:
            heapq.heappush(heap, item)
        lists[c].extend(rows)
        ctas.append(c)
        if last is not None:
            last[c] = columns[i]
        heapq.heappush(heap, (load + len(rows), c))
    return ctas


def _pieces(piece_from, codes, num_pieces: int, num_split: int) -> Pieces:
    """The Pieces of per-CTA first piece visits ``piece_from`` and per-CTA run codes ``codes``."""
    cta_pieces = np.zeros((len(codes), 2), dtype=np.int32)
    cta_pieces[:, 0] = piece_from
    cta_pieces[:, 1] = np.concatenate([[0], np.cumsum([len(x) for x in codes])[:-1]])
    return Pieces(cta_pieces, np.asarray([x for cs in codes for x in cs], dtype=np.int32), num_pieces, num_split)


def _with_pieces(plan, base, split: Pieces, form):
    plan.pieces = split
    for a in (split.cta_pieces, split.piece_code):
        a.flags.writeable = False
    plan.key = base.key + ((form, split.num_pieces),)
    return plan.validate()


def ranked(base, lists):
    """A per-visit Schedule of ``base``'s problem whose CTA c runs ``lists[c]`` ((bh, n_block, m_block) each: a
    :class:`Rows` or a list of triples), every dQ tile adding in the order of its visits' positions in their lists
    (ties: the lower CTA first)."""
    arrays = [lst.array() if isinstance(lst, Rows) else np.asarray(lst, dtype=np.int32).reshape(-1, 3)
              for lst in lists]
    sizes = [len(a) for a in arrays]
    rows = np.zeros((sum(sizes), 4), dtype=np.int32)
    rows[:, 0] = np.repeat(np.arange(len(lists)), sizes)
    if len(rows):
        rows[:, 1:] = np.concatenate(arrays)
    cta_start = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    rank = rank_by_position(rows, cta_start, base.num_m_blocks)
    return per_visit.Schedule(base.policy, base.seqlen_q, base.seqlen_k, base.block_m, base.block_n, base.num_heads,
                              base.causal, base.num_sms, rows, rank, cta_start, base.group_size, base.window,
                              base.head_section)


def rank_by_position(rows: np.ndarray, cta_start: np.ndarray, num_m_blocks: int) -> np.ndarray:
    """int32 ranks: each dQ tile (bh, m_block) adds in the order of (position in its CTA's list, CTA)."""
    pos = np.arange(len(rows)) - np.repeat(cta_start[:-1], np.diff(cta_start))
    ctas, longest = len(cta_start) - 1, int(np.diff(cta_start).max(initial=0)) + 1
    heads = int(rows[:, 1].max(initial=0)) + 1
    if heads * num_m_blocks * longest * max(ctas, 1) < 1 << 62:     # one int64 key: (bh, m_block, pos, cta)
        key = ((rows[:, 1].astype(np.int64) * num_m_blocks + rows[:, 3]) * longest + pos) * ctas + rows[:, 0]
        order = np.argsort(key, kind="stable")
    else:
        order = np.lexsort((rows[:, 0], pos, rows[:, 3], rows[:, 1]))
    tile = rows[order, 1].astype(np.int64) * num_m_blocks + rows[order, 3]
    first = np.concatenate([[0], np.flatnonzero(np.diff(tile)) + 1])
    rank = np.empty(len(rows), dtype=np.int32)
    rank[order] = np.arange(len(rows)) - np.repeat(first, np.diff(np.concatenate([first, [len(rows)]])))
    return rank


def check_arrays(plan, counts: np.ndarray):
    """The bounds of ``plan.pieces`` (None: no pieces), so that no table can make the kernel read or write outside
    its arrays: ``(cta_pieces, piece_code, num_pieces, num_split)`` in kernel dtypes, or None. ``counts``: the
    CTAs' visit counts. Raises ValueError naming ``plan.pieces``."""
    pieces = getattr(plan, "pieces", None)
    if pieces is None:
        return None
    cta_pieces = np.ascontiguousarray(pieces.cta_pieces, dtype=np.int32)
    piece_code = np.ascontiguousarray(pieces.piece_code, dtype=np.int32)
    num_pieces, num_split = int(pieces.num_pieces), int(pieces.num_split)
    if not 2 <= num_pieces <= 16 or num_split < 1:
        raise ValueError(f"plan.pieces: num_pieces must be in [2, 16] and num_split >= 1, got {num_pieces}, "
                         f"{num_split}")
    if cta_pieces.shape != (len(counts), 2) or piece_code.ndim != 1:
        raise ValueError(f"plan.pieces: cta_pieces must be ({len(counts)}, 2) and piece_code 1-D, got "
                         f"{cta_pieces.shape} and {piece_code.shape}")
    if (cta_pieces[:, 0] < 0).any() or (cta_pieces[:, 0] > counts).any():
        raise ValueError("plan.pieces: cta_pieces[:, 0] must lie within each CTA's visits")
    if (cta_pieces[:, 1] < 0).any() or (cta_pieces[:, 1] > len(piece_code)).any():
        raise ValueError("plan.pieces: cta_pieces[:, 1] must index piece_code")
    if len(piece_code) and (piece_code.min() < -1 or piece_code.max() >= num_split * num_pieces):
        raise ValueError(f"plan.pieces: piece codes must lie in [-1, {num_split * num_pieces})")
    return cta_pieces, piece_code, num_pieces, num_split


def validate(plan) -> None:
    """ValueError unless the pieces table ``plan`` is complete and live: every unmasked tile visited once; each KV
    column one whole run, or ``num_pieces`` piece runs whose codes are its split column's 0 .. num_pieces - 1;
    the piece runs' codes read in order from each CTA's first piece visit on (bounded as :func:`check_arrays`);
    every dQ tile's ranks in the order of (position in the CTA's list, CTA)."""
    visits, rank, cta_start = np.asarray(plan.visits), np.asarray(plan.rank), np.asarray(plan.cta_start)
    cta_pieces, piece_code, P, S = check_arrays(plan, np.diff(cta_start))
    M, N, H = plan.num_m_blocks, plan.num_n_blocks, plan.num_heads
    lo, hi = plan.column_ranges()
    if plan.group_size != 1:
        raise ValueError("plan.pieces: MHA tables only")
    tiles = (visits[:, 1].astype(np.int64) * N + visits[:, 2]) * M + visits[:, 3]
    if len(tiles) and (tiles.min() < 0 or tiles.max() >= H * N * M):
        raise ValueError("plan.pieces: a visit's (head, n_block, m_block) lies outside the problem")
    seen = np.bincount(tiles, minlength=H * N * M)
    want = np.zeros((H, N, M), dtype=np.int64)
    for n in range(N):
        want[:, n, lo[n]:hi[n]] = 1
    if not np.array_equal(seen, want.reshape(-1)):
        bad = int(np.flatnonzero(seen != want.reshape(-1))[0])
        raise ValueError(f"plan.pieces: tile (head {bad // (N * M)}, n_block {bad // M % N}, m_block {bad % M}) is "
                         f"visited {seen[bad]} times, expected {want.reshape(-1)[bad]}")
    whole, piece_of = set(), {}
    for c in range(plan.num_ctas):
        begin, end = int(cta_start[c]), int(cta_start[c + 1])
        split_at, nxt = begin + int(cta_pieces[c, 0]), int(cta_pieces[c, 1])
        for col, a, b in _run_bounds(visits, begin, end):
            code = -1
            if a >= split_at:
                if nxt >= len(piece_code):
                    raise ValueError(f"plan.pieces: cta {c} has more runs than piece codes")
                code, nxt = int(piece_code[nxt]), nxt + 1
            elif b > split_at:
                raise ValueError(f"plan.pieces: cta {c}'s first piece visit falls inside a run")
            if code < 0:
                if col in whole or (b - a) != hi[col[1]] - lo[col[1]]:
                    raise ValueError(f"plan.pieces: KV tile {col} is not one whole run (cta {c})")
                whole.add(col)
            else:
                if code in piece_of:
                    raise ValueError(f"plan.pieces: piece code {code} runs twice")
                piece_of[code] = col
    for s in range(S):
        cols = {piece_of.get(s * P + k) for k in range(P)}
        if len(cols) != 1 or None in cols or cols & whole:
            raise ValueError(f"plan.pieces: split column {s} must be {P} piece runs of one KV tile, got {cols}")
    if len(piece_of) != S * P:
        raise ValueError("plan.pieces: piece codes outside the split columns")
    if not np.array_equal(rank, rank_by_position(visits, cta_start, M)):
        raise ValueError("plan.pieces: ranks must follow (position in the CTA's list, CTA)")
