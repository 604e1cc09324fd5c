"""benchmarks/dq_handoff_model.py: the dQ hand-off protocol of the split-by-keys patch neither deadlocks nor leaves
arrivals behind, and the model does catch both kinds of slip. No GPU needed."""
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
if str(BENCHMARKS) not in sys.path:
    sys.path.insert(0, str(BENCHMARKS))
import dq_handoff_model as model  # noqa: E402


@pytest.mark.parametrize("writers", [1, 2])
@pytest.mark.parametrize("visits", [1, 2, 5])
def test_the_protocol_finishes_with_no_arrival_left(writers, visits):
    for seed in range(40):
        assert model.run(visits, writers, seed) == (True, {})


def test_the_model_reports_a_missing_free_and_an_extra_one(monkeypatch):
    real = model._writer

    def no_free(wi, writers, visits):            # the writer never frees slice 0: warpgroup 0 waits forever
        return (op for op in real(wi, writers, visits) if op != ("arrive", "empty0"))
    monkeypatch.setattr(model, "_writer", no_free)
    ok, details = model.run(2, 1, 0)
    assert not ok and (("wg", 0) in details)

    def extra_free(wi, writers, visits):          # one free more than hand-offs: an arrival is left over
        yield from real(wi, writers, visits)
        yield ("arrive", "empty1")
    monkeypatch.setattr(model, "_writer", extra_free)
    assert model.run(1, 1, 0) == (True, {"empty1": 1})
