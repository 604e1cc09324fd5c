"""The Hugging Face transformers adapter without a GPU: the sliding-window mapping against transformers' own mask
definitions (brute force over small shapes), the cu_seqlens rules, every error naming its model setting, the import
contract (``import cupy_dash`` imports neither torch nor transformers), and, where torch and transformers are
installed, the registration and the unpadding / packing plans on CPU tensors.
"""
from __future__ import annotations

import importlib.util
import types

import pytest

from cupy_dash import schedule
from cupy_dash.core import transformers_rules as rules
from cupy_dash.cuda import kernels

from fresh_interpreter import run


def cupy_dash_sees(i, j, sq, sk, left, right, causal):
    """docs/api.md: query i sees key j iff i + Sk - Sq - left <= j <= i + Sk - Sq + right (-1 unbounded), and
    j <= i + Sk - Sq when causal."""
    d = i + sk - sq
    return (left < 0 or j >= d - left) and (right < 0 or j <= d + right) and (not causal or j <= d)


def hf_causal_sliding_sees(q_abs, j, config_window):
    """transformers' causal sliding-window mask (Mistral, Qwen2, Gemma): kv > q - sliding_window and kv <= q."""
    return q_abs - config_window < j <= q_abs


def hf_bidirectional_sliding_sees(i, j, config_window):
    """transformers' bidirectional sliding-window mask (ModernBERT): |q - kv| <= config.sliding_window."""
    return abs(i - j) <= config_window


@pytest.mark.parametrize("config_window", [1, 2, 3, 5, 8, 40])
@pytest.mark.parametrize("sq,sk", [(1, 1), (7, 7), (16, 16), (1, 9), (4, 13)])
def test_causal_window_matches_transformers_mask(config_window, sq, sk):
    """Mistral / Qwen2 hand the attention function sliding_window = config.sliding_window; queries are the last
    sq of sk positions (a cache when sq < sk)."""
    left, right = rules.window(config_window, causal=True)
    assert schedule.check_window((left, right), True) == (left, right)
    for i in range(sq):
        for j in range(sk):
            want = hf_causal_sliding_sees(i + sk - sq, j, config_window)
            assert cupy_dash_sees(i, j, sq, sk, left, right, True) == want, (i, j, left, right)


@pytest.mark.parametrize("config_window", [0, 1, 2, 5, 20])
@pytest.mark.parametrize("s", [1, 6, 17])
def test_bidirectional_window_matches_transformers_mask(config_window, s):
    """ModernBERT hands the attention function sliding_window = config.sliding_window + 1."""
    left, right = rules.window(config_window + 1, causal=False)
    assert schedule.check_window((left, right), False) == (left, right)
    for i in range(s):
        for j in range(s):
            assert cupy_dash_sees(i, j, s, s, left, right, False) == hf_bidirectional_sliding_sees(i, j, config_window)


def test_window_without_sliding_window_and_bad_values():
    assert rules.window(None, causal=True) == (-1, -1)
    assert rules.window(None, causal=False) == (-1, -1)
    assert rules.window(4096, causal=True) == (4095, 0)
    for bad in (0, -3, 2.5, True, "8"):
        with pytest.raises(ValueError, match="config.sliding_window"):
            rules.window(bad, causal=True)


def test_cu_seqlens():
    assert rules.cu_seqlens([3, 0, 5]) == ([0, 3, 3, 8], 5)
    assert rules.cu_seqlens([]) == ([0], 0)
    with pytest.raises(ValueError):
        rules.cu_seqlens([2, -1])
    assert rules.cu_seqlens_from_starts([0, 4, 5], 9) == ([0, 4, 5, 9], 4)
    assert rules.cu_seqlens_from_starts([0], 6) == ([0, 6], 6)
    for starts, total in (([1, 3], 5), ([0, 3, 3], 5), ([0, 5], 5), ([], 5), ([0, 4, 2], 6)):
        with pytest.raises(ValueError, match="ascend"):
            rules.cu_seqlens_from_starts(starts, total)


GEMMA2 = types.SimpleNamespace(attn_logit_softcapping=50.0, final_logit_softcapping=30.0, attention_dropout=0.0,
                               head_dim=256)
LLAMA = types.SimpleNamespace(attention_dropout=0.1, hidden_dropout=0.1, head_dim=160)
BERT = types.SimpleNamespace(attention_probs_dropout_prob=0.2, hidden_dropout_prob=0.1, hidden_size=512)


