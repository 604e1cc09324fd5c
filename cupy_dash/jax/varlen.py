"""JAX: attention over packed variable-length batches (FlashAttention's varlen layout), under ``jax.jit`` and
``jax.grad``::

    out = cupy_dash.jax.attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                         causal=True)

q ``(total_q, H, D)``, k/v ``(total_k, Hkv, D)`` JAX arrays; ``cu_seqlens_q`` / ``cu_seqlens_k`` ``(B + 1,)``
integers, either **on the host** (numpy arrays, lists) or as **JAX arrays** (int32, traced). Host lengths: the
backward's schedule table is built when the call is traced, so they are static arguments of the traced function
(hashed into its cache key) and a new packing is a new trace and XLA compilation: this suits batches whose packing
repeats (fixed-length documents, a few bucketed layouts). JAX arrays: one compiled program serves every packing; the
backward reads the lengths back when it runs (a wait for XLA's stream) and finds or builds the packing's table then
(:mod:`cupy_dash.jax.varlen_dyn`). The calls are ``jax.experimental.buffer_callback`` custom calls on XLA's stream
(command-buffer compatible), prepared at trace time on every local Hopper GPU (kernels loaded, tables and cu_seqlens
uploaded, an error record), with the bits of the eager varlen functions on the same inputs. Not batched by
``jax.vmap`` (the sequences already are the batch).
"""
from __future__ import annotations

import collections
import functools

import numpy as np

from .. import config
from .. import schedule as _schedule
from ..core import api, interop, varlen_launch
from ..core.varlen import cu_seqlens_form
from ..core.varlen_launch import check_same_count, cu_seqlens_values
from ..cuda import device_tables, kernels, launchers
from ..cuda.errors import jit_record
from . import callbacks
from . import ops as _jax

__all__ = ["attention_host_lengths"]

_VarlenConfig = collections.namedtuple("_VarlenConfig", "base cu_q cu_k max_q max_k")


def attention_host_lengths(q, k, v, cu_seqlens_q, cu_seqlens_k, max_q, max_k, base):
    """:func:`cupy_dash.jax.attention_varlen` with host cu_seqlens (static: a new packing retraces); ``base`` is
    the call's checked configuration (``ops._config``), ``max_q`` / ``max_k`` the checked maxima."""
    cus = []
    for name, cu, total, m in (("cu_seqlens_q", cu_seqlens_q, q.shape[0], max_q),
                               ("cu_seqlens_k", cu_seqlens_k, k.shape[0], max_k)):
        info, host = cu_seqlens_form(name, cu)
        if info is not None:
            raise TypeError(f"{name}: expected a host array (numpy or list), got one on {info.device}")
        cus.append(tuple(int(x) for x in cu_seqlens_values(name, host, int(total),
                                                           name.replace("cu_seqlens", "max_seqlen"), m)))
    check_same_count(*cus)
    return _attention_jit(_VarlenConfig(base, cus[0], cus[1], max_q, max_k), *callbacks.vary_together(q, k, v))


_Shape = collections.namedtuple("_Shape", "shape dtype")


def _problem(vcfg, q, k, v, dout=None, out=None, lse=None):
    """(validated problem of the packed operands as one batch, the base config with the window in the form the
    kernels take: canonical for the longest sequences, as the eager varlen functions do)."""
    views = [_jax._Aval(_Shape((1, *x.shape), x.dtype)) if x is not None else None
             for x in (q, k, v, dout, out, lse)]
    for name, x in (("q", q), ("k", k), ("v", v), ("dout", dout), ("out", out)):
        if x is not None and len(x.shape) != 3:
            raise ValueError(f"{name}: expected a 3-D packed tensor (total, heads, head_dim), got shape {x.shape}")
    p = api.validate(*views, softmax_scale=vcfg.base.scale, backward=dout is not None, softcap=vcfg.base.softcap)
    base = vcfg.base
    return p, base._replace(window=_schedule.canonical_window(base.window, vcfg.max_q, vcfg.max_k, base.causal))


def _forward(vcfg, q, k, v):
    p, cfg = _problem(vcfg, q, k, v)
    key = ("fwd-varlen", p.dtype, (p.Sq, p.Sk, p.H, p.Hkv, p.D), p.scale, p.softcap, cfg.causal, cfg.window,
           vcfg.cu_q, vcfg.cu_k, vcfg.max_q)
    prepared = callbacks._get(key, lambda: _VarlenForward(p, cfg, len(vcfg.cu_q) - 1, vcfg.max_q,
                                                          (vcfg.cu_q, vcfg.cu_k)))
    return callbacks.vary_like(prepared.bind(q, k, v), (q, k, v))


def _backward(vcfg, dout, q, k, v, out, lse):
    p, cfg = _problem(vcfg, q, k, v, dout, out, lse)
    spin = config.spin_timeout_ns()
    key = ("bwd-varlen", p.dtype, (p.Sq, p.Sk, p.H, p.Hkv, p.D), p.scale, p.softcap, cfg.causal, cfg.window,
           cfg.schedule, cfg.deterministic, spin, vcfg.cu_q, vcfg.cu_k, vcfg.max_q)
    prepared = callbacks._get(key, lambda: _VarlenBackward(p, cfg, vcfg, spin))
    return callbacks.vary_like(prepared.bind(dout, q, k, v, out, lse), (dout, q, k, v, out, lse))


_attention_jit = _jax.differentiable(_forward, _backward)


