"""JAX varlen attention with ``cu_seqlens`` as JAX arrays (traced): one compiled program serves every packing.

:func:`cupy_dash.jax.attention_varlen` takes this path when ``cu_seqlens_q`` and ``cu_seqlens_k`` are JAX arrays
(int32 ``(B + 1,)``; ``max_seqlen_q`` / ``max_seqlen_k`` stay static ints, as in FlashAttention). The forward
kernel reads the sequence bounds from the device (a command-buffer compatible ``buffer_callback``). The backward
needs the lengths on the host for its schedule table, so its ``buffer_callback`` copies them from the device when
XLA runs it (a wait for XLA's stream), checks them (a ValueError from the callback fails the computation), builds
or finds the packing's table (:mod:`cupy_dash.cuda.varlen_device`, cached per packing) and launches on XLA's stream;
it is not command-buffer compatible. Same bits as the eager varlen functions and as the static-lengths path.
"""
from __future__ import annotations

import collections

import numpy as np

from .. import config
from ..core import interop, varlen_launch
from ..core.varlen_launch import checked_cu_seqlens
from ..cuda import kernels, launchers
from ..cuda.errors import jit_record
from . import callbacks
from . import ops as _jax, varlen as _static

_DynConfig = collections.namedtuple("_DynConfig", "base num_seqs max_q max_k")


def check_cu(name, cu) -> int:
    """The number of sequences of a traced ``cu_seqlens`` (int32, 1-D, at least 2 entries), checked at trace time."""
    if cu.dtype != np.int32 or len(cu.shape) != 1 or cu.shape[0] < 2:
        raise ValueError(f"{name}: expected an int32 JAX array (B + 1,) with B >= 1, got {cu.dtype} {cu.shape}")
    return int(cu.shape[0]) - 1


def _forward(dcfg, q, k, v, cu_q, cu_k):
    p, cfg = _static._problem(dcfg, q, k, v)
    key = ("fwd-varlen-dyn", p.dtype, (p.Sq, p.Sk, p.H, p.Hkv, p.D), p.scale, p.softcap, cfg.causal, cfg.window,
           dcfg.num_seqs, dcfg.max_q)
    prepared = callbacks._get(key, lambda: _static._VarlenForward(p, cfg, dcfg.num_seqs, dcfg.max_q))
    return callbacks.vary_like(prepared.bind(q, k, v, cu_q, cu_k), (q, k, v, cu_q, cu_k))


def _backward(dcfg, dout, q, k, v, out, lse, cu_q, cu_k):
    p, cfg = _static._problem(dcfg, q, k, v, dout, out, lse)
    spin = config.spin_timeout_ns()
    key = ("bwd-varlen-dyn", p.dtype, (p.Sq, p.Sk, p.H, p.Hkv, p.D), p.scale, p.softcap, cfg.causal, cfg.window,
           cfg.schedule, cfg.deterministic, spin, dcfg.num_seqs, dcfg.max_q, dcfg.max_k)
    operands = dout, q, k, v, out, lse, cu_q, cu_k
    return callbacks.vary_like(callbacks._get(key, lambda: _Backward(p, cfg, dcfg, spin)).bind(*operands), operands)


attention_jit = _jax.differentiable(_forward, _backward)


class _Backward(callbacks._Call):
    """A traced varlen backward with device cu_seqlens: the callback ``(ctx, (dq, dk, dv, workspace), dout, q, k,
    v, out, lse, cu_q, cu_k)``; per device its kernels (loaded at trace time) and error record; the packing's
    schedule table is found or built when the callback runs."""
    packed = True
    command_buffer = False   # NOTES: the callback reads the lengths back and may upload a table

    def __init__(self, p, cfg, dcfg, spin_timeout_ns):
        import cupy
        self.p, self.cfg, self.dcfg, self.spin = p, cfg, dcfg, spin_timeout_ns
        tile = kernels.bwd_tile(p.D, cfg.causal)
        specs = kernels.bwd_specs(p.dtype, p.D, cfg.causal, cfg.deterministic, varlen=True, softcap=p.softcap > 0)
        self.work_bytes = launchers.BwdLaunch(specs, tile.block_m, tile.block_n, p, cfg.deterministic,
                                              spin_timeout_ns, cfg.causal, cfg.window,
                                              varlen=(dcfg.num_seqs, dcfg.max_q)).work_bytes
        self.devices, self.records = callbacks._gpus(), {}
        for dev in self.devices:
            with cupy.cuda.Device(dev):                  # the per-visit kernels, loaded before any execution
                callbacks._load(kernels.bwd_entry(dev, p.dtype, p.D, cfg.causal, cfg.deterministic, varlen=True,
                                             softcap=p.softcap > 0)[0])
                self.records[dev] = jit_record(dev, (cfg.schedule, dcfg.num_seqs, p.H, p.Sq, p.Sk, p.D, cfg.causal,
                                                     cfg.window))

    def lengths(self, cu_q, cu_k, stream) -> tuple:
        """The host int32 cu_seqlens of the device buffers (after XLA's pending work on ``stream``), checked."""
        import cupy
        rt = cupy.cuda.runtime
        hosts = []
        for buffer in (cu_q, cu_k):
            host = np.empty(self.dcfg.num_seqs + 1, dtype=np.int32)
            rt.memcpyAsync(host.ctypes.data, callbacks._ptr(buffer), host.nbytes, rt.memcpyDeviceToHost, stream.ptr)
            hosts.append(host)
        stream.synchronize()
        p, d = self.p, self.dcfg
        return checked_cu_seqlens(*hosts, p.Sq, p.Sk, d.max_q, d.max_k)

    def __call__(self, ctx, outs, dout, q, k, v, out, lse, cu_q, cu_k):
        callbacks.callback_runs["backward"] += 1
        dev = callbacks._device(outs[0], self.devices)
        p, cfg = self.p, self.cfg
        import cupy
        with cupy.cuda.Device(dev):
            stream = interop.external_stream(ctx.stream, dev)
            cu_host = self.lengths(cu_q, cu_k, stream)
            c, cu_dev, _ = varlen_launch.packing_launch(dev, p, cfg.causal, cfg.deterministic, cfg.schedule,
                                                        cfg.window, self.spin, cu_host, self.dcfg.max_q,
                                                        stream)                          # the eager one
            cu = None if c is None else (cu_dev[0].data.ptr, cu_dev[1].data.ptr)   # None: no key seen, zeros
            _static.launch_backward(c, self.records[dev], ctx, dev, outs, dout, q, k, v, out, lse, cu)


def attention_device_lengths(q, k, v, cu_seqlens_q, cu_seqlens_k, max_q, max_k, base):
    """:func:`cupy_dash.jax.attention_varlen` with cu_seqlens as JAX arrays (one program for every packing);
    ``base`` is the call's checked configuration, ``max_q`` / ``max_k`` the checked maxima."""
    num_seqs = check_cu("cu_seqlens_q", cu_seqlens_q)
    if check_cu("cu_seqlens_k", cu_seqlens_k) != num_seqs:
        raise ValueError(f"cu_seqlens_k: expected {num_seqs + 1} entries (as cu_seqlens_q), got "
                         f"{cu_seqlens_k.shape[0]}")
    varlen_launch.check_max_within(max_q, max_k, q.shape[0], k.shape[0])
    q, k, v = callbacks.vary_together(q, k, v)
    return attention_jit(_DynConfig(base, num_seqs, max_q, max_k), q, k, v, cu_seqlens_q, cu_seqlens_k)
