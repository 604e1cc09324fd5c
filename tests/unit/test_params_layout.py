"""The kernels' parameter blocks on the host: the numpy layouts parsed from kernels_src/params.cuh match the C
structs (checked by compiling offsetof assertions with NVRTC, no GPU), a drifted layout fails that check, the
parser's rules, and the packing of every field of FwdParams / BwdParams.
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from cupy_dash.cuda import jit, kernels, params
from params_helpers import fwd_fields

REAL_KERNEL_DIR = jit.kernel_dir()


@pytest.mark.parametrize("offsetof", ["auto", "intaddr"])
def test_params_layout_matches_c_structs(offsetof):
    src = kernels.params_layout_check_source(offsetof)
    # every field of every struct is checked
    for struct, (dt, _) in kernels.PARAMS_STRUCTS.items():
        for name in dt.names:
            assert f"DASH_OFFSETOF({struct}, {name})" in src
    cubin, log, ok = jit.compile_source(src, "layout_check.cu", [*jit.BASE_OPTIONS, f"-I{REAL_KERNEL_DIR}"])
    assert ok, log
    # BwdParams: four 64-byte-aligned 128-byte tensor maps first, 400 bytes of 8-byte fields, then the compact
    # tables' 64 bytes, the varlen builds' two pointers, tile_columns, the compact varlen builds' three pointers
    # and the eager error record's host mirror, the fold flag and the soft-capping prescale appended (the earlier
    # offsets unchanged: softmax_scale_log2 still ends at 936), then the dk and dv maps at the next 64-byte
    # boundaries and the split columns' six fields; FwdParams likewise ends in the prescale, then the causal launch
    # order's head section
    assert kernels.FWD_PARAMS_DTYPE.itemsize == 704 and kernels.BWD_PARAMS_DTYPE.itemsize == 1408
    bwd = kernels.BWD_PARAMS_DTYPE
    appended = ("col_records", "cta_columns", "cta_col_start", "scan_bounds", "n_first", "columns_per_head",
                "tie_sign", "rank_rule", "cu_seqlens_q", "cu_seqlens_k", "tile_columns", "seg_col_start",
                "seq_n_first", "seq_tile_start", "error_host", "fold", "softcap_prescale")
    pieces = ("cta_pieces", "piece_code", "dkv_pieces", "piece_count", "num_pieces", "num_split_columns")
    assert bwd.names[-25:-8] == appended and bwd.fields["softmax_scale_log2"][1] == 932
    assert [bwd.fields[n][1] for n in appended] == list(range(936, 1072, 8))
    assert bwd.names[-8:-6] == ("tma_dk", "tma_dv") and [bwd.fields[n][1] for n in bwd.names[-8:-6]] == [1088, 1216]
    assert bwd.names[-6:] == pieces and [bwd.fields[n][1] for n in pieces] == list(range(1344, 1392, 8))
    assert kernels.FWD_PARAMS_DTYPE.names[-5:] == ("softcap_prescale", "head_section", "tile_counter", "num_tiles",
                                                   "num_m_blocks")
    assert kernels.PARAMS_STRUCTS["BwdParams"][1] == 64 and kernels.BWD_PARAMS_DTYPE.fields["q"][1] == 512


def test_params_layout_check_detects_drift():
    # The check must fail when the numpy side drifts: swap two fields of FwdParams.
    dt, align = kernels.PARAMS_STRUCTS["FwdParams"]
    names = list(dt.names)
    i, j = names.index("seqlen_q"), names.index("seqlen_k")
    names[i], names[j] = names[j], names[i]
    drifted = np.dtype([(n, dt.fields[n][0]) for n in names], align=True)
    structs = dict(kernels.PARAMS_STRUCTS, FwdParams=(drifted, align))
    _, log, ok = jit.compile_source(kernels.params_layout_check_source(structs=structs), "layout_check.cu",
                                    [*jit.BASE_OPTIONS, f"-I{REAL_KERNEL_DIR}"])
    assert not ok and "offsetof(FwdParams, seqlen_q)" in log


def test_params_parser_reads_declarations_and_rejects_the_unknown():
    text = """
    struct Strides { int64_t batch, row, head; };  // comment
    struct FwdParams { const elem_t* q; float* lse; /* block */ Strides s; int64_t n; float a, b; };
    struct BwdParams { TmaDesc tma_q; int32_t* sem; };
    """
    got = params.parse_structs(text)
    assert got["FwdParams"] == [("q", "ptr"), ("lse", "ptr"), ("s", "strides"), ("n", "i64"), ("a", "f32"),
                                ("b", "f32")]
    assert got["BwdParams"] == [("tma_q", "tma"), ("sem", "ptr")]
    dt, fmt, align = params.layout(got["BwdParams"])
    assert (dt.itemsize, dt.fields["sem"][1], align) == (192, 128, 64)
    with pytest.raises(ValueError, match="unsupported type 'double'"):
        params.parse_structs(text.replace("int64_t n;", "double n;"))
    with pytest.raises(ValueError, match="BwdParams not found"):
        params.parse_structs("struct Strides { int64_t batch, row, head; }; struct FwdParams { float a; };")


def test_pack_fwd_params_bytes():
    p = kernels.pack_fwd_params(**fwd_fields())
    # four 128-byte tensor maps, lse, seven int64, two floats, three varlen pointers; padded to the maps'
    # 64-byte alignment
    assert p.shape == (1,) and p.dtype == kernels.FWD_PARAMS_DTYPE and p.nbytes == 704
    raw = p.tobytes()
    assert raw[:512] == b"".join(bytes([i]) * 128 for i in (1, 2, 3, 4))
    words = np.frombuffer(raw[512:576], dtype="<i8")
    assert list(words) == [0x5000, 2, 300, 500, 8, 2, -1, 7]
    tail = np.frombuffer(raw[576:584], dtype="<f4")
    assert tail[0] == np.float32(0.125) and tail[1] == np.float32(0.125 * 1.4426950408889634)
    assert list(np.frombuffer(raw[584:608], dtype="<u8")) == [0x6000, 0x7000, 0x8000]
    assert np.frombuffer(raw[616:624], dtype="<i8")[0] == 11      # head_section, after softcap_prescale's 4 bytes


def test_pack_params_errors():
    fields = fwd_fields()
    del fields["num_heads_kv"]
    with pytest.raises(TypeError, match="num_heads_kv"):
        kernels.pack_fwd_params(**fields)
    with pytest.raises(TypeError, match="bogus"):
        kernels.pack_fwd_params(**fwd_fields(bogus=1))
    with pytest.raises(TypeError, match="FwdParams.lse"):
        kernels.pack_fwd_params(**fwd_fields(lse=1.5))
    with pytest.raises(ValueError, match="FwdParams.tma_o: a tensor map is 128 bytes"):
        kernels.pack_fwd_params(**fwd_fields(tma_o=b"short"))
    with pytest.raises(TypeError, match="dq"):
        kernels.pack_bwd_params(**fwd_fields())


def test_pack_bwd_params_every_field():
    dt = kernels.BWD_PARAMS_DTYPE
    fields, expect = {}, {}
    counter = itertools.count(1)
    for name in dt.names:
        kind = dt.fields[name][0]
        if kind.names:                                      # Strides
            fields[name] = (next(counter), next(counter), next(counter))
        elif kind.kind == "V":                              # tensor map
            fields[name] = bytes([next(counter) % 256]) * 128
        elif kind.kind == "f":
            fields[name] = 0.5 * next(counter)
        else:
            fields[name] = next(counter) * 16
        expect[name] = fields[name]
    fields["error"] = None                                  # None -> null pointer
    expect["error"] = 0
    fields["tma_v"] = None                                  # None -> all-zero map
    expect["tma_v"] = bytes(128)
    p = kernels.pack_bwd_params(**fields)
    assert p.nbytes == 1408
    with pytest.raises(ValueError, match="BwdParams.tma_q: a tensor map is 128 bytes"):
        kernels.pack_bwd_params(**dict(fields, tma_q=b"short"))
    with pytest.raises(ValueError, match="q_stride"):
        kernels.pack_bwd_params(**dict(fields, q_stride=(1, 2)))
    for name in dt.names:
        got = p[name][0]
        want = expect[name]
        if isinstance(want, tuple):
            assert tuple(int(x) for x in got) == want, name
        elif isinstance(want, bytes):
            assert bytes(got) == want, name
        else:
            assert got == (np.float32(want) if dt.fields[name][0].kind == "f" else want), name
