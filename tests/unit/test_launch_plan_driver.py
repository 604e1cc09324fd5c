"""The executor of launch plans (cupy_dash/cuda/launch_plan.c) against a stand-in libcuda (fake_libcuda.c, built
here, loaded by a child process through LD_LIBRARY_PATH): the driver calls of a run, in order and with their
arguments. The tensor maps re-pointed at their buffers, the zeroing of each buffer of the plan's list, then one
cuLaunchKernel per kernel with its grid, block, shared memory, the caller's stream and the patched block (the one
inspect mode gives); a failed launch raises naming the kernel; a thread with no context current gets one bound and
the run repeated once. No GPU, no CUDA toolkit: a C compiler."""
from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest

from cupy_dash.cuda import executor, plans

_CHILD = """
import ctypes, os, sys
from cupy_dash import gpu
from cupy_dash.cuda import executor
if os.environ.get("BIND"):              # gpu.bind_context's stand-in: binds once ("never": finds a context bound)
    calls = []
    def bind():
        calls.append(1)
        if os.environ["BIND"] == "never" or len(calls) > 1:
            return False
        ctypes.CDLL("libcuda.so.1").fake_cuda_bind()
        return True
    gpu.bind_context = bind
plan = executor.LaunchPlan(bytes.fromhex(os.environ["PLAN"]))
buffers = tuple(int(b) for b in os.environ["BUFFERS"].split())
try:
    if os.environ.get("ONE"):
        executor.launch(0x3333, 5, 6, 7, 96, 512, 0x55, bytes(range(16)))
    else:
        plan.run(0x77, buffers)
except RuntimeError as e:
    print(e)
"""


@pytest.fixture(scope="module")
def fake_libcuda(tmp_path_factory):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    out = tmp_path_factory.mktemp("fake_cuda")
    src = pathlib.Path(__file__).with_name("fake_libcuda.c")
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(out / "libcuda.so.1"), str(src)], check=True)
    return out


def _run(lib, blob, buffers, params_size, **env):
    log = lib / f"log_{len(list(lib.iterdir()))}.txt"
    child_env = dict(os.environ, LD_LIBRARY_PATH=str(lib), FAKE_CUDA_LOG=str(log), FAKE_CUDA_PARAMS=str(params_size),
                     PLAN=blob.hex(), BUFFERS=" ".join(map(str, buffers)), **env)
    run = subprocess.run([sys.executable, "-c", _CHILD], env=child_env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    return run.stdout.strip(), (log.read_text().splitlines() if log.exists() else [])


def _plan():
    template = np.frombuffer(bytes(range(256)), dtype=np.dtype((np.void, 256)))
    parts = plans.Parts(((0x1111, (3, 2), 128, 1000), (0x2222, (7,), 384, 2000)), template,
                        ((0, 1, 16), (8, 0, 0)), ((64, 2, 0),), ((3, 4096), (0, 8)))
    return parts, parts.plan().blob


def test_a_run_makes_the_driver_calls_of_its_plan(fake_libcuda):
    parts, blob = _plan()
    buffers = (0x1000, 0x2000, 0x3000, 0x4000)
    out, calls = _run(fake_libcuda, blob, buffers, 256)
    block = executor.LaunchPlan(blob).inspect(buffers).hex()        # the map's address in its first 8 bytes too
    assert out == "" and calls == [
        f"replace {0x3000}",
        f"memset {0x4000} 0 4096 {0x77}", f"memset {0x1000} 0 8 {0x77}",
        f"launch {0x1111} 3 2 1 128 1 1 1000 {0x77} 1 {block}",
        f"launch {0x2222} 7 1 1 384 1 1 2000 {0x77} 1 {block}"]


def test_a_failed_launch_raises_naming_the_kernel(fake_libcuda):
    _, blob = _plan()
    out, calls = _run(fake_libcuda, blob, (0x1000, 0x2000, 0x3000, 0x4000), 8, FAKE_CUDA_FAIL_LAUNCH="1")
    assert out == "cupy_dash launch: cuLaunchKernel failed (CUresult 700) for kernel 1 of 2"
    assert [c.split()[0] for c in calls] == ["replace", "memset", "memset", "launch", "launch"]


def test_one_kernel_outside_a_plan(fake_libcuda):
    _, blob = _plan()
    out, calls = _run(fake_libcuda, blob, (), 16, ONE="1")
    assert out == "" and calls == [f"launch {0x3333} 5 6 7 96 1 1 512 {0x55} 1 {bytes(range(16)).hex()}"]


def test_a_run_without_a_context_binds_one_and_runs_again(fake_libcuda):
    """CUDA_ERROR_INVALID_CONTEXT (a new thread with every need cached: no runtime call bound a context) fails the
    run's first driver call before anything is enqueued; the executor binds the device's context and runs the plan
    once more, with the same calls as a thread that had one."""
    _, blob = _plan()
    buffers = (0x1000, 0x2000, 0x3000, 0x4000)
    out, calls = _run(fake_libcuda, blob, buffers, 8, FAKE_CUDA_NO_CONTEXT="1", BIND="once")
    _, bound = _run(fake_libcuda, blob, buffers, 8)
    assert out == "" and calls == [f"replace {0x3000}", "nocontext memset", "bind", *bound]
    out, calls = _run(fake_libcuda, blob, (), 16, FAKE_CUDA_NO_CONTEXT="1", BIND="once", ONE="1")
    assert out == "" and calls == ["nocontext launch", "bind", f"launch {0x3333} 5 6 7 96 1 1 512 {0x55} 1 "
                                                                f"{bytes(range(16)).hex()}"]


def test_a_context_that_cannot_be_bound_raises_after_one_try(fake_libcuda):
    """When binding finds a context current already (the failure is not a missing one), the executor does not run
    again: the CUresult is raised."""
    _, blob = _plan()
    out, calls = _run(fake_libcuda, blob, (0x1000, 0x2000, 0x3000, 0x4000), 8, FAKE_CUDA_NO_CONTEXT="1",
                      BIND="never")
    assert out.startswith("cupy_dash launch: cuMemsetD8Async failed (CUresult 201)") and calls == [
        f"replace {0x3000}", "nocontext memset"]
