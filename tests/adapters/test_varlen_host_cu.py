"""CPU tests of cupy_dash.core.varlen_host_cu (the forward's asynchronous host copy of device cu_seqlens, taken by the
backward instead of a synchronizing copy), with the CUDA calls replaced: an entry serves only the memory the
forward saw (held by the entry, or its tensor alive), at the same address, shape and version; anything else falls
back (None)."""
from __future__ import annotations

import types

import numpy as np
import pytest

from cupy_dash.core import varlen_host_cu


class FakeStorage:
    def __init__(self, nbytes):
        self._nbytes = nbytes

    def nbytes(self):
        return self._nbytes


class FakeTensor:
    """What the module reads of a torch tensor: weak-referenceable, with an address, a shape, strides, a dtype, a
    storage and a version counter (``alias_of``: another Python object over the same memory, sharing its storage
    and version, as autograd's saved tensors and compiled graphs' inputs)."""
    dtype = "torch.int32"

    def __init__(self, values, ptr=0, alias_of=None, storage_bytes=None, step=1):
        self.values = np.asarray(values, np.int32)
        self.shape, self._step = self.values.shape, step
        self._ptr = ptr
        self._of = alias_of
        self._own_version = 0
        self._storage = alias_of._storage if alias_of is not None else FakeStorage(
            self.values.nbytes if storage_bytes is None else storage_bytes)

    def untyped_storage(self):
        return self._storage

    def stride(self):
        return (self._step,)

    def is_inference(self):
        return False

    @property
    def _version(self):
        return self._of._version if self._of is not None else self._own_version

    @_version.setter
    def _version(self, value):
        if self._of is not None:
            self._of._version = value
        else:
            self._own_version = value

    def data_ptr(self):
        return self._ptr


