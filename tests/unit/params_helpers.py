"""The forward's parameter fields with recognisable values, for the tests that pack FwdParams
(tests/unit/test_params_layout.py, and the GPU echo test of tests/unit/test_jit.py)."""


def fwd_fields(**over):
    """Every FwdParams field (distinct values; ``over`` replaces some) as pack_fwd_params takes them."""
    fields = dict(tma_q=b"\x01" * 128, tma_k=b"\x02" * 128, tma_v=b"\x03" * 128, tma_o=b"\x04" * 128, lse=0x5000,
                  batch=2, seqlen_q=300, seqlen_k=500, num_heads=8, num_heads_kv=2, window_left=-1,
                  window_right=7, cu_seqlens_q=0x6000, cu_seqlens_k=0x7000, out=0x8000, softmax_scale=0.125,
                  softmax_scale_log2=0.125 * 1.4426950408889634, softcap_prescale=0.0,
                  head_section=11, tile_counter=0, num_tiles=0, num_m_blocks=0)
    fields.update(over)
    return fields
