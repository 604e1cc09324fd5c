"""benchmarks/steady_bench.py's host side: shapes, the pipelined loop's count and timing, the report's ratios and
table from synthetic loops. No GPU needed."""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
if str(BENCHMARKS) not in sys.path:
    sys.path.insert(0, str(BENCHMARKS))

import steady_bench as sb  # noqa: E402


@pytest.mark.parametrize("spec, batch, causal", [("full:1280", 12, False), ("causal:2048", 8, True),
                                                 ("full:4096:16384", 4, False)])
def test_shapes_take_the_engine_tables_token_counts(spec, batch, causal):
    shape = sb.parse_shape(spec, 2048, 128)
    assert (shape["batch"], shape["causal"], shape["heads"]) == (batch, causal, 16)


def test_pipelined_loop_keeps_two_calls_in_flight_and_times_completed_ones():
    in_flight, peak, issued = [], [0], [0]

    def call():
        issued[0] += 1
        in_flight.append(time.perf_counter())
        peak[0] = max(peak[0], len(in_flight))
        return issued[0]

    def done(handle):
        in_flight.pop(0)
        time.sleep(0.002)

    ms, n, wall0, wall1 = sb.pipelined_loop(call, done, loop_s=0.05, warm_s=0.01)
    assert peak[0] == 2 and not in_flight
    assert n >= 10 and 1.5 <= ms <= 10
    assert wall1 > wall0


def _report(shape, legs, ratio_key, ratio):
    """A one-shape report of legs {name: ms} and one ratio (median, min, max), as steady_bench writes it."""
    summary = {name: dict(ms_median=ms, ms_min=ms, ms_max=ms, tflops=100 / ms, sm_mhz_median=1800.0,
                          power_w_median=600.0, mcycles_median=ms * 1.8, rel_diff_vs_ours=1e-3, valid=True,
                          repeats_bits=True)
               for name, ms in legs.items()}
    return dict(meta=dict(date="d", command="c", commit="abc", kernels_sha256="0" * 64, gpu="H200", rounds=3,
                          loop_s=1.0),
                shapes=[dict(shape=dict(name=shape), summary=summary,
                             ratios={ratio_key: dict(zip(("median", "min", "max"), ratio))})])


@pytest.mark.parametrize("shape, other, column, row", [
    ("full:1280", "fa3_nondet", "ours det / FA3 non-det", "| full:1280 | dash_det | 111 |"),
    ("causal:2048", "dash_fa3", "auto / fa3", "| causal:2048 | dash_fa3 | 105 |"),     # a named schedule's leg
    ("full:4096", "dash_nocap", "capped / uncapped", "| full:4096 | dash_nocap | 105 |"),
    ("causal:16384", "cudnn_nondet", "ours det / cuDNN non-det", "| causal:16384 | cudnn_nondet | 105 |")],
    ids=["fa3", "schedule", "cap", "cudnn"])
def test_markdown_names_every_leg_and_gives_each_ratio_its_column(shape, other, column, row):
    report = _report(shape, {"dash_det": 0.9, other: 0.95}, f"dash_det_speed_vs_{other}", (1.06, 1.04, 1.07))
    text = sb.markdown(report)
    assert f"| shape | {column} |" in text and row in text
    assert f"| {shape} | 1.06 (1.04-1.07) |" in text


def test_smi_windows_parse_each_complete_line_once(tmp_path):
    """Smi.window: medians of the samples between two times, read incrementally from nvidia-smi's trace; a line
    still being written waits for the next read (no nvidia-smi here: the trace is written by the test)."""
    import datetime as dt
    smi = sb.Smi.__new__(sb.Smi)
    smi.trace = open(tmp_path / "trace.csv", "w+")
    smi.samples, smi._raw, smi._pos = [], [], 0
    t0 = dt.datetime(2026, 12, 3, 12, 0, 0)

    def line(i, mhz, watt):
        stamp = (t0 + dt.timedelta(milliseconds=20 * i)).strftime("%Y/%m/%d %H:%M:%S.%f")[:-3]
        return f"{stamp}, {mhz} MHz, {watt} W, 40"

    smi.trace.write("\n".join(line(i, 1700 + i, 600 + i) for i in range(5)) + "\n" + line(5, 1980, 700)[:12])
    assert smi.window(t0, t0 + dt.timedelta(milliseconds=45)) == (1701, 601, 3)
    assert len(smi.samples) == 5                               # the partial sixth line is not parsed yet
    smi.trace.write(line(5, 1980, 700)[12:] + "\n")
    assert smi.window(t0 + dt.timedelta(milliseconds=90), t0 + dt.timedelta(seconds=1)) == (1980, 700, 1)
    assert len(smi.samples) == 6 and len(smi.lines()) == 6


