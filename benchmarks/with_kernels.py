"""Runs a script or a module with cupy_dash's CUDA sources taken from another directory: an A/B of two kernel
versions in one device run (the disk cache keys on the source text, so both builds coexist). Only for kernel
versions that share this tree's host contract: the parameter structs and the shared-memory formula of
cupy_dash/cuda/kernels.py (a kernel whose smem layout changed fails its static_assert and is reported as an error).

    git archive <old commit> kernels_src | tar -x -C /tmp/old
    python benchmarks/with_kernels.py /tmp/old/kernels_src benchmarks/bench.py --hdims 128 ...
    python benchmarks/with_kernels.py /tmp/old/kernels_src cupy_dash demo ...

The second argument is a script when it ends in .py (run as ``python SCRIPT``: its folder first on sys.path),
else a module (run as ``python -m MODULE``); the rest are its arguments.
"""
import os
import runpy
import sys
from pathlib import Path


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    src = Path(sys.argv[1]).resolve()
    if not (src / "bwd_main.cu").is_file():
        sys.exit(f"{src}: not a kernels_src directory")
    from cupy_dash.cuda import jit
    jit._default_kernel_dir.cache_clear()
    jit._default_kernel_dir = lambda: src
    run_target(sys.argv[2], sys.argv[3:])


def run_target(target: str, args: list) -> None:
    """Runs ``target`` with ``args`` as ``python SCRIPT`` (it ends in .py) or ``python -m MODULE`` would."""
    sys.argv = [target] + list(args)
    if target.endswith(".py"):
        if not os.path.isfile(target):
            sys.exit(f"{target}: no such script")
        sys.path[0] = os.path.dirname(os.path.abspath(target))      # as `python SCRIPT` would have it
        runpy.run_path(target, run_name="__main__")
    else:
        runpy.run_module(target, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
