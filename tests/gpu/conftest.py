"""GPU tests: the backward head dims that are built but not yet shipped (kernels.BWD_PENDING_HEAD_DIMS) are enabled
for every test here, so that their GPU cases run before the API takes them (a test that checks the shipped set
undoes it with ``monkeypatch.undo()``)."""
import pytest

from cupy_dash.cuda import kernels


@pytest.fixture(autouse=True)
def _pending_backward_head_dims(monkeypatch):
    monkeypatch.setattr(kernels, "BWD_HEAD_DIMS", kernels.BWD_BUILT_HEAD_DIMS)
