"""One process, two GPUs: the same calls on cuda:0 and cuda:1, alternating, with the *other* GPU current, from
CuPy, torch and JAX (one jit over a two-device mesh too), fixed length and varlen, give bitwise the results of
the same call on cuda:0 alone; a failed backward on cuda:1 is reported and leaves both GPUs usable. What this
checks is that kernels, schedule tables, error records and launch plans made on one device are never used on
the other (tests/unit/test_per_device.py checks the keying without a GPU). Skipped without two Hopper GPUs."""
from __future__ import annotations

import types

import numpy as np
import pytest

cupy = pytest.importorskip("cupy")
import cupy_dash  # noqa: E402
from gpu_helpers import BF16, _assert_same_bits, _dev, _host  # noqa: E402

pytestmark = pytest.mark.gpu

B, S, H, HKV = 2, 300, 4, 2
LENS = [100, 1, 513, 64]


@pytest.fixture(scope="module", autouse=True)
def two_gpus():
    n = cupy.cuda.runtime.getDeviceCount()
    if n < 2 or any(cupy.cuda.Device(i).compute_capability != "90" for i in range(2)):
        pytest.skip(f"needs two Hopper GPUs, found {n} CUDA device(s)")


def _arrays(hdim, seed=0, rows=None):
    """q, do (B, S, H, D), k, v (B, S, Hkv, D) bf16 (or, ``rows`` = total, the varlen (rows, heads, D) forms)."""
    rng = np.random.default_rng(seed)
    lead = (B, S) if rows is None else (rows,)
    shapes = dict(q=(*lead, H, hdim), k=(*lead, HKV, hdim), v=(*lead, HKV, hdim), do=(*lead, H, hdim))
    return {n: rng.standard_normal(s, dtype=np.float32).astype(BF16) for n, s in shapes.items()}


def _cupy_call(a, dev, current, kw, varlen=None):
    """(out, lse, dq, dk, dv) as host bits of forward + backward with CuPy arrays on ``dev``, ``current`` the
    current device during the calls (``varlen``: (cu_seqlens on the device, max_seqlen))."""
    with cupy.cuda.Device(dev):
        q, k, v, do = (_dev(a[n]) for n in ("q", "k", "v", "do"))
        cu = None if varlen is None else cupy.asarray(varlen[0])
    with cupy.cuda.Device(current):
        if varlen is None:
            out, lse = cupy_dash.attention_forward(q, k, v, causal=True)
            grads = cupy_dash.attention_backward(do, q, k, v, out, lse, causal=True, **kw)
        else:
            lens = (cu, cu, varlen[1], varlen[1])
            out, lse = cupy_dash.attention_forward_varlen(q, k, v, *lens, causal=True)
            grads = cupy_dash.attention_backward_varlen(do, q, k, v, out, lse, *lens, causal=True, **kw)
    assert all(x.device.id == dev for x in (out, lse, *grads))
    return [_host(x) for x in (out, lse, *grads)]


def _same(results, want, what):
    for name, got, exp in zip(("out", "lse", "dq", "dk", "dv"), results, want):
        _assert_same_bits(f"{what}: {name}", got, exp)


@pytest.mark.parametrize("compact", ["0", "1"], ids=["per_visit", "compact"])
@pytest.mark.parametrize("schedule", ["auto", "descending"])
@pytest.mark.parametrize("hdim", [64, 128])
def test_cupy_calls_alternate_between_gpus(hdim, schedule, compact, monkeypatch):
    monkeypatch.setenv("CUPY_DASH_COMPACT_TABLES", compact)
    a, kw = _arrays(hdim), dict(schedule=schedule)
    want = _cupy_call(a, 0, 0, kw)
    for rnd in range(3):
        for dev in (1, 0):
            _same(_cupy_call(a, dev, 1 - dev, kw), want, f"round {rnd}, cuda:{dev} with cuda:{1 - dev} current")
    cupy_dash.check_errors()


