"""NVRTC -> sm_90a cubin -> content-addressed disk cache -> CuPy module.

:func:`compile_spec` needs no GPU, :func:`load` needs one. Entries are written atomically, the JSON last, under an
exclusive ``flock``; a damaged entry is deleted and rebuilt; an unwritable cache keeps new kernels in memory
(:class:`CacheWarning`). Key, entries, locking and NVRTC's own cache: docs/architecture.md, "Kernel cache".
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import re
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path

try:
    import fcntl
except ImportError:                      # not POSIX: no inter-process lock (entries are still written atomically)
    fcntl = None

from .. import config, gpu
from .._version import __version__

ARCH = "sm_90a"
BASE_OPTIONS = (f"-arch={ARCH}", "-std=c++17", "-default-device", "--ptxas-options=-v")
_CACHE_FORMAT = 1


class CacheWarning(RuntimeWarning):
    """The disk cache cannot be written; compiled kernels are kept in memory for this process only."""


class CompileError(RuntimeError):
    """NVRTC failed; the message names the kernel variant and carries the full compiler log."""

    def __init__(self, label: str, log: str):
        super().__init__(f"NVRTC failed to compile {label}:\n{log}")
        self.label = label
        self.log = log

    def __reduce__(self):                # picklable across compile worker processes
        return type(self), (self.label, self.log)


@dataclasses.dataclass(frozen=True)
class CompiledKernel:
    cubin_path: Path | None  # the cache entry's cubin; None when the cubin lives in memory only (see cubin)
    registers: int           # per thread, of the entry function
    spill_stores: int        # bytes, entry plus any non-inlined callees
    spill_loads: int         # bytes, likewise
    stack_frame: int         # bytes: max of the entry's frame and its cumulative stack size (callees included)
    static_smem: int         # bytes of static __shared__ (the launch adds spec.smem_bytes dynamic)
    log: str                 # NVRTC + ptxas log
    cached: bool             # True when served from a cache (disk, or memory if the disk cache is unusable)
    seconds: float           # wall time of this call (compile, or cache lookup + verification)
    cubin_sha256: str = ""
    key: str = ""
    perf_warnings: tuple = ()  # ptxas C75xx "Potential Performance Loss" lines (wgmma serialized, setmaxnreg ignored)
    cubin: bytes | None = dataclasses.field(default=None, repr=False)   # set when not on disk (cubin_path None)

    def read_cubin(self) -> bytes:
        """The cubin's bytes: from memory if the disk cache was unusable, else read from ``cubin_path``."""
        return self.cubin if self.cubin is not None else self.cubin_path.read_bytes()


# ---------------------------------------------------------------------------------------------------------
# Locations.
def kernel_dir() -> Path:
    """The kernels_src directory: the installed copy inside the package if present, else the repository's."""
    return _default_kernel_dir()


@functools.lru_cache(maxsize=1)
def _default_kernel_dir() -> Path:
    package = Path(__file__).resolve().parents[1]          # cupy_dash, this module's package's parent
    installed = package / "kernels_src"
    if installed.is_dir():
        return installed
    return package.parent / "kernels_src"


def cache_dir() -> Path:
    """CUPY_DASH_CACHE_DIR, else $XDG_CACHE_HOME/cupy_dash, else ~/.cache/cupy_dash; a process without a home
    directory (a container's uid missing from /etc/passwd) uses cupy_dash-<uid> in the temporary directory."""
    env = config.CACHE_DIR.get()
    if env:
        return Path(env).expanduser()
    xdg = config.XDG_CACHE_HOME.get()
    if xdg:
        return Path(xdg).expanduser() / "cupy_dash"
    try:
        return Path.home() / ".cache" / "cupy_dash"
    except (RuntimeError, KeyError):
        return Path(tempfile.gettempdir()) / f"cupy_dash-{os.getuid()}"


# ---------------------------------------------------------------------------------------------------------
# NVRTC.
def _nvrtc():
    from cuda.bindings import nvrtc
    return nvrtc


def _check_nvrtc(result, what: str):
    """Unpack a cuda.bindings result tuple ``(err, *values)``; raise on an error code."""
    err, *values = result
    if err != _nvrtc().nvrtcResult.NVRTC_SUCCESS:
        raise RuntimeError(f"{what} failed: {err!r}")
    return values[0] if len(values) == 1 else tuple(values)


@functools.lru_cache(maxsize=None)
def nvrtc_version() -> tuple:
    return tuple(_check_nvrtc(_nvrtc().nvrtcVersion(), "nvrtcVersion"))


