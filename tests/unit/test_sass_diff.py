"""benchmarks/sass_diff.py's comparison: labels from cache file names, instructions without addresses (five hex
digits past 64 KB included), changed / added / removed variants. No GPU or cuobjdump needed."""
from __future__ import annotations

import sys
from pathlib import Path

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


def test_instructions_drop_addresses_of_any_width():
    assert sass_diff.instructions(_sass("FFMA R1, R2, R3, R4", "EXIT")) == ["FFMA R1, R2, R3, R4", "EXIT"]


def test_compare_finds_a_change_past_the_first_64_kb():
    texts = {"old/a": _sass("NOP", "EXIT"), "new/a": _sass("NOP", "BRA 0x0"), "old/b": _sass("EXIT"),
             "new/b": _sass("EXIT", start=0x20), "old/c": _sass("EXIT"), "new/d": _sass("EXIT")}
    changed, gone, added = sass_diff.compare({"a": "old/a", "b": "old/b", "c": "old/c"},
                                             {"a": "new/a", "b": "new/b", "d": "new/d"}, texts.__getitem__)
    assert (changed, gone, added) == (["a"], ["c"], ["d"])
