"""The Python part of the backward's host fast path, on any machine (no GPU): torch tensors imitated and every
CUDA call replaced by a no-op (the fakes of tests/fastpath_fakes.py), so what is timed is cupy_dash's own code
per call (plus the fakes' attribute methods, slower than torch's C ones): the launch plan runs in the executor's
inspect mode (every patch in C, no driver call). Prints µs per call and a cProfile.

    python benchmarks/host_python.py
"""
import sys, time, types, contextlib, cProfile, pstats
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1] / "tests"))
import numpy as np
import pytest
import cupy_dash
from cupy_dash.core import api, fastpath, interop
from cupy_dash.cuda import errors, kernels, launchers, plans, tensormap
from fastpath_fakes import Tensor, BF16, F32, I32, U8
mp = pytest.MonkeyPatch()
addresses = iter(range(0x1000000, 0x900000000, 0x10000))
def empty(shape, dtype=None, device=None):
    return Tensor(shape if isinstance(shape, tuple) else (shape,), dtype, next(addresses) % (1 << 40))
mp.setattr(fastpath, "_torch", types.SimpleNamespace(empty=empty, uint8=U8, float32=F32, int32=I32,
                                                     empty_like=lambda t: empty(t.shape, t.dtype)))
mp.setattr(fastpath, "_ready_stream", lambda dev: Stream())
mp.setattr(interop, "capturing", lambda x: False)
mp.setattr(tensormap, "bhsd_map", lambda ptr, *a, **kw: int(ptr).to_bytes(8, "little").ljust(128, b"\0"))
mp.setattr(tensormap, "check_encodable", lambda *a, **kw: None)
mp.setattr(launchers, "l2_bytes", lambda dev: 60 << 20)       # the H200's L2 and SMs
mp.setattr(kernels, "sm_count", lambda dev: 132)
def new(fw, dev, shape, dtype):
    t = empty(tuple(shape), {"uint8": U8, "float32": F32, "int32": I32}.get(dtype, BF16)); return t, t.ptr
mp.setattr(api, "_new", new); mp.setattr(api, "_export", lambda fw, a, like: a)
class Stream(contextlib.nullcontext):
    ptr = 0x77
mp.setattr(interop, "caller_stream", lambda x, dev: Stream())
mp.setattr(api.cupy.cuda, "Device", lambda dev: contextlib.nullcontext())
specs = kernels.bwd_specs("bfloat16", 64, False); tile = kernels.bwd_tile(64, False)
mp.setattr(kernels, "bwd_entry", lambda *a, **kw: (specs, tile.block_m, tile.block_n, 132))
mp.setattr(plans.jit, "load", lambda spec: types.SimpleNamespace(ptr=0xF00))
P = types.SimpleNamespace
mp.setattr(launchers, "bwd_tables", lambda *a, **kw: P(visits=P(data=P(ptr=1)), rank=P(data=P(ptr=2)), cta_start=P(data=P(ptr=3)), num_ctas=2, policy="fa3"))
class Slot:
    __slots__=("dptr","hdev","host","pool","device_id")
    def done(self): return True
pool = types.SimpleNamespace(free=[])
def acquire(dev):
    s = Slot(); s.dptr=0xA000; s.hdev=0xB000; s.host=np.array([1,0,0,0,0,0,0,0],np.int32); s.pool=pool; s.device_id=0; return s
mp.setattr(api, "acquire_slot", acquire); mp.setattr(errors, "acquire_slot", acquire)
def enqueue_backward(c, stream, buffers, *, slot=None, call=None):     # the executor without its driver calls
    c.plan.inspect(buffers)
    if slot is not None:
        launchers._track(slot, call)
mp.setattr(launchers, "enqueue_backward", enqueue_backward)
mp.setattr(launchers, "enqueue_forward", lambda plan, stream, buffers: plan.inspect(buffers))

q, do, out, k, v = (Tensor((1,128,1,64), BF16, 0x10000*(i+1)) for i in range(5))
lse = Tensor((1,1,128), F32, 0x90000)
cupy_dash.attention_backward(do, q, k, v, out, lse)
n = 20000
t0 = time.perf_counter()
for _ in range(n): cupy_dash.attention_backward(do, q, k, v, out, lse)
print("python-only backward fast path: %.1f us/call" % ((time.perf_counter()-t0)/n*1e6), fastpath.stats())
pr = cProfile.Profile(); pr.enable()
for _ in range(5000): cupy_dash.attention_backward(do, q, k, v, out, lse)
pr.disable(); pstats.Stats(pr).sort_stats("tottime").print_stats(14)

# the forward's fast path, the same way
mp.setattr(fastpath, "_ready_stream", lambda dev: Stream())
mp.setattr(kernels, "fwd_entry", lambda *a, **kw: (kernels.fwd_spec("bfloat16", 64, False), 128, 128))
out0, lse0 = cupy_dash.attention_forward(q, k, v)
t0 = time.perf_counter()
for _ in range(n):
    cupy_dash.attention_forward(q, k, v)
print("python-only forward fast path: %.1f us/call" % ((time.perf_counter() - t0) / n * 1e6), fastpath.stats())
