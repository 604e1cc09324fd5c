"""JAX varlen attention with ``cu_seqlens`` as int32 JAX arrays: one compiled program serves every packing
(docs/api.md, "JAX"). The forward reads the bounds on the device; the backward is always a ``buffer_callback``,
not command-buffer compatible, that reads the lengths back when XLA runs it (a wait for XLA's stream), checks them
(a ValueError fails the computation), finds or builds the packing's table (:mod:`cupy_dash.cuda.varlen_device`) and
launches on XLA's stream. Same bits as the eager varlen functions and the static-lengths path.
"""
from __future__ import annotations

import numpy as np

from ..core import varlen_launch
from ..core.varlen_launch import checked_cu_seqlens
from ..cuda import kernels, plans
from ..cuda.errors import jit_record
from . import callbacks, varlen


def check_cu(name, cu) -> int:
    """The number of sequences of a traced ``cu_seqlens`` (int32, 1-D, at least 2 entries), checked at trace time."""
    if cu.dtype != np.int32 or len(cu.shape) != 1 or cu.shape[0] < 2:
        raise ValueError(f"{name}: expected an int32 JAX array (B + 1,) with B >= 1, got {cu.dtype} {cu.shape}")
    return int(cu.shape[0]) - 1


def attention_device_lengths(q, k, v, cu_seqlens_q, cu_seqlens_k, max_q, max_k, base):
    """:func:`cupy_dash.jax.attention_varlen` with cu_seqlens as JAX arrays (one program for every packing);
    ``base`` is the call's checked configuration, ``max_q`` / ``max_k`` the checked maxima."""
    num_seqs = check_cu("cu_seqlens_q", cu_seqlens_q)
    check_cu("cu_seqlens_k", cu_seqlens_k)
    varlen_launch.check_same_count(cu_seqlens_q, cu_seqlens_k)      # and at most MAX_GRID_YZ sequences
    varlen_launch.check_max_within(max_q, max_k, q.shape[0], k.shape[0])
    vcfg = varlen._VarlenConfig(base, num_seqs, max_q, max_k, None, _Backward)
    return varlen.attention_jit(vcfg, *callbacks.vary_together(q, k, v), cu_seqlens_q, cu_seqlens_k)


class _Backward(varlen._PackedBackward):
    """A traced varlen backward with device cu_seqlens: buffers dout, q, k, v, out, lse, cu_seqlens_q,
    cu_seqlens_k (arguments), dq, dk, dv and the workspace (results); per device its kernels (loaded at trace time)
    and error record; the packing's schedule table and launch plan are found or built when the callback runs."""
    command_buffer = False   # NOTES: the callback reads the lengths back and may upload a table
    ffi_capable = False

    def __init__(self, p, cfg, vcfg, spin_timeout_ns):
        super().__init__(p, cfg, vcfg, spin_timeout_ns)
        import cupy
        for dev in self.devices:
            with cupy.cuda.Device(dev):                  # the per-visit kernels of every tile, before any execution
                for tile_sq in kernels.varlen_tile_seqlens(vcfg.max_q):
                    callbacks._load(kernels.bwd_entry(dev, p.dtype, p.D, cfg.causal, softcap=p.softcap > 0,
                                                      seqlen_q=tile_sq, window=cfg.window, head_dim_v=p.Dv)[0])
                self.records[dev] = jit_record(dev, (cfg.schedule, vcfg.num_seqs, p.H, p.Sq, p.Sk, p.D, cfg.causal,
                                                     cfg.window))

    def parts(self, dev):
        return None                                      # made per packing, when the call runs

    def lengths(self, cu_q, cu_k, stream) -> tuple:
        """The host int32 cu_seqlens of the device buffers at ``cu_q``, ``cu_k`` (after XLA's pending work on
        ``stream``), checked."""
        import cupy
        rt = cupy.cuda.runtime
        hosts = []
        for ptr in (cu_q, cu_k):
            host = np.empty(self.vcfg.num_seqs + 1, dtype=np.int32)
            rt.memcpyAsync(host.ctypes.data, ptr, host.nbytes, rt.memcpyDeviceToHost, stream.ptr)
            hosts.append(host)
        stream.synchronize()
        p, d = self.p, self.vcfg
        return checked_cu_seqlens(*hosts, p.Sq, p.Sk, d.max_q, d.max_k)

    def run(self, dev, stream, buffers) -> None:
        c, cu, _ = self.packing_launch(dev, self.lengths(buffers[6], buffers[7], stream), stream)   # the eager one
        plan = self.zero_gradients().plan() if c is None else self.packing_plan(dev, c, cu, plans.backward_plan)
        plan.run(stream.ptr, (*buffers[:6], *buffers[8:]))
