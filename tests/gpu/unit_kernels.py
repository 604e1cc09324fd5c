"""The unit kernels of tests/gpu/kernels/ (one file each, entry point = file name): compiled with NVRTC as the
package's kernels are (no GPU needed), launched as one CTA, and their fp32 results compared with numpy."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from cupy_dash.cuda import jit

KERNELS = Path(__file__).parent / "kernels"


def compile_unit(name: str, *defines: str) -> tuple:
    """(cubin, ptxas stats, log) of tests/gpu/kernels/<name>.cu with ``-D`` ``defines`` (it may include the package's
    kernels_src headers and the folder's own); asserts it compiled."""
    cubin, log, ok = jit.compile_source((KERNELS / f"{name}.cu").read_text(), f"{name}.cu",
                                        [*jit.BASE_OPTIONS, f"-I{jit.kernel_dir()}", f"-I{KERNELS}",
                                         *(f"-D{d}" for d in defines)])
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


def visit_problem(seed: int, m: int, n: int, d: int) -> dict:
    """One backward visit's inputs on the host: bf16 q, do (m x d) and k, v (n x d); scale_log2; the float64 scores s
    (queries x keys, log2 units); lse_log2 (fp32, 0.5-2 above each row's largest score, so that P < 1) and dpsum
    (fp32) per query."""
    import ml_dtypes
    bf16 = np.dtype(ml_dtypes.bfloat16)
    rng = np.random.default_rng(seed)
    q, do = (rng.standard_normal((m, d), dtype=np.float32).astype(bf16) for _ in range(2))
    k, v = (rng.standard_normal((n, d), dtype=np.float32).astype(bf16) for _ in range(2))
    scale_log2 = np.float32(d ** -0.5 * np.log2(np.e))
    s = q.astype(np.float64) @ k.astype(np.float64).T * scale_log2
    lse_log2 = (s.max(axis=1) + rng.uniform(0.5, 2.0, m)).astype(np.float32)
    dpsum = rng.standard_normal(m).astype(np.float32)
    return dict(q=q, k=k, v=v, do=do, scale_log2=scale_log2, s=s, lse_log2=lse_log2, dpsum=dpsum)


def visit_p_ds(r: dict) -> tuple:
    """P and dS (queries x keys) of a :func:`visit_problem` in float64."""
    p = np.exp2(r["s"] - r["lse_log2"][:, None].astype(np.float64))
    dp = r["do"].astype(np.float64) @ r["v"].astype(np.float64).T
    return p, p * (dp - r["dpsum"][:, None])


def run_visit(name: str, threads: int, r: dict, outputs: tuple, smem: int) -> dict:
    """Launches visit unit kernel ``name`` on a :func:`visit_problem` ``r``: arguments q, k, v, do (bf16 bits),
    lse_log2, dpsum, scale_log2, then one fp32 array per ``outputs`` entry ``(name, shape)``, filled with NaN first;
    returns ``r`` with the outputs on the host."""
    import cupy
    dev = [cupy.asarray(r[n].view(np.uint16)) for n in ("q", "k", "v", "do")]
    outs = {n: cupy.full(shape, np.nan, dtype=cupy.float32) for n, shape in outputs}
    launch_unit(compile_unit(name)[0], name, threads, (*dev, cupy.asarray(r["lse_log2"]), cupy.asarray(r["dpsum"]),
                                                      r["scale_log2"], *outs.values()), smem)
    return dict(r, **{n: x.get() for n, x in outs.items()})


def bf16_f64(*arrays) -> tuple:
    """Each array rounded to bf16 (as the kernel's tiles hold it), then in float64."""
    import ml_dtypes
    return tuple(np.asarray(a).astype(ml_dtypes.bfloat16).astype(np.float64) for a in arrays)
