"""benchmarks/sass_diff.py's comparison: labels from cache file names, instructions without addresses (five hex
digits past 64 KB included), changed / added / removed variants. No GPU or cuobjdump needed."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
if str(BENCHMARKS) not in sys.path:
    sys.path.insert(0, str(BENCHMARKS))

import sass_diff  # noqa: E402


def _sass(*ops, start=0xfff0):
    return "\n".join(f"        /*{start + 16 * i:04x}*/      {op} ;  /* 0x{i:016x} */" for i, op in enumerate(ops))


def test_cubins_are_keyed_by_label(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / f"bwd_main-bf16-d64-full-{'a' * 32}.cubin").write_bytes(b"")
    (tmp_path / "notes.txt").write_text("")
    assert list(sass_diff.cubins(str(tmp_path))) == ["bwd_main-bf16-d64-full"]


# As cuobjdump -sass prints a kernel: a header, then each instruction with its address and encoding, the encoding's
# second half (scheduling bits) on a line of its own.
_REAL = """
        Function : dash_bwd_main
        .headerflags    @"EF_CUDA_SM90 EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)"
        /*10a40*/   @!P0 BRA 0x10ad0 ;                         /* 0x0000000000208947 */
                                                               /* 0x000fea0003800000 */
        /*10a50*/   HGMMA.64x128x16.F32.BF16 R24, R192, gdesc[UR8].tnspB, R24 ;  /* 0x00e0000c18187df3 */
                                                               /* 0x000fe20008000818 */
"""


def test_instructions_drop_addresses_of_any_width_and_the_encodings():
    assert sass_diff.instructions(_sass("FFMA R1, R2, R3, R4", "EXIT")) == ["FFMA R1, R2, R3, R4", "EXIT"]
    assert sass_diff.instructions(_REAL) == ["@!P0 BRA 0x10ad0",
                                             "HGMMA.64x128x16.F32.BF16 R24, R192, gdesc[UR8].tnspB, R24"]


def test_a_cache_with_two_builds_of_a_label_is_refused(tmp_path):
    for digest in ("a" * 32, "b" * 32):
        (tmp_path / f"fwd-bf16-d64-full-{digest}.cubin").write_bytes(b"")
    with pytest.raises(ValueError, match="two builds of fwd-bf16-d64-full"):
        sass_diff.cubins(str(tmp_path))


def test_compare_finds_a_change_past_the_first_64_kb():
    texts = {"old/a": _sass("NOP", "EXIT"), "new/a": _sass("NOP", "BRA 0x0"), "old/b": _sass("EXIT"),
             "new/b": _sass("EXIT", start=0x20), "old/c": _sass("EXIT"), "new/d": _sass("EXIT")}
    changed, gone, added = sass_diff.compare({"a": "old/a", "b": "old/b", "c": "old/c"},
                                             {"a": "new/a", "b": "new/b", "d": "new/d"}, texts.__getitem__)
    assert (changed, gone, added) == (["a"], ["c"], ["d"])
