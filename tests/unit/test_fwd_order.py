"""benchmarks/fwd_order.py without a GPU: its packings and its report."""
from __future__ import annotations

import sys
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import fwd_order  # noqa: E402

OPTS = types.SimpleNamespace(hidden=2048, hdim=128)


def test_packings_fill_16k_tokens():
    equal = fwd_order._shape("varlen:4", OPTS)
    assert equal["lengths"] == [4096] * 4 and equal["causal"] and equal["heads"] == 16
    mixed = fwd_order._shape("varlen:mixed", OPTS)["lengths"]
    assert sum(mixed) == 16384 and len(mixed) > 2 and min(mixed) > 0
    assert fwd_order._shape("varlen:mixed", OPTS)["lengths"] == mixed          # seeded
    assert fwd_order._shape("causal:2048", OPTS)["batch"] == 8


def test_markdown_has_one_row_per_leg():
    legs = {"1": 1, "rule": 8}
    summary = {n: dict(head_section=h, ms_median=0.3, tflops=450.0, mcycles_median=0.5, speed_vs_1=1.0 + h / 100,
                       differing_vs_1=0, differing_on_repeat=0) for n, h in legs.items()}
    report = dict(meta=dict(date="d", command="c", commit="x", kernels_sha256="0" * 64, gpu="H200", rounds=3,
                            loop_s=0.5), shapes=[dict(shape=dict(name="causal:2048"), summary=summary)])
    text = fwd_order.markdown(report)
    assert "| causal:2048 | rule | 8 | 450 | 0.3000 | 0.500 | 1.080 | 0 / 0 |" in text