@pytest.mark.parametrize("host_lengths", [False, True], ids=["device_cu", "host_cu"])
def test_cupy_varlen_calls_alternate_between_gpus(host_lengths):
    cu = np.concatenate([[0], np.cumsum(LENS)]).astype(np.int32)
    a = _arrays(128, seed=1, rows=int(cu[-1]))
    want = _cupy_call(a, 0, 0, {}, (cu, max(LENS)))
    for rnd in range(3):
        for dev in (1, 0):
            with cupy.cuda.Device(dev):
                q, k, v, do = (_dev(a[n]) for n in ("q", "k", "v", "do"))
                cu_dev = cupy.asarray(cu)                    # the forward reads the lengths on the device
            lens = (cu, cu) if host_lengths else (cu_dev, cu_dev)
            with cupy.cuda.Device(1 - dev):
                out, lse = cupy_dash.attention_forward_varlen(q, k, v, cu_dev, cu_dev, max(LENS), max(LENS),
                                                              causal=True)
                grads = cupy_dash.attention_backward_varlen(do, q, k, v, out, lse, *lens, max(LENS), max(LENS),
                                                            causal=True)
            _same([_host(x) for x in (out, lse, *grads)], want, f"varlen round {rnd}, cuda:{dev}")
    cupy_dash.check_errors()


def test_torch_calls_alternate_between_gpus():
    """cupy_dash.torch.attention (autograd) and attention_varlen on cuda:0 / cuda:1, with the other GPU current
    (the forward's full path) and with their own GPU current (its host fast path: the plans are per device). The
    backward runs in torch's autograd thread of the tensors' device, which makes that device current: the other
    device current is the CuPy calls' case (test_cupy_calls_alternate_between_gpus)."""
    torch = pytest.importorskip("torch")
    import cupy_dash.torch as dash_torch
    a = _arrays(64, seed=2)
    want = _cupy_call(a, 0, 0, {})
    cu = np.concatenate([[0], np.cumsum(LENS)]).astype(np.int32)
    av = _arrays(64, seed=3, rows=int(cu[-1]))
    want_v = _cupy_call(av, 0, 0, {}, (cu, max(LENS)))

    def step(arrays, dev, varlen):
        t = {n: torch.from_numpy(x.view(np.int16)).view(torch.bfloat16).to(f"cuda:{dev}") for n, x in arrays.items()}
        q, k, v = (t[n].requires_grad_(True) for n in ("q", "k", "v"))
        if varlen:
            cu_t = torch.from_numpy(cu).to(f"cuda:{dev}")
            out = dash_torch.attention_varlen(q, k, v, cu_t, cu_t, max(LENS), max(LENS), causal=True)
            lse = dash_torch.attention_forward_varlen(q, k, v, cu_t, cu_t, max(LENS), max(LENS), causal=True)[1]
        else:
            out = dash_torch.attention(q, k, v, causal=True)
            lse = dash_torch.attention_forward(q, k, v, causal=True)[1]
        out.backward(t["do"])
        return [out.detach(), lse, q.grad, k.grad, v.grad]
    for rnd in range(3):
        for dev in (1, 0):
            for current in (1 - dev, dev):
                with torch.cuda.device(current):
                    _same(step(a, dev, False), want, f"torch round {rnd}, cuda:{dev}, cuda:{current} current")
                    _same(step(av, dev, True), want_v, f"torch varlen round {rnd}, cuda:{dev}")
    cupy_dash.check_errors()


def _jax_devices():
    jax = pytest.importorskip("jax")
    gpus = [d for d in jax.devices() if d.platform == "gpu"]
    if len(gpus) < 2:
        pytest.skip(f"JAX sees {len(gpus)} GPU(s)")
    return jax, gpus[:2]


