"""Runs a cupy_dash module with the CUDA sources taken from another directory: an A/B of two kernel versions
in one device run (the disk cache keys on the source text, so both builds coexist). Only for kernel versions
that share this tree's host contract: the parameter structs and the shared-memory formula of cupy_dash/kernels.py
(a kernel whose smem layout changed fails its static_assert and is reported as an error).

    git archive <old commit> kernels_src | tar -x -C /tmp/old
    python benchmarks/with_kernels.py /tmp/old/kernels_src cupy_dash bench --hdims 128 ...
"""
import runpy
import sys
from pathlib import Path


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    src = Path(sys.argv[1]).resolve()
    if not (src / "bwd_main.cu").is_file():
        sys.exit(f"{src}: not a kernels_src directory")
    from cupy_dash import jit
    jit._default_kernel_dir.cache_clear()
    jit._default_kernel_dir = lambda: src
    module = sys.argv[2]
    sys.argv = [module] + sys.argv[3:]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
