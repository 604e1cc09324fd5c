"""torch integration: the forward and backward, fixed length and varlen, as registered ``torch.library`` custom
ops (namespace ``cupy_dash``) with autograd and fake implementations, and :func:`attention` /
:func:`attention_varlen`, which skip the dispatcher in eager calls (:func:`eager`). Imported only on demand.
Signatures, autograd, ``torch.compile`` and CUDA graphs: docs/api.md, "torch: custom ops, torch.compile, CUDA graphs".
"""
from .ops import attention, attention_backward, attention_forward, eager
from .varlen import attention_backward_varlen, attention_forward_varlen, attention_varlen

__all__ = ["attention", "attention_forward", "attention_backward", "attention_varlen", "attention_forward_varlen",
           "attention_backward_varlen", "eager"]
