"""Deferred error records of the backward's bounded waits: an eager call's slot (a device record and its mirror in
mapped pinned host memory), polled without blocking by every public call (:func:`poll_errors`); the sticky device
records of calls captured into CUDA graphs or traced by ``jax.jit`` (:func:`graph_record`, :func:`jit_record`),
read only by :func:`check_errors`. A failed slot is retired, never reused. Layout and life cycle:
docs/architecture.md, "Error record".
"""
from __future__ import annotations

import collections
import ctypes
import threading
import warnings

import cupy
import numpy as np

from .. import config
from .params import CONSTANTS as K

_lock = threading.RLock()


# int32 words of a device record and of its host mirror (docs/architecture.md, "Error record")
RECORD_WORDS = K.kErrorRecordWords
RECORD_BYTES = 4 * RECORD_WORDS
FAILURE_WORDS = K.kErrorFailureWords


class _Slot:
    """One error record: device int32[RECORD_WORDS] at ``dptr``, and its mirror ``host`` int32[RECORD_WORDS] in
    mapped pinned memory (device address ``hdev``): ``host[0]`` = 1 once the call finished, ``host[1:5]`` = the
    device record's failure (FAILURE_WORDS words)."""
    __slots__ = ("dptr", "hdev", "host", "pool", "device_id")

    def done(self) -> bool:
        return bool(self.host[0])


class _SlotPool:
    """Error slots of one device, allocated in blocks and never freed; a slot is reused once its call has finished.
    Also holds the device's records for backward calls captured in CUDA graphs (:class:`_GraphRecords`)."""

    def __init__(self, device_id: int):
        self.device_id = device_id
        self.free: list[_Slot] = []
        self._blocks = []
        self.graph = _GraphRecords(device_id)

    def acquire(self) -> _Slot:
        if not self.free:
            self._grow(64)
        slot = self.free.pop()
        slot.host[0] = 0    # NOTES: a free slot's last call has finished: nothing on the GPU writes it now
        return slot

    def _grow(self, n: int):
        rt = cupy.cuda.runtime
        with cupy.cuda.Device(self.device_id):
            dbuf = cupy.zeros(RECORD_WORDS * n, dtype=np.int32)
            # NOTES: zeroed on CuPy's current stream, which need not be the launch's (the fast path's): wait, once
            # per block of slots, so that no kernel on another stream reads the records before they are zero
            cupy.cuda.get_current_stream().synchronize()
            hptr = rt.hostAlloc(RECORD_BYTES * n, rt.hostAllocMapped | rt.hostAllocPortable)   # never freed (pool)
            hdev = rt.pointerGetAttributes(hptr).devicePointer
            host = np.ctypeslib.as_array((ctypes.c_int32 * (RECORD_WORDS * n)).from_address(hptr)).reshape(
                n, RECORD_WORDS)
            host[:] = 0
            self._blocks.append((dbuf, hptr))
            for i in range(n):
                s = _Slot()
                s.dptr = dbuf.data.ptr + RECORD_BYTES * i
                s.hdev = hdev + RECORD_BYTES * i
                s.host = host[i]
                s.pool, s.device_id = self, self.device_id
                self.free.append(s)


GRAPH_RECORDS = 1024     # error records per device for backward calls captured in CUDA graphs