@functools.lru_cache(maxsize=None)
def _nvrtc_fingerprint() -> str:
    """NVRTC version (plus the wheel's full version when the pip wheel provides it)."""
    fp = "nvrtc-%d.%d" % nvrtc_version()
    try:
        from importlib import metadata
        fp += "+" + metadata.version("nvidia-cuda-nvrtc")
    except Exception:
        pass
    return fp


def compile_source(source: str, name: str, options) -> tuple:
    """Compile one translation unit with NVRTC. Returns ``(cubin bytes or None, log, ok)``; never raises for
    compile errors (only for NVRTC API failures)."""
    nvrtc = _nvrtc()
    options = list(options)
    if nvrtc_version() >= (12, 9) and "--no-cache" not in options:
        # NVRTC >= 12.9's own cache skips ptxas on a hit, and the ptxas report parsed here with it: we cache ourselves
        options.append("--no-cache")
    opts = [o.encode() for o in options]
    prog = _check_nvrtc(nvrtc.nvrtcCreateProgram(source.encode(), name.encode(), 0, [], []),
                        "nvrtcCreateProgram")
    try:
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        # Buffers are bytearrays: cuda.bindings writes into them in place (never into a bytes object, which
        # may be an interned singleton).
        buf = bytearray(_check_nvrtc(nvrtc.nvrtcGetProgramLogSize(prog), "nvrtcGetProgramLogSize"))
        _check_nvrtc(nvrtc.nvrtcGetProgramLog(prog, buf), "nvrtcGetProgramLog")
        log = bytes(buf).rstrip(b"\0").decode(errors="replace")
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            return None, log, False
        # cuda.bindings' nvrtcGetCUBIN fills the whole buffer (CuPy's wrapper drops the last byte: see
        # shared/reference/toolchain.md); the size is stored with the entry and checked on every load.
        size = _check_nvrtc(nvrtc.nvrtcGetCUBINSize(prog), "nvrtcGetCUBINSize")
        buf = bytearray(size)
        _check_nvrtc(nvrtc.nvrtcGetCUBIN(prog, buf), "nvrtcGetCUBIN")
        cubin = bytes(buf)
        if len(cubin) != size or cubin[:4] != b"\x7fELF":
            raise RuntimeError(f"NVRTC returned a malformed cubin for {name} ({len(cubin)} of {size} bytes)")
        return cubin, log, True
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


_RE_FUNC = re.compile(r"(?:Compiling entry function|Function properties for) '?([\w$.]+)'?")
_RE_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_RE_REGS = re.compile(r"Used (\d+) registers")
_RE_SMEM = re.compile(r"(\d+) bytes smem")
_RE_CUMSTACK = re.compile(r"(\d+) bytes cumulative stack size")
_RE_PERF = re.compile(r"\(C75\d\d\)[^\n]*")


def perf_warnings(log: str) -> tuple:
    """The ptxas performance warnings of a log (C7508 setmaxnreg ignored, C7510-C7515 wgmma serialized, ...)."""
    return tuple(dict.fromkeys(m.group(0).strip() for m in _RE_PERF.finditer(log)))


def parse_ptxas_log(log: str, entry: str) -> dict:
    """registers / spill_stores / spill_loads / stack_frame / static_smem of ``entry`` from a ptxas -v log.

    Spills of non-inlined callees (their own "Function properties" blocks) are added to the entry's, so a
    spilling helper is not hidden."""
    funcs: dict = {}
    current = None
    for line in log.splitlines():
        m = _RE_FUNC.search(line)
        if m:
            current = funcs.setdefault(m.group(1), {})
            continue
        if current is None:
            continue
        m = _RE_FRAME.search(line)
        if m:
            current["stack_frame"], current["spill_stores"], current["spill_loads"] = map(int, m.groups())
        m = _RE_REGS.search(line)
        if m:
            current["registers"] = int(m.group(1))
        m = _RE_SMEM.search(line)
        if m:
            current["static_smem"] = int(m.group(1))
        m = _RE_CUMSTACK.search(line)
        if m:
            current["cumulative_stack"] = int(m.group(1))
    if entry not in funcs:
        raise ValueError(f"no ptxas report for entry {entry!r} in the log (was ptxas skipped by a compile "
                         f"cache, or the entry name misspelt?):\n{log}")
    e = funcs[entry]
    others = [f for name, f in funcs.items() if name != entry]
    return {
        "registers": e.get("registers", 0),
        "spill_stores": e.get("spill_stores", 0) + sum(f.get("spill_stores", 0) for f in others),
        "spill_loads": e.get("spill_loads", 0) + sum(f.get("spill_loads", 0) for f in others),
        "stack_frame": max(e.get("stack_frame", 0), e.get("cumulative_stack", 0)),
        "static_smem": e.get("static_smem", 0),
    }


