"""benchmarks/with_nvrtc_cubins.py: the record / replay of jit's NVRTC compiles through a folder of cubins (an A/B of
two compilers on a machine that has only one), and its ctypes NVRTC against the NVRTC library this package
installs. No GPU needed."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from cupy_dash.cuda import jit

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
if str(BENCHMARKS) not in sys.path:
    sys.path.insert(0, str(BENCHMARKS))

import with_nvrtc_cubins as wnc  # noqa: E402

KERNEL = 'extern "C" __global__ void k(float* x) { x[threadIdx.x] *= 2.0f; }\n'


class FakeNvrtc:
    version = (12, 8)

    def __init__(self):
        self.calls = []

    def compile(self, source, name, options):
        self.calls.append((name, list(options)))
        return b"\x7fELF" + source.encode()[:8], "ptxas info: fake", True


def _program(root: Path, text: str = KERNEL):
    root.mkdir(exist_ok=True)
    (root / "k.cu").write_text(text)
    return text, str(root / "k.cu")


def test_recorded_programs_replay_from_any_folder_of_the_same_sources(tmp_path, monkeypatch):
    monkeypatch.setattr(jit, "compile_source", jit.compile_source)       # restored after the test
    monkeypatch.setattr(jit, "_nvrtc_fingerprint", jit._nvrtc_fingerprint)
    source, name = _program(tmp_path / "a")
    fake = FakeNvrtc()
    wnc.install(tmp_path / "cubins", record_with=fake)
    cubin, log, ok = jit.compile_source(source, name, ["-arch=sm_90a", f"-I{tmp_path / 'a'}"])
    assert ok and cubin.startswith(b"\x7fELF") and log == "ptxas info: fake" and len(fake.calls) == 1
    assert jit._nvrtc_fingerprint().startswith("nvrtc-12.8-cubins-")
    wnc.install(tmp_path / "cubins")                                     # replay: the fake is not called again
    source_b, name_b = _program(tmp_path / "b")                          # the same sources elsewhere: -I ignored
    assert jit.compile_source(source_b, name_b, ["-arch=sm_90a", f"-I{tmp_path / 'b'}"]) == (cubin, log, True)
    assert len(fake.calls) == 1
    with pytest.raises(RuntimeError, match="no recorded cubin for k.cu"):
        jit.compile_source(source, name, ["-arch=sm_90a", "-DX=1"])       # other options: another program
    _program(tmp_path / "b", KERNEL + "// changed\n")
    with pytest.raises(RuntimeError, match="no recorded cubin"):        # other sources: another program
        jit.compile_source(KERNEL + "// changed\n", name_b, ["-arch=sm_90a"])


def test_ctypes_nvrtc_compiles_as_the_package_does():
    """The ctypes calls against this package's own NVRTC library: the same version and a cubin of the kernel."""
    import cuda.pathfinder
    try:
        lib = cuda.pathfinder.load_nvidia_dynamic_lib("nvrtc").abs_path
    except Exception as exc:                                              # no NVRTC wheel / library here
        pytest.skip(f"NVRTC library not found: {exc}")
    nvrtc = wnc.CtypesNvrtc(lib)
    assert nvrtc.version == jit.nvrtc_version()
    cubin, log, ok = nvrtc.compile(KERNEL, "k.cu", ["-arch=sm_90a", "--ptxas-options=-v"])
    assert ok and cubin[:4] == b"\x7fELF" and "Used" in log
    cubin, log, ok = nvrtc.compile("this is not C++", "bad.cu", ["-arch=sm_90a"])
    assert not ok and cubin is None and "error" in log
