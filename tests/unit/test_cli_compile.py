"""``python -m cupy_dash compile``: how many processes compile (every available core unless ``-j`` says). The
compiles themselves are stand-ins here (CI compiles every variant for real); CPU only."""
from __future__ import annotations

import os
import types

import pytest

from cupy_dash.cli import compile as cli_compile
from cupy_dash.cuda import jit, kernels


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


def test_timeline_selects_the_debug_builds_alone(pools, capsys, monkeypatch):
    ran = []
    compiled = types.SimpleNamespace(registers=168, spill_stores=0, spill_loads=0, stack_frame=0, static_smem=0,
                                     seconds=0.0, cached=True, log="", perf_warnings=[])
    monkeypatch.setattr(cli_compile, "_compile_one", lambda job: (ran.append(job[0]) or (job[0], compiled, None)))
    assert cli_compile.main(["--timeline"]) == 0
    assert ran == kernels.timeline_specs() and not set(ran) & set(kernels.all_specs())
    labels = {s.label for s in ran}
    assert "bwd_main[bf16,d128,causal,timeline]" in labels and "bwd_main[bf16,d128,m80,full,timeline]" in labels
    assert all(dict(s.defines)["DASH_TIMELINE"] for s in ran)
    assert {dict(s.defines)["DASH_HEAD_DIM"] for s in ran} == set(kernels.BWD_BUILT_HEAD_DIMS)
    out = capsys.readouterr().out
    assert f"OK: {len(ran)} kernel(s)" in out and "bwd_main[bf16,d128,m80,causal,timeline] " in out
    for other in (["--all"], ["--kernel", "bwd_main"]):
        with pytest.raises(SystemExit) as exit_:
            cli_compile.main(["--timeline", *other])
        assert exit_.value.code == 2
    assert "debug builds alone" in capsys.readouterr().err


def test_a_performance_warning_fails_the_compile(pools, capsys, monkeypatch):
    """A ptxas C75xx line (the timeline builds had C7519 under NVRTC 13.0: injected warpgroup.arrive) fails."""
    warned = types.SimpleNamespace(registers=168, spill_stores=0, spill_loads=0, stack_frame=0, static_smem=0,
                                   seconds=0.0, cached=False, log="",
                                   perf_warnings=["(C7519) warpgroup.arrive is injected in around line 1"])
    monkeypatch.setattr(cli_compile, "_compile_one", lambda job: (job[0], warned, None))
    assert cli_compile.main(["--timeline"]) == 1
    assert "C7519" in capsys.readouterr().err
