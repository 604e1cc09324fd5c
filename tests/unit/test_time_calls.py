"""benchmarks/measure.py's time_calls on the CPU, with events that read the host clock: the warm-up by count and by
time, the rotation over input sets, one time per timed call."""
from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
if str(BENCHMARKS) not in sys.path:
    sys.path.insert(0, str(BENCHMARKS))      # a standalone module beside the scripts, imported by name as they do

from measure import time_calls  # noqa: E402


class HostEvents:
    """The four methods time_calls uses, on the host clock (each call below runs synchronously)."""

    def __init__(self):
        self.synchronized = 0

    def event(self):
        return [None]

    def record(self, ev):
        ev[0] = time.perf_counter()

    def synchronize(self, ev):
        self.synchronized += 1

    def elapsed_ms(self, start, end):
        return (end[0] - start[0]) * 1e3


@pytest.mark.parametrize("warmup_s", [0.0, 0.05], ids=["by_count", "by_time"])
def test_warmup_then_one_time_per_call(warmup_s):
    seen = []
    calls = [lambda i=i: (seen.append(i), time.sleep(0.002)) for i in range(2)]
    start = time.perf_counter()
    times = time_calls(calls, warmup=3, repeats=6, events=HostEvents(), warmup_s=warmup_s)
    assert len(times) == 6 and all(t >= 1.5 for t in times)
    warm = len(seen) - 6
    if warmup_s:
        assert warm > 3 and time.perf_counter() - start >= warmup_s
    else:
        assert warm == 3
    assert seen[:warm] == [i % 2 for i in range(warm)]          # both phases rotate over the input sets
    assert seen[warm:] == [0, 1] * 3
