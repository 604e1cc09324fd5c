"""The patches that benchmarks/patches/README.md says apply to today's tree do apply to it (``git apply --check`` at
the repository root), so that a change of the tree that moves what they patch is caught here, not on the GPU
machine whose stage applies them. Skipped outside a git checkout (an installed sdist has no benchmarks/)."""
from __future__ import annotations

import pathlib
import re
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PATCHES = ROOT / "benchmarks" / "patches"


def todays_patches() -> list:
    """The patch names of the README's bullets that start "to today's tree"."""
    names, inside = [], False
    for line in (PATCHES / "README.md").read_text().splitlines():
        if line.startswith("- "):
            inside = line.startswith("- to today's tree")
        if inside:
            names += [n for n in re.findall(r"`([a-z0-9_]+)`", line) if (PATCHES / f"{n}.patch").exists()]
    return names


@pytest.mark.skipif(not (ROOT / ".git").exists() or not PATCHES.is_dir() or shutil.which("git") is None,
                    reason="not a git checkout with benchmarks/patches")
def test_todays_patches_apply():
    names = todays_patches()
    assert {"no_dq_add"} <= set(names), names
    for name in names:
        run = subprocess.run(["git", "apply", "--check", str(PATCHES / f"{name}.patch")], cwd=ROOT,
                             capture_output=True, text=True)
        assert run.returncode == 0, f"{name}.patch no longer applies to this tree: {run.stderr}"