def test_softcap_caps_every_leg_but_the_uncapped_one(monkeypatch):
    """implementations(softcap=...): the capped legs get the capped forward's out / lse and the cap; dash_nocap the
    uncapped forward's and none (a stand-in cupy_dash records the calls; no GPU)."""
    import types
    calls = []

    def forward(q, k, v, *, causal, softcap=0.0):
        calls.append(("fwd", softcap))
        return (f"out{softcap}", f"lse{softcap}")

    def backward(do, q, k, v, out, lse, *, causal, schedule, deterministic, softcap):
        calls.append(("bwd", softcap, out, lse, deterministic, os.environ.get("DASH_TEST_KNOB")))
        return ("dq", "dk", "dv")

    class Event:
        def __init__(self, **kw):
            pass

        def record(self):
            pass

    fake = types.SimpleNamespace(attention_forward=forward, attention_backward=backward)
    measure = types.SimpleNamespace(random_tensor=lambda shape, dtype, seed: f"t{seed}")
    cupy = types.SimpleNamespace(cuda=types.SimpleNamespace(Event=Event))
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    monkeypatch.setitem(sys.modules, "cupy_dash", fake)
    monkeypatch.setitem(sys.modules, "cupy_dash.cli.measure", measure)
    shape = sb.parse_shape("full:4096", 1024, 64)
    monkeypatch.delenv("DASH_TEST_KNOB", raising=False)
    impls = sb.implementations(shape, None, softcap=30.0, env_legs=[("k1", "DASH_TEST_KNOB", "1")])
    assert set(impls) == {"dash_det", "dash_atomic", "dash_nocap", "dash_k1"}
    calls.clear()
    impls["dash_det"][2]()
    impls["dash_nocap"][2]()
    impls["dash_atomic"][0]()
    impls["dash_k1"][0]()                                   # the variable is set for its call only
    assert calls == [("bwd", 30.0, "out30.0", "lse30.0", True, None), ("bwd", 0.0, "out0.0", "lse0.0", True, None),
                     ("bwd", 30.0, "out30.0", "lse30.0", False, None), ("bwd", 30.0, "out30.0", "lse30.0", True, "1")]
    assert "DASH_TEST_KNOB" not in os.environ
    forward_impls = sb.implementations(shape, None, forward=True, softcap=30.0)
    assert set(forward_impls) == {"dash_fwd", "dash_nocap"}
    calls.clear()
    assert forward_impls["dash_fwd"][2]() == ("out30.0",) and forward_impls["dash_nocap"][2]() == ("out0.0",)
    assert calls == [("fwd", 30.0), ("fwd", 0.0)]


