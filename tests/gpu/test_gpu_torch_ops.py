"""GPU tests of the torch ops (need an NVIDIA Hopper GPU and torch with CUDA; skipped elsewhere).

What is checked, always bit for bit against eager ``cupy_dash.torch.attention`` + ``backward`` on the same inputs
(the kernels are deterministic, so any difference is a bug in the integration, not rounding):

* ``torch.compile(fullgraph=True)`` forward and backward (hdim 64 / 128, causal / full), and a GQA case;
* ``torch.compile(mode="reduce-overhead")`` (CUDA graph trees: warm-up, record, replay with new inputs), on a
  shape no earlier call has used, so the mode's own warm-up must prepare everything; no cudagraph skips;
* manual ``torch.cuda.graph`` capture of forward + ``autograd.grad`` after one eager warm-up (one shape whose
  tables have split KV columns), replayed with the captured inputs and with new ones copied in; a capture of a
  shape that never ran eagerly, which makes its kernels and tables outside the capture, gives the same bits; a
  failure recorded by a replayed backward is reported (then cleared) by ``cupy_dash.check_errors``;
* ``torch.library.opcheck`` of both ops.
"""
from __future__ import annotations

import numpy as np
import pytest

import cupy_dash

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
from torch_helpers import (Case, assert_same_bits, attention_fn, capture_step, eager, make_inputs,  # noqa: E402
                           replay, run_step, torch_cuda)  # noqa: F401  (torch_cuda: an autouse fixture)
import cupy_dash.torch  # noqa: E402,F401  (registers torch.ops.cupy_dash, which test_opcheck names directly)

CASES = [Case(hdim, causal) for hdim in (64, 128) for causal in (False, True)]
GQA = Case(128, True, seqlen_q=256, seqlen_k=384, heads=4, heads_kv=2)
# `auto` cuts this one's last wave into split KV columns (30 Q tiles of 80, 152 columns on 132 CTAs: the fp32 slots
# and the counters that preprocess zeroes, in every replay)
SPLIT = Case(128, False, seqlen_q=2400, seqlen_k=2411, heads=8, heads_kv=8, batch=1)


# --------------------------------------------------------------------------------------------------------------
# torch.compile
# --------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_compile_fullgraph_matches_eager(case):
    q, k, v, dout = make_inputs(case)
    want = eager(case, q, k, v, dout)
    torch._dynamo.reset()
    compiled = torch.compile(attention_fn(case), fullgraph=True, dynamic=False)
    got = run_step(compiled, q, k, v, dout)
    assert_same_bits("torch.compile", got, want)
    q2, k2, v2, dout2 = make_inputs(case, "second call")
    assert_same_bits("torch.compile, second call", run_step(compiled, q2, k2, v2, dout2),
                     eager(case, q2, k2, v2, dout2))


def test_compile_fullgraph_gqa():
    case = GQA
    q, k, v, dout = make_inputs(case)
    torch._dynamo.reset()
    compiled = torch.compile(attention_fn(case), fullgraph=True, dynamic=False)
    with torch.no_grad():
        out = compiled(q, k, v)
        want_out = attention_fn(case)(q, k, v)
    assert_same_bits("torch.compile GQA forward", (out,), (want_out,))
    want = eager(case, q, k, v, dout)
    torch._dynamo.reset()
    compiled = torch.compile(attention_fn(case), fullgraph=True, dynamic=False)
    assert_same_bits("torch.compile GQA", run_step(compiled, q, k, v, dout), want)


@pytest.mark.parametrize("case", [Case(64, True, 448, 448), Case(128, False, 192, 576)], ids=lambda c: c.id)
def test_compile_reduce_overhead_matches_eager(case):
    """Shapes used by no other test: the first (warm-up) run of the compiled step must prepare the kernels and
    the schedule tables itself before graph trees record; then replays with new inputs."""
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(attention_fn(case), mode="reduce-overhead", fullgraph=True, dynamic=False)
    inputs = [make_inputs(case, f"step {i}") for i in range(4)]      # warm-up, record, two replays
    results = []
    for step in inputs:
        torch.compiler.cudagraph_mark_step_begin()
        results.append(run_step(compiled, *step))
    assert counters["inductor"]["cudagraph_skips"] == 0, dict(counters["inductor"])
    for i, (step, got) in enumerate(zip(inputs, results)):
        assert_same_bits(f"reduce-overhead step {i}", got, eager(case, *step))


