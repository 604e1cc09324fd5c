"""cupy_dash.cuda.capture.outside on the CPU, the driver and CuPy's streams replaced: the thread's capture mode is
relaxed for the block and restored after it (after an error too), the block runs on a non-blocking stream of its
device made once, which is synchronized when the block ends normally."""
from __future__ import annotations

import contextlib
import types

import pytest

from cupy_dash.cuda import capture

GLOBAL, RELAXED = 0, 2


@pytest.fixture
def driver(monkeypatch):
    state = types.SimpleNamespace(mode=GLOBAL, modes=[], streams=[], devices=[], fail=False)
    ok, bad = "CUDA_SUCCESS", "CUDA_ERROR_INVALID_VALUE"

    def exchange(mode):
        if state.fail:
            return bad, None
        old, state.mode = state.mode, int(mode)
        state.modes.append(int(mode))
        return ok, old
    fake = types.SimpleNamespace(cuThreadExchangeStreamCaptureMode=exchange,
                                 CUresult=types.SimpleNamespace(CUDA_SUCCESS=ok),
                                 CUstreamCaptureMode=types.SimpleNamespace(CU_STREAM_CAPTURE_MODE_RELAXED=RELAXED))
    monkeypatch.setattr(capture, "cuda_driver", lambda: fake)

    class Stream(contextlib.nullcontext):
        def __init__(self, non_blocking=False):
            super().__init__()
            self.non_blocking, self.synced, self.ptr = non_blocking, 0, 0x100 + len(state.streams)
            state.streams.append(self)

        def synchronize(self):
            assert state.mode == RELAXED       # still inside the relaxed block
            self.synced += 1

    @contextlib.contextmanager
    def device(dev):
        state.devices.append(dev)
        yield
    monkeypatch.setattr(capture.cupy.cuda, "Stream", Stream)
    monkeypatch.setattr(capture.cupy.cuda, "Device", device)
    monkeypatch.setattr(capture, "_streams", {})
    return state


def test_the_block_runs_relaxed_on_its_own_synchronized_stream(driver):
    with capture.outside(1) as side:
        assert driver.mode == RELAXED and side.non_blocking and 1 in driver.devices
    assert driver.mode == GLOBAL and driver.modes == [RELAXED, GLOBAL] and side.synced == 1
    with capture.outside(1) as again:
        pass
    assert again is side and side.synced == 2 and len(driver.streams) == 1
    with capture.outside(0) as other:
        pass
    assert other is not side and len(driver.streams) == 2


def test_an_error_in_the_block_restores_the_mode(driver):
    driver.mode = 1                                  # thread-local: restored as it was
    with pytest.raises(ValueError, match="inside"):
        with capture.outside(0) as side:
            raise ValueError("inside")
    assert driver.mode == 1 and driver.modes == [RELAXED, 1] and side.synced == 0


def test_a_driver_failure_raises_before_the_block(driver):
    driver.fail = True
    with pytest.raises(RuntimeError, match="cuThreadExchangeStreamCaptureMode failed"):
        with capture.outside(0):
            pytest.fail("the block ran")


def test_a_cupy_callers_capture_is_refused_before_anything_is_made(monkeypatch):
    """Only torch callers may capture: a CuPy array whose device's current stream is capturing gets RuntimeError
    (an eager call there would bake its error slot into the graph); not capturing, False."""
    import cupy
    from cupy_dash.core import interop

    class Array:                                  # what interop reads of a CuPy array: its module and device
        __module__ = "cupy._core.core"
        device = types.SimpleNamespace(id=1)
    state = {"capturing": 1, "asked": []}
    monkeypatch.setattr(cupy.cuda, "get_current_stream",
                        lambda dev: state["asked"].append(dev) or types.SimpleNamespace(ptr=0x40 + dev))
    monkeypatch.setattr(cupy.cuda.runtime, "streamIsCapturing", lambda ptr: state["capturing"] if ptr == 0x41 else 0)
    with pytest.raises(RuntimeError, match="capture is supported for torch callers"):
        interop.capturing(Array())
    state["capturing"] = 0
    assert interop.capturing(Array()) is False and state["asked"] == [1, 1]
