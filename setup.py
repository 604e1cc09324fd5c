import os

from setuptools import Extension, setup


def _cores() -> int:
    """CPU cores this process may run on (the affinity mask, e.g. under taskset or a container's cpuset)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:          # no sched_getaffinity (macOS, Windows)
        return os.cpu_count() or 1


# cupy_dash.schedule: _varlen_sched builds and checks the compact (per-column) records of every schedule (a
# fixed-length problem is one sequence), varlen_pack runs it (on the scratch of _scratch.pxd) and packs the records
# in the byte layout uploaded, _varlen_view expands them into per-visit tables; _schedule holds the mask ranges and
# validates and simulates per-visit tables (it cimports the inline heap of _heap.pxd); _compact
# computes and checks what only fixed-length records have (scan bounds), _compact_view what the kernel will compute
# per visit; _records holds the checks that every table of records shares (_records.pxd: the record layout and rule,
# _units.pxd: the builders' shared inline code); testing holds the tests' oracles (the direct builders of earlier
# versions).
# cupy_dash.cuda.executor is every kernel launch (launch plans, launch_plan.c: the executor);
# cupy_dash.jax._xla_ffi is the JAX adapter's XLA FFI handler (xla_ffi.c), which runs plans with the same executor.


def _ext(name: str, *sources: str, extra=(), **kw) -> Extension:
    """An extension built without debug information: Cython's generated C is 1-1.6 MB per module, and -g0 (after
    the interpreter's own -g) makes gcc ~30 % faster on it (varlen_pack.c: 16.8 -> 11.8 s); the code is the same
    -O3."""
    return Extension(name, list(sources), extra_compile_args=[*extra, "-g0"], **kw)


_LAUNCH_PLAN, _PLAN_H = "cupy_dash/cuda/launch_plan.c", "cupy_dash/cuda/launch_plan.h"
EXTENSIONS = [_ext("cupy_dash.schedule._schedule", "cupy_dash/schedule/_schedule.pyx"),
              _ext("cupy_dash.schedule._records", "cupy_dash/schedule/_records.pyx"),
              _ext("cupy_dash.schedule._compact", "cupy_dash/schedule/_compact.pyx"),
              _ext("cupy_dash.schedule._compact_view", "cupy_dash/schedule/_compact_view.pyx"),
              _ext("cupy_dash.schedule._varlen_sched", "cupy_dash/schedule/_varlen_sched.pyx"),
              _ext("cupy_dash.schedule._varlen_view", "cupy_dash/schedule/_varlen_view.pyx"),
              _ext("cupy_dash.schedule.varlen_pack", "cupy_dash/schedule/varlen_pack.pyx"),
              _ext("cupy_dash.schedule.testing", "cupy_dash/schedule/testing.pyx"),
              _ext("cupy_dash.cuda.executor", "cupy_dash/cuda/executor.pyx", _LAUNCH_PLAN, depends=[_PLAN_H],
                   include_dirs=["cupy_dash/cuda"], libraries=["dl", "pthread"], extra=["-std=gnu11"]),
              _ext("cupy_dash.jax._xla_ffi", "cupy_dash/jax/_xla_ffi.pyx", "cupy_dash/jax/xla_ffi.c", _LAUNCH_PLAN,
                   depends=["cupy_dash/jax/xla_ffi.h", _PLAN_H], include_dirs=["cupy_dash/jax", "cupy_dash/cuda"],
                   libraries=["dl", "pthread"], extra=["-std=gnu11"])]

# Cython's own utility code (typed memoryviews, argument parsing: about half of each generated C file) is
# generated once into the shared module SHARED_UTILITY, which every module above imports, instead of into each of
# them: the C to compile halves (13.5 -> 7.0 MB) and so does the build (67 -> 37 s on 2 cores).
SHARED_UTILITY = "cupy_dash._cyutility"

# Both build steps use every core: Cython translates the .pyx files in nthreads processes, and build_ext runs
# the C compiler on that many extensions at once (`build_ext -j N` on the command line still overrides).
# Guarded because cythonize's worker processes may re-import this file as __mp_main__ (spawn / forkserver), and
# so that tests/unit/test_packaging.py can read EXTENSIONS without Cython.
if __name__ == "__main__":
    from Cython.Build import cythonize
    JOBS = _cores()
    from Cython import __version__ as cython_version
    # (3.2.0 broke relative imports with a shared module, fixed in 3.2.1; older versions: each module keeps its own)
    version = tuple(int(x) for x in cython_version.split(".")[:3] if x.isdigit())
    shared = {"shared_utility_qualified_name": SHARED_UTILITY} if version >= (3, 2, 1) else {}
    setup(ext_modules=cythonize(EXTENSIONS + ([_ext(SHARED_UTILITY)] if shared else []), language_level=3,
                                nthreads=JOBS if JOBS > 1 else 0, **shared),
          options={"build_ext": {"parallel": JOBS}})