def _call(config, dropout=0.0, sinks=False, output_attentions=False):
    rules.check_call(config, dropout=dropout, sinks=sinks, output_attentions=output_attentions)


def test_errors_name_the_model_setting():
    _call(GEMMA2)                                   # soft-capping is supported: nothing to refuse
    with pytest.raises(NotImplementedError, match=r"dropout=0.1.*config\.attention_dropout.*model\.eval\(\)"):
        _call(LLAMA, dropout=0.1)
    with pytest.raises(NotImplementedError, match=r"config\.attention_probs_dropout_prob"):
        _call(BERT, dropout=0.2)
    with pytest.raises(NotImplementedError, match="the model's dropout setting"):
        _call(None, dropout=0.3)
    with pytest.raises(NotImplementedError, match="attention sinks"):
        _call(LLAMA, sinks=True)
    with pytest.raises(NotImplementedError, match="output_attentions=True"):
        _call(LLAMA, output_attentions=True)
    for message in ("attn_implementation='cupy_dash'", "attn_implementation='sdpa' or 'eager'"):
        with pytest.raises(NotImplementedError, match=message):
            _call(LLAMA, dropout=0.1)


def test_head_dim_and_mask_errors():
    rules.check_head_dims(LLAMA, 64, 64)
    rules.check_head_dims(LLAMA, 96, 96)            # Phi: the head-dim-128 kernels, padded
    rules.check_head_dims(LLAMA, 128, 128)
    rules.check_head_dims(LLAMA, 256, 256)          # Gemma
    assert rules.HEAD_DIMS == kernels.BWD_HEAD_DIMS             # the rules' copy of the backward's head dims
    assert rules.VALUE_HEAD_DIMS == kernels.VALUE_HEAD_DIMS
    with pytest.raises(NotImplementedError, match=r"head dim 160.*64, 96, 128, 192 or 256.*config\.head_dim"):
        rules.check_head_dims(LLAMA, 160, 160)
    with pytest.raises(NotImplementedError, match="value head dim 64"):
        rules.check_head_dims(LLAMA, 128, 64)
    rules.check_mask(2, "torch.bool", False)
    with pytest.raises(NotImplementedError, match="a 4D attention mask"):
        rules.check_mask(4, "torch.bfloat16", True)
    with pytest.raises(NotImplementedError, match=r"floating-point \(torch.float32\)"):
        rules.check_mask(2, "torch.float32", True)
    rules.check_mask_overlay(False, None, 10 ** 6)
    rules.check_mask_overlay(False, 8192, 8192)
    with pytest.raises(NotImplementedError, match="or_mask_function"):
        rules.check_mask_overlay(True, None, 16)
    with pytest.raises(NotImplementedError, match=r"config\.attention_chunk_size"):
        rules.check_mask_overlay(False, 8192, 8193)
    assert "dtype=torch.bfloat16" in str(rules.fp32_error("torch.float32"))


def test_import_cupy_dash_imports_neither_torch_nor_transformers():
    run("""
        import sys
        import cupy_dash, cupy_dash.core.transformers_rules
        assert "torch" not in sys.modules and "transformers" not in sys.modules
        assert "cupy_dash.transformers" not in sys.modules
    """)


def test_adapter_without_torch_is_a_module_not_found_error():
    run("""
        import sys
        sys.modules["torch"] = None
        try:
            import cupy_dash.transformers
        except ModuleNotFoundError as e:
            assert "torch" in str(e), e
        else:
            raise AssertionError("cupy_dash.transformers imported without torch")
    """)


needs_hf = pytest.mark.skipif(importlib.util.find_spec("torch") is None
                              or importlib.util.find_spec("transformers") is None,
                              reason="needs torch and transformers")


@needs_hf
def test_registration_is_idempotent():
    run("""
        import sys
        import cupy_dash.transformers as adapter
        from transformers import AttentionInterface, AttentionMaskInterface
        from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
        fn = ALL_ATTENTION_FUNCTIONS["cupy_dash"]
        assert ALL_MASK_ATTENTION_FUNCTIONS["cupy_dash"] is adapter.padding_mask
        assert adapter.register() == "cupy_dash" and ALL_ATTENTION_FUNCTIONS["cupy_dash"] is fn
        del sys.modules["cupy_dash.transformers"]
        import cupy_dash.transformers
        assert AttentionInterface._global_mapping["cupy_dash"] is not None
        assert AttentionMaskInterface._global_mapping["cupy_dash"] is not None
        adapter.register("cupy_dash_atomic", deterministic=False)
        assert ALL_ATTENTION_FUNCTIONS["cupy_dash_atomic"] is not ALL_ATTENTION_FUNCTIONS["cupy_dash"]
    """)