# --------------------------------------------------------------------------------------------------------------
# manual CUDA graph capture
# --------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", CASES + [SPLIT], ids=lambda c: c.id)
def test_cuda_graph_capture_and_replay_matches_eager(case):
    q, k, v, dout = make_inputs(case)
    graph, static_in, static_out = capture_step(case, q, k, v, dout)
    want = eager(case, q, k, v, dout)
    assert_same_bits("graph replay", replay(graph, static_in, static_out, (q, k, v, dout)), want)
    new = make_inputs(case, "new inputs")
    assert_same_bits("graph replay, new inputs", replay(graph, static_in, static_out, new), eager(case, *new))
    assert_same_bits("graph replay, again", replay(graph, static_in, static_out, (q, k, v, dout)), want)
    cupy_dash.check_errors()        # reads the captured backward's record: no failure


@pytest.mark.parametrize("case", [Case(64, False, 136, 136), Case(128, True, 200, 328, heads_kv=2)],
                         ids=lambda c: c.id)
def test_capture_without_warm_up_matches_eager(case):
    """Shapes no other test uses (their tables were never uploaded): the captured step makes them outside the
    capture (cupy_dash.cuda.capture) and its replays give the eager bits, with the captured inputs and new ones."""
    q, k, v, dout = make_inputs(case)
    graph, static_in, static_out = capture_step(case, q, k, v, dout, warm_up=False)
    got = replay(graph, static_in, static_out, (q, k, v, dout))
    assert_same_bits("graph captured without warm-up", got, eager(case, q, k, v, dout))
    new = make_inputs(case, "new inputs")
    assert_same_bits("graph captured without warm-up, new inputs", replay(graph, static_in, static_out, new),
                     eager(case, *new))
    cupy_dash.check_errors()


def test_failure_in_a_graph_replay_is_reported_by_check_errors():
    from cupy_dash.cuda import errors
    import cupy
    case = Case(128, True, 264, 264)
    q, k, v, dout = make_inputs(case)
    graph, static_in, static_out = capture_step(case, q, k, v, dout)
    want = replay(graph, static_in, static_out, (q, k, v, dout))
    cupy_dash.check_errors()
    records = errors._slot_pools[q.device.index].graph
    index = len(records.infos) - 1                  # the record this capture took
    assert records.infos[index][0][1:7] == (case.batch, case.heads, 264, 264, 128, True)   # (policy, ..., window)
    with cupy.cuda.Device(q.device.index):
        records.block[index, :4] = cupy.asarray(np.array([1, 7, 2, 1], np.int32))   # as the kernel writes a timeout
        cupy.cuda.runtime.deviceSynchronize()
    with pytest.raises(RuntimeError, match="CUDA graph replay") as info:
        cupy_dash.check_errors()
    for needle in ("visit 7 waited for rank 2, saw 1", "Sq=264", "D=128", "causal=True"):
        assert needle in str(info.value)
    cupy_dash.check_errors()                        # reported once, record cleared
    assert_same_bits("replay after the cleared failure", replay(graph, static_in, static_out, (q, k, v, dout)),
                     want)


# --------------------------------------------------------------------------------------------------------------
# opcheck
# --------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_opcheck(causal):
    case = Case(64, causal, 192, 256)
    q, k, v, dout = make_inputs(case)
    ops = torch.ops.cupy_dash
    leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
    torch.library.opcheck(ops.attention_forward.default, (*leaves, causal, None, "auto", True))
    out, lse = ops.attention_forward(q, k, v, causal)
    torch.library.opcheck(ops.attention_backward.default, (dout, q, k, v, out, lse, causal, 0.1, "shift", True))