# ---------------------------------------------------------------------------------------------------------
# Cache.
def source_tree_digest(root: Path) -> str:
    """sha256 over every .cu / .cuh file below ``root`` (relative names and contents): part of the cache key, and
    what benchmarks record to name the kernels they measured."""
    h = hashlib.sha256()
    files = sorted(p for p in root.rglob("*") if p.suffix in (".cu", ".cuh") and p.is_file())
    for p in files:
        rel = p.relative_to(root).as_posix().encode()
        data = p.read_bytes()
        h.update(b"%d:%s:%d:" % (len(rel), rel, len(data)))
        h.update(data)
    return h.hexdigest()


def base_options() -> list:
    """BASE_OPTIONS, with -lineinfo where ``CUPY_DASH_JIT_LINEINFO`` asks for it (same SASS, source lines)."""
    return [*BASE_OPTIONS, *(("-lineinfo",) if config.JIT_LINEINFO.get() else ())]


def spec_options(spec, root: Path | None = None) -> list:
    root = kernel_dir() if root is None else root
    return [*base_options(), f"-I{root}", *(f"-D{name}={int(value)}" for name, value in spec.defines)]


def cache_key(spec, root: Path | None = None) -> str:
    """sha256 over the kernel sources, options, defines, NVRTC version and package version."""
    root = kernel_dir() if root is None else root
    material = {
        "format": _CACHE_FORMAT,
        "sources": source_tree_digest(root),
        "source": spec.source,
        "entry": spec.entry,
        "options": base_options(),            # -I<dir> left out: the content is hashed, the location is not
        "defines": [[n, int(v)] for n, v in spec.defines],
        "nvrtc": _nvrtc_fingerprint(),
        "package": __version__,
    }
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()


def _entry_stem(spec, key: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]+", "-", spec.label).strip("-") + "-" + key[:32]


def _atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o644)             # mkstemp makes 0600; cache entries are plain readable files
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _remove(*paths: Path) -> None:
    """Best effort: a file that is gone, or that a read-only cache keeps, is left alone (a damaged entry that
    stays is never served, and the next successful write replaces it)."""
    for p in paths:
        try:
            p.unlink()
        except OSError:
            pass


def _read_entry(cubin_path: Path, meta_path: Path, key: str, locked: bool):
    """The entry's metadata dict if both files are present and consistent, else None. ``locked``: the caller holds
    the entry's lock, so that a damaged entry (unparseable JSON, wrong key, missing cubin, size or sha256 mismatch,
    a cubin without its JSON: an interrupted write) is deleted; without the lock nothing is deleted (another process
    may be between its two writes), nor after a read error that is not the content's (EIO, EMFILE, ESTALE)."""
    if not meta_path.exists():
        if locked and cubin_path.exists():
            _remove(cubin_path)
        return None
    try:
        meta = json.loads(meta_path.read_text())
        cubin = cubin_path.read_bytes()
        ok = (isinstance(meta, dict) and meta.get("key") == key
              and meta.get("cubin_size") == len(cubin)
              and meta.get("cubin_sha256") == hashlib.sha256(cubin).hexdigest()
              and cubin[:4] == b"\x7fELF" and _META_FIELDS <= meta.keys())
    except (FileNotFoundError, ValueError):   # a file missing, or unparseable JSON: damaged
        ok = False
    except OSError:
        return None
    if not ok:
        if locked:
            _remove(cubin_path, meta_path)
        return None
    return meta


_META_FIELDS = frozenset(("registers", "spill_stores", "spill_loads", "stack_frame", "static_smem", "log"))


