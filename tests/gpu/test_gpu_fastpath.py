"""GPU tests of the host fast path (cupy_dash.core.fastpath): a repeated call with torch tensors is served from the
stored plan and gives the bits of the full path; new buffers get new tensor maps; bad input still raises before
any launch. Skipped without a Hopper GPU and torch with CUDA."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import cupy_dash  # noqa: E402
from cupy_dash.core import fastpath  # noqa: E402

pytestmark = pytest.mark.gpu

CASES = [  # (hdim, causal, Sq, Sk, H, Hkv, window, schedule)
    (128, True, 1000, 1000, 4, 4, (-1, -1), "auto"), (64, False, 777, 1500, 4, 2, (-1, -1), "shift"),
    (128, False, 513, 513, 8, 1, (100, 50), "descending"), (64, True, 2048, 2048, 2, 2, (300, -1), "fa3"),
]


def _inputs(hdim, Sq, Sk, H, Hkv, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    mk = lambda S, n: torch.randn(2, S, n, hdim, device="cuda", dtype=torch.bfloat16, generator=g)  # noqa: E731
    return mk(Sq, H), mk(Sk, Hkv), mk(Sk, Hkv), mk(Sq, H)


def _same(a, b):
    return all(bool((x.view(torch.int16) if x.dtype != torch.float32 else x.view(torch.int32)).equal(
        y.view(torch.int16) if y.dtype != torch.float32 else y.view(torch.int32))) for x, y in zip(a, b))


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"d{c[0]}-{'causal' if c[1] else 'full'}-sq{c[2]}-sk{c[3]}"
                         f"-h{c[4]}-hkv{c[5]}-w{c[6][0]}_{c[6][1]}-{c[7]}")
def test_fast_path_gives_the_full_paths_bits(case, monkeypatch):
    hdim, causal, Sq, Sk, H, Hkv, window, schedule = case
    fastpath.clear()
    q, k, v, do = _inputs(hdim, Sq, Sk, H, Hkv, 1)
    kw = dict(causal=causal, window=window)
    out, lse = cupy_dash.attention_forward(q, k, v, **kw)                     # full path, stores the plan
    grads = cupy_dash.attention_backward(do, q, k, v, out, lse, schedule=schedule, **kw)
    hits = fastpath.stats()
    out2, lse2 = cupy_dash.attention_forward(q, k, v, **kw)                   # fast path
    grads2 = cupy_dash.attention_backward(do, q, k, v, out, lse, schedule=schedule, **kw)
    after = fastpath.stats()
    assert after["fwd_hits"] == hits["fwd_hits"] + 1 and after["bwd_hits"] == hits["bwd_hits"] + 1
    assert _same((out, lse), (out2, lse2)) and _same(grads, grads2)
    # other buffers of the same layout: new tensor maps, still the full path's bits
    q3, k3, v3, do3 = _inputs(hdim, Sq, Sk, H, Hkv, 2)
    fast = cupy_dash.attention_forward(q3, k3, v3, **kw)
    fast_grads = cupy_dash.attention_backward(do3, q3, k3, v3, *fast, schedule=schedule, **kw)
    monkeypatch.setenv("CUPY_DASH_FASTPATH", "0")
    full = cupy_dash.attention_forward(q3, k3, v3, **kw)
    full_grads = cupy_dash.attention_backward(do3, q3, k3, v3, *full, schedule=schedule, **kw)
    cupy_dash.check_errors()
    assert fastpath.stats()["fwd_hits"] == after["fwd_hits"] + 1
    assert _same(fast, full) and _same(fast_grads, full_grads)


def test_bad_input_after_a_plan_still_raises():
    fastpath.clear()
    q, k, v, do = _inputs(64, 256, 256, 2, 2, 3)
    out, lse = cupy_dash.attention_forward(q, k, v, causal=True)
    cupy_dash.attention_backward(do, q, k, v, out, lse, causal=True)
    with pytest.raises(TypeError, match="causal"):
        cupy_dash.attention_forward(q, k, v, causal=1)
    buf = torch.zeros(q.numel() + 1, device="cuda", dtype=torch.bfloat16)
    shifted = buf[1:].view(q.shape)                                           # 2 bytes off: not 16-byte aligned
    with pytest.raises(ValueError, match="q"):
        cupy_dash.attention_forward(shifted, k, v, causal=True)
    with pytest.raises(ValueError, match="k"):
        cupy_dash.attention_backward(do, q, k.to(torch.float16), v, out, lse, causal=True)
    cupy_dash.check_errors()


def test_every_backward_publishes_its_error_record():
    """The postprocess kernel marks each eager call's host record finished: after the device drains, a poll
    retires every pending call (none waits for an event or copy), and the slots are reused, not grown."""
    from cupy_dash.cuda import errors
    fastpath.clear()
    q, k, v, do = _inputs(64, 300, 300, 2, 1, 4)
    out, lse = cupy_dash.attention_forward(q, k, v, causal=True)
    cupy_dash.attention_backward(do, q, k, v, out, lse, causal=True)
    cupy_dash.check_errors()
    pool = errors._slot_pools[torch.cuda.current_device()]
    blocks, free = len(pool._blocks), len(pool.free)
    hits = fastpath.stats()["bwd_hits"]
    for _ in range(300):                                    # more calls than one block of 64 slots
        cupy_dash.attention_backward(do, q, k, v, out, lse, causal=True)
        torch.cuda.synchronize()
    assert fastpath.stats()["bwd_hits"] == hits + 300
    errors.poll_errors()
    assert not errors._pending
    assert (len(pool._blocks), len(pool.free)) == (blocks, free)