@needs_hf
def test_padding_mask_and_plans_on_cpu():
    import torch

    import cupy_dash.transformers as adapter
    mask = torch.tensor([[1, 1, 1, 0, 0], [0, 0, 1, 1, 1], [1, 1, 1, 1, 1]], dtype=torch.bool)
    assert adapter.padding_mask(3, 5, 5, attention_mask=torch.ones(3, 5, dtype=torch.bool)) is None
    assert adapter.padding_mask(3, 5, 5, attention_mask=None) is None
    assert torch.equal(adapter.padding_mask(3, 3, 5, attention_mask=mask), mask)
    with pytest.raises(NotImplementedError, match="or_mask_function"):
        adapter.padding_mask(3, 5, 5, attention_mask=mask, use_vmap=True)

    q_rows, cu_q, max_q, k_rows, cu_k, max_k = adapter._padding_plan(mask, 2, True)   # queries: the last 2
    assert cu_k.tolist() == [0, 3, 6, 11] and max_k == 5 and cu_k.dtype == torch.int32
    assert [r.tolist() for r in k_rows] == [[0, 0, 0, 1, 1, 1, 2, 2, 2, 2, 2], [0, 1, 2, 2, 3, 4, 0, 1, 2, 3, 4]]
    assert cu_q.tolist() == [0, 0, 2, 4] and max_q == 2
    assert [r.tolist() for r in q_rows] == [[1, 1, 2, 2], [0, 1, 0, 1]]

    assert adapter._packing_plan(torch.arange(6)[None], 2) is None               # (1, S) broadcast over 2 rows
    cu, longest = adapter._packing_plan(torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2, 3]]), 1)
    assert cu.tolist() == [0, 3, 5, 9] and longest == 4
    cu, longest = adapter._packing_plan(torch.tensor([[2, 3, 2, 3], [0, 1, 2, 3]]), 2)   # restarts at 2 too
    assert cu.tolist() == [0, 2, 4, 8] and longest == 4


@needs_hf
def test_generation_cases_on_cpu():
    """What generate() hands the adapter: a static cache (more key slots than tokens seen; an all-ones mask dropped
    by generate), cross-attention over a padded encoder (every decoder query is one), inference tensors, position
    ids of another rank (multimodal rotary ids), a prefix-LM mask overlay (refused), a quantized model's dtype."""
    import torch

    import cupy_dash.transformers as adapter
    from transformers.masking_utils import and_masks, causal_mask_function, or_masks
    # a static cache of 8 slots after 5 tokens: the keys are the first 5 (no padding, no mask from generate)
    assert adapter.padding_mask(2, 1, 8, q_offset=4, attention_mask=None, device="cpu").shape == (2, 5)
    assert adapter.padding_mask(2, 1, 8, q_offset=torch.tensor(4), attention_mask=None).all()
    assert adapter.padding_mask(2, 3, 8, q_offset=5, attention_mask=None) is None       # all 8 slots seen
    with pytest.raises(NotImplementedError, match="or_mask_function"):
        adapter.padding_mask(2, 4, 4, mask_function=or_masks(causal_mask_function, causal_mask_function))
    assert adapter.padding_mask(2, 4, 4, mask_function=and_masks(causal_mask_function, causal_mask_function)) is None

    encoder = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]], dtype=torch.bool)
    q_rows, cu_q, max_q, _, cu_k, _ = adapter._padding_plan(encoder, 1, False)      # decoding: one query a row
    assert cu_q.tolist() == [0, 1, 2] and max_q == 1 and cu_k.tolist() == [0, 3, 7]
    _, cu_q, max_q, *_ = adapter._padding_plan(encoder, 3, False)                   # teacher forcing
    assert cu_q.tolist() == [0, 3, 6] and max_q == 3

    with torch.inference_mode():
        ids = torch.tensor([[0, 1, 2, 0, 1]])
        assert adapter._packing(ids, 1)[0].tolist() == [0, 3, 5]                    # no version counter: planned
    assert adapter._packing_plan(torch.zeros(3, 2, 5, dtype=torch.long), 2) is None

    module = torch.nn.Module()
    module.config = types.SimpleNamespace(_is_quantized=True, dtype=torch.bfloat16)
    assert adapter._target_dtype(torch.zeros(1), module) == torch.bfloat16
