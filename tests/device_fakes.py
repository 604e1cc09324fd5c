"""CuPy's device switching imitated without a GPU (not a test module): :func:`install` replaces
``cupy.cuda.Device`` (the context manager) and ``cupy.cuda.runtime.getDevice`` / ``setDevice`` with a per-test
current-device counter, so that CPU tests can check on which device cupy_dash allocates, uploads, loads and
records. It sits beside conftest.py because conftest's ``host_tables`` fixture and the unit tests use it."""
from __future__ import annotations


class FakeDevices:
    """The current device of a test: ``current`` (an int), changed by ``Device(i)`` blocks, restored after them,
    and ``entered`` (every device a ``Device`` block made current, in order)."""

    def __init__(self, current: int = 0):
        self.current = current
        self.entered: list[int] = []

    def Device(self, device_id=None):
        fake = self

        class _Device:
            id = fake.current if device_id is None else int(device_id)

            def __enter__(self):
                self._previous = fake.current
                fake.current = self.id
                fake.entered.append(self.id)
                return self

            def __exit__(self, *exc):
                fake.current = self._previous
                return False
        return _Device()


def install(monkeypatch, current: int = 0) -> FakeDevices:
    """Replace CuPy's device switching for the rest of the test; returns the :class:`FakeDevices`."""
    import cupy
    fake = FakeDevices(current)
    monkeypatch.setattr(cupy.cuda, "Device", fake.Device)
    monkeypatch.setattr(cupy.cuda.runtime, "getDevice", lambda: fake.current)
    monkeypatch.setattr(cupy.cuda.runtime, "setDevice", lambda dev: setattr(fake, "current", int(dev)))
    return fake


def fake_uploads(monkeypatch, fake: FakeDevices | None = None) -> list:
    """Replace the one upload of schedule tables (``device_tables.upload_async``) by numpy copies and the cached
    tables by empty caches; returns the list of ``(current device, dtype)`` of every array uploaded (the device
    None without ``fake``)."""
    import collections

    import numpy as np

    from cupy_dash.cuda import device_tables
    uploads = []

    def upload_async(arrays, stream, wait=False):
        uploads.extend((None if fake is None else fake.current, a.dtype) for a in arrays)
        return [np.array(a) for a in arrays]
    monkeypatch.setattr(device_tables, "upload_async", upload_async)
    monkeypatch.setattr(device_tables, "_caches", {f: collections.OrderedDict() for f in device_tables._LIMITS})
    monkeypatch.setattr(device_tables, "_plans", collections.OrderedDict())
    return uploads