@pytest.fixture
def fake_cuda(monkeypatch):
    device = {}
    events = []

    def memcpy(dst, src, nbytes, kind, stream):
        np.ctypeslib.as_array((np.ctypeslib.ctypes.c_int32 * (nbytes // 4)).from_address(dst))[:] = device[src]

    class Event:
        def __init__(self, **kw):
            self.synced = 0
            events.append(self)

        def record(self, stream):
            pass

        def synchronize(self):
            self.synced += 1
    monkeypatch.setattr(varlen_host_cu.cupyx, "empty_pinned", lambda n, dtype: np.zeros(n, dtype))
    monkeypatch.setattr(varlen_host_cu.cupy.cuda.runtime, "memcpyAsync", memcpy)
    monkeypatch.setattr(varlen_host_cu.cupy.cuda, "Event", Event)
    varlen_host_cu.clear()
    yield device, events
    varlen_host_cu.clear()


def _info(n, framework="torch", device_id=0):
    return types.SimpleNamespace(framework=framework, shape=(n,), device_id=device_id)


def test_the_backward_gets_the_forwards_copy(fake_cuda):
    device, events = fake_cuda
    cu = FakeTensor([0, 3, 10, 12])
    device[0x1000] = cu.values
    varlen_host_cu.remember(cu, _info(4), 0x1000, types.SimpleNamespace(ptr=7))
    device[0x1000] = np.array([0, 1, 2, 12], np.int32)     # later device contents are not what the forward saw
    host = varlen_host_cu.lookup(cu, _info(4), 0x1000)
    assert host.dtype == np.int64 and host.tolist() == [0, 3, 10, 12] and events[0].synced == 1


def test_other_tensors_versions_and_frameworks_fall_back(fake_cuda):
    device, _ = fake_cuda
    cu = FakeTensor([0, 5, 9], ptr=0x2000)
    device[0x2000] = cu.values
    varlen_host_cu.remember(cu, _info(3), 0x2000, types.SimpleNamespace(ptr=0))
    elsewhere = FakeTensor([0, 5, 9], ptr=0x2400)            # equal values, another tensor
    assert varlen_host_cu.lookup(elsewhere, _info(3), 0x2400) is None
    shorter = FakeTensor([0, 5], ptr=0x2000, alias_of=cu)    # a view of another shape
    assert varlen_host_cu.lookup(shorter, _info(2), 0x2000) is None
    strided = FakeTensor([0, 9, 0], ptr=0x2000, alias_of=cu, step=2)    # same address and shape, other strides
    assert varlen_host_cu.lookup(strided, _info(3), 0x2000) is None
    other_dtype = FakeTensor([0, 5, 9], ptr=0x2000, alias_of=cu)
    other_dtype.dtype = "torch.float32"                                  # the same bytes read as floats
    assert varlen_host_cu.lookup(other_dtype, _info(3), 0x2000) is None
    assert varlen_host_cu.lookup(cu, _info(3), 0x3000) is None                 # another address
    assert varlen_host_cu.lookup(cu, _info(3, device_id=1), 0x2000) is None    # another device
    cu._version += 1                                                           # modified in place
    assert varlen_host_cu.lookup(cu, _info(3), 0x2000) is None
    cupy_like = FakeTensor([0, 5, 9])
    varlen_host_cu.remember(cupy_like, _info(3, "cupy"), 0x4000, types.SimpleNamespace(ptr=0))
    assert varlen_host_cu.lookup(cupy_like, _info(3, "cupy"), 0x4000) is None


def test_an_alias_is_served_until_a_change(fake_cuda):
    """The backward's cu_seqlens is often another Python object over the forward's memory (a saved tensor)."""
    device, events = fake_cuda
    cu = FakeTensor([0, 6, 9], ptr=0x2800)
    device[0x2800] = cu.values
    varlen_host_cu.remember(cu, _info(3), 0x2800, types.SimpleNamespace(ptr=0))
    saved = FakeTensor([0, 6, 9], ptr=0x2800, alias_of=cu)
    assert varlen_host_cu.lookup(saved, _info(3), 0x2800).tolist() == [0, 6, 9]
    varlen_host_cu.remember(saved, _info(3), 0x2800, types.SimpleNamespace(ptr=0))
    assert len(events) == 1                                  # the alias's forward does not copy again
    saved._version += 1                                      # changed in place through the alias
    assert varlen_host_cu.lookup(saved, _info(3), 0x2800) is None
    assert varlen_host_cu.lookup(cu, _info(3), 0x2800) is None


def test_the_entry_holds_small_memory_and_serves_it_after_the_tensor_dies(fake_cuda):
    """Under torch.compile the forward's tensor object dies when the forward returns and the backward gets another
    object over the same memory: the entry holds the (small) storage, so that memory cannot be handed to another
    tensor, and an alias of it is served."""
    import weakref
    device, _ = fake_cuda
    cu = FakeTensor([0, 2, 5], ptr=0x5000)
    device[0x5000] = cu.values
    varlen_host_cu.remember(cu, _info(3), 0x5000, types.SimpleNamespace(ptr=0))
    storage = weakref.ref(cu._storage)
    later = FakeTensor([0, 2, 5], ptr=0x5000, alias_of=cu)
    del cu
    assert storage() is not None
    assert varlen_host_cu.lookup(later, _info(3), 0x5000).tolist() == [0, 2, 5]
    later._version += 1
    assert varlen_host_cu.lookup(later, _info(3), 0x5000) is None


def test_a_large_storage_is_not_held_and_its_freed_tensor_is_not_served(fake_cuda):
    device, _ = fake_cuda
    cu = FakeTensor([0, 2], ptr=0x5800, storage_bytes=varlen_host_cu._MAX_HELD_BYTES + 4)
    device[0x5800] = cu.values
    varlen_host_cu.remember(cu, _info(2), 0x5800, types.SimpleNamespace(ptr=0))
    assert varlen_host_cu.lookup(cu, _info(2), 0x5800).tolist() == [0, 2]
    del cu
    new = FakeTensor([0, 2], ptr=0x5800)
    assert varlen_host_cu.lookup(new, _info(2), 0x5800) is None


def test_entries_are_bounded(fake_cuda):
    device, _ = fake_cuda
    tensors = []
    for i in range(varlen_host_cu._MAX_ENTRIES + 5):
        t = FakeTensor([0, i + 1])
        device[0x10000 + 64 * i] = t.values
        varlen_host_cu.remember(t, _info(2), 0x10000 + 64 * i, types.SimpleNamespace(ptr=0))
        tensors.append(t)
    assert len(varlen_host_cu._entries) == varlen_host_cu._MAX_ENTRIES
    assert varlen_host_cu.lookup(tensors[0], _info(2), 0x10000) is None
    assert varlen_host_cu.lookup(tensors[-1], _info(2), 0x10000 + 64 * (len(tensors) - 1)).tolist() == [
        0, len(tensors)]


def test_an_unchanged_tensor_is_copied_once(fake_cuda):
    device, events = fake_cuda
    cu = FakeTensor([0, 4, 8])
    device[0x6000] = cu.values
    for _ in range(3):                                       # the forward of every layer of one step
        varlen_host_cu.remember(cu, _info(3), 0x6000, types.SimpleNamespace(ptr=0))
    assert len(events) == 1
    cu._version += 1                                         # changed in place: copied again
    varlen_host_cu.remember(cu, _info(3), 0x6000, types.SimpleNamespace(ptr=0))
    assert len(events) == 2 and varlen_host_cu.lookup(cu, _info(3), 0x6000).tolist() == [0, 4, 8]


def test_capture_reads_a_waited_copy_and_never_waits(fake_cuda, monkeypatch):
    """Under CUDA graph capture (reduce-overhead's recording run after its eager warm-up) no wait is allowed: a copy
    that an eager lookup already waited for is served without waiting; one never waited for misses; nothing new
    is enqueued."""
    device, events = fake_cuda
    waited, fresh = FakeTensor([0, 3, 7]), FakeTensor([0, 1, 7])
    device[0x7000], device[0x8000] = waited.values, fresh.values
    for cu, ptr in ((waited, 0x7000), (fresh, 0x8000)):
        varlen_host_cu.remember(cu, _info(3), ptr, types.SimpleNamespace(ptr=0))
    assert varlen_host_cu.lookup(waited, _info(3), 0x7000).tolist() == [0, 3, 7] and events[0].synced == 1
    monkeypatch.setattr(varlen_host_cu.interop, "capturing", lambda x: True)
    assert varlen_host_cu.lookup(waited, _info(3), 0x7000).tolist() == [0, 3, 7] and events[0].synced == 1
    assert varlen_host_cu.lookup(fresh, _info(3), 0x8000) is None and events[1].synced == 0
    new = FakeTensor([0, 2, 7])
    device[0x9000] = new.values
    varlen_host_cu.remember(new, _info(3), 0x9000, types.SimpleNamespace(ptr=0))
    assert len(events) == 2


def test_inference_tensors_are_never_cached(fake_cuda):
    """An inference tensor has no version counter: its forward takes no copy (the backward copies the lengths
    itself) and nothing raises after the forward's launch."""
    device, events = fake_cuda
    inference = FakeTensor([0, 5, 9], ptr=0x7400)
    inference.is_inference = lambda: True
    device[0x7400] = inference.values
    varlen_host_cu.remember(inference, _info(3), 0x7400, types.SimpleNamespace(ptr=0))
    assert varlen_host_cu.lookup(inference, _info(3), 0x7400) is None and len(events) == 0