@pytest.mark.parametrize("rounds, legs, balanced", [(3, 2, 4), (4, 2, 4), (3, 5, 5), (6, 5, 10), (1, 1, 1)])
def test_rounds_give_every_leg_every_place_of_the_order_equally_often(rounds, legs, balanced):
    """rotated_orders: each leg runs first, second, ... equally often (the clock of a loop depends on what ran
    before it), every round's order a rotation of the one before."""
    names = list(range(legs))
    orders = sb.rotated_orders(names, rounds)
    assert len(orders) == balanced
    assert all(sorted(order) == names for order in orders)
    assert all(b == a[1:] + a[:1] for a, b in zip(orders, orders[1:]))
    places = {n: [order.index(n) for order in orders] for n in names}
    assert all(p.count(k) == balanced // legs for p in places.values() for k in range(legs))


def test_markdown_gives_the_rounds_the_loops_ran():
    report = _report("full:4096", {"dash_det": 0.9, "dash_nocap": 0.8}, "dash_det_speed_vs_dash_nocap",
                     (0.89, 0.88, 0.9))
    assert "median ms per call of 3 loops" in sb.markdown(report)     # meta's, in reports before per-shape rounds
    report["shapes"][0]["rounds"] = 4
    assert "median ms per call of 4 loops" in sb.markdown(report)


def test_markdown_names_the_dtype_of_reports_that_record_it():
    report = _report("full:4096", {"dash_det": 0.9, "dash_nocap": 0.8}, "dash_det_speed_vs_dash_nocap",
                     (0.89, 0.88, 0.9))
    assert "GPU H200; commit abc" in sb.markdown(report)
    report["meta"]["dtype"] = "fp16"
    assert "GPU H200; fp16; commit abc" in sb.markdown(report)


def _fake_torch(monkeypatch, log):
    """A stand-in torch with what cudnn_legs uses: DLPack views, SDPA under a backend, autograd.grad, events."""
    import contextlib
    import types

    class T:
        def __init__(self, name):
            self.name, self.requires_grad = name, False

        def detach(self):
            return self

        def requires_grad_(self, flag):
            self.requires_grad = flag
            return self

        def transpose(self, a, b):
            assert (a, b) == (1, 2)
            return T(self.name[:-2] if self.name.endswith("^T") else self.name + "^T")

    @contextlib.contextmanager
    def sdpa_kernel(backend):
        log.append(("backend", backend))
        yield

    def sdpa(q, k, v, *, is_causal):
        log.append(("sdpa", q.name, k.name, v.name, is_causal))
        return T("out^T")

    def grad(out, leaves, do, retain_graph):
        log.append(("grad", out.name, tuple(x.name for x in leaves), do.name, retain_graph,
                    all(x.requires_grad for x in leaves)))
        return tuple(T("d" + x.name) for x in leaves)

    class Event:
        def record(self):
            log.append(("record",))

        def synchronize(self):
            pass
    attention = types.SimpleNamespace(SDPBackend=types.SimpleNamespace(CUDNN_ATTENTION="cudnn"),
                                      sdpa_kernel=sdpa_kernel)
    functional = types.SimpleNamespace(scaled_dot_product_attention=sdpa)
    torch = types.SimpleNamespace(from_dlpack=lambda x: T(x), no_grad=contextlib.nullcontext,
                                  autograd=types.SimpleNamespace(grad=grad),
                                  cuda=types.SimpleNamespace(Event=Event, synchronize=lambda: None),
                                  nn=types.SimpleNamespace(functional=functional, attention=attention))
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setitem(sys.modules, "torch.nn", torch.nn)
    monkeypatch.setitem(sys.modules, "torch.nn.functional", functional)
    monkeypatch.setitem(sys.modules, "torch.nn.attention", attention)


@pytest.mark.parametrize("forward", [False, True], ids=["backward", "forward"])
def test_cudnn_legs_time_the_backward_of_one_forward_graph_or_the_forward(monkeypatch, forward):
    """cudnn_legs: q, k, v through DLPack as (B, H, S, D) views, SDPA under the cuDNN backend with the shape's mask;
    the backward leg builds one forward graph and each call is one autograd.grad of it (retain_graph), its result
    (dq, dk, dv) as CuPy arrays; the forward leg's result back in (B, S, H, D). No GPU: stand-ins for both."""
    import types
    log = []
    _fake_torch(monkeypatch, log)
    cupy = types.SimpleNamespace(cuda=types.SimpleNamespace(Device=lambda: types.SimpleNamespace(
        synchronize=lambda: None)), from_dlpack=lambda x: ("cupy", x.name))
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    tensors = {n: n for n in ("q", "k", "v", "do")}
    legs = sb.cudnn_legs(tensors, True, forward)
    name = "cudnn_fwd" if forward else "cudnn_nondet"
    assert set(legs) == {name}
    call, done, result = legs[name]
    built = [x for x in log if x[0] == "sdpa"]                # the graph (backward), one warm-up call (either)
    assert built == [("sdpa", "q^T", "k^T", "v^T", True)]
    assert len([x for x in log if x[0] == "grad"]) == (0 if forward else 1)
    log.clear()
    done(call())
    done(call())
    if forward:
        assert [x for x in log if x[0] == "sdpa"] == [("sdpa", "q^T", "k^T", "v^T", True)] * 2
        assert ("backend", "cudnn") in log
        assert result() == (("cupy", "out"),)
    else:
        assert not [x for x in log if x[0] == "sdpa"]           # the graph is built once, before the loop
        assert [x for x in log if x[0] == "grad"] == [("grad", "out^T", ("q", "k", "v"), "do^T", True, True)] * 2
        assert result() == (("cupy", "dq"), ("cupy", "dk"), ("cupy", "dv"))
    assert log.count(("record",)) == 2


def test_cudnn_leg_is_left_out_of_capped_calls(monkeypatch):
    """implementations(cudnn=True) adds the cuDNN leg beside uncapped calls only (SDPA has no cap)."""
    import types
    _fake_torch(monkeypatch, [])
    fake = types.SimpleNamespace(attention_forward=lambda q, k, v, *, causal, softcap=0.0: ("out", "lse"),
                                 attention_backward=lambda *a, **k: ("dq", "dk", "dv"))
    measure = types.SimpleNamespace(random_tensor=lambda shape, dtype, seed: f"t{seed}")
    cupy = types.SimpleNamespace(cuda=types.SimpleNamespace(Event=object, Device=lambda: types.SimpleNamespace(
        synchronize=lambda: None)), from_dlpack=lambda x: x)
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    monkeypatch.setitem(sys.modules, "cupy_dash", fake)
    monkeypatch.setitem(sys.modules, "cupy_dash.cli.measure", measure)
    shape = sb.parse_shape("causal:4096", 2048, 128)
    assert "cudnn_nondet" in sb.implementations(shape, None, cudnn=True)
    assert "cudnn_fwd" in sb.implementations(shape, None, forward=True, cudnn=True)
    assert "cudnn_nondet" not in sb.implementations(shape, None, softcap=30.0, cudnn=True)


def test_a_gqa_shape_gives_k_and_v_fewer_heads_and_no_peer(monkeypatch):
    """--group G: k and v get heads // G heads (q and dO all of them), the cuDNN and FA3 legs are left out, and a
    group that does not divide the heads is refused."""
    import types
    _fake_torch(monkeypatch, [])
    made = {}

    def random_tensor(shape, dtype, seed):
        made[seed] = shape
        return f"t{seed}"
    fake = types.SimpleNamespace(attention_forward=lambda q, k, v, *, causal, softcap=0.0: ("out", "lse"),
                                 attention_backward=lambda *a, **k: ("dq", "dk", "dv"))
    cupy = types.SimpleNamespace(cuda=types.SimpleNamespace(Event=object, Device=lambda: types.SimpleNamespace(
        synchronize=lambda: None)), from_dlpack=lambda x: x)
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    monkeypatch.setitem(sys.modules, "cupy_dash", fake)
    monkeypatch.setitem(sys.modules, "cupy_dash.cli.measure", types.SimpleNamespace(random_tensor=random_tensor))
    shape = sb.parse_shape("causal:4096", 3072, 192, group=2)
    assert (shape["heads"], shape["group"]) == (16, 2)
    impls = sb.implementations(shape, object(), cudnn=True, schedules=("shift",))
    assert set(impls) == {"dash_det", "dash_atomic", "dash_shift"}
    assert made == {0: (4, 4096, 16, 192), 1: (4, 4096, 8, 192), 2: (4, 4096, 8, 192), 3: (4, 4096, 16, 192)}
    assert sb.parse_shape("causal:4096", 2048, 128)["group"] == 1
    with pytest.raises(ValueError, match="--group 3"):
        sb.parse_shape("causal:4096", 2048, 128, group=3)