class _GraphRecords:
    """Error records of captured (or jax-traced) backward calls on one device: a zeroed device int32
    (GRAPH_RECORDS, RECORD_WORDS) block (allocated outside capture, with the device's first eager, captured or
    traced backward), handed out one per call and never reused; once all are taken, the last one is shared
    (:meth:`shared`: such calls are not folded, whose grid barriers need a record of their own). ``infos[i]`` names
    the calls of record ``i``, ``wheres[i]`` how the first of them runs."""

    def __init__(self, device_id: int):
        self.device_id = device_id
        with cupy.cuda.Device(device_id):
            self.block = cupy.zeros((GRAPH_RECORDS, RECORD_WORDS), dtype=np.int32)
            # NOTES: once per device and process: graphs captured later (on any stream) must see the zeros. Not
            # deviceSynchronize: made during a capture (capture.outside), the current stream is the block's own.
            cupy.cuda.get_current_stream().synchronize()
        self.infos: list[list] = []
        self.wheres: list[str] = []

    def take(self, info, where="a CUDA graph replay of a captured call") -> int:
        """Device address of a fresh record for one call described by ``info``, run as ``where`` says."""
        if len(self.infos) < GRAPH_RECORDS:
            self.infos.append([info])
            self.wheres.append(where)
        else:
            self.infos[-1].append(info)
        return self.block.data.ptr + RECORD_BYTES * (len(self.infos) - 1)

    def shared(self, ptr) -> bool:
        """Whether the record at ``ptr`` (from :meth:`take`) serves more than one call."""
        return len(self.infos[(ptr - self.block.data.ptr) // RECORD_BYTES]) > 1

    def collect(self) -> list:
        """Synchronize the device, read the records in use, clear the failed ones; return their messages."""
        n = len(self.infos)
        if not n:
            return []
        with cupy.cuda.Device(self.device_id):
            cupy.cuda.runtime.deviceSynchronize()
            host = cupy.asnumpy(self.block[:n, :FAILURE_WORDS])
            failed = np.flatnonzero(host[:, 0])
            if not len(failed):
                return []
            # NOTES: the failed records only: another thread's replay of a folded graph may be counting in its own
            self.block[cupy.asarray(failed)] = 0
            cupy.cuda.runtime.deviceSynchronize()
        msgs = []
        for i in failed:
            flag, visit, want, seen = (int(x) for x in host[i])
            calls = self.infos[i]
            msg = _format_failure(calls[0], flag, visit, want, seen)
            extra = f" (or one of {len(calls) - 1} other calls sharing its record)" if len(calls) > 1 else ""
            msgs.append(f"{msg} [in {self.wheres[i]}{extra}]")
        return msgs


_slot_pools: dict[int, _SlotPool] = {}


def _pool(device_id: int) -> _SlotPool:       # under _lock
    pool = _slot_pools.get(device_id)
    if pool is None:
        pool = _slot_pools[device_id] = _SlotPool(device_id)
    return pool


class _Pending:
    """Work whose completion the host still has to observe: an eager backward's error slot to read (finished when
    the slot says so), or objects to keep alive until ``event``."""
    __slots__ = ("event", "slot", "info", "keep")

    def done(self) -> bool:
        return self.slot.done() if self.slot is not None else self.event.done

    def wait(self) -> None:
        if self.slot is None:
            self.event.synchronize()
        elif not self.slot.done():
            # NOTES: the slot's postprocess runs on a stream the host does not know here: wait for the device
            with cupy.cuda.Device(self.slot.device_id):
                cupy.cuda.runtime.deviceSynchronize()


_pending: collections.deque = collections.deque()


def acquire_slot(device_id: int) -> _Slot:
    with _lock:
        return _pool(device_id).acquire()


def graph_record(device_id: int, info, where="a CUDA graph replay of a captured call") -> int:
    """Device address of a fresh error record for a backward call being captured into a CUDA graph (the caller
    holds :func:`cupy_dash.cuda.capture.outside`: the device's first record block is allocated and zeroed then) or
    traced by ``jax.jit`` (:func:`jit_record`), run as ``where`` says."""
    with _lock:
        return _pool(device_id).graph.take(info, where)


def record_shared(device_id: int, ptr) -> bool:
    """Whether the captured or traced call's record ``ptr`` (:func:`graph_record`, :func:`jit_record`) is shared
    with other calls (all GRAPH_RECORDS taken): such a call must not be folded."""
    with _lock:
        return _slot_pools[device_id].graph.shared(ptr)


def jit_record(device_id: int, info) -> int:
    """Device address of a fresh error record for a backward call traced by ``jax.jit`` (called at trace time,
    outside any capture: creates the device's records on first use, which synchronizes the stream once)."""
    return graph_record(device_id, info, "an execution of a jax.jit-compiled call")


def release_slot(slot: _Slot):
    with _lock:
        slot.pool.free.append(slot)


def _stall_bound() -> str:
    """In words, the bound of the kernel's waits that only a semaphore wait can hold up (the load pipelines' and
    the fold's grid barriers: kernels_src/constants.cuh)."""
    return (f"{K.kStallTimeoutFactor} x CUPY_DASH_SPIN_TIMEOUT_MS (now {config.SPIN_TIMEOUT_MS.get():g} ms) + "
            f"{K.kStallSlackNs / 1e9:g} s")


def _format_failure(info, flag, visit, want, seen) -> str:
    policy, B, H, Sq, Sk, D, causal, *window = info
    bounds = tuple(window[0]) if window else (-1, 0 if causal else -1)
    window = f", window={bounds}" if bounds != (-1, 0 if causal else -1) else ""
    where = f"in schedule '{policy}' (B={B}, H={H}, Sq={Sq}, Sk={Sk}, D={D}, causal={causal}{window})"
    if flag == K.kErrorSemaphoreTimeout:
        return (f"cupy_dash backward: dQ semaphore wait timed out {where}: visit {visit} waited for rank {want}, "
                f"saw {seen}; the schedule table is inconsistent (a dQ tile's ranks cannot be reached in the "
                f"CTAs' execution order) or the persistent grid exceeded the co-resident CTAs. The kernel "
                f"abandoned the wait instead of hanging; dq/dk/dv of that call are invalid. If it was merely "
                f"slow, raise CUPY_DASH_SPIN_TIMEOUT_MS (now {config.SPIN_TIMEOUT_MS.get():g} ms).")
    if flag == K.kErrorPipelineStall:
        return (f"cupy_dash backward: a load-pipeline wait inside CTA {visit} never ended {where} (barrier at "
                f"shared offset {want}, parity {seen}; abandoned after {_stall_bound()}); this is a kernel bug, "
                f"please report it with the shape. The kernel abandoned the wait instead of hanging; dq/dk/dv of "
                f"that call are invalid.")
    if flag == K.kErrorGridBarrier:
        return (f"cupy_dash backward: a grid barrier of the folded (one-launch) backward did not fill in time "
                f"{where}: CTA {visit} saw {seen} CTAs at counter word {want}; the persistent grid exceeded the "
                f"co-resident CTAs (another kernel holding SMs?) or an earlier failure stopped it. The kernel "
                f"abandoned the wait instead of hanging; dq/dk/dv of that call are invalid. CUPY_DASH_FOLD=0 turns "
                f"the fold off; the wait is bounded by {_stall_bound()}.")
    return (f"cupy_dash backward: the main kernel reported error code {flag} {where} (visit {visit}, "
            f"values {want}, {seen}); dq/dk/dv of that call are invalid.")


def _consume(rec: _Pending):
    """Retire a finished record; return its failure message or None."""
    msg = None
    slot = rec.slot
    if slot is not None:
        done, flag, visit, want, seen = slot.host[:1 + FAILURE_WORDS].tolist()
        if not done:
            msg = (f"cupy_dash backward: the call {rec.info} finished without its kernels writing its error "
                   f"record (an earlier CUDA error?); its dq/dk/dv may be invalid.")
        elif flag:
            msg = _format_failure(rec.info, flag, visit, want, seen)
        if msg is None:
            release_slot(slot)     # NOTES: a failed slot is retired: its record may not be zero
    rec.slot = rec.keep = None
    return msg


def _raise_failures(failures):
    if failures:
        if len(failures) == 1:
            raise RuntimeError(failures[0])
        raise RuntimeError(f"{len(failures)} cupy_dash backward calls failed:\n" + "\n".join(failures))


def poll_errors():
    """Retire finished records without blocking (in submission order, stopping at the first unfinished one);
    raise RuntimeError for any that failed."""
    if not _pending:
        return
    failures = []
    with _lock:
        while _pending and _pending[0].done():
            msg = _consume(_pending.popleft())
            if msg:
                failures.append(msg)
    _raise_failures(failures)


def check_errors() -> None:
    """Wait for every pending cupy_dash backward and raise ``RuntimeError`` if any of them failed.

    The main backward kernel never hangs on a dQ semaphore: past ``CUPY_DASH_SPIN_TIMEOUT_MS`` (default
    10000 ms) it records ``error = [1, visit, rank awaited, value seen]`` and exits. Those records are read
    asynchronously; this function synchronizes on all of them (public calls only poll finished ones). The
    message names the schedule policy and the problem size (B, H, Sq, Sk, D, causal, window).

    Once a backward has been captured into a CUDA graph on a device, or traced by ``jax.jit``
    (:mod:`cupy_dash.jax`), this also synchronizes that device and reads (and clears) the records of those calls,
    so failures in graph replays and in compiled JAX programs are reported here (and only here). Do not call it
    while a stream is capturing.
    """
    # NOTES: the waits run outside the lock, so that other threads (one per GPU) launch meanwhile; what they
    # enqueue later is theirs to check
    with _lock:
        recs, pools = list(_pending), list(_slot_pools.values())
        _pending.clear()
    failures, done = [], 0
    try:
        for rec in recs:
            rec.wait()
            msg = _consume(rec)
            done += 1
            if msg:
                failures.append(msg)
    except BaseException:    # (an interrupted wait, a CUDA error): the records not read go back to the queue
        with _lock:
            _pending.extendleft(reversed(recs[done:]))
        for msg in failures:     # read already: not lost behind the exception
            warnings.warn(msg, RuntimeWarning, stacklevel=2)
        raise
    for pool in pools:
        failures += pool.graph.collect()
    _raise_failures(failures)


def _track(slot: _Slot, info) -> None:
    """Remember a launched backward whose error record ``slot`` the host must still read; ``info`` = (policy, B,
    H, Sq, Sk, D, causal, window) names it in a failure message."""
    rec = _Pending()
    rec.event, rec.slot, rec.keep, rec.info = None, slot, None, info
    with _lock:
        _pending.append(rec)


def stream_device(stream) -> int:
    """The device of a CuPy stream (``device_id``, which CuPy streams and ExternalStream carry), else the current
    device."""
    dev = getattr(stream, "device_id", -1)
    return cupy.cuda.runtime.getDevice() if dev is None or dev < 0 else int(dev)


def keep_alive(keep, stream, event=None):
    """Hold ``keep`` (imported DLPack views) until the work enqueued on ``stream`` so far has finished, or (an
    ``event`` the caller has just recorded on ``stream``) until ``event`` has completed.

    NOTES: the event is made on the stream's device (an event recorded on another device's stream fails), which
    need not be the current one: a varlen call on one GPU may release tables another GPU's streams read."""
    rec = _Pending()
    if event is None:
        with cupy.cuda.Device(stream_device(stream)):
            event = cupy.cuda.Event(block=False, disable_timing=True)
            event.record(stream)
    rec.event = event
    rec.slot, rec.info, rec.keep = None, None, keep
    with _lock:
        _pending.append(rec)
        # NOTES: a program that makes no eager backward never polls (JAX): finished keep-alives at the head go now
        while _pending[0].slot is None and _pending[0] is not rec and _pending[0].done():
            _pending.popleft().keep = None
