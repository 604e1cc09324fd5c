"""The ``--shard K/N`` option of tests/conftest.py: N shards partition a collection (each test in exactly one), in
collection order, and a malformed value is a usage error. CPU only (runs pytest on a CPU test file)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TARGET = "tests/unit/test_device_run.py"


def _collected(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", TARGET,
                           *args], capture_output=True, text=True, cwd=ROOT, timeout=120)


def _ids(run) -> list:
    assert run.returncode == 0, run.stdout + run.stderr
    return [line for line in run.stdout.splitlines() if "::" in line]


@pytest.mark.parametrize("n", [2, 3])
def test_shards_partition_the_collection_in_order(n):
    whole = _ids(_collected())
    shards = [_ids(_collected("--shard", f"{k}/{n}")) for k in range(1, n + 1)]
    assert sorted(sum(shards, [])) == sorted(whole)
    for k, shard in enumerate(shards):
        assert shard == whole[k::n]


@pytest.mark.parametrize("spec", ["0/2", "3/2", "1", "a/b"])
def test_a_bad_shard_is_a_usage_error(spec):
    run = _collected("--shard", spec)
    assert run.returncode == 4 and "--shard" in run.stderr
