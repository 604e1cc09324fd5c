"""NVRTC JIT, disk cache, kernel specs and ``python -m cupy_dash compile`` (the parameter blocks:
test_params_layout.py).

Everything here runs on a CPU-only machine (NVRTC from the pip wheel compiles sm_90a without a GPU) except the
tests marked ``gpu``. Most compiles use tiny stand-in kernels in a temporary copy of the kernel sources, so the
file stays fast; only a couple of real variants are compiled here (CI runs ``compile --all`` on its own).
"""
from __future__ import annotations

import hashlib
import itertools
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from cupy_dash.cli import compile as cli_compile
from cupy_dash.cuda import jit, kernels
from params_helpers import fwd_fields

REAL_KERNEL_DIR = jit.kernel_dir()

# A stand-in for a kernel source: every entry point the specs name, taking its real params struct.
STUB_KERNEL = r"""
#include "common.cuh"
#include "params.cuh"
static_assert(DASH_HEAD_DIM == 64 || DASH_HEAD_DIM == 128, "head dim");
extern "C" __global__ void __launch_bounds__(DASH_NUM_THREADS) ENTRY(const __grid_constant__ PARAMS p) {
  __shared__ float s[DASH_NUM_THREADS];
  s[threadIdx.x] = p.softmax_scale * (float)p.seqlen_q;
  __syncthreads();
  p.PTR[blockIdx.x * DASH_NUM_THREADS + threadIdx.x] = s[DASH_NUM_THREADS - 1 - threadIdx.x] + DASH_BLOCK_M;
}
"""
_STUBS = {
    "fwd.cu": ("dash_fwd", "FwdParams", "lse"),
    "bwd_preprocess.cu": ("dash_bwd_preprocess", "BwdParams", "dpsum"),
    "bwd_main.cu": ("dash_bwd_main", "BwdParams", "dq_accum"),
    "bwd_postprocess.cu": ("dash_bwd_postprocess", "BwdParams", "dpsum"),
    "bwd_expand.cu": ("dash_bwd_expand", "BwdParams", "dpsum"),
}


def _stub(source: str) -> str:
    entry, params, ptr = _STUBS[source]
    return STUB_KERNEL.replace("ENTRY", entry).replace("PARAMS", params).replace("PTR", ptr)


