"""torch integration: the forward and backward as registered ``torch.library`` custom ops.

Imported only on demand (``cupy_dash.torch``, or ``cupy_dash.attention`` with torch tensors); importing
``cupy_dash`` itself never imports torch. Layout: q ``(B, Sq, H, D)``, k/v ``(B, Sk, Hkv, D)`` with
``H % Hkv == 0``, bf16/fp16, one CUDA device; D is 64, 96, 128, 192 or 256 (v's 128 with D 192). The ops
(namespace ``cupy_dash``)::

    out, lse = torch.ops.cupy_dash.attention_forward(q, k, v, causal=False, softmax_scale=None,
                                                     schedule="auto", deterministic=True,
                                                     window_left=-1, window_right=-1, softcap=0.0)
    dq, dk, dv = torch.ops.cupy_dash.attention_backward(dout, q, k, v, out, lse, causal=False,
                                                        softmax_scale=None, schedule="auto", deterministic=True,
                                                        window_left=-1, window_right=-1, softcap=0.0)

Packed variable-length batches have their own ops, ``attention_forward_varlen`` / ``attention_backward_varlen``
(:mod:`cupy_dash.torch.varlen`), and :func:`attention_varlen`.

The sliding window ``(left, right)`` of :func:`cupy_dash.attention_forward` is two int arguments of the ops
(-1: unbounded). ``attention_forward`` is differentiable (``register_autograd``): its gradient is
``attention_backward`` with the forward's window, ``schedule`` and ``deterministic`` (the latter two carried by
the forward op for that purpose; the forward kernel does not use them). ``lse`` ``(B, H, Sq)`` float32 is
returned but not differentiable. Both ops have fake implementations (exact output shapes, dtypes and
contiguous strides, and the argument checks of
:mod:`cupy_dash.core.api` wherever sizes are concrete), so ``torch.compile(fullgraph=True)`` traces forward and
backward without graph breaks, and ``torch.library.opcheck`` passes.

Inside an op: kernels run on torch's current stream; outputs and scratch buffers are ``torch.empty`` on the
inputs' device (under CUDA graph capture they come from the graph's private pool); nothing synchronizes the
host. Two one-time costs of the first *eager* call of a variant and shape happen outside any op-level
contract: NVRTC compile / module load of its kernels, and the upload of the backward's schedule tables (which
synchronizes the stream once; the tables are then cached in device memory per shape and schedule).

CUDA graphs (``torch.cuda.graph`` or ``torch.compile(..., mode="reduce-overhead")``): a call captured into a
graph enqueues only its kernels on the capturing stream. If no eager call of the same dtype, head dim, causal
flag, shape and schedule (varlen: and packing, :mod:`cupy_dash.torch.varlen`) has run on that device, the
captured call compiles and loads its kernels and uploads its schedule tables outside the capture
(:mod:`cupy_dash.cuda.capture`: the thread's capture mode relaxed, a stream of its own, synchronized), so no
warm-up call is needed. Tables used by a graph are kept for the life of the process. A captured backward cannot hand
its semaphore-timeout record to the host asynchronously; failures inside graph replays are reported by
:func:`cupy_dash.check_errors` (which synchronizes), not by the next call; call it outside capture.
"""
from .ops import attention, attention_backward, attention_forward, eager
from .varlen import attention_backward_varlen, attention_forward_varlen, attention_varlen

__all__ = ["attention", "attention_forward", "attention_backward", "attention_varlen", "attention_forward_varlen",
           "attention_backward_varlen", "eager"]
