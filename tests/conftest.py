"""Shared pytest configuration: the ``gpu`` marker and fixtures for tests that need an NVIDIA Hopper GPU.

Every test marked ``@pytest.mark.gpu`` (or in a module with ``pytestmark = pytest.mark.gpu``) is skipped, with
the reason, unless CuPy sees a CUDA device of compute capability 9.0 (H100 / H200). Everything here must work on
a machine without a GPU, a driver or torch / JAX.
"""
from __future__ import annotations

import os
import sys
import zlib

# JAX preallocates 75 % of the GPU at import unless told otherwise; the GPU tests share the device between CuPy,
# torch and JAX, so this has to be set before anything imports JAX.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

_NO_REASON = object()
_hopper_reason = _NO_REASON


def hopper_skip_reason():
    """``None`` when a Hopper GPU (compute capability 9.0) is usable through CuPy, else why not (cached)."""
    global _hopper_reason
    if _hopper_reason is not _NO_REASON:
        return _hopper_reason
    reason = None
    try:
        import cupy
    except Exception as exc:  # pragma: no cover - cupy is a hard dependency
        reason = f"CuPy is not importable: {exc!r}"
    else:
        try:
            if not cupy.cuda.is_available():
                reason = "no CUDA GPU (cupy.cuda.is_available() is False)"
            else:
                cc = str(cupy.cuda.Device(0).compute_capability)
                if cc != "90":
                    reason = f"needs an NVIDIA Hopper GPU (compute capability 9.0), found sm_{cc}"
        except Exception as exc:  # any CUDA error while querying: no usable GPU
            reason = f"CUDA error while querying the GPU: {exc!r}"
    _hopper_reason = reason
    return reason


def pytest_addoption(parser):
    parser.addoption("--shard", default=None, metavar="K/N",
                     help="run only shard K of N (1 <= K <= N): every N-th test of the collection order from the "
                          "K-th, so that a GPU test file too long for one device call is finished exactly across N "
                          "calls")


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs an NVIDIA Hopper GPU (skipped without one)")
    _share_cores_between_workers(config)


_BLAS_THREAD_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def _share_cores_between_workers(config):
    """With ``-n N`` (pytest-xdist, N >= 2): each worker's BLAS threads set to the cores over N (at least 1), unless
    the caller set them. Runs in the controller before it starts the workers, which inherit its environment and load
    numpy's OpenBLAS with it."""
    # NOTES: the float64 references are numpy matmuls. OpenBLAS starts a thread per core in every process, so 15
    # workers on 16 cores ran 240 spinning threads; on a 2-core machine, 4 processes computing references took 2x as
    # long as with one thread each.
    workers = getattr(config.option, "numprocesses", None)
    if isinstance(workers, int) and getattr(config.option, "maxprocesses", None):
        workers = min(workers, config.option.maxprocesses)
    if hasattr(config, "workerinput") or not isinstance(workers, int) or workers < 2:
        return
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    for var in _BLAS_THREAD_VARS:
        os.environ.setdefault(var, str(max(1, cores // workers)))


def _shard(spec: str) -> tuple:
    """(k, n) of a ``--shard K/N`` value, 0-based k; UsageError otherwise."""
    try:
        k, n = (int(x) for x in spec.split("/"))
    except ValueError:
        k = n = 0
    if not 1 <= k <= n:
        raise pytest.UsageError(f"--shard: expected K/N with 1 <= K <= N, got {spec!r}")
    return k - 1, n


def pytest_collection_modifyitems(config, items):
    spec = config.getoption("--shard")
    if spec is not None:
        k, n = _shard(spec)
        config.hook.pytest_deselected(items=[item for i, item in enumerate(items) if i % n != k])
        items[:] = items[k::n]
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu_items:
        return
    reason = hopper_skip_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=reason)
    for item in gpu_items:
        item.add_marker(skip)


def seed_from(text: str) -> int:
    """A stable 32-bit seed derived from a string (a test id or a case id)."""
    return zlib.crc32(text.encode("utf-8"))


@pytest.fixture
def rng(request):
    """A numpy Generator seeded by the test's node id: fresh inputs per test, reproducible across runs."""
    return np.random.default_rng(seed_from(request.node.nodeid))


@pytest.fixture(autouse=True)
def _fresh_launch_plans():
    """Launch plans are cached by what they depend on, which fakes of the driver (tensor maps, kernel handles) do
    not show: each test starts without the plans of the tests before it."""
    yield
    plans = sys.modules.get("cupy_dash.cuda.plans")
    if plans is not None:
        plans.clear()


@pytest.fixture
def hopper():
    """Skip unless a Hopper GPU is usable; returns the CuPy device (for tests not marked ``gpu``)."""
    reason = hopper_skip_reason()
    if reason is not None:
        pytest.skip(reason)
    import cupy
    return cupy.cuda.Device(0)


def pytest_terminal_summary(terminalreporter):
    """Print the lines tests recorded with ``record_property("report", line)`` (observations, not asserts)."""
    lines = []
    for report in terminalreporter.stats.get("passed", []):
        if getattr(report, "when", "call") != "call":
            continue
        lines += [str(value) for key, value in getattr(report, "user_properties", ()) if key == "report"]
    if lines:
        terminalreporter.section("cupy_dash observations")
        for line in lines:
            terminalreporter.write_line(line)


@pytest.fixture
def host_tables(monkeypatch):
    """``device_tables.per_visit`` without a GPU: uploads become numpy arrays, the table caches start empty; the
    fixture's value stands in for the stream argument (device switching: tests/device_fakes.py)."""
    from device_fakes import fake_uploads, install
    fake_uploads(monkeypatch, install(monkeypatch))

    class Stream:
        ptr = 0

        def synchronize(self):
            pass
    return Stream()
