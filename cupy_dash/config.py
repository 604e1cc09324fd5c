"""Every environment variable cupy_dash reads (:data:`KNOBS`), defined once as a :class:`Knob` and parsed in one
place; modules ask a knob (``config.FOLD.get()``), never ``os.environ``. What each means, when a change takes
effect and :func:`fingerprint`: docs/configuration.md (which names every knob: tests/unit/test_config.py).

NOTES: on POSIX CPython, ``os.environ`` keeps a bytes-keyed dict ``_data`` in step with every write through it
(``monkeypatch.setenv`` included); the knobs read it directly, elsewhere ``os.environ``.
"""
from __future__ import annotations

import math
import os

_ENV_DATA = os.environ._data if os.name == "posix" and isinstance(getattr(os.environ, "_data", None), dict) \
    else None
_UNREAD = object()


def _environ_get(key: bytes):
    value = os.environ.get(key.decode())
    return None if value is None else os.fsencode(value)


# raw(key): the environment variable ``key`` (ASCII bytes) as bytes, or None when unset
raw = _ENV_DATA.get if _ENV_DATA is not None else _environ_get


class Knob:
    """One environment variable: ``name``, ``kind`` (the values it takes, in words), ``meaning`` (one line) and
    ``parse`` (raw string, or None when unset -> value; raises ValueError); ``default`` is ``parse(None)``."""
    __slots__ = ("name", "key", "kind", "meaning", "parse", "default", "_last")

    def __init__(self, name: str, kind: str, meaning: str, parse):
        self.name, self.key, self.kind, self.meaning, self.parse = name, name.encode(), kind, meaning, parse
        self.default = parse(None)
        self._last = (_UNREAD, None)        # (raw bytes or None, its value): one tuple, replaced whole

    def get(self):
        """The knob's value now (parsed again only when the raw value changed since the last read)."""
        value = raw(self.key)
        last = self._last
        if value == last[0]:
            return last[1]
        parsed = self.parse(None if value is None else os.fsdecode(value))
        self._last = (value, parsed)
        return parsed

    def raw(self):
        """The variable's raw value (str), or None when unset."""
        value = raw(self.key)
        return None if value is None else os.fsdecode(value)

    def __repr__(self):
        return f"Knob({self.name})"


# ------------------------------------------------------------------------------------------------------------
# parsers: raw string (None: unset) -> value
# ------------------------------------------------------------------------------------------------------------
def _flag(s) -> bool:
    """Set to anything but "" or "0": on."""
    return s not in (None, "", "0")


def _on_unless_off(s) -> bool:
    """Unset: on; "0" or "": off; anything else: on."""
    return s not in ("0", "")


def _tristate(s):
    """Unset or "": None (automatic); "0": False; anything else: True."""
    return None if not s else s != "0"


def _fold(s):
    """ "0": False (never); "1": True (always); anything else, or unset: None (automatic). Spaces ignored."""
    s = (s or "").strip()
    return False if s == "0" else True if s == "1" else None


def _expand(s) -> str:
    return "host" if s == "host" else "device"


def _path(s):
    return s or None


def _int_choice(name: str, choices: tuple, default):
    """A parser for a knob that is one of the integers ``choices``: unset gives ``default``; anything else raises
    naming ``name``."""
    def parse(s):
        if s in (None, ""):
            return default
        if s in tuple(map(str, choices)):
            return int(s)
        raise ValueError(f"{name}: expected {' or '.join(map(str, choices))}, got {s!r}")
    return parse


_DEFAULT_SPIN_TIMEOUT_MS = 10000.0


def _spin_timeout(s) -> float:
    if s is None or not s.strip():
        return _DEFAULT_SPIN_TIMEOUT_MS
    try:
        ms = float(s)
    except ValueError:
        ms = float("nan")
    if not (math.isfinite(ms) and ms > 0):
        raise ValueError(f"CUPY_DASH_SPIN_TIMEOUT_MS: expected a positive number of milliseconds, got {s!r}")
    return ms


# ------------------------------------------------------------------------------------------------------------
# the knobs
# ------------------------------------------------------------------------------------------------------------
SPIN_TIMEOUT_MS = Knob("CUPY_DASH_SPIN_TIMEOUT_MS", "float > 0 (ms)",
    "bound of the backward's dQ semaphore waits; past it the kernel records an error and exits", _spin_timeout)
FOLD = Knob("CUPY_DASH_FOLD", "0 / 1 / unset",
    "0: never fold the backward into one launch; 1: fold every foldable one; unset: small problems only", _fold)
COMPACT_TABLES = Knob("CUPY_DASH_COMPACT_TABLES", "0 / 1 / unset",
    "backward schedule tables: 0 per-visit always, 1 compact (per-column) always, unset: compact for huge tables",
    _tristate)
VARLEN_EXPAND = Knob("CUPY_DASH_VARLEN_EXPAND", "host / unset",
    "host: expand a varlen backward's per-visit table on the host instead of the GPU", _expand)
FASTPATH = Knob("CUPY_DASH_FASTPATH", "0 / unset",
    "0 (or set empty): no host fast path for repeated torch or CuPy calls; every call takes the full path",
    _on_unless_off)
