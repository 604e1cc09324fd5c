"""cupy_dash.config: every environment knob defined once, parsed in one place, read again when it changes.
CPU only."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

import cupy_dash
from cupy_dash import config
from cupy_dash.cuda import launchers, varlen_device
from cupy_dash.schedule import compact_device

ROOT = Path(cupy_dash.__file__).resolve().parent.parent


@pytest.fixture
def clean_env(monkeypatch):
    for knob in config.KNOBS:
        monkeypatch.delenv(knob.name, raising=False)
    return monkeypatch


def test_knobs_are_defined_once():
    names = [k.name for k in config.KNOBS]
    assert len(set(names)) == len(names)
    assert all(n.startswith("CUPY_DASH_") for n in names if n != "XDG_CACHE_HOME")
    assert set(config.PLAN_KNOBS) <= set(config.KNOBS)
    assert all(knob.meaning and knob.kind and knob.key == knob.name.encode() for knob in config.KNOBS)
    assert {k.name[10:]: k.default for k in config.KNOBS if k.name.startswith("CUPY_DASH_")} == {
        "SPIN_TIMEOUT_MS": 10000.0, "FOLD": None, "COMPACT_TABLES": None, "VARLEN_EXPAND": "device", "FASTPATH": True,
        "SYNC_ERRORS": False, "JAX_FFI": None, "CACHE_DIR": None, "JIT_VERBOSE": False,
        "JIT_LINEINFO": False, "BWD_DQ_WRITERS": 2, "BWD_FULL_BLOCK_M": None,
        "BWD_CAUSAL_BLOCK_M": None, "SPLIT_COLUMNS": None, "SPLIT_PIECES": None}
    # the names other modules (and benchmarks, tests, the CLI) use are the config's
    assert compact_device.ENV == config.COMPACT_TABLES.name
    assert launchers.FOLD_ENV == config.FOLD.name
    assert varlen_device.EXPAND_ENV == config.VARLEN_EXPAND.name


def test_values_when_unset(clean_env):
    assert [k.get() for k in config.KNOBS] == [k.default for k in config.KNOBS]
    assert config.fingerprint() == (None,) * len(config.PLAN_KNOBS)
    assert config.spin_timeout_ns() == 10 ** 10


@pytest.mark.parametrize("knob,cases", [
    (config.FOLD, [("0", False), ("1", True), (" 1 ", True), ("", None), ("2", None), ("auto", None)]),
    (config.COMPACT_TABLES, [("0", False), ("1", True), ("yes", True), ("", None)]),
    (config.JAX_FFI, [("0", False), ("1", True), ("", None)]),
    (config.VARLEN_EXPAND, [("host", "host"), ("device", "device"), ("", "device"), ("HOST", "device")]),
    (config.FASTPATH, [("0", False), ("", False), ("1", True), ("no", True)]),
    (config.SYNC_ERRORS, [("0", False), ("", False), ("1", True)]),
    (config.JIT_VERBOSE, [("0", False), ("", False), ("1", True)]),
    (config.CACHE_DIR, [("", None), ("/x", "/x")]),
    (config.SPIN_TIMEOUT_MS, [("250", 250.0), (" ", 10000.0), ("", 10000.0), ("1e3", 1000.0)]),
], ids=lambda x: getattr(x, "name", ""))
def test_parse(knob, cases, clean_env):
    """Each knob's values as the modules that read os.environ before config existed interpreted them."""
    for raw, value in cases:
        clean_env.setenv(knob.name, raw)
        assert knob.get() == value and type(knob.get()) is type(value), (raw, knob.get())


def test_a_change_takes_effect_on_the_next_read(clean_env):
    """A knob follows setenv and delenv at once (it reads os.environ's own dict on POSIX)."""
    assert config.FASTPATH.get() is True
    clean_env.setenv("CUPY_DASH_FASTPATH", "0")
    assert config.raw(b"CUPY_DASH_FASTPATH") == b"0" and config.FASTPATH.get() is False
    clean_env.setenv("CUPY_DASH_FASTPATH", "1")
    assert config.FASTPATH.get() is True
    clean_env.delenv("CUPY_DASH_FASTPATH")
    assert config.raw(b"CUPY_DASH_FASTPATH") is None and config.FASTPATH.get() is True


