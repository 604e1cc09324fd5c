"""CPU tests of the C XLA FFI handler of cupy_dash.jax (``CUPY_DASH_JAX_FFI=1``; cupy_dash/jax/xla_ffi.c, _ffi.py).

* ABI: our declarations of the XLA FFI structs match jaxlib's ``c_api.h`` (compiled static_asserts; needs jaxlib's
  headers and a C compiler);
* the handler inside XLA (JAX's CPU backend, plan in inspect mode): XLA accepts its metadata, the attribute and
  the argument / result buffers are read right, addresses land where the plan says; a device without a plan is
  a clear error (the plans themselves: tests/unit/test_launch_plans.py);
* lowering: the custom call target and its ``slots`` attribute, the vmap fold.
What needs a GPU (stream, tensor-map patching, cuLaunchKernel) is tested in tests/gpu/test_gpu_jax_jit.py.
"""
from __future__ import annotations

import pathlib
import re
import shutil
import struct
import subprocess
import types

import numpy as np
import pytest

from cupy_dash.cuda import plans, tensormap
from fastpath_fakes import backward_launch

pytest.importorskip("jax")
xla_ffi = pytest.importorskip("cupy_dash.jax._xla_ffi", reason="the extension is not built (setup.py build_ext)")
from cupy_dash.jax import _ffi as _jax_ffi, ops as jax_ops  # noqa: E402


def fake_map(ptr, dtype, shape, strides, box_rows, name="tensor", box_panels=None):
    """Stands in for cuTensorMapEncodeTiled (no driver here): 128 bytes that depend on every argument."""
    return struct.pack("<Q", ptr) + repr((dtype, tuple(shape), tuple(strides), box_rows, box_panels)).encode()[:120] \
        .ljust(120, b"\0")


@pytest.fixture
def no_driver(monkeypatch):
    monkeypatch.setattr(tensormap, "bhsd_map", fake_map)
    monkeypatch.setattr(plans.jit, "load", lambda spec: types.SimpleNamespace(ptr=0))


def problem(B=2, Sq=200, Sk=320, H=4, Hkv=2, D=64):
    return types.SimpleNamespace(B=B, Sq=Sq, Sk=Sk, H=H, Hkv=Hkv, D=D, Dv=D, dtype="bfloat16", scale=0.125,
                                 softcap=0.0)


def strides(shape):
    _, S, H, D = shape
    return (S * H * D, H * D, D)


