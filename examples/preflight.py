"""What a training example needs, checked before it imports its framework: where anything is missing, one line on
stderr that names all of it and exit status 1, instead of a traceback from deep inside torch, JAX or CuPy."""
from __future__ import annotations

import importlib.util
import os
import sys


def require(framework: str, install: str, gpu_backend=None) -> None:
    """Return if cupy_dash and ``framework`` can be imported and CUDA device 0 is a Hopper GPU (and, when given,
    ``gpu_backend()``, called only then, returns None rather than what the framework lacks); else exit with one
    line. ``install``: how to install the framework."""
    missing = []
    gpu_ok = False
    if importlib.util.find_spec("cupy_dash") is None:
        missing.append("cupy_dash (pip install -e . in the repository root)")
    else:
        from cupy_dash import gpu
        state, desc = gpu.state(0)
        gpu_ok = state == "hopper"
        if not gpu_ok:
            missing.append(f"{gpu.NEEDS}, found {desc if state == 'other' else 'none: ' + desc}")
    if importlib.util.find_spec(framework) is None:
        missing.append(f"{framework} ({install})")
    elif gpu_ok and gpu_backend is not None:
        lacking = gpu_backend()
        if lacking:
            missing.append(lacking)
    if missing:
        sys.exit(f"{os.path.basename(sys.argv[0])}: cannot run here, it needs " + "; and ".join(missing))