SYNC_ERRORS = Knob("CUPY_DASH_SYNC_ERRORS", "1 / unset",
    "1: every backward waits for its kernels and raises its own error (check_errors) before returning", _flag)
JAX_FFI = Knob("CUPY_DASH_JAX_FFI", "0 / 1 / unset",
    "0: JAX calls go through buffer_callback; 1: require the C XLA FFI handler; unset: the handler if built", _tristate)
CACHE_DIR = Knob("CUPY_DASH_CACHE_DIR", "path / unset",
    "directory of the compiled-kernel disk cache (default $XDG_CACHE_HOME/cupy_dash, else ~/.cache/cupy_dash)", _path)
JIT_VERBOSE = Knob("CUPY_DASH_JIT_VERBOSE", "1 / unset",
    "1: print each kernel's ptxas report to stderr when it is compiled", _flag)
JIT_LINEINFO = Knob("CUPY_DASH_JIT_LINEINFO", "1 / unset",
    "1: compile kernels with -lineinfo (CUDA source lines in Nsight Compute and compute-sanitizer; the SASS is the "
    "same, NVRTC takes ~15 % longer)", _flag)
BWD_DQ_WRITERS = Knob("CUPY_DASH_BWD_DQ_WRITERS", "1 / 2 / unset",
    "dQ writer warps of the backward, deterministic or atomic (default 2: visits alternate between them); read "
    "per call, a plan knob", _int_choice("CUPY_DASH_BWD_DQ_WRITERS", (1, 2), 2))
BWD_FULL_BLOCK_M = Knob("CUPY_DASH_BWD_FULL_BLOCK_M", "64 / 80 / unset",
    "queries per Q tile of the head-dim-128 backward without a causal mask (80: FA3's plan, dQ computed "
    "transposed, one K buffer); unset: 80 from 1024 queries without a window (varlen: a sequence of 4096), else "
    "64; read per call, a plan knob", _int_choice("CUPY_DASH_BWD_FULL_BLOCK_M", (64, 80), None))
BWD_CAUSAL_BLOCK_M = Knob("CUPY_DASH_BWD_CAUSAL_BLOCK_M", "64 / 80 / unset",
    "queries per Q tile of the head-dim-128 backward with a causal mask (80: the full-mask plan's tile); unset: 80 "
    "from 8192 queries without a window (varlen: the longest sequence), else 64; read per call, a plan knob",
    _int_choice("CUPY_DASH_BWD_CAUSAL_BLOCK_M", (64, 80), None))
SPLIT_COLUMNS = Knob("CUPY_DASH_SPLIT_COLUMNS", "0 / 1 / unset",
    "the backward tables' last wave cut into pieces of KV columns: 0 never; 1 every table that can be cut; unset: "
    "`auto` tables of long full-mask MHA backwards (pieces.AUTO_MIN_M_BLOCKS); read per call, a plan knob", _tristate)
SPLIT_PIECES = Knob("CUPY_DASH_SPLIT_PIECES", "2 .. 16 / unset",
    "pieces per split KV column where the backward's tables are cut (CUPY_DASH_SPLIT_COLUMNS); unset: "
    "pieces.AUTO_NUM_PIECES (3), 6 from pieces.AUTO_SIXTHS_MIN_M_BLOCKS Q tiles; read per call, a plan knob",
    _int_choice("CUPY_DASH_SPLIT_PIECES", tuple(range(2, 17)), None))
XDG_CACHE_HOME = Knob("XDG_CACHE_HOME", "path / unset",
    "(the XDG standard's) base of the default kernel cache directory", _path)

KNOBS = (SPIN_TIMEOUT_MS, FOLD, COMPACT_TABLES, VARLEN_EXPAND, FASTPATH, SYNC_ERRORS, JAX_FFI, CACHE_DIR,
         JIT_VERBOSE, JIT_LINEINFO, BWD_DQ_WRITERS, BWD_FULL_BLOCK_M, BWD_CAUSAL_BLOCK_M, SPLIT_COLUMNS,
         SPLIT_PIECES, XDG_CACHE_HOME)
# The knobs that decide what a backward launches (the spin timeout is in its parameter block).
PLAN_KNOBS = (SPIN_TIMEOUT_MS, FOLD, COMPACT_TABLES, VARLEN_EXPAND, BWD_DQ_WRITERS, BWD_FULL_BLOCK_M,
              BWD_CAUSAL_BLOCK_M, SPLIT_COLUMNS, SPLIT_PIECES)


def _fingerprint_of(a, b, c, d, e, f, g, h, i):
    # NOTES: one lookup per knob spelled out: 0.14 us a call (five knobs), where tuple(map(raw, keys)) took 0.37 us
    def fingerprint(get=raw) -> tuple:
        """The raw values (bytes or None) of :data:`PLAN_KNOBS`: equal fingerprints, equal plans."""
        return get(a), get(b), get(c), get(d), get(e), get(f), get(g), get(h), get(i)
    return fingerprint


fingerprint = _fingerprint_of(*(k.key for k in PLAN_KNOBS))


def spin_timeout_ns() -> int:
    """CUPY_DASH_SPIN_TIMEOUT_MS in nanoseconds, as the backward's parameter block takes it."""
    return int(SPIN_TIMEOUT_MS.get() * 1e6)