# ------------------------------------------------------------------------------------------------------------
# ABI
# ------------------------------------------------------------------------------------------------------------
ABI_CHECK = """
#include "xla/ffi/api/c_api.h"
#include "xla_ffi.h"
#define SAME(a, fa, b, fb) _Static_assert(offsetof(a, fa) == offsetof(b, fb) && \\
    sizeof(((a*)0)->fa) == sizeof(((b*)0)->fb), #a "." #fa);
SAME(XLA_FFI_Extension_Base, type, dash_ffi_extension, type)
SAME(XLA_FFI_Extension_Base, next, dash_ffi_extension, next)
SAME(XLA_FFI_Api_Version, minor_version, dash_ffi_version, minor_version)
SAME(XLA_FFI_Metadata, api_version, dash_ffi_metadata, api_version)
SAME(XLA_FFI_Metadata, traits, dash_ffi_metadata, traits)
SAME(XLA_FFI_Metadata_Extension, metadata, dash_ffi_metadata_extension, metadata)
SAME(XLA_FFI_Error_Create_Args, message, dash_ffi_error_create_args, message)
SAME(XLA_FFI_Error_Create_Args, errc, dash_ffi_error_create_args, errc)
SAME(XLA_FFI_Stream_Get_Args, ctx, dash_ffi_stream_get_args, ctx)
SAME(XLA_FFI_Stream_Get_Args, stream, dash_ffi_stream_get_args, stream)
SAME(XLA_FFI_DeviceOrdinal_Get_Args, device_ordinal, dash_ffi_ordinal_get_args, device_ordinal)
SAME(XLA_FFI_Api, XLA_FFI_Error_Create, dash_ffi_api, error_create)
SAME(XLA_FFI_Api, XLA_FFI_Stream_Get, dash_ffi_api, stream_get)
SAME(XLA_FFI_Api, XLA_FFI_DeviceOrdinal_Get, dash_ffi_api, device_ordinal_get)
SAME(XLA_FFI_Buffer, data, dash_ffi_buffer, data)
SAME(XLA_FFI_Array, dtype, dash_ffi_array, dtype)
SAME(XLA_FFI_Array, size, dash_ffi_array, size)
SAME(XLA_FFI_Array, data, dash_ffi_array, data)
SAME(XLA_FFI_ByteSpan, len, dash_ffi_bytes, len)
SAME(XLA_FFI_Args, size, dash_ffi_list, size)
SAME(XLA_FFI_Args, args, dash_ffi_list, items)
SAME(XLA_FFI_Rets, rets, dash_ffi_list, items)
SAME(XLA_FFI_Attrs, types, dash_ffi_attrs, types)
SAME(XLA_FFI_Attrs, names, dash_ffi_attrs, names)
SAME(XLA_FFI_Attrs, attrs, dash_ffi_attrs, attrs)
SAME(XLA_FFI_CallFrame, api, dash_ffi_call_frame, api)
SAME(XLA_FFI_CallFrame, ctx, dash_ffi_call_frame, ctx)
SAME(XLA_FFI_CallFrame, stage, dash_ffi_call_frame, stage)
SAME(XLA_FFI_CallFrame, args, dash_ffi_call_frame, args)
SAME(XLA_FFI_CallFrame, rets, dash_ffi_call_frame, rets)
SAME(XLA_FFI_CallFrame, attrs, dash_ffi_call_frame, attrs)
_Static_assert(XLA_FFI_Extension_Metadata == DASH_FFI_EXTENSION_METADATA, "metadata extension");
_Static_assert(XLA_FFI_ExecutionStage_EXECUTE == DASH_FFI_STAGE_EXECUTE, "execute stage");
_Static_assert(XLA_FFI_AttrType_ARRAY == DASH_FFI_ATTR_ARRAY, "array attribute");
_Static_assert(XLA_FFI_DataType_S64 == DASH_FFI_S64, "s64");
_Static_assert(XLA_FFI_HANDLER_TRAITS_COMMAND_BUFFER_COMPATIBLE == DASH_FFI_TRAIT_COMMAND_BUFFER_COMPATIBLE, "trait");
_Static_assert(XLA_FFI_Error_Code_INVALID_ARGUMENT == DASH_FFI_INVALID_ARGUMENT, "invalid argument");
_Static_assert(XLA_FFI_Error_Code_FAILED_PRECONDITION == DASH_FFI_FAILED_PRECONDITION, "failed precondition");
_Static_assert(XLA_FFI_Error_Code_INTERNAL == DASH_FFI_INTERNAL, "internal");
_Static_assert(XLA_FFI_API_MAJOR == DASH_FFI_API_MAJOR && XLA_FFI_API_MINOR >= DASH_FFI_API_MINOR, "version");
"""


