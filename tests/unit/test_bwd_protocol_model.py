"""benchmarks/bwd_protocol_model.py: the backward's barrier protocol around the dK / dV epilogue holds under random
interleavings, as built (stage_dkv: dV, then dK, in the dS tiles) and as benchmarks/patches/dkv_one_pass.patch would
build it (dK in the last visit's Q / dO stages, freed at the next visit), and the model catches that patch without
its held stages."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bwd_protocol_model as model  # noqa: E402


@pytest.mark.parametrize("one_pass", [False, True], ids=["two_passes", "one_pass"])
@pytest.mark.parametrize("k_stages", [1, 2], ids=["one_k_buffer", "two_k_buffers"])
def test_the_epilogue_protocol_holds(one_pass, k_stages):
    for seed in range(150):
        model.run(model.random_tiles(seed), seed, one_pass=one_pass, k_stages=k_stages)
    model.run([1, 1, 1, 1], 7, one_pass=one_pass, k_stages=k_stages)      # single-visit tiles back to back


def test_dk_in_the_q_and_do_stages_needs_them_held_until_the_stores_read_them():
    with pytest.raises(AssertionError, match="TMA loads it|while it is read"):
        for seed in range(100):
            model.run(model.random_tiles(seed), seed, one_pass=True, hold=False)
