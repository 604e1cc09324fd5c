"""Runs a script or a module with cupy_dash's NVRTC compiles taken from, or recorded into, a folder of cubins: an A/B
of two compilers on the GPU machine, which has only its own NVRTC (13.x). The record happens here, with another
NVRTC's library (an NVRTC 12.x wheel's ``libnvrtc.so.12``, called through ctypes); the replay on the GPU machine
answers every compile from the folder and fails on a program it does not hold (no fallback to the machine's NVRTC).
Each program is keyed by the digests of its source's folder and of every ``-I`` folder, its file name, source text and
options (include paths left out), so a folder serves the same tree wherever it lies; the fingerprint in the cache keys
becomes the folder's, so recorded and regular cubins coexist in the disk cache. A record compiles into a fresh disk
cache (a cache hit would record nothing); compile worker processes are forked, so that they inherit the routing.

    python benchmarks/with_nvrtc_cubins.py --record DIR --libnvrtc LIB -m cupy_dash compile --head-dim 128 \\
        --dtype bf16
    python benchmarks/with_nvrtc_cubins.py --replay DIR benchmarks/steady_bench.py --impls dash_det fa3_nondet ...

The target is a script when it ends in .py, else a module after ``-m`` (as benchmarks/with_kernels.py runs them).
"""
from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import multiprocessing
import os
import tempfile
from pathlib import Path

from with_kernels import run_target


def program_key(source: str, name: str, options) -> str:
    """sha256 of a program as jit.compile_source gets it: the digests of the kernel folders it can include from (its
    source's folder and every ``-I`` folder; ``name`` is the source's path), the file name, the source text and the
    options without ``-I`` (a location) and ``--no-cache``."""
    from cupy_dash.cuda import jit
    folders = {Path(name).resolve().parent} | {Path(o[2:]).resolve() for o in options if o.startswith("-I")}
    material = dict(sources=sorted(jit.source_tree_digest(f) for f in folders), file=Path(name).name,
                    source=source, options=[o for o in options if not o.startswith("-I") and o != "--no-cache"])
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()


class CtypesNvrtc:
    """The NVRTC C API of one library (``libnvrtc.so.N``), as far as jit.compile_source uses it."""

    def __init__(self, path: str):
        self.lib = ctypes.CDLL(path)
        major, minor = ctypes.c_int(), ctypes.c_int()
        self._check(self.lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)), "nvrtcVersion")
        self.version = (major.value, minor.value)

    @staticmethod
    def _check(result: int, what: str) -> None:
        if result != 0:
            raise RuntimeError(f"{what} failed: nvrtcResult {result}")

    def compile(self, source: str, name: str, options) -> tuple:
        """(cubin bytes or None, log, ok), as jit.compile_source returns them."""
        prog = ctypes.c_void_p()
        self._check(self.lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), name.encode(), 0, None, None),
                    "nvrtcCreateProgram")
        try:
            options = list(options)
            if self.version >= (12, 9) and "--no-cache" not in options:   # as jit.compile_source does
                options.append("--no-cache")
            opts = [o.encode() for o in options]
            err = self.lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
            size = ctypes.c_size_t()
            self._check(self.lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size)), "nvrtcGetProgramLogSize")
            buf = ctypes.create_string_buffer(size.value)
            self._check(self.lib.nvrtcGetProgramLog(prog, buf), "nvrtcGetProgramLog")
            log = buf.raw.rstrip(b"\0").decode(errors="replace")
            if err != 0:
                return None, log, False
            self._check(self.lib.nvrtcGetCUBINSize(prog, ctypes.byref(size)), "nvrtcGetCUBINSize")
            buf = ctypes.create_string_buffer(size.value)
            self._check(self.lib.nvrtcGetCUBIN(prog, buf), "nvrtcGetCUBIN")
            return buf.raw, log, True
        finally:
            self.lib.nvrtcDestroyProgram(ctypes.byref(prog))


def install(folder: Path, record_with: CtypesNvrtc | None = None) -> None:
    """Route jit.compile_source through ``folder``: recorded with ``record_with``'s NVRTC, or replayed from it. Each
    program is ``KEY.cubin`` and ``KEY.json`` (its file name and NVRTC log); ``nvrtc.json`` names the version."""
    from cupy_dash.cuda import jit
    folder = folder.resolve()
    version_path = folder / "nvrtc.json"
    if record_with is not None:
        version = "%d.%d" % record_with.version
        if version_path.exists() and json.loads(version_path.read_text())["nvrtc"] != version:
            raise SystemExit(f"{folder} holds another NVRTC's cubins ({version_path.read_text().strip()}): record "
                             f"NVRTC {version} into another folder")
        folder.mkdir(parents=True, exist_ok=True)
        jit._atomic_write(version_path, json.dumps(dict(nvrtc=version)).encode())
        os.environ["CUPY_DASH_CACHE_DIR"] = tempfile.mkdtemp(prefix="nvrtc_record_cache_")
    elif not version_path.exists():
        raise SystemExit(f"{folder}: no recorded cubins (no nvrtc.json; carried to this machine?)")
    else:
        version = json.loads(version_path.read_text())["nvrtc"]

    def compile_source(source, name, options):
        key = program_key(source, name, options)
        if record_with is None:
            if not (folder / f"{key}.json").exists():
                raise RuntimeError(f"{folder}: no recorded cubin for {Path(name).name} with options {list(options)}")
            return ((folder / f"{key}.cubin").read_bytes(), json.loads((folder / f"{key}.json").read_text())["log"],
                    True)
        cubin, log, ok = record_with.compile(source, name, options)
        if ok:
            jit._atomic_write(folder / f"{key}.cubin", cubin)   # whole or not at all: forked workers record
            jit._atomic_write(folder / f"{key}.json", json.dumps(dict(file=Path(name).name, log=log)).encode())
        return cubin, log, ok

    fingerprint = f"nvrtc-{version}-cubins-{hashlib.sha256(str(folder).encode()).hexdigest()[:12]}"
    jit.compile_source = compile_source
    jit._nvrtc_fingerprint = lambda: fingerprint
    # NOTES: a worker started by spawn or forkserver would import an unrouted jit and compile with this machine's
    # NVRTC, silently; forked ones inherit the routing.
    multiprocessing.set_start_method("fork", force=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--record", metavar="DIR", help="compile with --libnvrtc's NVRTC and keep the cubins in DIR")
    mode.add_argument("--replay", metavar="DIR", help="answer every compile from DIR's cubins")
    ap.add_argument("--libnvrtc", help="the NVRTC library to record with (libnvrtc.so.N of an NVRTC wheel)")
    ap.add_argument("-m", dest="module", help="run this module (python -m MODULE) instead of a script")
    ap.add_argument("target", nargs=argparse.REMAINDER, help="the script and its arguments (or the module's)")
    opts = ap.parse_args()
    if opts.record and not opts.libnvrtc:
        ap.error("--record needs --libnvrtc")
    if not opts.module and not opts.target:
        ap.error("name a script (SCRIPT.py ...) or a module (-m MODULE ...)")
    folder = Path(opts.record or opts.replay)
    install(folder, CtypesNvrtc(opts.libnvrtc) if opts.record else None)
    if opts.module:
        run_target(opts.module, opts.target)
    else:
        run_target(opts.target[0], opts.target[1:])


if __name__ == "__main__":
    main()
