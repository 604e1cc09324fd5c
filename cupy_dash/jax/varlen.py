"""JAX attention over packed variable-length batches (:func:`cupy_dash.jax.attention_varlen`, docs/api.md): the
path with host ``cu_seqlens`` (static: the backward's table is built at trace time, a new packing retraces) and
the traced calls that :mod:`cupy_dash.jax.varlen_dyn` (JAX-array lengths) shares. Not batched by ``jax.vmap``.
"""
from __future__ import annotations

import collections

import numpy as np

from ..core import varlen_launch
from ..core.varlen import cu_seqlens_form
from ..core.varlen_launch import check_same_count, cu_seqlens_values
from ..cuda import device_tables, kernels, launchers, plans
from ..cuda.errors import jit_record
from . import callbacks
from . import ops as _jax

__all__ = ["attention_host_lengths"]

# NOTES: cu: the host lengths (tuples cu_seqlens_q, cu_seqlens_k), None when they are the call's device operands;
# backward: the class of the traced backward (_VarlenBackward, or varlen_dyn._Backward)
_VarlenConfig = collections.namedtuple("_VarlenConfig", "base num_seqs max_q max_k cu backward")


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
    vcfg = _VarlenConfig(base, len(cus[0]) - 1, max_q, max_k, tuple(cus), _VarlenBackward)
    return attention_jit(vcfg, *callbacks.vary_together(q, k, v))


def _prepared(vcfg, p, cfg, backward=False):
    """The traced call of this packing: the key names the host lengths and max_seqlen_q or, for device lengths,
    the number of sequences, max_seqlen_q and (the backward checks the lengths it reads) max_seqlen_k."""
    kind = ("bwd" if backward else "fwd") + ("-varlen" if vcfg.cu is not None else "-varlen-dyn")
    if vcfg.cu is not None:
        lengths = (*vcfg.cu, vcfg.max_q)
    else:
        lengths = (vcfg.num_seqs, vcfg.max_q, vcfg.max_k) if backward else (vcfg.num_seqs, vcfg.max_q)
    cls = vcfg.backward if backward else _VarlenForward
    return _jax.prepare(kind, cls, p, cfg, vcfg, extra=lengths, backward=backward)


def _problem(vcfg, *arrays):
    return _jax._problem(vcfg.base, *arrays, lengths=(vcfg.max_q, vcfg.max_k))


def _forward(vcfg, q, k, v, *cu):
    p, cfg = _problem(vcfg, q, k, v)
    return callbacks.vary_like(_prepared(vcfg, p, cfg).bind(q, k, v, *cu), (q, k, v, *cu))


def _backward(vcfg, dout, q, k, v, out, lse, *cu):
    p, cfg = _problem(vcfg, q, k, v, dout, out, lse)
    operands = dout, q, k, v, out, lse, *cu
    return callbacks.vary_like(_prepared(vcfg, p, cfg, backward=True).bind(*operands), operands)


attention_jit = _jax.differentiable(_forward, _backward)


