"""The framework-free rules of the Hugging Face transformers adapter (:mod:`cupy_dash.transformers`): a module's
``sliding_window`` as cupy_dash's ``window`` (the mapping: docs/api.md, "Sliding windows" of the transformers
section), the cumulative lengths of padded and packed batches, and the errors for what the kernels cannot do, each
naming the model setting responsible. Pure Python (no torch, no transformers): every rule is tested on any machine.
"""
from __future__ import annotations

NAME = "cupy_dash"
HEAD_DIMS = (64, 96, 128, 192, 256)   # kernels.BWD_HEAD_DIMS (a test of the transformers adapter keeps them equal)
VALUE_HEAD_DIMS = {192: (128,)}  # kernels.VALUE_HEAD_DIMS (likewise)


def window(sliding_window, causal: bool) -> tuple:
    """cupy_dash's ``(left, right)`` for a module's ``sliding_window`` (None: no window, ``(-1, -1)``)."""
    if sliding_window is None:
        return (-1, -1)
    if isinstance(sliding_window, bool) or not isinstance(sliding_window, int) or sliding_window < 1:
        raise ValueError(f"attn_implementation={NAME!r}: the attention module's sliding_window must be a positive "
                         f"int or None (config.sliding_window), got {sliding_window!r}")
    return (sliding_window - 1, 0 if causal else sliding_window - 1)


def cu_seqlens(lengths) -> tuple:
    """Sequence lengths -> (cumulative lengths ``[0, l0, l0 + l1, ...]`` (B + 1 ints), the longest length)."""
    cu = [0]
    for n in lengths:
        n = int(n)
        if n < 0:
            raise ValueError(f"sequence lengths must be >= 0, got {list(lengths)}")
        cu.append(cu[-1] + n)
    return cu, max((int(n) for n in lengths), default=0)


def cu_seqlens_from_starts(starts, total: int) -> tuple:
    """The first rows of the sequences of a packed row axis of ``total`` rows (ascending, ``starts[0] == 0``) ->
    (cumulative lengths ``starts + [total]``, the longest length)."""
    starts = [int(s) for s in starts]
    if not starts or starts[0] != 0 or any(b <= a for a, b in zip(starts, starts[1:])) or starts[-1] >= total:
        raise ValueError(f"sequence starts must ascend strictly from 0 below {total}, got {starts}")
    cu = starts + [int(total)]
    return cu, max(b - a for a, b in zip(cu, cu[1:]))


def config_attribute(config, value, word: str) -> str:
    """``"config.<name>"`` for the attribute of ``config`` whose name contains ``word`` and whose value is
    ``value`` (the model setting behind an argument of the attention function), else a generic description."""
    names = [n for n in dir(config) if word in n and not n.startswith("_")] if config is not None else []
    names.sort(key=lambda n: ("att" not in n, n))        # attention settings first
    for name in names:
        try:
            if getattr(config, name) == value:
                return f"config.{name}"
        except Exception:               # a property that raises: not the setting we are looking for
            continue
    return f"the model's {word} setting"


def _unsupported(what: str, setting: str, fix: str) -> NotImplementedError:
    return NotImplementedError(f"attn_implementation={NAME!r} does not support {what} (set by {setting}); {fix}, "
                               f"or load the model with attn_implementation='sdpa' or 'eager'")


def check_call(config, *, dropout, sinks: bool, output_attentions: bool) -> None:
    """Raise for what the kernels cannot compute: attention dropout, attention sinks, attention weights as an
    output."""
    if dropout:
        raise _unsupported(f"attention dropout in training (dropout={dropout!r})",
                           config_attribute(config, dropout, "dropout"),
                           "set it to 0.0 or call model.eval()")
    if sinks:
        raise _unsupported("attention sinks (s_aux)", "the model's architecture",
                           "there is no setting to turn them off")
    if output_attentions:
        raise _unsupported("returning attention weights", "output_attentions=True", "do not ask for them")


def check_head_dims(config, head_dim: int, value_dim: int) -> None:
    if head_dim not in HEAD_DIMS or value_dim not in (head_dim, *VALUE_HEAD_DIMS.get(head_dim, ())):
        setting = config_attribute(config, head_dim, "head_dim") if head_dim not in HEAD_DIMS else \
            "the model's value head dim"
        dims = f"{', '.join(map(str, HEAD_DIMS[:-1]))} or {HEAD_DIMS[-1]}"
        pairs = "".join(f", or {d} with value head dim {v}" for d, vs in VALUE_HEAD_DIMS.items() if d in HEAD_DIMS
                        for v in vs)
        raise _unsupported(f"query/key head dim {head_dim} with value head dim {value_dim} (it needs both equal to "
                           f"{dims}{pairs})", setting, f"use a model whose heads are {dims} wide")


def check_mask(ndim: int, dtype_name: str, floating: bool) -> None:
    """The attention function takes the 2D padding mask that :func:`cupy_dash.transformers.padding_mask` hands
    over (bool or integer 0/1, ``(batch, kv_length)``), or None."""
    if ndim != 2:
        raise _unsupported(f"a {ndim}D attention mask (an arbitrary additive or boolean mask; it takes the 2D "
                           f"padding mask (batch, kv_length) or packed sequences)", "the attention_mask passed to "
                           "the model, or the model's own mask code", "pass a 2D padding mask")
    if floating:
        raise _unsupported(f"a floating-point ({dtype_name}) attention mask (an additive mask)",
                           "the attention_mask passed to the model", "pass a 2D boolean or 0/1 integer padding mask")


def check_mask_overlay(custom_overlay: bool, chunk_size, kv_end: int) -> None:
    """Raise where the model asks its mask function for more than padding: a custom mask overlay
    (``or_mask_function`` / ``and_mask_function``, e.g. bidirectional image tokens), or chunked attention over
    more keys than one chunk."""
    if custom_overlay:
        raise _unsupported("a custom mask overlay (or_mask_function / and_mask_function)",
                           "the model's mask code (e.g. bidirectional attention over image tokens)",
                           "run the model without the inputs that need it")
    if chunk_size is not None and kv_end > chunk_size:
        raise _unsupported(f"chunked attention over {kv_end} keys (chunks of {chunk_size})",
                           "config.attention_chunk_size", "keep sequences within one chunk")


def fp32_error(weight_dtype: str) -> TypeError:
    return TypeError(f"attn_implementation={NAME!r} computes in bfloat16 or float16, and this float32 query has no "
                     f"half-precision target (the model's Linear weights are {weight_dtype}, no autocast): load the "
                     f"model with dtype=torch.bfloat16, or run it under torch.autocast('cuda', dtype=torch.bfloat16)")
