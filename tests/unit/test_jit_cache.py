"""The disk cache of ``cupy_dash.cuda.jit`` under stress: an unusable ``CUPY_DASH_CACHE_DIR`` (compiles fall back to
memory with one warning) and processes compiling the same kernel at once (NVRTC runs once). CPU only: NVRTC from
the pip wheel compiles sm_90a without a GPU; the variants used here compile in well under a second.
"""
from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import cupy_dash
from cupy_dash.cli import compile as cli_compile
from cupy_dash.cuda import jit, kernels

SPEC = kernels.bwd_specs("bfloat16", 64, causal=False).preprocess
OTHER = kernels.bwd_specs("float16", 64, causal=False).preprocess
REPO_ROOT = Path(cupy_dash.__file__).resolve().parent.parent


@pytest.fixture
def nvrtc_runs(monkeypatch):
    """Fresh warning state and memory cache; yields the list of sources NVRTC compiled from then on (their names
    relative to kernels_src: NVRTC gets absolute paths)."""
    monkeypatch.setattr(jit, "_cache_warned", False)
    monkeypatch.setattr(jit, "_memory_cache", {})
    monkeypatch.delenv("CUPY_DASH_JIT_VERBOSE", raising=False)
    runs = []
    real = jit.compile_source

    def counted(source, name, options):
        runs.append(str(Path(name).relative_to(jit.kernel_dir())))
        return real(source, name, options)

    monkeypatch.setattr(jit, "compile_source", counted)
    return runs


@pytest.fixture
def read_only(monkeypatch):
    """``read_only(directory)``: from then on, opening a file for writing under ``directory`` fails with EROFS,
    as on a read-only mount (chmod would not stop root, who runs some CI machines)."""
    real_open = os.open

    def make(directory: Path):
        prefix = str(directory) + os.sep

        def guarded(path, flags, *args, **kwargs):
            writing = flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT)
            if writing and os.path.abspath(os.fspath(path)).startswith(prefix):
                raise OSError(errno.EROFS, os.strerror(errno.EROFS), os.fspath(path))
            return real_open(path, flags, *args, **kwargs)

        monkeypatch.setattr(os, "open", guarded)
    return make


def _cache_warnings(caught):
    return [w for w in caught if issubclass(w.category, jit.CacheWarning)]


def test_unusable_cache_dir_compiles_in_memory_with_one_warning(tmp_path, monkeypatch, nvrtc_runs):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("CUPY_DASH_CACHE_DIR", str(blocker / "cache"))     # mkdir fails: not a directory
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = jit.compile_spec(SPEC)
        second = jit.compile_spec(SPEC)
        other = jit.compile_spec(OTHER)
    found = _cache_warnings(caught)
    assert len(found) == 1, [str(w.message) for w in caught]
    message = str(found[0].message)
    assert "CUPY_DASH_CACHE_DIR" in message and str(blocker / "cache") in message
    assert first.cubin_path is None and not first.cached and first.registers > 0
    cubin = first.read_cubin()
    assert cubin[:4] == b"\x7fELF" and jit.hashlib.sha256(cubin).hexdigest() == first.cubin_sha256
    assert second.cached and second.read_cubin() == cubin        # served from memory: NVRTC not run again
    assert not other.cached and other.cubin_sha256 != first.cubin_sha256
    assert nvrtc_runs == [SPEC.source, OTHER.source]


def test_read_only_cache_serves_its_entries_and_keeps_new_ones_in_memory(tmp_path, monkeypatch, nvrtc_runs,
                                                                          read_only):
    cache = tmp_path / "cache"
    monkeypatch.setenv("CUPY_DASH_CACHE_DIR", str(cache))
    written = jit.compile_spec(SPEC)
    read_only(cache)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        hit = jit.compile_spec(SPEC)
        assert not _cache_warnings(caught)                        # reading a read-only cache is fine
        assert hit.cached and hit.cubin_path == written.cubin_path and hit.read_cubin() == written.read_cubin()
        forced = jit.compile_spec(SPEC, force=True)
        missing = jit.compile_spec(OTHER)
    found = _cache_warnings(caught)
    assert len(found) == 1 and "Read-only file system" in str(found[0].message)
    assert not forced.cached and forced.cubin_path is None and forced.read_cubin() == written.read_cubin()
    assert not missing.cached and missing.cubin_path is None and missing.read_cubin()[:4] == b"\x7fELF"
    assert nvrtc_runs == [SPEC.source, SPEC.source, OTHER.source]
    assert sorted(p.name for p in cache.iterdir()) == sorted(                 # nothing new on disk
        [written.cubin_path.name, written.cubin_path.with_suffix(".json").name,
         written.cubin_path.with_suffix(".lock").name])


def test_cli_compile_with_read_only_cache_succeeds(tmp_path, monkeypatch, capsys, nvrtc_runs, read_only):
    cache = tmp_path / "cache"
    cache.mkdir()
    monkeypatch.setenv("CUPY_DASH_CACHE_DIR", str(cache))
    read_only(cache)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code = cli_compile.main(["--kernel", "bwd_preprocess", "--head-dim", "64", "-j", "1"])   # in this process
    out = capsys.readouterr().out
    assert code == 0 and "COMPILE ERROR" not in out and "OK: 2 kernel(s)" in out, out   # bf16 / fp16
    assert len(_cache_warnings(caught)) == 1 and len(nvrtc_runs) == 2
    assert list(cache.iterdir()) == []


# A process of the concurrency test: waits until all of them are ready, compiles SPEC, prints a JSON line.
_CHILD = r"""
import json, os, sys, time
from pathlib import Path
from cupy_dash.cuda import jit, kernels

runs = []
real = jit.compile_source

def counted(*args, **kwargs):
    runs.append(args[1])
    result = real(*args, **kwargs)
    time.sleep(1.0)      # hold the entry long enough that an unlocked lookup elsewhere would miss it
    return result

jit.compile_source = counted
barrier, n = Path(sys.argv[1]), int(sys.argv[2])
(barrier / f"ready-{os.getpid()}").touch()
deadline = time.monotonic() + 120
while len(list(barrier.glob("ready-*"))) < n:
    if time.monotonic() > deadline:
        sys.exit("the other processes never became ready")
    time.sleep(0.002)
ck = jit.compile_spec(kernels.bwd_specs("bfloat16", 64, causal=False).preprocess)
print(json.dumps({"cached": ck.cached, "nvrtc_runs": len(runs), "sha256": ck.cubin_sha256}))
"""


def test_concurrent_processes_compile_once(tmp_path):
    n = 3
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "CUPY_DASH_JIT_VERBOSE"}
    env["CUPY_DASH_CACHE_DIR"] = str(tmp_path / "cache")
    procs = [subprocess.Popen([sys.executable, "-c", _CHILD, str(barrier), str(n)], cwd=REPO_ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(n)]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert sum(r["nvrtc_runs"] for r in results) == 1, results
    assert sorted(r["cached"] for r in results) == [False] + [True] * (n - 1), results
    assert len({r["sha256"] for r in results}) == 1
    assert sorted(p.suffix for p in (tmp_path / "cache").iterdir()) == [".cubin", ".json", ".lock"]