def test_parsed_only_when_the_raw_value_changes(clean_env):
    calls = []
    knob = config.Knob("CUPY_DASH_TEST_KNOB", "int", "a test", lambda s: calls.append(s) or int(s or 0))
    assert knob.default == 0 and calls == [None]            # the default: parse(None)
    calls.clear()
    assert knob.get() == knob.get() == 0 and calls == [None]
    clean_env.setenv("CUPY_DASH_TEST_KNOB", "7")
    assert knob.get() == knob.get() == 7 and calls == [None, "7"]
    clean_env.setenv("CUPY_DASH_TEST_KNOB", "7")           # the same value again: no new parse
    assert knob.get() == 7 and calls == [None, "7"]


def test_a_bad_value_raises_on_every_read(clean_env):
    for bad in ("-1", "0", "nan", "inf", "soon"):
        clean_env.setenv("CUPY_DASH_SPIN_TIMEOUT_MS", bad)
        for _ in range(2):
            with pytest.raises(ValueError, match="CUPY_DASH_SPIN_TIMEOUT_MS"):
                config.SPIN_TIMEOUT_MS.get()
    clean_env.setenv("CUPY_DASH_SPIN_TIMEOUT_MS", "250")
    assert config.SPIN_TIMEOUT_MS.get() == 250.0 and config.spin_timeout_ns() == 250_000_000


def test_fingerprint_follows_the_plan_knobs_only(clean_env):
    base = config.fingerprint()
    seen = {base}
    for knob in config.PLAN_KNOBS:
        clean_env.setenv(knob.name, "1")
        fp = config.fingerprint()
        assert fp not in seen and fp[config.PLAN_KNOBS.index(knob)] == b"1"
        seen.add(fp)
    before = config.fingerprint()
    for knob in set(config.KNOBS) - set(config.PLAN_KNOBS):
        clean_env.setenv(knob.name, "1")
    assert config.fingerprint() == before


def test_fast_path_signatures_key_on_the_fingerprint(clean_env):
    """A repeated torch backward re-launches a stored plan only under the same plan knobs (torch imitated)."""
    from cupy_dash.core import fastpath
    from fastpath_fakes import BF16, F32, Tensor
    q = Tensor((2, 64, 4, 64), BF16, 0x10000)
    args = (q, q, q, q, q, Tensor((2, 4, 64), F32, 0x20000), True, None, "auto", True, (-1, -1))
    base = fastpath.bwd_key(*args)
    assert base is not None and base == fastpath.bwd_key(*args)
    keys = {base}
    changes = ((config.FOLD, "0"), (config.COMPACT_TABLES, "1"), (config.SPIN_TIMEOUT_MS, "5"),
               (config.VARLEN_EXPAND, "host"), (config.BWD_DQ_WRITERS, "1"),
               (config.BWD_FULL_BLOCK_M, "64"), (config.BWD_CAUSAL_BLOCK_M, "80"),   # the tile and kernel knobs too
               (config.SPLIT_COLUMNS, "0"), (config.SPLIT_PIECES, "6"))
    assert {knob for knob, _ in changes} == set(config.PLAN_KNOBS)
    for knob, value in changes:
        clean_env.setenv(knob.name, value)
        keys.add(fastpath.bwd_key(*args))
    assert len(keys) == 1 + len(changes)
    clean_env.setenv(config.SYNC_ERRORS.name, "1")                    # not a plan knob: the same plan
    assert fastpath.bwd_key(*args) in keys
    assert fastpath.bwd_key(*args[:-1], (-1.0, -1)) is None           # a window the full path rejects: no plan
    clean_env.setenv(config.FASTPATH.name, "0")
    assert not fastpath.enabled()


def test_no_module_reads_the_environment_but_config():
    """Modules of every subpackage ask config; the command line (cupy_dash/cli/) may set variables for the processes
    it starts, but reads them through config too."""
    package = ROOT / "cupy_dash"
    offenders = [str(p.relative_to(package)) for p in sorted(package.rglob("*.py")) if p.name != "config.py"
                 and re.search(r"os\.getenv|environ\.get" if p.parent.name == "cli" else r"os\.environ|os\.getenv",
                               p.read_text())]
    assert offenders == []


def test_docs_list_every_knob():
    text = (ROOT / "docs" / "configuration.md").read_text()
    for knob in config.KNOBS:
        assert f"`{knob.name}`" in text, knob.name