@pytest.mark.parametrize("ffi", ["1", "0"], ids=["c_handler", "callback"])
def test_jax_calls_alternate_between_gpus(ffi, monkeypatch):
    """cupy_dash.jax under jax.jit on arrays committed to either GPU (JAX's default device and CuPy's current
    device the other one), and the functional API on JAX arrays (DLPack) likewise."""
    jax, gpus = _jax_devices()
    monkeypatch.setenv("CUPY_DASH_JAX_FFI", ffi)
    import cupy_dash.jax as dash_jax
    a = _arrays(128, seed=4)
    want = _cupy_call(a, 0, 0, {})

    @jax.jit
    def step(q, k, v, do):
        out, vjp = jax.vjp(lambda q, k, v: dash_jax.attention(q, k, v, causal=True), q, k, v)
        lse = dash_jax.attention_forward(q, k, v, causal=True)[1]
        return (out, lse, *vjp(do))
    for rnd in range(3):
        for dev in (1, 0):
            x = {n: jax.device_put(arr, gpus[dev]) for n, arr in a.items()}
            with jax.default_device(gpus[1 - dev]), cupy.cuda.Device(1 - dev):
                got = step(x["q"], x["k"], x["v"], x["do"])
                out, lse = cupy_dash.attention_forward(x["q"], x["k"], x["v"], causal=True)
            assert all(r.devices() == {gpus[dev]} for r in got)
            _same([np.asarray(r) for r in got], want, f"jax round {rnd}, cuda:{dev}")
            _same([np.asarray(out), np.asarray(lse)], want[:2], f"functional API on JAX arrays, cuda:{dev}")
    cupy_dash.check_errors()


def test_jax_shard_map_over_two_gpus():
    """One jit whose batch is sharded over a two-GPU mesh, attention under shard_map: each GPU's shard of out
    and of the gradients is bitwise the result of the same call on that half of the batch on cuda:0 alone
    (``descending``: addition orders independent of the batch size)."""
    jax, gpus = _jax_devices()
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    import cupy_dash.jax as dash_jax
    mesh = Mesh(np.array(gpus), ("data",))
    a = _arrays(64, seed=5)
    halves = [_cupy_call({n: x[i:i + 1] for n, x in a.items()}, 0, 0, dict(schedule="descending"))
              for i in range(B)]

    def attention(q, k, v):
        return dash_jax.attention(q, k, v, causal=True, schedule="descending")
    sharded = jax.shard_map(attention, mesh=mesh, in_specs=P("data"), out_specs=P("data"))

    @jax.jit
    def step(q, k, v, do):
        out, vjp = jax.vjp(sharded, q, k, v)
        return (out, *vjp(do))
    x = {n: jax.device_put(arr, NamedSharding(mesh, P("data"))) for n, arr in a.items()}
    got = step(x["q"], x["k"], x["v"], x["do"])
    for name, r, i in zip(("out", "dq", "dk", "dv"), got, (0, 2, 3, 4)):
        for shard in r.addressable_shards:
            row = shard.index[0].start or 0
            _assert_same_bits(f"{name} on {shard.device}", np.asarray(shard.data), halves[row][i])
    cupy_dash.check_errors()


def test_failed_backward_on_the_second_gpu_is_reported():
    """A backward on cuda:1 (cuda:0 current) driven by a table whose rank cannot be reached times out, is
    reported by check_errors, and leaves both GPUs giving the reference bits."""
    from cupy_dash import schedule
    from cupy_dash.cuda import kernels
    from cupy_dash.core.api import _backward_with_plan
    a = _arrays(64, seed=6)
    want = _cupy_call(a, 0, 0, {})
    tile = kernels.bwd_tile(64, True)
    plan = schedule.build("descending", seqlen_q=S, seqlen_k=S, block_m=tile.block_m, block_n=tile.block_n,
                          num_heads=B * H, causal=True, num_sms=8, group_size=H // HKV)
    rank = np.array(plan.rank, copy=True)
    rank[int(plan.cta_start[1]) - 1] += 1000                  # a count its dQ tile's semaphore never reaches
    bad = types.SimpleNamespace(visits=plan.visits, rank=rank, cta_start=plan.cta_start, num_ctas=plan.num_ctas,
                                policy="corrupted", group_size=H // HKV)
    with cupy.cuda.Device(1):
        q, k, v, do = (_dev(a[n]) for n in ("q", "k", "v", "do"))
        out, lse = cupy_dash.attention_forward(q, k, v, causal=True)
    with cupy.cuda.Device(0):
        _backward_with_plan(do, q, k, v, out, lse, plan=bad, causal=True, spin_timeout_ns=200_000_000)
        with pytest.raises(RuntimeError, match="corrupted"):
            cupy_dash.check_errors()
    for dev in (1, 0):
        _same(_cupy_call(a, dev, 1 - dev, {}), want, f"after the failure, cuda:{dev}")
    cupy_dash.check_errors()