def _build(spec, root: Path, key: str, t0: float) -> tuple:
    """Run NVRTC on ``spec``: ``(cubin bytes, the entry's metadata dict)``. Raises :class:`CompileError`."""
    source_path = root / spec.source
    try:
        source = source_path.read_text()
    except OSError as exc:
        raise CompileError(spec.label, f"cannot read kernel source {source_path}: {exc}") from None
    # NOTES: the program is named by its absolute path: NVRTC looks for a quoted include in the directory of that
    # name first, and a relative name would make it the working directory's (a common.cuh there would be compiled
    # in, and cached under this key)
    cubin, log, ok = compile_source(source, str(source_path), spec_options(spec, root))
    if not ok:
        raise CompileError(spec.label, log)
    stats = parse_ptxas_log(log, spec.entry)
    meta = {
        "format": _CACHE_FORMAT, "key": key, "label": spec.label, "source": spec.source, "entry": spec.entry,
        "defines": [[n, int(v)] for n, v in spec.defines], "options": spec_options(spec, root),
        "nvrtc": _nvrtc_fingerprint(), "package": __version__, **stats, "log": log,
        "cubin_size": len(cubin), "cubin_sha256": hashlib.sha256(cubin).hexdigest(),
        "compile_seconds": round(time.perf_counter() - t0, 4),
    }
    return cubin, meta


class _CacheUnwritable(Exception):
    """Internal: the disk cache cannot take a new entry. ``error`` is the OSError; ``built`` the ``(cubin, meta)``
    compiled before a write failed, or None."""

    def __init__(self, error: OSError, built=None):
        super().__init__(str(error))
        self.error, self.built = error, built


LOCK_WAIT_S = 300.0      # the longest wait for another process's compile of the same entry
LOCK_TELL_S = 10.0       # then a line on stderr says what this process waits for


def _lock_entry(lock_path: Path, label: str) -> tuple:
    """``(descriptor, locked)``: ``lock_path`` opened (created if needed, mode 0666 less the umask, so that a shared
    cache's other users open it too; read-only where it is not writable) with an exclusive ``flock`` taken when it
    can be: polled, with a line on stderr after LOCK_TELL_S and unlocked after LOCK_WAIT_S (a holder stopped, or
    one whose lock a network file system keeps), unlocked at once where flock is refused (some network file
    systems). Closing the descriptor releases the lock. Raises OSError if the file cannot be opened. Entries are
    written atomically and nothing is deleted unlocked, so going on without the lock compiles a kernel twice at
    worst."""
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o666)
    except PermissionError:
        fd = os.open(lock_path, os.O_RDONLY)
    if fcntl is None:
        return fd, False
    start, told = time.monotonic(), False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd, True
        except BlockingIOError:
            waited = time.monotonic() - start
            if waited > LOCK_WAIT_S:
                print(f"cupy_dash: {label}: no lock on {lock_path} after {waited:.0f} s; compiling without it",
                      file=sys.stderr)
                return fd, False
            if not told and waited > LOCK_TELL_S:
                print(f"cupy_dash: {label}: waiting for {lock_path} (another process is compiling this kernel)",
                      file=sys.stderr)
                told = True
            time.sleep(0.05)
        except OSError:
            return fd, False


def _disk_entry(spec, root: Path, key: str, cubin_path: Path, meta_path: Path, force: bool, t0: float) -> tuple:
    """``(meta, cached)`` of the entry on disk, compiled and written under the entry's lock when it is missing
    (or ``force``). Raises :class:`_CacheUnwritable` when the entry is needed but cannot be written."""
    try:
        cubin_path.parent.mkdir(parents=True, exist_ok=True)
        fd, locked = _lock_entry(cubin_path.with_suffix(".lock"), spec.label)
    except OSError as exc:
        # A read-only cache still serves what it holds (entries are written atomically: no lock needed to read).
        meta = None if force else _read_entry(cubin_path, meta_path, key, False)
        if meta is not None:
            return meta, True
        raise _CacheUnwritable(exc) from None
    try:
        # Looked up only once the lock is held: a process that waited for it finds the entry just written.
        meta = None if force else _read_entry(cubin_path, meta_path, key, locked)
        if meta is not None:
            return meta, True
        cubin, meta = _build(spec, root, key, t0)
        try:
            _atomic_write(cubin_path, cubin)
            _atomic_write(meta_path, json.dumps(meta, indent=1).encode())   # written last: commits the entry
        except OSError as exc:
            raise _CacheUnwritable(exc, (cubin, meta)) from None
        return meta, False
    finally:
        os.close(fd)


# Kernels compiled while the disk cache was unusable: cache key -> (cubin, meta), for the life of the process.
_memory_cache: dict = {}
_cache_warned = False
_cache_warned_lock = threading.Lock()


def _warn_cache_unwritable(cdir: Path, error: OSError) -> None:
    """One :class:`CacheWarning` per process about the unusable cache directory."""
    global _cache_warned
    with _cache_warned_lock:
        if _cache_warned:
            return
        _cache_warned = True
    warnings.warn(f"cupy_dash: cannot write the kernel cache {cdir} ({error}); kernels compiled from now on are "
                  f"kept in memory for this process only. Point CUPY_DASH_CACHE_DIR at a writable directory to "
                  f"keep them across runs.", CacheWarning, stacklevel=3)