def test_the_80_query_tile_serves_long_calls(monkeypatch):
    """Head dim 128 without a window takes 80-query tiles from FULL80_MIN_SEQLEN queries on (one K buffer, the
    shared memory of kernels_src/bwd/config.cuh), from CAUSAL80_MIN_SEQLEN with a causal mask, varlen batches by
    their longest sequence from VARLEN80_MIN_SEQLEN on; shorter calls, windows, head dim 64 and compact builds keep
    theirs. CUPY_DASH_BWD_FULL_BLOCK_M /
    CUPY_DASH_BWD_CAUSAL_BLOCK_M = 64 / 80 force either; bad values raise naming the variable."""
    from cupy_dash.cuda import kernels
    monkeypatch.delenv("CUPY_DASH_BWD_FULL_BLOCK_M", raising=False)
    monkeypatch.delenv("CUPY_DASH_BWD_CAUSAL_BLOCK_M", raising=False)
    long, causal_long = kernels.FULL80_MIN_SEQLEN, kernels.CAUSAL80_MIN_SEQLEN

    def block_m(*a, **kw):
        return kernels.bwd_tile(*a, **kw).block_m
    assert [block_m(128, False, seqlen_q=long), block_m(128, True, seqlen_q=causal_long),
            block_m(128, True, seqlen_q=causal_long, window=(-1, 0)), block_m(96, True, seqlen_q=causal_long)] \
        == [80] * 4
    assert [block_m(128, False, seqlen_q=long - 1), block_m(128, True, seqlen_q=causal_long - 1),
            block_m(128, False, seqlen_q=long, window=(100, -1)),
            block_m(128, True, seqlen_q=causal_long, window=(100, 0)), block_m(128, False), block_m(128, True),
            block_m(128, False, True, long), block_m(128, True, True, causal_long),
            block_m(64, False, seqlen_q=long)] == [64] * 8 + [128]
    varlen_long = kernels.VARLEN80_MIN_SEQLEN
    assert kernels.varlen_tile_seqlen(varlen_long - 1) == 0 and kernels.varlen_tile_seqlen(varlen_long) == varlen_long
    assert [block_m(128, False, seqlen_q=kernels.varlen_tile_seqlen(n)) for n in (varlen_long - 1, varlen_long)] \
        == [64, 80]
    assert kernels.varlen_tile_seqlens(varlen_long - 1) == (0,)
    assert sorted(kernels.varlen_tile_seqlens(varlen_long)) == [0, varlen_long]
    specs = kernels.bwd_specs("bfloat16", 128, False, seqlen_q=long)
    short = kernels.bwd_specs("bfloat16", 128, False)
    assert {dict(s.defines)["DASH_BLOCK_M"] for s in specs} == {80}
    assert {dict(s.defines)["DASH_BLOCK_M"] for s in short} == {64}
    assert specs.main.smem_bytes == kernels._bwd_main_smem(kernels.TILES[("bwd_main", 128, "full80")], 128)
    assert specs.main.smem_bytes <= kernels.K.kSmemMaxBytes < short.main.smem_bytes + 32 * 1024
    assert set(specs) <= set(kernels.all_specs())
    monkeypatch.setenv("CUPY_DASH_BWD_FULL_BLOCK_M", "80")
    assert [block_m(128, False), block_m(128, False, True), block_m(128, True)] == [80, 64, 64]
    monkeypatch.setenv("CUPY_DASH_BWD_FULL_BLOCK_M", "64")
    assert block_m(128, False, seqlen_q=long) == 64
    monkeypatch.setenv("CUPY_DASH_BWD_FULL_BLOCK_M", "96")
    with pytest.raises(ValueError, match="CUPY_DASH_BWD_FULL_BLOCK_M"):
        kernels.bwd_tile(128, False)
    monkeypatch.delenv("CUPY_DASH_BWD_FULL_BLOCK_M")
    monkeypatch.setenv("CUPY_DASH_BWD_CAUSAL_BLOCK_M", "80")
    assert [block_m(128, True), block_m(96, True, seqlen_q=long), block_m(128, True, True), block_m(64, True),
            block_m(128, False)] == [80, 80, 64, 128, 64]
    monkeypatch.setenv("CUPY_DASH_BWD_CAUSAL_BLOCK_M", "64")
    assert block_m(128, True, seqlen_q=causal_long) == 64
    monkeypatch.setenv("CUPY_DASH_BWD_CAUSAL_BLOCK_M", "72")
    with pytest.raises(ValueError, match="CUPY_DASH_BWD_CAUSAL_BLOCK_M"):
        kernels.bwd_tile(128, True)
