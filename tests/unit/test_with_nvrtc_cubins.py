"""benchmarks/with_nvrtc_cubins.py: the record / replay of jit's NVRTC compiles through a folder of cubins (an A/B of
two compilers on a machine that has only one), and its ctypes NVRTC against the NVRTC library this package
installs. No GPU needed."""
from __future__ import annotations

import multiprocessing
import sys
from pathlib import Path

import pytest

from cupy_dash import config
from cupy_dash.cuda import jit

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
if str(BENCHMARKS) not in sys.path:
    sys.path.insert(0, str(BENCHMARKS))

import with_nvrtc_cubins as wnc  # noqa: E402

KERNEL = '#include "h.cuh"\nextern "C" __global__ void k(float* x) { x[threadIdx.x] *= TWO; }\n'


class FakeNvrtc:
    version = (12, 8)

    def __init__(self):
        self.calls = []

    def compile(self, source, name, options):
        self.calls.append((name, list(options)))
        return b"\x7fELF" + source.encode()[-8:], "ptxas info: fake", True


@pytest.fixture
def routed(monkeypatch, tmp_path):
    """jit's routing, the cache directory and the start method restored after the test."""
    monkeypatch.setattr(jit, "compile_source", jit.compile_source)
    monkeypatch.setattr(jit, "_nvrtc_fingerprint", jit._nvrtc_fingerprint)
    monkeypatch.setenv("CUPY_DASH_CACHE_DIR", str(tmp_path / "cache"))
    method = multiprocessing.get_start_method(allow_none=True)
    yield
    multiprocessing.set_start_method(method, force=True)


def _program(root: Path, header: str = "#define TWO 2.0f\n"):
    root.mkdir(exist_ok=True)
    (root / "k.cu").write_text(KERNEL)
    (root / "h.cuh").write_text(header)
    return KERNEL, str(root / "k.cu"), ["-arch=sm_90a", f"-I{root}"]


def test_recorded_programs_replay_from_any_folder_of_the_same_sources(tmp_path, routed):
    source, name, options = _program(tmp_path / "a")
    fake = FakeNvrtc()
    multiprocessing.set_start_method("spawn", force=True)                    # as Python 3.14 defaults to forkserver
    wnc.install(tmp_path / "cubins", record_with=fake)
    assert config.CACHE_DIR.get() != str(tmp_path / "cache")                # a fresh cache for the record
    cubin, log, ok = jit.compile_source(source, name, options)
    assert ok and cubin.startswith(b"\x7fELF") and log == "ptxas info: fake" and len(fake.calls) == 1
    assert jit._nvrtc_fingerprint().startswith("nvrtc-12.8-cubins-")
    assert multiprocessing.get_start_method() == "fork"
    wnc.install(tmp_path / "cubins")                                        # replay
    source_b, name_b, options_b = _program(tmp_path / "b")                  # the same sources elsewhere
    assert jit.compile_source(source_b, name_b, options_b) == (cubin, log, True)
    with pytest.raises(RuntimeError, match="no recorded cubin for k.cu"):
        jit.compile_source(source_b, name_b, options_b + ["-DX=1"])        # other options: another program
    _program(tmp_path / "b", header="#define TWO 3.0f\n")
    with pytest.raises(RuntimeError, match="no recorded cubin"):           # another header: another program
        jit.compile_source(source_b, name_b, options_b)


def test_a_folder_holds_one_nvrtc_and_a_replay_needs_a_record(tmp_path, routed):
    wnc.install(tmp_path / "cubins", record_with=FakeNvrtc())
    other = FakeNvrtc()
    other.version = (12, 4)
    with pytest.raises(SystemExit, match="another NVRTC"):
        wnc.install(tmp_path / "cubins", record_with=other)
    with pytest.raises(SystemExit, match="no recorded cubins"):
        wnc.install(tmp_path / "empty")


def test_ctypes_nvrtc_record_replays_a_real_kernel_spec_without_the_package_nvrtc(tmp_path, routed, monkeypatch):
    """The ctypes calls against this package's own NVRTC library: its version, a kernel spec of this tree recorded
    through jit.compile_spec, then replayed in a fresh cache while jit's own NVRTC would fail the test."""
    import cuda.pathfinder
    from cupy_dash.cuda import kernels
    try:
        lib = cuda.pathfinder.load_nvidia_dynamic_lib("nvrtc").abs_path
    except Exception as exc:                                                 # no NVRTC wheel / library here
        pytest.skip(f"NVRTC library not found: {exc}")
    nvrtc = wnc.CtypesNvrtc(lib)
    assert nvrtc.version == jit.nvrtc_version()
    bad = nvrtc.compile("this is not C++", "bad.cu", ["-arch=sm_90a"])
    assert bad[0] is None and not bad[2] and "error" in bad[1]
    spec = next(s for s in kernels.all_specs() if s.label.startswith("bwd_postprocess[bf16,d128"))
    wnc.install(tmp_path / "cubins", record_with=nvrtc)
    recorded = jit.compile_spec(spec, force=True)
    monkeypatch.setenv("CUPY_DASH_CACHE_DIR", str(tmp_path / "replay_cache"))
    monkeypatch.setattr(jit, "_nvrtc", lambda: pytest.fail("the replay called this machine's NVRTC"))
    wnc.install(tmp_path / "cubins")
    replayed = jit.compile_spec(spec)
    assert replayed.read_cubin() == recorded.read_cubin() and replayed.registers == recorded.registers