def _memory_entry(spec, root: Path, key: str, force: bool, t0: float, built) -> tuple:
    """``(cubin, meta, cached)`` from the in-memory cache, compiling into it (or storing ``built``) if needed."""
    if built is None:
        hit = None if force else _memory_cache.get(key)
        if hit is not None:
            return (*hit, True)
        built = _build(spec, root, key, t0)
    _memory_cache[key] = built
    return (*built, False)


def compile_spec(spec, *, verbose=None, force: bool = False) -> CompiledKernel:
    """Compile ``spec`` to an sm_90a cubin (or take it from the disk cache). Works without a GPU.

    ``force=True`` ignores and overwrites any cached entry. Raises :class:`CompileError` on a compile error.
    When the cache directory cannot be written, the kernel is compiled into (or taken from) an in-memory cache
    and the result's ``cubin_path`` is None (use :meth:`CompiledKernel.read_cubin`)."""
    t0 = time.perf_counter()
    root = kernel_dir()
    key = cache_key(spec, root)
    cdir = cache_dir()
    stem = _entry_stem(spec, key)
    cubin_path, meta_path = cdir / f"{stem}.cubin", cdir / f"{stem}.json"
    cubin = None
    try:
        meta, cached = _disk_entry(spec, root, key, cubin_path, meta_path, force, t0)
    except _CacheUnwritable as exc:
        _warn_cache_unwritable(cdir, exc.error)
        cubin_path = None
        cubin, meta, cached = _memory_entry(spec, root, key, force, t0, exc.built)

    result = CompiledKernel(
        cubin_path=cubin_path, registers=meta["registers"], spill_stores=meta["spill_stores"],
        spill_loads=meta["spill_loads"], stack_frame=meta["stack_frame"], static_smem=meta["static_smem"],
        log=meta["log"], cached=cached, seconds=time.perf_counter() - t0, cubin_sha256=meta["cubin_sha256"],
        key=key, perf_warnings=perf_warnings(meta["log"]), cubin=cubin)
    if config.JIT_VERBOSE.get() if verbose is None else verbose:
        print(f"[cupy_dash.cuda.jit] {spec.label}{' (cached)' if cached else ''}: {result.registers} registers, "
              f"{result.spill_stores}/{result.spill_loads} bytes spill stores/loads, {result.stack_frame} bytes "
              f"stack, {result.static_smem} static + {spec.smem_bytes} dynamic smem, {result.seconds:.2f} s\n"
              f"{result.log.rstrip()}", file=sys.stderr)
    return result


# ---------------------------------------------------------------------------------------------------------
# Loading (GPU).
_loaded: dict = {}
_load_lock = threading.Lock()
_SMEM_DEFAULT_LIMIT = 48 * 1024


def load(spec):
    """A launchable ``cupy.cuda.function.Function`` for ``spec`` on the current device, memoized per
    (spec, device, kernel directory): source edits made after the first load in a process are not picked up.
    Call it as ``f(grid, block, args, shared_mem=..., stream=...)``."""
    import cupy
    from cupy.cuda import driver, function
    dev = cupy.cuda.runtime.getDevice()
    memo_key = (spec, dev, kernel_dir())
    fn = _loaded.get(memo_key)
    if fn is not None:
        return fn
    gpu.require(f"cupy_dash (loading the kernel {spec.label})", dev)   # once per device: not another GPU model
    with _load_lock:
        fn = _loaded.get(memo_key)
        if fn is not None:
            return fn
        compiled = compile_spec(spec)
        try:
            cubin = compiled.read_cubin()
        except OSError:                   # gone since it was verified (another process's cleanup)
            cubin = b""
        if hashlib.sha256(cubin).hexdigest() != compiled.cubin_sha256:   # changed since it was verified
            compiled = compile_spec(spec, force=True)
            cubin = compiled.read_cubin()
        gpu.bind_context()                # a thread's first CUDA call may be this load (driver API)
        module = function.Module()
        module.load(cubin)
        fn = module.get_function(spec.entry)    # keeps a reference to its module
        if spec.smem_bytes > _SMEM_DEFAULT_LIMIT:
            driver.funcSetAttribute(fn.ptr, driver.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                    spec.smem_bytes)
        _loaded[memo_key] = fn
        return fn
