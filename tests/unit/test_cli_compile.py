"""``python -m cupy_dash compile``: how many processes compile (every available core unless ``-j`` says). The
compiles themselves are stand-ins here (CI compiles every variant for real); CPU only."""
from __future__ import annotations

import os
import types

import pytest

from cupy_dash.cli import compile as cli_compile
from cupy_dash.cuda import jit


class Pool:
    """Stands in for ProcessPoolExecutor: records max_workers, runs the jobs in this process."""
    made: list = []

    def __init__(self, max_workers):
        Pool.made.append(max_workers)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def map(self, fn, jobs):
        return map(fn, jobs)


@pytest.fixture
def pools(monkeypatch):
    """The worker counts of the process pools that ``compile`` makes; nothing is compiled."""
    compiled = types.SimpleNamespace(registers=90, spill_stores=0, spill_loads=0, stack_frame=0, static_smem=0,
                                     seconds=0.0, cached=True, log="", perf_warnings=[])
    monkeypatch.setattr(cli_compile, "ProcessPoolExecutor", Pool)
    monkeypatch.setattr(cli_compile, "_compile_one", lambda job: (job[0], compiled, None))
    monkeypatch.setattr(cli_compile, "available_cores", lambda: 3)
    monkeypatch.setattr(jit, "nvrtc_version", lambda: (13, 0))
    Pool.made = []
    return Pool.made


@pytest.mark.parametrize("flags, workers", [([], [3]), (["-j", "1"], []), (["-j", "2"], [2]), (["--jobs", "5"], [5])],
                         ids=["default", "j1", "j2", "jobs5"])
def test_jobs_default_to_every_available_core(pools, flags, workers, capsys):
    selection = ["--kernel", "bwd_main"]
    assert len(cli_compile.select(names=["bwd_main"])) >= 5
    assert cli_compile.main(selection + flags) == 0
    assert pools == workers
    assert "OK:" in capsys.readouterr().out


def test_available_cores_is_the_affinity_mask():
    cores = cli_compile.available_cores()
    assert cores >= 1
    if hasattr(os, "sched_getaffinity"):
        assert cores == len(os.sched_getaffinity(0))


def test_help_names_the_default(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli_compile.main(["--help"])
    assert exit_.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert f"every core this process may run on, {cli_compile.available_cores()} here" in text