class _VarlenForward(callbacks._Call):
    """A traced varlen forward: the callback ``(ctx, (out, lse), q, k, v[, cu_q, cu_k])``, with the lengths
    uploaded here per device (``host_cu``: the static lengths) or, without them, read from the call's own device
    operands cu_q, cu_k (:mod:`cupy_dash.jax.varlen_dyn`)."""
    packed = True

    def __init__(self, p, cfg, num_seqs, max_q, host_cu=None):
        import cupy
        self.p, self.window, self.num_seqs = p, cfg.window, num_seqs
        self.spec, self.block_m, self.block_n = kernels.fwd_entry(p.dtype, p.D, cfg.causal, varlen=True,
                                                                  softcap=p.softcap > 0)
        self.grid = (-(-max_q // self.block_m), p.H, self.num_seqs)
        self.q_strides, self.kv_strides = _packed_strides(p.Sq, p.Sk, p.H, p.Hkv, p.D)
        self.devices, self.cu = callbacks._gpus(), {}
        for dev in self.devices:
            with cupy.cuda.Device(dev):
                callbacks._load([self.spec])
                if host_cu is not None:
                    stream = cupy.cuda.Stream(non_blocking=True)
                    self.cu[dev] = device_tables.upload_async([np.asarray(c, np.int32) for c in host_cu], stream)
                    stream.synchronize()

    def __call__(self, ctx, outs, q, k, v, *cu):
        callbacks.callback_runs["forward"] += 1
        out, lse = outs
        dev = callbacks._device(out, self.devices)
        import cupy
        with cupy.cuda.Device(dev):
            ptr = callbacks._ptr
            operands = (ptr(q), self.q_strides), (ptr(k), self.kv_strides), (ptr(v), self.kv_strides)
            cu_ptrs = tuple(ptr(x) for x in cu) if cu else tuple(x.data.ptr for x in self.cu[dev])
            params = launchers.fwd_params(self.block_m, self.block_n, self.p, self.window, operands, ptr(out),
                                          ptr(lse), varlen=(self.num_seqs, *cu_ptrs))
            kernels.launch(self.spec, self.grid, params, interop.external_stream(ctx.stream, dev))


@functools.lru_cache(maxsize=64)
def _packed_strides(Sq, Sk, H, Hkv, D) -> tuple:
    """(batch, row, head) element strides of contiguous packed q-like (1, Sq, H, D) and k-like tensors."""
    return (interop.contiguous_strides((1, Sq, H, D))[:3], interop.contiguous_strides((1, Sk, Hkv, D))[:3])


def launch_backward(c, record, ctx, dev, outs, dout, q, k, v, out, lse, cu_ptrs):
    """Enqueue the varlen backward ``c`` (tables set; None: no sequence sees a key, so dq, dk, dv are zeroed) on
    XLA's stream, buffers as the callbacks get them, errors to the traced call's device ``record``."""
    import cupy
    dq, dk, dv, work = outs
    ptr, p = callbacks._ptr, (c.p if c is not None else None)
    stream = interop.external_stream(ctx.stream, dev)
    if c is None:
        for x in (dq, dk, dv):
            cupy.cuda.runtime.memsetAsync(ptr(x), 0, int(np.prod(x.shape)) * 2, stream.ptr)
        return
    qs, kvs = _packed_strides(p.Sq, p.Sk, p.H, p.Hkv, p.D)
    operands = ((ptr(q), qs), (ptr(k), kvs), (ptr(v), kvs), (ptr(out), qs), (ptr(dout), qs))
    launchers.launch_backward(c, operands, ptr(lse), ptr(work), (ptr(dq), ptr(dk), ptr(dv)), stream,
                              error_ptr=record, cu_seqlens=cu_ptrs)


class _VarlenBackward(callbacks._Call):
    """A traced varlen backward: the callback ``(ctx, (dq, dk, dv, workspace), dout, q, k, v, out, lse)``; per
    device its BwdLaunch (kernels loaded, the packing's schedule table uploaded), cu_seqlens and error record."""
    packed = True

    def __init__(self, p, cfg, vcfg, spin_timeout_ns):
        import cupy
        self.p = p
        num_seqs = len(vcfg.cu_q) - 1
        cu_host = tuple(np.asarray(c, np.int64) for c in (vcfg.cu_q, vcfg.cu_k))
        tile = kernels.bwd_tile(p.D, cfg.causal)
        specs = kernels.bwd_specs(p.dtype, p.D, cfg.causal, cfg.deterministic, varlen=True, softcap=p.softcap > 0)
        self.work_bytes = launchers.BwdLaunch(specs, tile.block_m, tile.block_n, p, cfg.deterministic,
                                              spin_timeout_ns, cfg.causal, cfg.window,
                                              varlen=(num_seqs, vcfg.max_q)).work_bytes
        self.devices, self.launches, self.records, self.cu = callbacks._gpus(), {}, {}, {}
        for dev in self.devices:
            with cupy.cuda.Device(dev):
                stream = cupy.cuda.Stream(non_blocking=True)
                c, cu, call = varlen_launch.packing_launch(dev, p, cfg.causal, cfg.deterministic, cfg.schedule,
                                                           cfg.window, spin_timeout_ns, cu_host, vcfg.max_q, stream)
                self.launches[dev] = c                   # None: no sequence sees a key, zero gradients, no kernel
                if c is None:
                    continue
                callbacks._load(c.specs)
                stream.synchronize()
                self.cu[dev], self.records[dev] = cu, jit_record(dev, call)

    def __call__(self, ctx, outs, dout, q, k, v, out, lse):
        callbacks.callback_runs["backward"] += 1
        dev = callbacks._device(outs[0], self.devices)
        import cupy
        with cupy.cuda.Device(dev):
            c = self.launches[dev]
            cu = tuple(x.data.ptr for x in self.cu[dev]) if c is not None else None
            launch_backward(c, self.records.get(dev), ctx, dev, outs, dout, q, k, v, out, lse, cu)
