"""GPU tests of cupy_dash.jax under jax.jit / grad / vmap (need a Hopper GPU and JAX with CUDA; skipped elsewhere).

Everything is compared bit for bit with the eager functional API (:func:`cupy_dash.attention_forward` /
:func:`cupy_dash.attention_backward` on the same JAX arrays, through DLPack): both run the same kernels with the
same schedule tables, so any difference is a bug of the integration, not rounding. Most tests run with both
mechanisms: the C FFI handler (default where built, ``CUPY_DASH_JAX_FFI=1``) and the Python ``buffer_callback``
(``CUPY_DASH_JAX_FFI=0``).

* ``jax.jit`` forward (hdim 64 / 128, causal / full, GQA with Sq != Sk, fp16, sliding windows, one of which
  leaves whole KV tiles unseen, so dk / dv are zeroed first) and ``jax.jit(jax.grad(loss))`` (also on a shape
  whose tables have split KV columns); the backward
  function with every deterministic schedule;
* ``jax.vmap`` over a leading axis: equal to one call on the folded batch (any schedule), and to a loop of calls
  (forward; backward with a ``PORTABLE_POLICIES`` schedule); unmapped k / v;
* a jitted train step run twice from the same start: identical losses and weights; a second call of a traced
  function prepares nothing new;
* a semaphore timeout inside a compiled call is reported by ``cupy_dash.check_errors`` (then the call works);
* XLA command buffers (``--xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL``) in a fresh process: still equal to
  the eager bits over fresh and repeated inputs.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import types
import zlib

import ml_dtypes
import numpy as np
import pytest

import cupy_dash

pytestmark = pytest.mark.gpu
jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
cj = pytest.importorskip("cupy_dash.jax")
import cupy_dash.jax.callbacks as callbacks  # noqa: E402  (private: the preparation cache)
from framework_case import Case  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(cupy_dash.__file__)))

DTYPES = {"bfloat16": np.dtype(ml_dtypes.bfloat16), "float16": np.dtype(np.float16)}
DETERMINISTIC_POLICIES = ("fa3", "descending", "shift", "symmetric_shift", "auto")


CASES = [Case(hdim, causal) for hdim in (64, 128) for causal in (False, True)] + [
    Case(128, True, seqlen_q=256, seqlen_k=384, heads=4, heads_kv=2),
    Case(64, False, seqlen_q=200, seqlen_k=333, heads=6, heads_kv=2, batch=1, dtype="float16"),
    Case(128, False, seqlen_q=300, seqlen_k=300, window=(48, 64)),
    Case(64, True, seqlen_q=128, seqlen_k=512, heads=4, heads_kv=2, window=(32, 0)),   # keys 0..351 unseen
]
# `auto` cuts this one's last wave into split KV columns: the traced workspace holds their slots
SPLIT = Case(128, False, seqlen_q=2400, seqlen_k=2411, heads=8, heads_kv=8, batch=1)


@pytest.fixture(params=["callback", "ffi"])
def mechanism(request, monkeypatch):
    """Which custom call the jax functions traced in the test use (read when a call is traced)."""
    if request.param == "ffi":
        pytest.importorskip("cupy_dash.jax._xla_ffi", reason="the extension is not built (setup.py build_ext)")
        monkeypatch.setenv("CUPY_DASH_JAX_FFI", "1")
    else:
        monkeypatch.setenv("CUPY_DASH_JAX_FFI", "0")
    return request.param


@pytest.fixture(scope="module", autouse=True)
def jax_gpu():
    try:
        devices = jax.devices("gpu")
    except RuntimeError as exc:
        pytest.skip(f"JAX has no GPU backend: {exc}")
    yield devices[0]
    cupy_dash.check_errors()


def make(case: Case, salt: str = "", lead=()):
    """q, k, v, dout as JAX arrays on the GPU, seeded by the case id (and ``salt``); ``lead``: extra leading axes."""
    rng = np.random.default_rng(zlib.crc32((case.id + salt).encode()))
    b, sq, sk, h, hkv, d = case.batch, case.seqlen_q, case.seqlen_k, case.heads, case.heads_kv, case.hdim
    shapes = ((b, sq, h, d), (b, sk, hkv, d), (b, sk, hkv, d), (b, sq, h, d))
    dt = DTYPES[case.dtype]
    device = jax.devices("gpu")[0]
    return tuple(jax.device_put(rng.standard_normal((*lead, *s), dtype=np.float32).astype(dt), device)
                 for s in shapes)


def bits(x) -> np.ndarray:
    a = np.asarray(x)
    return a.view({2: np.uint16, 4: np.uint32}[a.dtype.itemsize])


def assert_same_bits(name, actual, expected):
    a, e = bits(actual), bits(expected)
    assert a.shape == e.shape, f"{name}: shape {a.shape} != {e.shape}"
    n = int(np.count_nonzero(a != e))
    assert n == 0, f"{name}: {n} of {a.size} elements differ bitwise from the eager call"


def eager(q, k, v, dout, causal, schedule="auto", window=(-1, -1)):
    """(out, lse, dq, dk, dv) of the eager functional API (DLPack path) on the same arrays."""
    out, lse = cupy_dash.attention_forward(q, k, v, causal=causal, window=window)
    grads = cupy_dash.attention_backward(dout, q, k, v, out, lse, causal=causal, schedule=schedule, window=window)
    cupy_dash.check_errors()
    return (out, lse, *grads)


def weighted_loss(attention, dout):
    """sum(attention(q, k, v) * dout) in fp32: its gradient with respect to out is exactly dout."""
    def loss(q, k, v):
        return jnp.sum(attention(q, k, v).astype(jnp.float32) * dout.astype(jnp.float32))
    return loss


# ----------------------------------------------------------------------------------------------------------------
# jit
# ----------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_jit_forward_matches_eager(case, mechanism):
    q, k, v, dout = make(case)
    out, lse = jax.jit(lambda q, k, v: cj.attention_forward(q, k, v, causal=case.causal, window=case.window))(
        q, k, v)
    assert out.dtype == q.dtype and out.shape == q.shape and lse.shape == (case.batch, case.heads, case.seqlen_q)
    expected = eager(q, k, v, dout, case.causal, window=case.window)
    assert_same_bits("out", out, expected[0])
    assert_same_bits("lse", lse, expected[1])


@pytest.mark.parametrize("case", CASES + [SPLIT], ids=lambda c: c.id)
def test_jit_grad_matches_eager_vjp(case, mechanism):
    q, k, v, dout = make(case)
    loss = weighted_loss(lambda q, k, v: cj.attention(q, k, v, causal=case.causal, window=case.window), dout)
    dq, dk, dv = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v)
    cupy_dash.check_errors()
    expected = eager(q, k, v, dout, case.causal, window=case.window)
    for name, x, e in zip(("dq", "dk", "dv"), (dq, dk, dv), expected[2:]):
        assert x.shape == e.shape and x.dtype == q.dtype, (name, x.shape, x.dtype)
        assert_same_bits(name, x, e)
    # the forward function's out is differentiable too, with the same gradient
    loss_fwd = weighted_loss(lambda q, k, v: cj.attention_forward(q, k, v, causal=case.causal,
                                                                  window=case.window)[0], dout)
    for name, x, e in zip(("dq", "dk", "dv"), jax.jit(jax.grad(loss_fwd, argnums=(0, 1, 2)))(q, k, v), expected[2:]):
        assert_same_bits(f"attention_forward {name}", x, e)


@pytest.mark.parametrize("schedule", DETERMINISTIC_POLICIES)
def test_jit_backward_function_matches_eager(schedule, mechanism):
    case = Case(128, True, seqlen_q=640, seqlen_k=640, heads=6, heads_kv=3)
    q, k, v, dout = make(case)
    out, lse = cupy_dash.attention_forward(q, k, v, causal=True)
    backward = jax.jit(lambda *a: cj.attention_backward(*a, causal=True, schedule=schedule))
    got = backward(dout, q, k, v, out, lse)
    cupy_dash.check_errors()
    expected = eager(q, k, v, dout, True, schedule)
    for name, x, e in zip(("dq", "dk", "dv"), got, expected[2:]):
        assert_same_bits(f"{schedule} {name}", x, e)


def test_generic_attention_accepts_tracers():
    case = CASES[1]
    q, k, v, dout = make(case)
    out = jax.jit(lambda q, k, v: cupy_dash.attention(q, k, v, causal=case.causal))(q, k, v)
    assert_same_bits("out", out, eager(q, k, v, dout, case.causal)[0])


# ----------------------------------------------------------------------------------------------------------------
# vmap
# ----------------------------------------------------------------------------------------------------------------
def fold(x):
    return x.reshape(x.shape[0] * x.shape[1], *x.shape[2:])


@pytest.mark.parametrize("schedule", ["auto", "descending"])
def test_vmap_equals_folded_call_and_loop(schedule, mechanism):
    case = Case(64, True, seqlen_q=384, seqlen_k=384, heads=4, heads_kv=2, batch=2)
    n = 3
    q, k, v, dout = make(case, lead=(n,))

    def step(q, k, v, dout):
        out, lse = cj.attention_forward(q, k, v, causal=True)
        grads = jax.grad(weighted_loss(lambda *a: cj.attention(*a, causal=True, schedule=schedule), dout),
                         argnums=(0, 1, 2))(q, k, v)
        return (out, lse, *grads)
    got = jax.jit(jax.vmap(step))(q, k, v, dout)
    cupy_dash.check_errors()
    assert got[0].shape == q.shape and got[1].shape == (n, case.batch, case.heads, case.seqlen_q)
    folded = eager(*(fold(x) for x in (q, k, v, dout)), True, schedule)
    for name, x, e in zip(("out", "lse", "dq", "dk", "dv"), got, folded):
        assert_same_bits(f"vmap vs folded {name}", fold(x), e)
    # a loop of calls: the forward always; the backward for schedules whose orders ignore the batch size
    names = ("out", "lse", "dq", "dk", "dv") if schedule in cupy_dash.schedule.PORTABLE_POLICIES else ("out", "lse")
    for i in range(n):
        one = eager(q[i], k[i], v[i], dout[i], True, schedule)
        for j, name in enumerate(names):
            assert_same_bits(f"vmap vs loop [{i}] {name}", got[j][i], one[j])


def test_vmap_with_unmapped_kv(mechanism):
    case = Case(128, False, seqlen_q=256, seqlen_k=320, heads=4, heads_kv=4, batch=1)
    q, _, _, _ = make(case, lead=(2,))
    _, k, v, _ = make(case, salt="kv")
    out = jax.jit(jax.vmap(lambda q: cj.attention(q, k, v), in_axes=0))(q)
    for i in range(2):
        assert_same_bits(f"out[{i}]", out[i], cupy_dash.attention_forward(q[i], k, v)[0])


# ----------------------------------------------------------------------------------------------------------------
# a train step, twice
# ----------------------------------------------------------------------------------------------------------------
def test_jitted_train_step_is_reproducible_and_prepares_once(mechanism):
    B, S, H, HKV, D, E = 2, 256, 4, 2, 64, 128
    key = jax.random.PRNGKey(0)
    k1, k2, k3 = jax.random.split(key, 3)

    def init():
        return dict(wqkv=jax.random.normal(k1, (E, (H + 2 * HKV) * D), jnp.float32) / np.sqrt(E),
                    wo=jax.random.normal(k2, (H * D, E), jnp.float32) / np.sqrt(H * D))
    x = jax.random.normal(k3, (B, S, E), jnp.float32).astype(jnp.bfloat16)

    def loss_fn(params, x):
        h = x @ params["wqkv"].astype(jnp.bfloat16)
        q, k, v = jnp.split(h, [H * D, (H + HKV) * D], axis=-1)
        o = cj.attention(q.reshape(B, S, H, D), k.reshape(B, S, HKV, D), v.reshape(B, S, HKV, D), causal=True)
        y = o.reshape(B, S, H * D) @ params["wo"].astype(jnp.bfloat16)
        return jnp.mean(jnp.square(y.astype(jnp.float32) - x.astype(jnp.float32)))

    @jax.jit
    def step(params, x):
        loss, grads = jax.value_and_grad(loss_fn)(params, x)
        return jax.tree.map(lambda p, g: p - 0.05 * g, params, grads), loss

    def run():
        params, losses = init(), []
        for _ in range(4):
            params, loss = step(params, x)
            losses.append(float(loss))
        cupy_dash.check_errors()
        return losses, {name: bits(p) for name, p in params.items()}

    losses1, params1 = run()
    prepared = len(callbacks._prepared)
    losses2, params2 = run()
    assert len(callbacks._prepared) == prepared, "a second run of a compiled step prepared new calls"
    assert losses1 == losses2, f"losses differ between two runs: {losses1} vs {losses2}"
    for name in params1:
        assert params1[name].tobytes() == params2[name].tobytes(), f"weights {name} differ between two runs"
    # wqkv gets its gradient only through the attention backward: it must have moved
    assert params1["wqkv"].tobytes() != bits(init()["wqkv"]).tobytes(), "wqkv did not change: no gradient"
    assert all(np.isfinite(losses1)), losses1


# ----------------------------------------------------------------------------------------------------------------
# errors inside a compiled call
# ----------------------------------------------------------------------------------------------------------------
def test_semaphore_timeout_in_compiled_call_is_reported_by_check_errors(monkeypatch):
    monkeypatch.setenv("CUPY_DASH_JAX_FFI", "0")                 # the callback runs the plan it is given
    from cupy_dash.cuda import device_tables
    case = Case(64, False, seqlen_q=512, seqlen_k=512, heads=2, heads_kv=2, batch=1)
    q, k, v, dout = make(case, salt="timeout")
    out, lse = cupy_dash.attention_forward(q, k, v)
    backward = jax.jit(lambda *a: cj.attention_backward(*a, schedule="fa3"))
    before = set(callbacks._prepared)
    good = backward(dout, q, k, v, out, lse)
    cupy_dash.check_errors()
    new = [key for key in set(callbacks._prepared) - before if key[0] == "bwd"]
    assert len(new) == 1, f"expected one newly traced backward, got {new}"
    prepared = callbacks._prepared[new[0]]
    dev = jax.devices("gpu")[0].local_hardware_id or 0
    launch = prepared.launches[dev]
    tables, timeout = launch.tables, launch.spin_timeout_ns
    visits, rank, cta_start = (np.asarray(a.get()) for a in (tables.visits, tables.rank, tables.cta_start))
    bad_rank = rank.copy()
    last = int(cta_start[1]) - 1                       # the last visit of CTA 0 waits for a rank never reached
    bad_rank[last] = int(((visits[:, 1] == visits[last, 1]) & (visits[:, 3] == visits[last, 3])).sum()) + 7
    bad = types.SimpleNamespace(visits=visits, rank=bad_rank, cta_start=cta_start, num_ctas=tables.num_ctas,
                                policy="fa3")
    try:
        import cupy
        with cupy.cuda.Device(dev):
            launch.tables = device_tables.upload(bad, case.batch * case.heads, -(-case.seqlen_k // launch.block_n),
                                                 launch.num_m_blocks, dev, cupy.cuda.get_current_stream(), wait=True)
            cupy.cuda.get_current_stream().synchronize()
        launch.spin_timeout_ns = 200_000_000
        with cupy.cuda.Device(dev):
            prepared.plans[dev] = prepared.parts(dev).plan()         # the launch plan of the bad table
        jax.block_until_ready(backward(dout, q, k, v, out, lse))
        with pytest.raises(RuntimeError, match="jax.jit-compiled call") as info:
            cupy_dash.check_errors()
        assert "fa3" in str(info.value) and "timed out" in str(info.value), info.value
    finally:
        launch.tables, launch.spin_timeout_ns = tables, timeout
        with cupy.cuda.Device(dev):
            prepared.plans[dev] = prepared.parts(dev).plan()
    again = backward(dout, q, k, v, out, lse)
    cupy_dash.check_errors()                          # the record was cleared: no error is left
    for name, x, e in zip(("dq", "dk", "dv"), again, good):
        assert_same_bits(name, x, e)


# ----------------------------------------------------------------------------------------------------------------
# XLA command buffers (a fresh process: XLA_FLAGS are read when the backend starts)
# ----------------------------------------------------------------------------------------------------------------
COMMAND_BUFFER_SCRIPT = """
    import json
    import jax, jax.numpy as jnp, ml_dtypes, numpy as np
    import cupy_dash, cupy_dash.jax as cj

    def bits(x):
        return np.asarray(x).view(np.uint16 if np.asarray(x).dtype.itemsize == 2 else np.uint32)

    B, S, H, D = 2, 256, 4, 64
    f = jax.jit(lambda q, k, v, do: (cj.attention_forward(q, k, v, causal=True),
                                     jax.vjp(lambda *a: cj.attention(*a, causal=True), q, k, v)[1](do)))
    rng, dev = np.random.default_rng(3), jax.devices("gpu")[0]
    mismatches, results = [], []
    for trial in range(3):                               # fresh inputs: new addresses, so XLA must re-record
        q, k, v, do = (jax.device_put(rng.standard_normal((B, S, H, D), dtype=np.float32)
                                      .astype(ml_dtypes.bfloat16), dev) for _ in range(4))
        (out, lse), grads = f(q, k, v, do)
        e_out, e_lse = cupy_dash.attention_forward(q, k, v, causal=True)
        expected = (e_out, e_lse, *cupy_dash.attention_backward(do, q, k, v, e_out, e_lse, causal=True))
        for name, x, e in zip(("out", "lse", "dq", "dk", "dv"), (out, lse, *grads), expected):
            if bits(x).tobytes() != bits(e).tobytes():
                mismatches.append(f"trial {trial} {name}")
    runs_before = dict(cj.callback_runs)
    first = None
    for repeat in range(20):                             # the same inputs: XLA may replay its recording
        (out, lse), grads = f(q, k, v, do)
        now = [bits(x).tobytes() for x in (out, lse, *grads)]
        if first is None:
            first = now
        elif now != first:
            mismatches.append(f"repeat {repeat}")
        del out, lse, grads
    cupy_dash.check_errors()
    runs = {key: cj.callback_runs[key] - runs_before.get(key, 0) for key in cj.callback_runs}
    print("RESULT " + json.dumps(dict(mismatches=mismatches, callback_runs_in_20_repeats=runs)))
"""


def test_command_buffers_give_the_eager_bits(record_property, mechanism):
    env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false",
               XLA_FLAGS=(os.environ.get("XLA_FLAGS", "") + " --xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL"
                          " --xla_gpu_graph_min_graph_size=1").strip(),
               PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(COMMAND_BUFFER_SCRIPT)], capture_output=True,
                          text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert line, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = json.loads(line[-1][len("RESULT "):])
    assert not result["mismatches"], f"with command buffers, results differ from eager: {result['mismatches']}"
    record_property("report", f"jax command buffers ({mechanism}): Python callback runs in 20 repeated calls "
                              f"(fwd+bwd each): {result['callback_runs_in_20_repeats']}")
