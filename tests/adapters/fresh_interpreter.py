"""Run code in a fresh Python interpreter that imports this checkout's cupy_dash (for tests of what an import
does or does not load)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import cupy_dash

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(cupy_dash.__file__)))


def run(code: str) -> None:
    """Run ``code`` (dedented) in a fresh interpreter; fail with its stderr unless it exits 0."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