def test_declared_abi_matches_jaxlib_header(tmp_path):
    import jax
    import cupy_dash
    include = jax.ffi.include_dir()
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None or not (pathlib.Path(include) / "xla/ffi/api/c_api.h").exists():
        pytest.skip("no C compiler, or jaxlib without its FFI headers")
    src = tmp_path / "abi_check.c"
    header = (pathlib.Path(include) / "xla/ffi/api/c_api.h").read_text()
    # jaxlib 0.11 renamed the call frame's extension header XLA_FFI_Extension_Base to XLA_FFI_InternalExtension
    # (same fields; XLA_FFI_Extension is now another struct, of the public extension API)
    base = "XLA_FFI_Extension_Base" if "XLA_FFI_Extension_Base" in header else "XLA_FFI_InternalExtension"
    src.write_text(ABI_CHECK.replace("XLA_FFI_Extension_Base", base))
    here = pathlib.Path(cupy_dash.__file__).parent
    run = subprocess.run([cc, "-std=c11", "-fsyntax-only", f"-I{include}", f"-I{here / 'jax'}", f"-I{here / 'cuda'}",
                          str(src)],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr


# ------------------------------------------------------------------------------------------------------------
# the handler inside XLA (CPU backend, inspect mode: the patched block is written to the last result)
# ------------------------------------------------------------------------------------------------------------
TEST_TARGET = "cupy_dash_launch_cpu_test"


@pytest.fixture(scope="module")
def cpu_target():
    import jax
    jax.ffi.register_ffi_target(TEST_TARGET, xla_ffi.handler(), platform="cpu")
    return jax


def test_handler_writes_addresses_where_the_plan_says(cpu_target, no_driver):
    jax = cpu_target
    with jax.default_device(jax.devices("cpu")[0]):     # the CPU backend, also where a GPU is the default
        _handler_writes_addresses(jax)


def _handler_writes_addresses(jax):
    jnp = jax.numpy
    p = problem(B=1, Sq=64, Sk=128, H=2, Hkv=1, D=64)
    c = backward_launch(p)
    qs, kvs = strides((p.B, p.Sq, p.H, p.D)), strides((p.B, p.Sk, p.Hkv, p.D))
    parts = plans.backward(c, (qs, kvs, kvs, qs, qs), plans.BWD_BUFFERS[:10], error=(0x8000, 0))
    params = parts.params
    slot = xla_ffi.register_plan(plans.pack_plan([(0, (1,), 128, 0)] * 3, params, parts.pointers, parts.maps,
                                                 flags=plans.PLAN_INSPECT))
    q, dout, out = (jnp.full((p.B, p.Sq, p.H, p.D), i, jnp.bfloat16) for i in range(3))
    k, v = (jnp.full((p.B, p.Sk, p.Hkv, p.D), i, jnp.bfloat16) for i in range(2))
    lse = jnp.zeros((p.B, p.H, p.Sq), jnp.float32)
    results = (jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct(k.shape, k.dtype),
               jax.ShapeDtypeStruct(v.shape, v.dtype), jax.ShapeDtypeStruct((c.work_bytes,), np.uint8),
               jax.ShapeDtypeStruct((params.dtype.itemsize,), np.uint8))
    call = jax.ffi.ffi_call(TEST_TARGET, results)
    *_, block = call(dout, q, k, v, out, lse, slots=_jax_ffi.slots_of([slot]))
    got = np.frombuffer(np.asarray(block).tobytes(), dtype=params.dtype)
    for name, x in (("dout", dout), ("q", q), ("k", k), ("v", v), ("out", out), ("lse", lse)):
        assert int(got[name][0]) == x.unsafe_buffer_pointer(), name
    for name, x in (("tma_q", q), ("tma_k", k), ("tma_v", v), ("tma_do", dout)):   # inspect: the address in the
        assert got[name].tobytes()[:8] == struct.pack("<Q", x.unsafe_buffer_pointer()), name   # first 8 bytes
        assert got[name].tobytes()[8:] == params[name].tobytes()[8:], name
    base = int(got["lse_log2"][0])
    for field, k_ in (("dpsum", 1), ("dq_accum", 2), ("dq_semaphore", 3)):
        assert int(got[field][0]) - base == c.offsets[k_] - c.offsets[0], field
    assert len({int(got[f][0]) for f in ("dq", "dk", "dv", "lse_log2")}) == 4
    for field in ("visits", "error", "q_stride", "num_m_blocks", "softmax_scale"):
        assert got[field].tobytes() == params[field].tobytes(), field       # untouched
    with pytest.raises(Exception, match="not prepared for device 0 when it was traced"):
        jax.block_until_ready(call(dout, q, k, v, out, lse, slots=_jax_ffi.slots_of([-1])))
    other_process = np.array([slot, _jax_ffi.slots_of([])[0] ^ 2], np.int64)    # another process's token
    with pytest.raises(Exception, match="compiled in another process"):
        jax.block_until_ready(call(dout, q, k, v, out, lse, slots=other_process))


def test_ffi_lowering_and_vmap_fold(monkeypatch):
    import jax
    import cupy_dash.jax as cj
    monkeypatch.setenv("CUPY_DASH_JAX_FFI", "1")
    jnp = jax.numpy
    q, k = jax.ShapeDtypeStruct((3, 2, 256, 4, 64), jnp.bfloat16), jax.ShapeDtypeStruct((3, 2, 384, 2, 64),
                                                                                         jnp.bfloat16)

    def loss(q, k, v):
        return jnp.sum(cj.attention(q, k, v, causal=True).astype(jnp.float32))
    text = jax.jit(jax.vmap(jax.grad(loss, argnums=(0, 1, 2)))).trace(q, k, k).lower(
        lowering_platforms=("cuda",)).as_text()
    calls = re.findall(r"custom_call @(\w+)\((.*?)\).*?slots = (.*?)[,}].*?: \((.*?)\) ->", text)
    assert [name for name, *_ in calls] == [_jax_ffi.TARGET] * 2, calls
    assert all("tensor<6x256x4x64xbf16>" in operands for *_, operands in calls)      # N * B folded
    grads = jax.eval_shape(jax.vmap(jax.grad(loss, argnums=(0, 1, 2))), q, k, k)
    assert [g.shape for g in grads] == [q.shape, k.shape, k.shape]


def test_the_c_handler_is_the_default_where_built(monkeypatch):
    monkeypatch.delenv("CUPY_DASH_JAX_FFI", raising=False)
    assert jax_ops._use_ffi() is True                # this module runs only where cupy_dash.jax._xla_ffi is built
    monkeypatch.setenv("CUPY_DASH_JAX_FFI", "0")
    assert jax_ops._use_ffi() is False
    monkeypatch.setenv("CUPY_DASH_JAX_FFI", "1")
    assert jax_ops._use_ffi() is True


@pytest.mark.parametrize("lengths", ["host", "device"])
def test_varlen_calls_go_through_the_c_handler_but_the_backward_with_device_lengths(monkeypatch, lengths):
    """attention_varlen under jit(grad) with the C handler: host lengths, both passes its custom calls (their
    tables and cu_seqlens are fixed at trace time); device lengths, the forward (it reads them on the GPU) but not
    the backward, a Python callback that reads them back when it runs."""
    import jax
    import cupy_dash.jax as cj
    monkeypatch.setenv("CUPY_DASH_JAX_FFI", "1")
    jnp = jax.numpy
    cu_q, cu_k = np.array([0, 100, 100, 300], np.int32), np.array([0, 200, 260, 500], np.int32)
    q, k = jax.ShapeDtypeStruct((300, 4, 64), jnp.bfloat16), jax.ShapeDtypeStruct((500, 2, 64), jnp.bfloat16)

    def loss(q, k, v, cq, ck):
        return jnp.sum(cj.attention_varlen(q, k, v, cq, ck, 200, 240, causal=True).astype(jnp.float32))
    if lengths == "host":
        f = jax.jit(jax.grad(lambda q, k, v: loss(q, k, v, cu_q, cu_k), argnums=(0, 1, 2)))
        text = f.trace(q, k, k).lower(lowering_platforms=("cuda",)).as_text()
    else:
        cu = jax.ShapeDtypeStruct((4,), jnp.int32)
        text = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).trace(q, k, k, cu, cu).lower(
            lowering_platforms=("cuda",)).as_text()
    targets = re.findall(r"custom_call @(\w+)\(", text)
    assert len(targets) == 2 and targets[0] == _jax_ffi.TARGET, targets
    assert (targets[1] == _jax_ffi.TARGET) == (lengths == "host"), targets
