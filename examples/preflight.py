"""What a training example needs, checked before it imports its framework: where anything is missing, one line on
stderr that names all of it and exit status 1, instead of a traceback from deep inside torch, JAX or CuPy."""
from __future__ import annotations

import importlib.util
import os
import sys


def require(framework: str, install: str, gpu_backend=None, modules=()) -> None:
    """Return if cupy_dash, ``framework`` and ``modules`` (pip names) can be imported and CUDA device 0 is a Hopper
    GPU (and, when given, ``gpu_backend()``, called only then, returns None rather than what the framework lacks);
    else exit with one line. ``install``: how to install the framework. ``--help`` needs no GPU (the example prints
    its usage), but the modules the example imports."""
    help_only = "-h" in sys.argv[1:] or "--help" in sys.argv[1:]
    missing = []
    gpu_ok = False
    if importlib.util.find_spec("cupy_dash") is None:
        missing.append("cupy_dash (pip install -e . in the repository root)")
    elif not help_only:
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
    missing += [f"{name} (pip install {name})" for name in modules if importlib.util.find_spec(name) is None]
    if missing:
        sys.exit(f"{os.path.basename(sys.argv[0])}: cannot run here, it needs " + "; and ".join(missing))


def _torch_cuda():
    import torch
    if not torch.cuda.is_available():
        return f"a CUDA build of PyTorch (torch {torch.__version__} sees no GPU)"
    return None


def _jax_gpu():
    import jax
    try:
        jax.devices("gpu")
    except RuntimeError:
        return f"JAX with its CUDA backend (pip install 'jax[cuda13]'; jax {jax.__version__} has none)"
    return None


def require_torch(*extra: str) -> None:
    """:func:`require` for a torch example: a CUDA build of torch, and the modules ``extra`` (pip names)."""
    require("torch", "pip install torch", _torch_cuda, extra)


def require_jax() -> None:
    """:func:`require` for a JAX example: JAX with its CUDA backend."""
    require("jax", "pip install 'jax[cuda13]'", _jax_gpu)
