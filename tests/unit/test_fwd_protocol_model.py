"""benchmarks/fwd_protocol_model.py: the multi-tile forward's barrier protocol holds under random interleavings, and
the model still catches the protocol it was written to catch (Q loaded only for tiles with KV tiles)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import fwd_protocol_model as model  # noqa: E402


def test_the_persistent_protocol_holds(monkeypatch):
    monkeypatch.setattr(model, "FIXED", True)
    for seed in range(150):
        model.run(model.random_tiles(seed, 7), seed, persistent=True)
        model.run(model.random_tiles(seed, 1), seed, persistent=False)


def test_q_loaded_only_with_kv_tiles_lets_the_producer_run_two_phases_ahead(monkeypatch):
    monkeypatch.setattr(model, "FIXED", False)
    with pytest.raises(AssertionError, match="q_empty"):
        model.run([2, 5, 8, 0, 2, 1, 0], 0, persistent=True)
    for seed in range(150):                           # at most two tiles per CTA (fwd_tile_pairs): it holds
        model.run(model.random_tiles(seed, 2), seed, persistent=True)