class _VarlenForward(callbacks._Forward):
    """A traced varlen forward: buffers q, k, v[, cu_seqlens_q, cu_seqlens_k] (arguments), out, lse (results), with
    the host lengths (``vcfg.cu``) uploaded here per device or, without them, the call's own device operands
    (:mod:`cupy_dash.jax.varlen_dyn`)."""
    packed = True

    def __init__(self, p, cfg, vcfg):
        super().__init__(p, cfg)
        self.num_seqs, self.grid, self.cu = vcfg.num_seqs, (-(-vcfg.max_q // self.block_m), p.H, vcfg.num_seqs), {}
        if vcfg.cu is None:
            self.names = (*plans.FWD_BUFFERS[:3], *plans.FWD_BUFFERS[5:], *plans.FWD_BUFFERS[3:5])
            return
        import cupy
        for dev in self.devices:
            with cupy.cuda.Device(dev):
                stream = cupy.cuda.Stream(non_blocking=True)
                self.cu[dev] = device_tables.upload_async([np.asarray(c, np.int32) for c in vcfg.cu], stream)
                stream.synchronize()

    def cu_seqlens(self, dev) -> tuple:
        return tuple(x.data.ptr for x in self.cu[dev]) if dev in self.cu else (0, 0)


class _PackedBackward(callbacks._Call):
    """A traced varlen backward (``packed`` operands): buffers dout, q, k, v, out, lse (arguments), dq, dk, dv and
    the workspace (results), whose size covers every tile its packings may take."""
    packed = True
    kind, names = "backward", plans.BWD_BUFFERS[:10]

    def __init__(self, p, cfg, vcfg, spin_timeout_ns):
        self.cfg, self.vcfg, self.spin = cfg, vcfg, spin_timeout_ns
        specs = kernels.bwd_specs(p.dtype, p.D, cfg.causal, softcap=p.softcap > 0, head_dim_v=p.Dv)
        self.work_bytes = launchers.varlen_work_bytes(specs, p, cfg.deterministic, spin_timeout_ns, cfg.causal,
                                                      cfg.window, (vcfg.num_seqs, vcfg.max_q))
        super().__init__(p, cfg)
        self.records = {}

    def packing_launch(self, dev, cu_host, stream) -> tuple:
        """:func:`cupy_dash.core.varlen_launch.packing_launch` of this call for checked host lengths."""
        cfg = self.cfg
        return varlen_launch.packing_launch(dev, self.p, cfg.causal, cfg.deterministic, cfg.schedule, cfg.window,
                                            self.spin, cu_host, self.vcfg.max_q, stream)

    def zero_gradients(self) -> plans.Parts:
        """The plan where no sequence sees a key: no kernel, dq, dk and dv (buffers 6, 7, 8) zeroed."""
        p = self.p
        sizes = (p.Sq * p.H * p.D * 2, *launchers.kv_bytes(p))
        return plans.Parts((), np.zeros(1, kernels.BWD_PARAMS_DTYPE), (), (), tuple(zip((6, 7, 8), sizes)))

    def packing_plan(self, dev, c, cu_dev, build=plans.backward):
        """``build``'s plan (plans.backward: parts; plans.backward_plan: the plan, cached with the tables) of the
        packing's launch ``c`` on ``dev`` (device cu_seqlens ``cu_dev``), its workspace checked."""
        if c.work_bytes > self.work_bytes:   # launchers.varlen_work_bytes covers every tile: never expected
            raise RuntimeError(f"cupy_dash: the backward needs {c.work_bytes} bytes of workspace, the traced call "
                               f"reserved {self.work_bytes}")
        return build(c, self.bwd_strides(), self.names, error=(self.records[dev], 0),
                     cu_seqlens=tuple(x.data.ptr for x in cu_dev))


class _VarlenBackward(_PackedBackward):
    """A traced varlen backward with host lengths: per device its BwdLaunch (kernels loaded, the packing's schedule
    table uploaded), cu_seqlens and error record."""

    def __init__(self, p, cfg, vcfg, spin_timeout_ns):
        super().__init__(p, cfg, vcfg, spin_timeout_ns)
        import cupy
        cu_host = tuple(np.asarray(c, np.int64) for c in vcfg.cu)
        self.launches, self.cu = {}, {}
        for dev in self.devices:
            with cupy.cuda.Device(dev):
                stream = cupy.cuda.Stream(non_blocking=True)
                c, cu, call = self.packing_launch(dev, cu_host, stream)
                self.launches[dev] = c                   # None: no sequence sees a key, zero gradients, no kernel
                if c is None:
                    continue
                callbacks._load(c.specs)
                stream.synchronize()
                self.cu[dev], self.records[dev] = cu, jit_record(dev, call)

    def parts(self, dev):
        c = self.launches[dev]
        return self.zero_gradients() if c is None else self.packing_plan(dev, c, self.cu[dev])
