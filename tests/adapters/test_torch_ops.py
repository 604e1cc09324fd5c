"""The torch ops of ``cupy_dash.torch`` on the CPU (skipped without torch): registration and schemas, the fake
implementations' outputs (FakeTensorMode and the meta device), their argument checks, the real ops' argument
checks on CPU tensors (raised before any GPU work), and a ``torch.compile(fullgraph=True)`` trace of forward and
backward on the meta device whose graphs hold exactly the two ops. GPU behaviour: tests/gpu/test_gpu_torch_ops.py.
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

import cupy_dash  # noqa: E402
from cupy_dash.core import api  # noqa: E402
import cupy_dash.torch as dash_torch  # noqa: E402

BF16, FP16 = torch.bfloat16, torch.float16
OPS = torch.ops.cupy_dash


def shapes(B=2, Sq=96, Sk=160, H=4, Hkv=4, D=64):
    return (B, Sq, H, D), (B, Sk, Hkv, D), (B, H, Sq)


def fwd_inputs(device, dtype=BF16, requires_grad=False, **kw):
    q_shape, kv_shape, _ = shapes(**kw)
    return tuple(torch.empty(s, device=device, dtype=dtype, requires_grad=requires_grad)
                 for s in (q_shape, kv_shape, kv_shape))


def bwd_inputs(device, dtype=BF16, **kw):
    q_shape, kv_shape, lse_shape = shapes(**kw)
    q, k, v = fwd_inputs(device, dtype, **kw)
    do, out = torch.empty(q_shape, device=device, dtype=dtype), torch.empty(q_shape, device=device, dtype=dtype)
    return do, q, k, v, out, torch.empty(lse_shape, device=device, dtype=torch.float32)


def raises(exc, call, *needles):
    with pytest.raises(exc) as info:
        call()
    for needle in needles:
        assert needle in str(info.value), f"{needle!r} not in {str(info.value)!r}"


# --------------------------------------------------------------------------------------------------------------
# registration
# --------------------------------------------------------------------------------------------------------------
def test_ops_are_registered_with_their_schemas():
    # torch versions print inferred int arguments as "int" or "SymInt"
    # ... and a float default of 0 as "0." or "0.0"
    fwd = str(OPS.attention_forward.default._schema).replace("SymInt ", "int ").replace("=0.0", "=0.")
    bwd = str(OPS.attention_backward.default._schema).replace("SymInt ", "int ").replace("=0.0", "=0.")
    assert fwd == ("cupy_dash::attention_forward(Tensor q, Tensor k, Tensor v, bool causal=False, "
                   "float? softmax_scale=None, str schedule=\"auto\", bool deterministic=True, "
                   "int window_left=-1, int window_right=-1, float softcap=0.) -> (Tensor, Tensor)")
    assert bwd == ("cupy_dash::attention_backward(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, "
                   "Tensor lse, bool causal=False, float? softmax_scale=None, str schedule=\"auto\", "
                   "bool deterministic=True, int window_left=-1, int window_right=-1, float softcap=0.) -> "
                   "(Tensor, Tensor, Tensor)")
    # neither op mutates or aliases its inputs
    for schema in (OPS.attention_forward.default._schema, OPS.attention_backward.default._schema):
        assert not any(a.alias_info for a in (*schema.arguments, *schema.returns))


def test_lazy_attribute_is_the_registered_module():
    assert cupy_dash.torch is dash_torch
    assert cupy_dash.torch.attention is dash_torch.attention


# --------------------------------------------------------------------------------------------------------------
# fake implementations
# --------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [BF16, FP16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("Hkv", [4, 2, 1], ids=["mha", "gqa2", "mqa"])
def test_fake_outputs(dtype, D, Hkv):
    with FakeTensorMode():
        do, q, k, v, out, lse = bwd_inputs("cuda", dtype, Sq=96, Sk=160, H=4, Hkv=Hkv, D=D)
        o, l = OPS.attention_forward(q, k, v, True, None, "auto", True)
        dq, dk, dv = OPS.attention_backward(do, q, k, v, out, lse, True, 0.125, "shift", True)
    assert (o.shape, o.dtype, o.stride(), o.device.type) == ((2, 96, 4, D), dtype, (96 * 4 * D, 4 * D, D, 1), "cuda")
    assert (l.shape, l.dtype, l.stride()) == ((2, 4, 96), torch.float32, (4 * 96, 96, 1))
    assert (dq.shape, dq.dtype, dq.stride()) == ((2, 96, 4, D), dtype, o.stride())
    for g in (dk, dv):      # GQA passes through: (B, Sk, Hkv, D), contiguous, dtype of q
        assert (g.shape, g.dtype, g.stride()) == ((2, 160, Hkv, D), dtype, (160 * Hkv * D, Hkv * D, D, 1))


def test_fake_output_of_strided_input_is_contiguous():
    with FakeTensorMode():
        # q, k, v as views into a packed (B, S, 3, H, D) qkv tensor: strides (S*3*H*D, 3*H*D, D, 1)
        B, S, H, D = 2, 64, 4, 64
        q, k, v = (torch.empty_strided((B, S, H, D), (S * 3 * H * D, 3 * H * D, D, 1), device="cuda",
                                       dtype=BF16) for _ in range(3))
        o, l = OPS.attention_forward(q, k, v)
    assert o.stride() == (S * H * D, H * D, D, 1) and l.shape == (B, H, S)


def test_meta_device_gives_shapes():
    q, k, v = fwd_inputs("meta", Hkv=2)
    o, l = OPS.attention_forward(q, k, v, False)
    assert o.shape == q.shape and l.shape == (2, 4, 96) and o.device.type == "meta"


# argument checks of the fake implementations: the messages of cupy_dash.core.api, naming the argument
def _fake_call(case):
    do, q, k, v, out, lse = bwd_inputs("cuda")

    def fwd(**kw):
        a = dict(q=q, k=k, v=v, causal=False, softmax_scale=None, schedule="auto")
        a.update(kw)
        return OPS.attention_forward(a["q"], a["k"], a["v"], a["causal"], a["softmax_scale"], a["schedule"])

    def bwd(**kw):
        a = dict(do=do, q=q, k=k, v=v, out=out, lse=lse)
        a.update(kw)
        return OPS.attention_backward(a["do"], a["q"], a["k"], a["v"], a["out"], a["lse"])

    cuda = dict(device="cuda", dtype=BF16)
    return {
        "dtype": lambda: fwd(q=q.float()),
        "rank": lambda: fwd(q=torch.empty(96, 4, 64, **cuda)),
        "k_shape": lambda: fwd(k=torch.empty(2, 160, 4, 128, **cuda)),
        "v_shape": lambda: fwd(v=torch.empty(2, 150, 4, 64, **cuda)),
        "head_dim": lambda: fwd(q=torch.empty(2, 96, 4, 32, **cuda), k=torch.empty(2, 160, 4, 32, **cuda),
                                v=torch.empty(2, 160, 4, 32, **cuda)),
        "heads": lambda: fwd(k=torch.empty(2, 160, 3, 64, **cuda), v=torch.empty(2, 160, 3, 64, **cuda)),
        "scale": lambda: fwd(softmax_scale=-1.0),
        "schedule": lambda: fwd(schedule="nope"),
        "stride": lambda: fwd(q=torch.empty_strided((2, 96, 4, 64), (96 * 4 * 64, 4 * 64, 64, 2), **cuda)),
        "device": lambda: fwd(k=torch.empty(2, 160, 4, 64, device="cpu", dtype=BF16)),
        "lse_dtype": lambda: bwd(lse=lse.half()),
        "lse_shape": lambda: bwd(lse=torch.empty(2, 96, 4, device="cuda", dtype=torch.float32)),
        "do_shape": lambda: bwd(do=torch.empty(2, 95, 4, 64, **cuda)),
        "out_dtype": lambda: bwd(out=out.half()),
    }


_FAKE_ERRORS = {
    "dtype": (ValueError, "q:", "float32"), "rank": (ValueError, "q:", "4-D"), "k_shape": (ValueError, "k:"),
    "v_shape": (ValueError, "v:"), "head_dim": (NotImplementedError, "q:", "head dim"),
    "heads": (ValueError, "k:", "Hkv=3"), "scale": (ValueError, "softmax_scale"),
    "schedule": (ValueError, "schedule", "'nope'"), "stride": (ValueError, "q:", "contiguous"),
    "device": (ValueError, "k:", "CUDA"), "lse_dtype": (ValueError, "lse:", "float32"),
    "lse_shape": (ValueError, "lse:", "(B, H, Sq)"), "do_shape": (ValueError, "do:"),
    "out_dtype": (ValueError, "out:", "float16"),
}


@pytest.mark.parametrize("case", list(_FAKE_ERRORS))
def test_fake_argument_errors(case):
    exc, *needles = _FAKE_ERRORS[case]
    with FakeTensorMode():
        raises(exc, _fake_call(case)[case], *needles)


def test_fake_leaves_the_gqa_backward_decision_to_the_real_op():
    """The fake backward passes GQA shapes through; whether the kernels support them is decided at run time."""
    with FakeTensorMode():
        do, q, k, v, out, lse = bwd_inputs("cuda", Hkv=2)
        dq, dk, dv = OPS.attention_backward(do, q, k, v, out, lse)
    assert dk.shape == k.shape and dv.shape == v.shape


# --------------------------------------------------------------------------------------------------------------
# the real ops and the public wrapper on CPU tensors: validation errors, raised before any GPU work
# --------------------------------------------------------------------------------------------------------------
@pytest.fixture
def no_gpu_work(monkeypatch):
    """Every GPU entry point of cupy_dash raises AssertionError."""
    from cupy_dash.core import interop
    from cupy_dash.cuda import kernels

    def boom(*args, **kwargs):
        raise AssertionError("GPU work started before the error")
    # (interop.capturing runs first on every call: for CPU tensors it answers False without the GPU)
    for mod, name in ((interop, "caller_stream"), (interop, "to_cupy"), (kernels, "launch"),
                      (kernels, "max_resident_ctas"), (api, "acquire_slot"), (api, "_new")):
        monkeypatch.setattr(mod, name, boom)


def test_real_ops_reject_cpu_tensors(no_gpu_work):
    q, k, v = fwd_inputs("cpu")
    raises(ValueError, lambda: OPS.attention_forward(q, k, v), "q:", "CUDA device", "cpu")
    do, q, k, v, out, lse = bwd_inputs("cpu")
    raises(ValueError, lambda: OPS.attention_backward(do, q, k, v, out, lse), "CUDA device")


def test_real_ops_check_arguments_before_the_device(no_gpu_work):
    q, k, v = fwd_inputs("cpu")
    raises(ValueError, lambda: OPS.attention_forward(q[0], k, v), "q:", "4-D")
    raises(ValueError, lambda: OPS.attention_forward(q, k, v, False, None, "bogus"), "schedule", "'bogus'")
    raises(ValueError, lambda: OPS.attention_forward(q, k, v, False, float("nan")), "softmax_scale")
    do, q, k, v, out, lse = bwd_inputs("cpu")
    raises(ValueError, lambda: OPS.attention_backward(do, q, k, v, out, lse[:, :, :-1]), "lse:", "(B, H, Sq)")
    raises(ValueError, lambda: OPS.attention_backward(do, q, k, v, out, lse, False, None, "x"), "schedule")


def test_public_wrapper_checks_its_arguments(no_gpu_work):
    q, k, v = fwd_inputs("cpu", requires_grad=True)
    raises(ValueError, lambda: dash_torch.attention(q, k, v, schedule="fastest"), "schedule", "'fastest'")
    raises(ValueError, lambda: dash_torch.attention(q, k, v, softmax_scale="big"), "softmax_scale", "'big'")
    raises(ValueError, lambda: dash_torch.attention(q, k, v, softmax_scale=0.0), "softmax_scale")
    raises(ValueError, lambda: dash_torch.attention(q, k, v), "q:", "CUDA device")
    raises(ValueError, lambda: cupy_dash.attention(q, k, v), "q:", "CUDA device")   # routed through the op


# --------------------------------------------------------------------------------------------------------------
# torch.compile: one graph, the two ops, traced on the meta device (the real kernels need a GPU)
# --------------------------------------------------------------------------------------------------------------
def test_compile_fullgraph_traces_forward_and_backward_ops():
    from torch._dynamo.backends.common import aot_autograd
    from functorch.compile import make_boxed_func

    graphs = []

    def grab(gm, example_inputs):
        graphs.append(gm)
        return make_boxed_func(gm.forward)

    def f(q, k, v):
        return dash_torch.attention(q, k, v, causal=True, softmax_scale=0.1, schedule="shift", deterministic=False)

    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, backend=aot_autograd(fw_compiler=grab, bw_compiler=grab))
    q, k, v = fwd_inputs("meta", requires_grad=True, Hkv=2)
    out = compiled(q, k, v)
    assert out.shape == q.shape
    out.backward(torch.empty_like(out))
    assert q.grad.shape == q.shape and k.grad.shape == k.shape and v.grad.shape == v.shape
    assert len(graphs) == 2
    fw_targets = [n.target for n in graphs[0].graph.nodes if n.op == "call_function"]
    bw_targets = [n.target for n in graphs[1].graph.nodes if n.op == "call_function"]
    assert OPS.attention_forward.default in fw_targets and OPS.attention_backward.default not in fw_targets
    assert OPS.attention_backward.default in bw_targets
    bw = next(n for n in graphs[1].graph.nodes if n.target is OPS.attention_backward.default)
    assert bw.args[6:10] == (True, 0.1, "shift", False)  # the forward's options reach the backward op
    assert tuple(bw.args[10:]) in ((), (-1, 0), (-1, -1))  # and the window (defaults may be left out)
    torch._dynamo.reset()


def test_lse_is_not_differentiable():
    q, k, v = fwd_inputs("meta", requires_grad=True)
    out, lse = OPS.attention_forward(q, k, v)
    assert out.requires_grad and not lse.requires_grad


# --------------------------------------------------------------------------------------------------------------
# varlen ops (cupy_dash/torch/varlen.py): schemas, fake shapes, argument checks, autograd on the meta device
# --------------------------------------------------------------------------------------------------------------
def varlen_inputs(device, total_q=300, total_k=500, H=4, Hkv=2, D=64, requires_grad=False):
    q = torch.empty((total_q, H, D), device=device, dtype=BF16, requires_grad=requires_grad)
    k, v = (torch.empty((total_k, Hkv, D), device=device, dtype=BF16, requires_grad=requires_grad)
            for _ in range(2))
    cu_q = torch.tensor([0, 100, total_q], dtype=torch.int32, device=device)
    cu_k = torch.tensor([0, 200, total_k], dtype=torch.int32, device=device)
    return q, k, v, cu_q, cu_k


def test_varlen_ops_registered_and_fake_shapes():
    fwd = str(OPS.attention_forward_varlen.default._schema).replace("SymInt ", "int ")
    assert fwd.startswith("cupy_dash::attention_forward_varlen(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, "
                          "Tensor cu_seqlens_k, int max_seqlen_q, int max_seqlen_k, bool causal=False")
    q, k, v, cu_q, cu_k = varlen_inputs("meta")                 # meta tensors run the fake implementations
    out, lse = OPS.attention_forward_varlen(q, k, v, cu_q, cu_k, 200, 300, True)
    assert out.shape == q.shape and lse.shape == (4, 300) and lse.dtype == torch.float32
    dq, dk, dv = OPS.attention_backward_varlen(out, q, k, v, out, lse, cu_q, cu_k, 200, 300, True)
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
    with pytest.raises(ValueError, match="window: right=3 contradicts causal=True"):
        OPS.attention_forward_varlen(q, k, v, cu_q, cu_k, 200, 300, True, None, "auto", True, -1, 3)
    with pytest.raises(ValueError, match="lse: expected a 2-D tensor"):
        OPS.attention_backward_varlen(out, q, k, v, out, lse[None], cu_q, cu_k, 200, 300)


def test_varlen_real_ops_check_arguments_before_the_device(no_gpu_work):
    q, k, v, cu_q, cu_k = varlen_inputs("cpu")
    raises(ValueError, lambda: OPS.attention_forward_varlen(q, k, v, cu_q, cu_k, 200, 300), "CUDA device")
    raises(ValueError, lambda: OPS.attention_forward_varlen(q[None], k, v, cu_q, cu_k, 200, 300), "q:", "3-D")
    lse = torch.empty((4, 300), dtype=torch.float32)
    raises(ValueError, lambda: OPS.attention_backward_varlen(q, q, k, v, q, lse, cu_q, cu_k, 50, 300),
           "cu_seqlens_q", "max_seqlen_q")
    raises(ValueError, lambda: OPS.attention_backward_varlen(q, q, k, v, q, lse, cu_q, cu_k, 200, 300), "CUDA device")


def test_varlen_autograd_reaches_the_backward_op():
    q, k, v, cu_q, cu_k = varlen_inputs("meta", requires_grad=True)
    out = dash_torch.attention_varlen(q, k, v, cu_q, cu_k, 200, 300, causal=True, schedule="fa3")
    out.backward(torch.empty_like(out))
    assert q.grad.shape == q.shape and k.grad.shape == k.shape and v.grad.shape == v.shape


def test_eager_path_only_for_plain_cuda_tensors_outside_tracing():
    """cupy_dash.torch.eager (the plain autograd.Function path of attention / attention_varlen): never for CPU or
    meta tensors, fake tensors, or under a dispatch mode; those take the ops, as before."""
    from torch.utils._python_dispatch import TorchDispatchMode
    q, k, v = fwd_inputs("cpu")
    assert not dash_torch.eager(q, k, v)
    assert not dash_torch.eager(*fwd_inputs("meta"))
    with FakeTensorMode() as mode:
        fake = mode.from_tensor(q)
    assert not dash_torch.eager(fake, fake, fake)

    class Mode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))
    with Mode():
        assert not dash_torch.eager(q, k, v)


@pytest.mark.parametrize("varlen", [False, True], ids=["fixed", "varlen"])
def test_eager_function_routes_gradients_as_the_op_does(varlen):
    """The eager autograd.Function (cupy_dash.torch.ops._Eager) with recorders for cupy_dash's functions, on CPU
    tensors: the positional extras (varlen's cu_seqlens and max lengths) and the options reach both functions,
    dout is made contiguous, dq/dk/dv go to q/k/v, lse is not differentiable."""
    seen = {}

    def forward(q, k, v, *extra, causal, softmax_scale, window, softcap):
        seen["fwd"] = (extra, causal, softmax_scale, window, softcap)
        return q * 2, torch.zeros(q.shape[-2], q.shape[0])

    def backward(dout, q, k, v, out, lse, *extra, causal, softmax_scale, schedule, deterministic, window, softcap):
        seen["bwd"] = (dout.is_contiguous(), extra, causal, softmax_scale, schedule, deterministic, window, softcap)
        return dout + 1, torch.full_like(k, 3), torch.full_like(v, 4)
    q, k, v = (torch.randn(10, 2, 8, requires_grad=True) for _ in range(3))
    dout = torch.randn(8, 2, 10).permute(2, 1, 0)                    # not contiguous
    cu = torch.tensor([0, 4, 10], dtype=torch.int32)
    extra = (cu, cu, 6, 6) if varlen else ()
    options = (True, 0.5, "fa3", True, (3, 0), 30.0)
    out, lse = cupy_dash.torch.ops._Eager.apply((forward, backward), extra, options, q, k, v)
    assert not lse.requires_grad and out.requires_grad
    same = lambda a, b: len(a) == len(b) and all(x is y for x, y in zip(a, b))  # noqa: E731
    assert same(seen["fwd"][0], extra) and seen["fwd"][1:] == (True, 0.5, (3, 0), 30.0)
    out.backward(dout)
    assert seen["bwd"][0] and same(seen["bwd"][1], extra) and seen["bwd"][2:] == options
    assert torch.equal(q.grad, dout + 1) and torch.equal(k.grad, torch.full_like(k, 3))
    assert torch.equal(v.grad, torch.full_like(v, 4))


def _recorders():
    """cupy_dash's (forward, backward) stand-ins on CPU tensors: out = 2 q, and gradients 2 dout, 3, 4."""
    def forward(q, k, v, *extra, causal, softmax_scale, window, softcap):
        return q * 2, torch.zeros(q.shape[-2], q.shape[0])

    def backward(dout, q, k, v, out, lse, *extra, causal, softmax_scale, schedule, deterministic, window, softcap):
        return dout * 2, torch.full_like(k, 3), torch.full_like(v, 4)
    return forward, backward


OPTIONS = (True, 0.5, "fa3", True, (3, 0), 0.0)


@pytest.mark.parametrize("path", ["eager", "op"])
def test_a_second_derivative_raises_instead_of_dropping_terms(path, monkeypatch):
    """create_graph=True asks autograd to differentiate the gradient, which the backward kernel cannot: both paths
    raise (a gradient penalty or a Hessian-vector product would otherwise get a gradient without its terms)."""
    forward, backward = _recorders()
    x = torch.randn(2, 10, 2, 8, requires_grad=True)
    k, v = torch.randn(2, 10, 2, 8), torch.randn(2, 10, 2, 8)
    if path == "eager":
        out = cupy_dash.torch.ops._Eager.apply((forward, backward), (), OPTIONS, x * 1, k, v)[0]
    else:
        monkeypatch.setattr(api, "attention_forward", lambda q, k, v, **kw: forward(q, k, v, **{
            n: kw[n] for n in ("causal", "softmax_scale", "window", "softcap")}))
        monkeypatch.setattr(api, "attention_backward", lambda dout, q, k, v, out, lse, **kw: backward(
            dout, q, k, v, out, lse, **kw))
        out = OPS.attention_forward(x * 1, k, v, True, 0.5, "fa3", True, 3, 0, 0.0)[0]
    grad, = torch.autograd.grad(out.sum(), x, retain_graph=True)              # first order: fine
    assert torch.equal(grad, torch.full_like(x, 2.0))
    with pytest.raises(RuntimeError, match="second derivative through attention"):
        torch.autograd.grad(out.sum(), x, create_graph=True)


def test_eager_varlen_lengths_changed_before_the_backward_raise():
    """The eager path saves the varlen cu_seqlens as the op path does: a buffer refilled in place between the forward
    and the backward (the next micro-batch's packing) raises instead of giving the backward other lengths."""
    forward, backward = _recorders()
    q, k, v = (torch.randn(10, 2, 8, requires_grad=True) for _ in range(3))
    cu = torch.tensor([0, 4, 10], dtype=torch.int32)
    out = cupy_dash.torch.ops._Eager.apply((forward, backward), (cu, cu, 6, 6), OPTIONS, q, k, v)[0]
    cu.copy_(torch.tensor([0, 7, 10], dtype=torch.int32))
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()


def test_compile_with_dynamic_scalars():
    """torch.compile(dynamic=True) makes the scale, the cap and the window symbolic: the argument checks compare
    them (no math.isfinite, which breaks the graph) and take a SymInt window, so the whole step traces."""
    from torch._dynamo.backends.common import aot_autograd
    from functorch.compile import make_boxed_func

    def f(q, k, v, scale, cap, left):
        return dash_torch.attention(q, k, v, softmax_scale=scale, softcap=cap, window=(left, 0), causal=True)

    torch._dynamo.reset()
    def boxed(gm, example_inputs):
        return make_boxed_func(gm.forward)
    compiled = torch.compile(f, fullgraph=True, dynamic=True, backend=aot_autograd(fw_compiler=boxed,
                                                                                 bw_compiler=boxed))
    q, k, v = fwd_inputs("meta", requires_grad=True, Hkv=2)
    for scale, cap, left in ((0.1, 0.0, 64), (0.2, 30.0, 32)):
        out = compiled(q, k, v, scale, cap, left)
        out.backward(torch.empty_like(out))
    assert q.grad.shape == q.shape
    torch._dynamo.reset()