@pytest.fixture
def ksrc(tmp_path, monkeypatch):
    """A temporary kernels_src: the real headers plus stand-in kernels; jit.kernel_dir() points at it and the
    cache is a fresh temporary directory."""
    root = tmp_path / "kernels_src"
    root.mkdir()
    for p in REAL_KERNEL_DIR.rglob("*.cuh"):
        dest = root / p.relative_to(REAL_KERNEL_DIR)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(p, dest)
    for source in _STUBS:
        (root / source).write_text(_stub(source))
    monkeypatch.setattr(jit, "kernel_dir", lambda: root)
    monkeypatch.setenv("CUPY_DASH_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("CUPY_DASH_JIT_VERBOSE", raising=False)
    return root


SPEC = kernels.bwd_specs("bfloat16", 64, causal=True).main


# ------------------------------------------------------------------------------------------------ specs
def test_all_specs_cover_every_combination():
    specs = kernels.all_specs()
    labels = [s.label for s in specs]
    # + head dims 192 and 256's backwards: 2 preprocess, 2 postprocess, 4 main, 4 compact main, 4 soft-capping main;
    # + value head dim 128 with 192: 4 forward, 2 preprocess, 4 main, 4 compact main, 4 soft-capping main;
    # + every causal forward's persistent build (12);
    # + head dim 192's compact tables' own tile (96 x 64; the others 64 x 96): 4 preprocess, 2 postprocess;
    # + the capped compact main kernels: 2 dtypes x 6 head dims (192 with either value head dim) x 2 masks
    assert len(set(labels)) == len(labels) == len(set(specs)) == \
        20 + 6 + 24 + 6 + 1 + 12 + 24 + 2 * 16 + 18 + 12 + 6 + 24
    expected = {kernels.expand_spec()}
    for dtype, d, causal in itertools.product(kernels.SUPPORTED_DTYPES, kernels.SUPPORTED_HEAD_DIMS, (0, 1)):
        expected.add(kernels.fwd_spec(dtype, d, bool(causal)))
        if bool(causal) in kernels.FWD_PERSISTENT:
            expected.add(kernels.fwd_spec(dtype, d, bool(causal), persistent=True))
        expected.update(kernels.bwd_specs(dtype, d, bool(causal)))
        expected.update(kernels.bwd_specs(dtype, d, bool(causal), compact=True))      # 192: a tile of its own
        expected.add(kernels.bwd_specs(dtype, d, bool(causal), softcap=True).main)
        expected.add(kernels.bwd_specs(dtype, d, bool(causal), compact=True, softcap=True).main)
        for softcap in (False, True):           # the 80-query tile (head dims 96 and 128)
            expected.update(kernels.bwd_specs(dtype, d, bool(causal), softcap=softcap,
                                              seqlen_q=kernels.CAUSAL80_MIN_SEQLEN))
        for dv in kernels.VALUE_HEAD_DIMS.get(d, ()):    # the value head dim's own preprocess and main kernels
            expected.add(kernels.fwd_spec(dtype, d, bool(causal), dv))
            if bool(causal) in kernels.FWD_PERSISTENT:
                expected.add(kernels.fwd_spec(dtype, d, bool(causal), dv, persistent=True))
            for kw in ({}, {"compact": True}, {"softcap": True}, {"compact": True, "softcap": True}):
                expected.update(kernels.bwd_specs(dtype, d, bool(causal), head_dim_v=dv, **kw)[:2])
    assert expected == set(specs)
    by_kernel = {name: [s for s in specs if s.kernel == name] for name in kernels.KERNEL_NAMES}
    assert {k: len(v) for k, v in by_kernel.items()} == {"fwd": 36, "bwd_preprocess": 20, "bwd_main": 112,
                                                         "bwd_postprocess": 16, "bwd_expand": 1}
    v128 = kernels.bwd_specs("bfloat16", 192, True, head_dim_v=128)
    assert v128.main.label == "bwd_main[bf16,d192,v128,causal]"
    assert kernels.bwd_specs("bfloat16", 192, True, compact=True, head_dim_v=128).main.label == \
        "bwd_main[bf16,d192,v128,m96,causal,compact]"
    assert ("DASH_HEAD_DIM_V", 128) in v128.preprocess.defines
    assert v128.postprocess == kernels.bwd_specs("bfloat16", 192, True).postprocess     # dq is 192 wide either way
    assert kernels.fwd_spec("bfloat16", 192, False, 192) == kernels.fwd_spec("bfloat16", 192, False)
    with pytest.raises(ValueError, match="head_dim_v 64 with head_dim 192"):
        kernels.fwd_spec("bfloat16", 192, False, 64)
    with pytest.raises(ValueError, match="head_dim_v 128 with head_dim 256"):
        kernels.bwd_specs("bfloat16", 256, False, head_dim_v=128)
    # every forward head dim has a backward build (BWD_PENDING_HEAD_DIMS: built, refused by the API, none now)
    assert set(kernels.SUPPORTED_HEAD_DIMS) == set(kernels.BWD_BUILT_HEAD_DIMS)
    with pytest.raises(ValueError, match="for the backward"):
        kernels.bwd_specs("bfloat16", 160, False)
    assert kernels.expand_spec().label == "bwd_expand[bf16,d64,compact]"
    for s in specs:
        d = dict(s.defines)
        assert list(s.defines) == sorted(s.defines)
        assert d["DASH_SMEM_BYTES"] == s.smem_bytes and d["DASH_NUM_THREADS"] == s.threads
        assert s.smem_bytes <= 227 * 1024
        assert s.source.endswith(".cu") and s.entry.startswith("dash_")
    assert kernels.bwd_specs("bfloat16", 128, True).main.label == "bwd_main[bf16,d128,causal]"
    # deterministic or not is the launch's choice: no build of the main kernel carries it
    assert not any(name == "DASH_DETERMINISTIC" for s in kernels.all_specs() for name, _ in s.defines)
    assert kernels.fwd_spec("float16", 64, False).label == "fwd[fp16,d64,full]"
    assert kernels.bwd_specs("float16", 64, False).main.label == "bwd_main[fp16,d64,full]"
    assert kernels.fwd_spec("bfloat16", 96, True).label == "fwd[bf16,d96,causal]"
    assert kernels.bwd_specs("bfloat16", 96, False, seqlen_q=kernels.FULL80_MIN_SEQLEN).main.label == \
        "bwd_main[bf16,d96,m80,full]"


def test_tile_plan_and_smem():
    for d_io, (bm, bn) in ((64, (128, 128)), (96, (64, 128)), (128, (64, 128))):
        d = 128 if d_io == 96 else d_io      # head dim 96 runs the head-dim-128 kernels padded
        assert kernels.padded_head_dim(d_io) == d
        f, b = kernels.fwd_tile(d_io), kernels.bwd_tile(d_io, True)
        fs = kernels.fwd_spec("bfloat16", d_io, False)
        assert dict(fs.defines)["DASH_HEAD_DIM"] == d_io
        # the forward: Q; K, V x2 stages; 14 barriers, 2 tile slots; 1 KB of alignment slack (fwd/config.cuh
        # static_asserts it)
        assert fs.smem_bytes == (f.block_m + 4 * f.block_n) * d * 2 + 112 + 16 + 1024 and fs.threads == f.threads == 384
        pre, main, post = kernels.bwd_specs("bfloat16", d_io, False)
        # the main kernel: 384 threads; smem as bwd/config.cuh lays it out (the kernel static_asserts the same
        # number, so compile --all checks the formula): K x2, V; Q, dO, dS x2; fp32 dQ; lse, dpsum x2; 14
        # barriers; a 16-byte visit slot per stage; 1 KB of alignment slack
        assert (b.block_m, b.block_n, b.threads, main.threads) == (bm, bn, 384, 384)
        assert main.smem_bytes == (3 * bn * d * 2 + 2 * 2 * bm * d * 2 + 2 * bm * bn * 2 + bm * d * 4
                                   + 2 * 2 * bm * 4 + 112 + 2 * 16 + 1024) <= 227 * 1024
        for aux in (pre, post):
            assert aux.smem_bytes == 0 and dict(aux.defines)["DASH_BLOCK_M"] == b.block_m
            assert "DASH_CAUSAL" not in dict(aux.defines)
        assert "DASH_DETERMINISTIC" not in dict(main.defines)
    # head dim 192, FA3's 64 x 96 tile (kernels_src/bwd/keys_step.cuh): K, V; Q x2, dO; P^T and dS^T (one stage);
    # the whole fp32 dQ tile as staging (three 64 x 64 slices); lse x2, dpsum; 10 barriers, 2 visit slots; slack
    t = kernels.bwd_tile(192, True)
    assert (t.block_m, t.block_n) == (64, 96)
    assert kernels.bwd_specs("bfloat16", 192, True).main.smem_bytes == \
        2 * 96 * 192 * 2 + 3 * 64 * 192 * 2 + 2 * 64 * 96 * 2 + 64 * 192 * 4 + 3 * 64 * 4 + 80 + 32 + 1024 == 223088
    with pytest.raises(ValueError):
        kernels.fwd_spec("float32", 64, False)
    with pytest.raises(ValueError):
        kernels.bwd_specs("bfloat16", 160, False)
    for bad in (80, 160):
        with pytest.raises(ValueError, match="head_dim"):
            kernels.fwd_spec("bfloat16", bad, False)


def test_kernel_dir_has_sources():
    assert (REAL_KERNEL_DIR / "params.cuh").is_file() and (REAL_KERNEL_DIR / "common.cuh").is_file()


def test_cache_dir_env(monkeypatch, tmp_path):
    monkeypatch.delenv("CUPY_DASH_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert jit.cache_dir() == tmp_path / "xdg" / "cupy_dash"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert jit.cache_dir() == Path.home() / ".cache" / "cupy_dash"
    monkeypatch.setenv("CUPY_DASH_CACHE_DIR", str(tmp_path / "mine"))
    assert jit.cache_dir() == tmp_path / "mine"
    monkeypatch.delenv("CUPY_DASH_CACHE_DIR")

    def no_home():
        raise RuntimeError("Could not determine home directory.")
    monkeypatch.setattr(Path, "home", no_home)                 # a container's uid missing from /etc/passwd
    assert jit.cache_dir().name == f"cupy_dash-{os.getuid()}"


# ------------------------------------------------------------------------------------------------ ptxas log
def test_parse_ptxas_log():
    log = """ptxas info    : 4 bytes gmem
ptxas info    : Compiling entry function 'dash_bwd_main' for 'sm_90a'
ptxas info    : Function properties for dash_bwd_main
ptxas         .     16 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 168 registers, used 1 barriers, 64 bytes cumulative stack size, 1024 bytes smem
ptxas info    : Compile time = 14.250 ms
ptxas info    : Function properties for _Z6helperPfi
ptxas         .     48 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads
"""
    assert jit.parse_ptxas_log(log, "dash_bwd_main") == dict(
        registers=168, spill_stores=12, spill_loads=16, stack_frame=64, static_smem=1024)
    with pytest.raises(ValueError):
        jit.parse_ptxas_log(log, "dash_fwd")


# ------------------------------------------------------------------------------------------------ cache
def test_ptxas_report_on_every_compile():
    # NVRTC >= 12.9 caches on its own (with the driver's compute cache where a driver exists) and a hit there
    # drops the ptxas report; jit must bypass that cache so that a recompile still reports registers/spills.
    src = 'extern "C" __global__ void dash_twice(float* p) { p[threadIdx.x] *= 2.f; }'
    for _ in range(2):
        _, log, ok = jit.compile_source(src, "twice.cu", jit.BASE_OPTIONS)
        assert ok and jit.parse_ptxas_log(log, "dash_twice")["registers"] > 0


def test_compile_then_cache_hit(ksrc, tmp_path):
    cold = jit.compile_spec(SPEC)
    assert not cold.cached and cold.registers > 0 and cold.spill_stores == 0
    assert "for 'sm_90a'" in cold.log
    cubin = cold.cubin_path.read_bytes()
    assert cubin[:4] == b"\x7fELF" and hashlib.sha256(cubin).hexdigest() == cold.cubin_sha256
    meta = json.loads(cold.cubin_path.with_suffix(".json").read_text())
    assert meta["cubin_size"] == len(cubin) and meta["registers"] == cold.registers
    warm = jit.compile_spec(SPEC)
    assert warm.cached and warm.cubin_path == cold.cubin_path and warm.registers == cold.registers
    assert warm.seconds < 0.5 and warm.seconds < cold.seconds
    # atomic writes leave no temporary files behind (the entry's lock file stays)
    assert sorted(p.suffix for p in (tmp_path / "cache").iterdir()) == [".cubin", ".json", ".lock"]
    forced = jit.compile_spec(SPEC, force=True)
    assert not forced.cached and forced.cubin_path.read_bytes()[:4] == b"\x7fELF"


@pytest.mark.parametrize("damage", ["truncate_cubin", "flip_cubin_byte", "delete_cubin", "corrupt_json",
                                    "truncate_json", "json_wrong_key"])
def test_damaged_cache_entry_is_rebuilt(ksrc, damage):
    first = jit.compile_spec(SPEC)
    cubin_path, meta_path = first.cubin_path, first.cubin_path.with_suffix(".json")
    data = cubin_path.read_bytes()
    if damage == "truncate_cubin":
        cubin_path.write_bytes(data[:-1])
    elif damage == "flip_cubin_byte":
        cubin_path.write_bytes(data[:100] + bytes([data[100] ^ 0xFF]) + data[101:])
    elif damage == "delete_cubin":
        cubin_path.unlink()
    elif damage == "corrupt_json":
        meta_path.write_text("{not json")
    elif damage == "truncate_json":
        meta_path.write_bytes(meta_path.read_bytes()[:40])
    else:
        meta = json.loads(meta_path.read_text())
        meta["key"] = "0" * 64
        meta_path.write_text(json.dumps(meta))
    again = jit.compile_spec(SPEC)
    assert not again.cached                      # detected, deleted and rebuilt, never served
    assert again.cubin_path.read_bytes() == data
    assert jit.compile_spec(SPEC).cached         # and the rebuilt entry is good


def test_cubin_without_json_is_ignored(ksrc):
    first = jit.compile_spec(SPEC)
    first.cubin_path.with_suffix(".json").unlink()   # as if interrupted between the two writes
    assert not jit.compile_spec(SPEC).cached


def test_a_header_in_the_working_directory_is_not_compiled_in(ksrc, tmp_path, monkeypatch):
    """NVRTC looks for a quoted include beside the program's name first: the program is named by its absolute
    path, so a common.cuh in the working directory is never the kernel's (nor cached under its key)."""
    elsewhere = tmp_path / "project"
    elsewhere.mkdir()
    (elsewhere / "common.cuh").write_text('#error "the working directory\'s header"\n')
    monkeypatch.chdir(elsewhere)
    assert not jit.compile_spec(SPEC).cached


def test_without_the_lock_nothing_is_deleted(ksrc, monkeypatch, capsys):
    """Another process holds the entry's lock (between its two writes: a cubin without its JSON): this one waits,
    says so on stderr, and after LOCK_WAIT_S compiles without the lock, deleting nothing it did not write."""
    import fcntl
    first = jit.compile_spec(SPEC)
    first.cubin_path.with_suffix(".json").unlink()          # the other process's cubin, its JSON not yet written
    orphan = first.cubin_path.read_bytes()
    holder = os.open(first.cubin_path.with_suffix(".lock"), os.O_RDWR)
    fcntl.flock(holder, fcntl.LOCK_EX)
    monkeypatch.setattr(jit, "LOCK_TELL_S", 0.05)
    monkeypatch.setattr(jit, "LOCK_WAIT_S", 0.3)
    removed = []
    monkeypatch.setattr(jit, "_remove", lambda *paths: removed.extend(paths))
    try:
        again = jit.compile_spec(SPEC)
    finally:
        os.close(holder)
    err = capsys.readouterr().err
    assert "waiting for" in err and "compiling without it" in err
    assert not again.cached and removed == [] and again.cubin_sha256 == hashlib.sha256(orphan).hexdigest()


def test_key_changes_with_define_and_header(ksrc):
    k0 = jit.cache_key(SPEC)
    other = kernels.bwd_specs("bfloat16", 64, causal=False).main
    assert jit.cache_key(other) != k0
    jit.compile_spec(SPEC)
    assert jit.compile_spec(SPEC).cached
    header = ksrc / "ptx" / "wgmma.cuh"
    header.write_bytes(header.read_bytes() + b" ")      # one byte in a nested header
    assert jit.cache_key(SPEC) != k0
    assert not jit.compile_spec(SPEC).cached
    # the location of the sources is not part of the key, only their content
    header.write_bytes(header.read_bytes()[:-1])
    assert jit.cache_key(SPEC) == k0


def test_lineinfo_knob_adds_the_option_and_keys_apart(ksrc, monkeypatch):
    monkeypatch.delenv("CUPY_DASH_JIT_LINEINFO", raising=False)
    k0 = jit.cache_key(SPEC)
    assert "-lineinfo" not in jit.spec_options(SPEC)
    jit.compile_spec(SPEC)
    monkeypatch.setenv("CUPY_DASH_JIT_LINEINFO", "1")
    assert "-lineinfo" in jit.spec_options(SPEC)
    assert jit.cache_key(SPEC) != k0
    built = jit.compile_spec(SPEC)
    assert not built.cached and "-lineinfo" in json.loads(built.cubin_path.with_suffix(".json").read_text())["options"]
    monkeypatch.delenv("CUPY_DASH_JIT_LINEINFO")
    assert jit.compile_spec(SPEC).cached         # the entry without it is still there


def test_compile_error_names_kernel(ksrc):
    (ksrc / SPEC.source).write_text(_stub(SPEC.source) + "\nthis is not C++;\n")
    with pytest.raises(jit.CompileError) as info:
        jit.compile_spec(SPEC)
    assert SPEC.label in str(info.value) and "error" in info.value.log
    assert info.value.label == SPEC.label
    # a missing source is a CompileError too
    (ksrc / SPEC.source).unlink()
    with pytest.raises(jit.CompileError, match=r"bwd_main\[bf16,d64,causal\]"):
        jit.compile_spec(SPEC)


def test_verbose_prints_ptxas_report(ksrc, monkeypatch, capsys):
    monkeypatch.setenv("CUPY_DASH_JIT_VERBOSE", "1")
    jit.compile_spec(SPEC)
    err = capsys.readouterr().err
    assert SPEC.label in err and "registers" in err and "ptxas" in err
    jit.compile_spec(SPEC, verbose=False)
    assert capsys.readouterr().err == ""


# ------------------------------------------------------------------------------------------------ real kernels
@pytest.mark.parametrize("spec", [kernels.fwd_spec("bfloat16", 128, True),
                                  kernels.bwd_specs("float16", 64, False).main,
                                  kernels.bwd_specs("bfloat16", 128, True, timeline=True).main,
                                  kernels.bwd_specs("bfloat16", 128, True, compact=True).main],
                         ids=lambda s: s.label)
def test_real_kernel_compiles(spec):
    # The process's kernel cache: after the README test command's `compile --all` every variant here but the
    # timeline debug build is an entry already, whose stored ptxas log and counts are checked (the key holds the
    # sources, options and NVRTC, so an entry is this very compile); a fresh compile into a new cache is
    # test_forward_compiles_without_spills_at_head_dims_192_and_256's and the cache tests'.
    ck = jit.compile_spec(spec)
    assert ck.registers > 0 and "for 'sm_90a'" in ck.log and ck.cubin_path.is_file()
    assert ck.spill_stores == ck.spill_loads == ck.stack_frame == 0 and not ck.perf_warnings, ck.log


# ------------------------------------------------------------------------------------------------ CLI
def test_cli_compile_subset(ksrc, capsys):
    assert cli_compile.main(["--head-dim", "64", "--dtype", "bf16"]) == 0
    out = capsys.readouterr().out
    assert "regs" in out and "OK: 14 kernel(s)" in out   # 2 fwd, the causal one persistent, preprocess, 2 main,
    # 2 compact main, 2 soft-capping main builds, 2 capped compact main, postprocess, bwd_expand (bf16 / d64
    # defines, whatever the variant); varlen launches share them
    for spec in cli_compile.select([64], ["bfloat16"], None):
        assert spec.label in out
    # the second run is served from the cache
    assert cli_compile.main(["--kernel", "bwd_postprocess", "--head-dim", "64", "--dtype", "bfloat16"]) == 0
    assert "(1 from the cache)" in capsys.readouterr().out


def test_cli_compile_reports_failures(ksrc, capsys):
    (ksrc / "bwd_postprocess.cu").write_text("#error deliberately broken\n")
    assert cli_compile.main(["--kernel", "bwd_postprocess", "--kernel", "fwd", "--head-dim", "64",
                             "--dtype", "fp16"]) == 1
    captured = capsys.readouterr()
    assert "bwd_postprocess[fp16,d64]: compile error" in captured.err
    assert "deliberately broken" in captured.err
    assert "fwd[fp16,d64,causal]" in captured.out


def test_cli_compile_flags_spills(ksrc, capsys):
    # a kernel that spills under a tight register cap
    (ksrc / "bwd_preprocess.cu").write_text(r"""
#include "params.cuh"
extern "C" __global__ void __maxnreg__(24)
dash_bwd_preprocess(const __grid_constant__ BwdParams p) {
  float acc[48];
  #pragma unroll
  for (int i = 0; i < 48; ++i) acc[i] = p.dpsum[threadIdx.x * 48 + i];
  #pragma unroll
  for (int r = 0; r < 8; ++r)
  #pragma unroll
    for (int i = 0; i < 48; ++i) acc[i] = acc[i] * acc[(i + r + 1) % 48] + 1.f;
  #pragma unroll
  for (int i = 0; i < 48; ++i) p.dpsum[threadIdx.x * 48 + i] = acc[i];
}
""")
    assert cli_compile.main(["--kernel", "bwd_preprocess", "--head-dim", "128", "--dtype", "bf16"]) == 1
    err = capsys.readouterr().err
    assert "bwd_preprocess[bf16,d128]: spills" in err


def test_cli_compile_flags_ptxas_performance_warnings(ksrc, capsys):
    # setmaxnreg without __launch_bounds__(threads, 1): ptxas ignores it and says so (C7508)
    (ksrc / "bwd_preprocess.cu").write_text(r"""
#include "params.cuh"
#include "ptx/setmaxnreg.cuh"
extern "C" __global__ void dash_bwd_preprocess(const __grid_constant__ BwdParams p) {
  if (threadIdx.x < 128) { setmaxnreg_dec<24>(); } else { setmaxnreg_inc<240>(); p.dpsum[threadIdx.x] = 1.f; }
}
""")
    assert cli_compile.main(["--kernel", "bwd_preprocess", "--head-dim", "128", "--dtype", "bf16"]) == 1
    err = capsys.readouterr().err
    assert "bwd_preprocess[bf16,d128]: (C7508)" in err


@pytest.mark.parametrize("argv", [[], ["--all", "--head-dim", "64"], ["--head-dim", "160"], ["--dtype", "fp32"],
                                  ["--kernel", "nope"], ["--bogus"]])
def test_cli_compile_bad_arguments(argv, capsys):
    with pytest.raises(SystemExit) as info:
        cli_compile.main(argv)
    assert info.value.code == 2
    assert "error" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------ GPU
ECHO_KERNEL = r"""
#include "params.cuh"
// Copies its parameter block, byte for byte, into the buffer at p.lse + 16 bytes (one copy per CTA) and writes
// DASH_SMEM_BYTES to p.lse[0]: proves the by-value struct passing.
extern "C" __global__ void __launch_bounds__(DASH_NUM_THREADS) dash_fwd(const __grid_constant__ FwdParams p) {
  extern __shared__ unsigned char smem[];
  const unsigned char* src = reinterpret_cast<const unsigned char*>(&p);
  unsigned char* dst = reinterpret_cast<unsigned char*>(p.lse) + 16 + blockIdx.x * sizeof(FwdParams);
  for (int i = threadIdx.x; i < (int)sizeof(FwdParams); i += blockDim.x) { smem[i] = src[i]; }
  __syncthreads();
  for (int i = threadIdx.x; i < (int)sizeof(FwdParams); i += blockDim.x) dst[i] = smem[i];
  if (threadIdx.x == 0 && blockIdx.x == 0) p.lse[0] = (float)DASH_SMEM_BYTES;
}
"""


@pytest.mark.gpu
def test_launch_passes_params_by_value(ksrc):
    import cupy
    (ksrc / "fwd.cu").write_text(ECHO_KERNEL)
    spec = kernels.fwd_spec("bfloat16", 128, False)          # 161 KiB dynamic smem: needs the opt-in attribute
    assert spec.smem_bytes > 48 * 1024
    grid = 3
    buf = cupy.zeros(16 + grid * kernels.FWD_PARAMS_DTYPE.itemsize, dtype=cupy.uint8)
    lse = buf[:16].view(cupy.float32)
    out = buf[16:]
    params = kernels.pack_fwd_params(**fwd_fields(lse=buf.data.ptr))
    stream = cupy.cuda.Stream(non_blocking=True)
    kernels.launch(spec, (grid,), params, stream)
    stream.synchronize()
    got = out.get().reshape(grid, -1)
    for row in got:
        assert row.tobytes() == params.tobytes()
    assert float(lse[0].get()) == spec.smem_bytes
    assert jit.load(spec) is jit.load(spec)                   # memoized per (spec, device)
    n = kernels.max_resident_ctas(spec)
    sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
    assert n == sms                                           # 161 KiB smem, 384 threads: 1 CTA per SM
    bwd_params = np.zeros(1, dtype=kernels.BWD_PARAMS_DTYPE)
    with pytest.raises(TypeError, match="params"):             # the wrong struct for this kernel
        kernels.launch(spec, grid, bwd_params, stream)


def test_launch_checks_its_parameter_block_before_loading_anything():
    spec = kernels.fwd_spec("bfloat16", 64, False)
    size = kernels.FWD_PARAMS_DTYPE.itemsize
    with pytest.raises(TypeError, match=f"its {size} bytes"):
        kernels.launch(spec, 1, bytearray(size - 8), None)            # patched bytes of the wrong size
    with pytest.raises(TypeError, match="size-1 array of dtype"):
        kernels.launch(spec, 1, np.zeros(1, kernels.BWD_PARAMS_DTYPE), None)
    with pytest.raises(TypeError, match="params"):
        kernels.launch(spec, 1, "not a block", None)


@pytest.mark.parametrize("head_dim", [192, 256])
def test_forward_compiles_without_spills_at_head_dims_192_and_256(head_dim):
    """Head dims 192 and 256: the forward's 128 x 64 tile (128 x 128
    would need 247 / 329 KB of shared memory, docs/decisions/head-dim-plans.md) compiles for sm_90a without spills,
    O += P V in chunks of the wgmma wrappers' N (from the kernel cache that `compile --all` filled, where it ran)."""
    assert kernels.fwd_tile(head_dim) == kernels.TileConfig(128, 64, kernels.MAIN_THREADS)
    for causal in (False, True):
        spec = kernels.fwd_spec("bfloat16", head_dim, causal)
        assert spec.smem_bytes == kernels._fwd_smem(kernels.fwd_tile(head_dim), head_dim) <= 227 * 1024
        built = jit.compile_spec(spec)
        assert (built.spill_stores, built.spill_loads, built.stack_frame) == (0, 0, 0)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("head_dim,tile,compact_tile", [(256, (64, 64, 384), (64, 64, 384)),
                                                       (192, (64, 96, 512), (96, 64, 512))], ids=["d256", "d192"])
def test_backward_compiles_without_spills_at_head_dims_192_and_256(head_dim, tile, compact_tile, dtype, causal):
    """Head dims 192 and 256's backwards (the MMA warpgroups split the head dim: kernels_src/bwd/split_step.cuh):
    64 x 64 tiles and two MMA warpgroups at 256; at 192 three (512 threads, DASH_NUM_MMA_WG) on FA3's 64 x 96 tile
    (kernels_src/bwd/keys_step.cuh), or 96 x 64 with compact tables (whose 152 registers the 64 x 96 visit exceeds);
    one K buffer and one dO stage, in the 227 KB of a CTA; every build (per-visit and compact tables, soft-capping)
    compiles for sm_90a without spills."""
    got = kernels.bwd_tile(head_dim, causal, seqlen_q=1 << 20)
    assert (got.block_m, got.block_n, got.threads) == tile
    got = kernels.bwd_tile(head_dim, causal, compact=True, seqlen_q=1 << 20)
    assert (got.block_m, got.block_n, got.threads) == compact_tile
    builds = (kernels.bwd_specs(dtype, head_dim, causal), kernels.bwd_specs(dtype, head_dim, causal, compact=True),
              kernels.bwd_specs(dtype, head_dim, causal, softcap=True))
    assert (dict(builds[0].main.defines).get("DASH_NUM_MMA_WG", 2), builds[0].main.threads) == \
        ((3, 512) if head_dim == 192 else (2, 384))
    for spec in {s for b in builds for s in b}:
        assert spec.smem_bytes <= 227 * 1024
        built = jit.compile_spec(spec)
        assert (built.spill_stores, built.spill_loads, built.stack_frame) == (0, 0, 0), spec.label
