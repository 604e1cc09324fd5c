"""The figures docs/architecture.md states about the build match the code: the variant count of ``compile --all``
and its breakdown by kernel, and the sizes of the parameter structs. CPU only (no compile)."""
from __future__ import annotations

import re
from pathlib import Path

from cupy_dash.cuda import kernels, params

TEXT = " ".join((Path(__file__).resolve().parents[2] / "docs" / "architecture.md").read_text().split())


def _stated(pattern: str) -> int:
    found = re.search(pattern, TEXT)
    assert found, f"docs/architecture.md no longer says {pattern!r}"
    return int(found.group(1))


def _count(**want) -> int:
    def matches(spec):
        defines = dict(spec.defines)
        return all((spec.source if k == "source" else defines.get(k, 0)) == v for k, v in want.items())
    return sum(map(matches, kernels.all_specs()))


def test_variant_breakdown():
    assert _stated(r"`kernels\.all_specs\(\)` \((\d+) variants") == len(kernels.all_specs())
    assert _stated(r"(\d+) forwards") == _count(source="fwd.cu")
    assert _stated(r"\((\d+) of them the persistent causal build") == _count(source="fwd.cu", DASH_PERSISTENT=1)
    assert _stated(r"(\d+) preprocess") == _count(source="bwd_preprocess.cu")
    assert _stated(r"(\d+) postprocess passes") == _count(source="bwd_postprocess.cu")
    assert _count(source="bwd_expand.cu") == 1
    main = dict(source="bwd_main.cu")
    assert _stated(r"(\d+) backward main kernels") == _count(**main)
    assert _stated(r"(\d+) plain, \d+ with logit") == _count(**main, DASH_SOFTCAP=0, DASH_COMPACT=0)
    assert _stated(r"(\d+) with logit soft-capping") == _count(**main, DASH_SOFTCAP=1)
    assert _stated(r"(\d+) reading compact tables") == _count(**main, DASH_COMPACT=1)
    assert _stated(r"(\d+) of them with the 80-query tile") == _count(**main, DASH_BLOCK_M=80)


def test_struct_sizes():
    assert _stated(r"`BwdParams`, (\d+) bytes") == params.BWD_PARAMS_DTYPE.itemsize
    assert _stated(r"`FwdParams`, (\d+)\)") == params.FWD_PARAMS_DTYPE.itemsize
