"""kernels_src/constants.cuh: the constants the kernels and the host share, parsed into cupy_dash.cuda.params.CONSTANTS;
the host decodes the kernels' error codes and record through them. CPU only (the kernels' side is checked by
compiling them: python -m cupy_dash compile --all)."""
from __future__ import annotations

import re

import pytest

from cupy_dash.cuda import errors, jit, kernels, params
from cupy_dash.cuda.params import CONSTANTS as K

KDIR = jit.kernel_dir()
SOURCES = {p: p.read_text() for p in sorted(KDIR.rglob("*"))
           if p.suffix in (".cu", ".cuh") and p.name != "constants.cuh"}


def test_parsed_values():
    assert K._asdict() == params.parse_constants((KDIR / "constants.cuh").read_text())
    codes = (K.kErrorSemaphoreTimeout, K.kErrorPipelineStall, K.kErrorGridBarrier)
    assert codes == (1, 2, 3)
    assert (K.kErrorRecordWords, K.kErrorFailureWords) == (8, 4)
    assert errors.RECORD_BYTES == 4 * K.kErrorRecordWords == 32 and errors.FAILURE_WORDS == K.kErrorFailureWords
    counters = (K.kErrorWordBarrier1, K.kErrorWordBarrier2, K.kErrorWordExit)
    assert len(set(counters)) == 3 and all(K.kErrorFailureWords <= w < K.kErrorRecordWords for w in counters)
    assert 1 + K.kErrorFailureWords <= K.kErrorRecordWords              # the host mirror: done flag + the failure
    assert (K.kMainThreads, K.kAuxThreads) == (384, 256) == (kernels.MAIN_THREADS, kernels.AUX_THREADS)
    assert (K.kSmemAlign, K.kSmemMaxBytes) == (1024, 227 * 1024)


def test_every_constant_is_used_by_the_kernels():
    """A constant that no kernel source names would be a host-only constant: it belongs in Python, not here."""
    text = "\n".join(SOURCES.values())
    unused = [name for name in K._fields if not re.search(rf"\b{name}\b", text)]
    assert unused == []


def test_the_kernels_claim_failures_by_name():
    """No failure code is written as a literal in a kernel (every claim names a constants.cuh code)."""
    claims = [m.group(1) for src in SOURCES.values() for m in re.finditer(r"error_record_claim\(\s*p\s*,\s*(\w+)", src)]
    assert sorted(set(claims)) == sorted(n for n in K._fields if n.startswith("kError") and
                                         n not in ("kErrorRecordWords", "kErrorFailureWords") and
                                         not n.startswith("kErrorWord"))


@pytest.mark.parametrize("text,needle", [
    ("constexpr int kA = 1 + 2;", "expected"),
    ("#define kA 3", "expected"),
    ("constexpr long kA = 3;", "expected"),
    ("constexpr int kA = 3; constexpr int kB = 4;", "expected"),
    ("constexpr int kA = 03;", "expected"),
    ("constexpr int kA = 3;\nconstexpr int kA = 4;", "twice"),
])
def test_parser_rejects_what_it_does_not_understand(text, needle):
    with pytest.raises(ValueError, match=needle):
        params.parse_constants(text)


def test_parser_reads_comments_and_negatives():
    text = "// head\n#pragma once\n/* block\n comment */\nconstexpr int kA = -3;  // trailing\nconstexpr int kB=0;\n"
    assert params.parse_constants(text) == {"kA": -3, "kB": 0}


INFO = ("shift", 2, 4, 300, 1000, 128, True, (-1, 0))


@pytest.mark.parametrize("code,needles", [
    (K.kErrorSemaphoreTimeout, ("dQ semaphore wait timed out", "visit 7 waited for rank 3, saw 2",
                                "CUPY_DASH_SPIN_TIMEOUT_MS")),
    (K.kErrorPipelineStall, ("load-pipeline wait inside CTA 7", "shared offset 3, parity 2",
                             f"{K.kStallTimeoutFactor} x CUPY_DASH_SPIN_TIMEOUT_MS")),
    (K.kErrorGridBarrier, ("grid barrier of the folded", "CTA 7 saw 2 CTAs at counter word 3", "CUPY_DASH_FOLD=0",
                           f"{K.kStallSlackNs / 1e9:g} s")),
    (99, ("reported error code 99", "visit 7, values 3, 2")),
])
def test_errors_decode_each_code(code, needles, monkeypatch):
    monkeypatch.delenv("CUPY_DASH_SPIN_TIMEOUT_MS", raising=False)
    msg = errors._format_failure(INFO, code, 7, 3, 2)
    assert "schedule 'shift' (B=2, H=4, Sq=300, Sk=1000, D=128, causal=True)" in msg
    for needle in needles:
        assert needle in msg, (needle, msg)


def test_smem_formulas_use_the_header(monkeypatch):
    """The host's shared-memory sums follow the header's terms (the kernels static_assert the results)."""
    base = {d: (kernels.fwd_spec("bfloat16", d, False).smem_bytes,
                kernels.bwd_specs("bfloat16", d, False).main.smem_bytes) for d in (64, 128)}
    bigger = K._replace(kSmemAlign=2 * K.kSmemAlign, kFwdKvStages=K.kFwdKvStages + 1, kBwdStages=K.kBwdStages + 1)
    monkeypatch.setattr(kernels, "K", bigger)
    for d, (fwd, bwd) in base.items():
        t = kernels.TILES[("fwd", d)]
        assert kernels._fwd_smem(t, d) == fwd + K.kSmemAlign + 2 * t.block_n * d * 2 + 4 * K.kMbarrierBytes
        assert kernels._bwd_main_smem(kernels.TILES[("bwd_main", d)], d) > bwd + K.kSmemAlign
