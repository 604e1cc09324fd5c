"""The unit kernels of tests/gpu/kernels/ (one file each, entry point = file name): compiled with NVRTC as the
package's kernels are (no GPU needed), launched as one CTA, and their fp32 results compared with numpy."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from cupy_dash.cuda import jit

KERNELS = Path(__file__).parent / "kernels"


def compile_unit(name: str, *defines: str) -> tuple:
    """(cubin, ptxas stats, log) of tests/gpu/kernels/<name>.cu with ``-D`` ``defines``; asserts it compiled."""
    cubin, log, ok = jit.compile_source((KERNELS / f"{name}.cu").read_text(), f"{name}.cu",
                                        [*jit.BASE_OPTIONS, f"-I{jit.kernel_dir()}", *(f"-D{d}" for d in defines)])
    assert ok, log
    return cubin, jit.parse_ptxas_log(log, name), log


def assert_no_spills(name: str, *defines: str) -> None:
    _, stats, log = compile_unit(name, *defines)
    assert stats["spill_stores"] == stats["spill_loads"] == stats["stack_frame"] == 0, log
    assert not jit.perf_warnings(log), log


def launch_unit(cubin: bytes, name: str, threads: int, args: tuple, smem: int) -> None:
    """One CTA of ``threads`` threads of entry ``name`` with ``smem`` bytes of dynamic shared memory; waits."""
    import cupy
    from cupy.cuda import driver, function
    module = function.Module()
    module.load(cubin)
    kernel = module.get_function(name)
    driver.funcSetAttribute(kernel.ptr, driver.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem)
    kernel((1,), (threads,), args, shared_mem=smem)
    cupy.cuda.Device().synchronize()


def check_close(name: str, got: np.ndarray, ref: np.ndarray, tol: float = 1e-5) -> None:
    """Every element written (finite) and the max error relative to max(1, |ref|max) below ``tol``."""
    assert np.isfinite(got).all(), f"{name}: {int((~np.isfinite(got)).sum())} elements not written or NaN"
    err = np.abs(got - ref).max() / max(1.0, np.abs(ref).max())
    assert err < tol, f"{name}: max relative error {err:.3g}"
