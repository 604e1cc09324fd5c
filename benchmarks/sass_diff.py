"""Which kernel variants two kernels_src trees compile to different SASS: the evidence behind "only the capped
kernels' SASS changes" in a decision record. Compiles both trees with NVRTC (no GPU) into two fresh disk caches, or
reads two caches already filled (each variant once: a cache that holds two builds of a label is refused),
disassembles each cubin (``cuobjdump -sass``) and compares the instruction text, variant by variant (matched by
label): opcodes and operands, branch targets included; not the scheduling bits of the encodings (stalls, yields,
barriers), so two builds that differ only there read as the same.

    python benchmarks/sass_diff.py --old /tmp/old/kernels_src --new kernels_src [--kernel bwd_main] [-j 2]
    python benchmarks/sass_diff.py --old-cache /tmp/c_old --new-cache /tmp/c_new

``cuobjdump`` from ``$CUOBJDUMP``, the PATH, or triton's bundled copy (``pip install nvidia-cuda-cuobjdump`` also
provides it).
"""
from __future__ import annotations

import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

_CUBIN = re.compile(r"^(.*)-[0-9a-f]{32}\.cubin$")
_ADDRESS = re.compile(r"/\*[0-9a-f]+\*/")


def cubins(cache: str) -> dict:
    """{variant label: cubin path} of a cache directory (``jit``'s file names: label-<32 hex>.cubin); ValueError
    when a label has two cubins (a long-lived cache with builds of two trees)."""
    found = {}
    for path in sorted(glob.glob(os.path.join(cache, "**", "*.cubin"), recursive=True)):
        m = _CUBIN.match(os.path.basename(path))
        if m:
            if m.group(1) in found:
                raise ValueError(f"{cache}: two builds of {m.group(1)}; give a cache of one tree")
            found[m.group(1)] = path
    return found


def instructions(sass_text: str) -> list:
    """The instructions of ``cuobjdump -sass`` output: each line's text between its address comment (any number of
    hex digits: kernels past 64 KB have five) and the ``;`` before the encoding."""
    return [_ADDRESS.split(line, 1)[1].split(";")[0].strip() for line in sass_text.splitlines()
            if _ADDRESS.search(line)]


def cuobjdump() -> str:
    candidates = [os.environ.get("CUOBJDUMP"), shutil.which("cuobjdump")]
    try:
        import triton
        candidates.append(os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump"))
    except ImportError:
        pass
    for c in candidates:
        if c and os.path.isfile(c):
            return c
    sys.exit("cuobjdump not found: set CUOBJDUMP or pip install nvidia-cuda-cuobjdump")


def compare(old: dict, new: dict, disassemble) -> tuple:
    """(changed labels, labels only in old, labels only in new); ``disassemble(path)`` -> cuobjdump's text."""
    changed = [k for k in sorted(old.keys() & new.keys())
               if instructions(disassemble(old[k])) != instructions(disassemble(new[k]))]
    return changed, sorted(old.keys() - new.keys()), sorted(new.keys() - old.keys())


def _compile(src: str, cache: str, filters: list, jobs: int) -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    cmd = [sys.executable, os.path.join(here, "with_kernels.py"), os.path.abspath(src), "cupy_dash", "compile",
           "-j", str(jobs), *(filters or ["--all"])]
    subprocess.run(cmd, check=True, env={**os.environ, "CUPY_DASH_CACHE_DIR": cache}, stdout=subprocess.DEVNULL)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old"), ap.add_argument("--new"), ap.add_argument("--old-cache"), ap.add_argument("--new-cache")
    ap.add_argument("--kernel", action="append", default=[], help="compile only this kernel (repeatable)")
    ap.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args(argv)
    filters = [x for k in args.kernel for x in ("--kernel", k)]
    caches = []
    for tree, cache in ((args.old, args.old_cache), (args.new, args.new_cache)):
        if cache is None:
            if tree is None:
                ap.error("give --old / --new (kernels_src trees) or --old-cache / --new-cache")
            cache = tempfile.mkdtemp(prefix="sass_diff_")
            print(f"compiling {tree} into {cache}", flush=True)
            _compile(tree, cache, filters, args.jobs)
        caches.append(cache)
    if filters and args.old_cache and args.new_cache:
        ap.error("--kernel selects what to compile: not with two caches")
    tool = cuobjdump()
    changed, gone, added = compare(cubins(caches[0]), cubins(caches[1]),
                                   lambda p: subprocess.run([tool, "-sass", p], capture_output=True, text=True,
                                                            check=True).stdout)
    same = len(cubins(caches[0]).keys() & cubins(caches[1]).keys()) - len(changed)
    print(f"{same} variants with the same SASS, {len(changed)} changed" + "".join(f"\n  changed {k}" for k in changed)
          + "".join(f"\n  only old {k}" for k in gone) + "".join(f"\n  only new {k}" for k in added))
    return 0


if __name__ == "__main__":
    sys.exit(main())
