"""CPU tests of the launch plans (cupy_dash/cuda/plans.py) and their executor (cupy_dash/cuda/launch_plan.c through
executor.LaunchPlan), which every launch shares (eager calls, the host fast path, the JAX handler):

* the addresses found by packing the real parameter blocks twice (``find_patches``) are exactly the buffer fields;
* a plan run in inspect mode (no driver) gives, for any addresses, the block that launchers packs for them (the
  tensor-map encoder is replaced by one whose first 8 bytes are the address, as inspect mode writes it);
* malformed plans are refused.
What needs a GPU (tensor-map patching by the driver, cuLaunchKernel) runs in every GPU test.
"""
from __future__ import annotations

import struct
import types

import numpy as np
import pytest

from cupy_dash.cuda import executor, kernels, launchers, plans, tensormap
from fastpath_fakes import backward_launch


def fake_map(ptr, dtype, shape, strides, box_rows, name="tensor", box_panels=None):
    """Stands in for cuTensorMapEncodeTiled (no driver here): the address, then 120 bytes of every other argument."""
    return struct.pack("<Q", ptr) + repr((dtype, tuple(shape), tuple(strides), box_rows, box_panels)).encode()[:120] \
        .ljust(120, b"\0")


@pytest.fixture(autouse=True)
def no_driver(monkeypatch):
    monkeypatch.setattr(tensormap, "bhsd_map", fake_map)
    monkeypatch.setattr(launchers, "l2_bytes", lambda dev: 60 << 20)    # the H200's L2 and SMs
    monkeypatch.setattr(kernels, "sm_count", lambda dev: 132)
    monkeypatch.setattr(plans.jit, "load", lambda spec: types.SimpleNamespace(ptr=hash(spec.label) & 0xffff))


def problem(B=2, Sq=200, Sk=320, H=4, Hkv=2, D=64):
    return types.SimpleNamespace(B=B, Sq=Sq, Sk=Sk, H=H, Hkv=Hkv, D=D, Dv=D, dtype="bfloat16", scale=0.125,
                                 softcap=0.0, device_id=0)


def strides(shape):
    _, S, H, D = shape
    return (S * H * D, H * D, D)


def offsets(dtype, *names):
    return {n: dtype.fields[n][1] for n in names}


def forward_parts(p, names=plans.FWD_BUFFERS[:5]):
    spec, bm, bn = kernels.fwd_entry(p.dtype, p.D, True)
    st = (strides((p.B, p.Sq, p.H, p.D)), strides((p.B, p.Sk, p.Hkv, p.D)), strides((p.B, p.Sk, p.Hkv, p.D)))
    return plans.forward(spec, launchers.fwd_grid(p, bm), bm, bn, p, (-1, 0), st, names), st, bm, bn


def backward_strides(p):
    qs, kvs = strides((p.B, p.Sq, p.H, p.D)), strides((p.B, p.Sk, p.Hkv, p.D))
    return qs, kvs, kvs, qs, qs


def test_forward_plan_patches():
    p = problem()
    names = plans.FWD_BUFFERS[:5]
    parts, _, _, _ = forward_parts(p)
    off = offsets(parts.params.dtype, "lse", "tma_q", "tma_k", "tma_v", "tma_o")
    assert parts.pointers == ((off["lse"], names.index("lse"), 0),)
    assert sorted(parts.maps) == sorted((off[f"tma_{n}"], i, 0) for n, i in (("q", 0), ("k", 1), ("v", 2), ("o", 3)))
    assert int(parts.params["batch"][0]) == p.B and int(parts.params["window_right"][0]) == 0
    assert len(parts.kernels) == 1 and parts.kernels[0][1] == launchers.fwd_grid(p, 128) and parts.zeros == ()


@pytest.mark.parametrize("deterministic", [True, False], ids=["deterministic", "atomic"])
def test_backward_plan_patches(deterministic):
    p = problem()
    c = backward_launch(p, deterministic)
    names = plans.BWD_BUFFERS
    parts = plans.backward(c, backward_strides(p))
    dt = parts.params.dtype
    found = {o: (names[i], add) for o, i, add in parts.pointers}
    want = {dt.fields[f][1]: (f, 0) for f in ("q", "k", "v", "out", "lse", "dq", "dk", "dv", "error",
                                              "error_host")}
    want[dt.fields["dout"][1]] = ("dout", 0)
    for field, k in (("lse_log2", 0), ("dpsum", 1), ("dq_accum", 2)) + ((("dq_semaphore", 3),) if deterministic
                                                                          else ()):
        want[dt.fields[field][1]] = ("work", c.offsets[k])
    assert found == want
    for field, value in (("visits", 0x5000), ("rank", 0x6000), ("cta_start", 0x7000)):
        assert int(parts.params[field][0]) == value, field            # constants stay in the template
    assert {names[i] for _, i, _ in parts.maps} == {"q", "k", "v", "dout", "dk", "dv"}
    fixed = plans.backward(c, backward_strides(p), names[:10], error=(0x8000, 0))       # a JAX call's record
    assert {names[i] for _, i, _ in fixed.pointers} == set(names[:10])
    assert int(fixed.params["error"][0]) == 0x8000 and int(fixed.params["error_host"][0]) == 0


@pytest.mark.parametrize("window", [(-1, 0), (0, 0)], ids=["causal", "window-unseen-kv"])
def test_backward_plan_kernels_and_zeros(window):
    """preprocess, main, postprocess (or the folded main kernel alone) with their grids; dk and dv zeroed first
    exactly when a KV tile is unseen."""
    p = problem(Sq=64, Sk=320)
    c = backward_launch(p, window=window)
    parts = plans.backward(c, backward_strides(p))
    assert parts.zeros == (tuple(zip((7, 8), launchers.kv_bytes(p))) if c.zero_kv else ())
    assert [k[1] for k in parts.kernels] == [g for _, g in launchers.bwd_kernels(c)]
    assert [k[2:] for k in parts.kernels] == [(s.threads, s.smem_bytes) for s, _ in launchers.bwd_kernels(c)]


def test_inspected_blocks_are_the_launchers_blocks():
    """For fresh addresses, the executor's block (inspect mode) is the one launchers packs for them, forward and
    backward: every pointer, map and constant in place."""
    rng = np.random.default_rng(5)
    p = problem()
    parts, st, bm, bn = forward_parts(p)
    for _ in range(3):
        q, k, v, out, lse = (int(x) << 8 for x in rng.integers(1, 1 << 36, 5))
        want = launchers.fwd_params(bm, bn, p, (-1, 0), tuple(zip((q, k, v), st)), out, lse)
        assert parts.plan().inspect((q, k, v, out, lse)) == want.tobytes()
    c = backward_launch(p)
    plan = plans.backward(c, backward_strides(p)).plan()
    for _ in range(3):
        a = dict(zip(plans.BWD_BUFFERS, (int(x) << 8 for x in rng.integers(1, 1 << 36, len(plans.BWD_BUFFERS)))))
        operands = tuple(zip((a["q"], a["k"], a["v"], a["out"], a["dout"]), backward_strides(p)))
        want = launchers.bwd_params(c, operands, a["lse"], a["work"], (a["dq"], a["dk"], a["dv"]),
                                    (a["error"], a["error_host"]))
        assert plan.inspect(tuple(a.values())) == want.tobytes()
    with pytest.raises(RuntimeError, match="names buffer"):
        plan.inspect(tuple(a.values())[:5])                  # fewer addresses than the plan's buffers


def test_pointer_that_follows_no_buffer_is_refused():
    p = problem()
    spec, bm, bn = kernels.fwd_entry(p.dtype, p.D, True)
    st = forward_parts(p)[1]

    def bad(a):          # lse moves with the fake addresses, but not like a buffer
        return launchers.fwd_params(bm, bn, p, (-1, 0), tuple(zip((a["q"], a["k"], a["v"]), st)), a["out"],
                                    a["lse"] // 2)
    with pytest.raises(ValueError, match="pointer field lse does not follow any one buffer"):
        plans.find_patches(bad, plans.FWD_BUFFERS[:5])


def test_malformed_plans_are_refused():
    parts = forward_parts(problem())[0]
    params, pointers, maps = parts.params, parts.pointers, parts.maps
    ok = plans.pack_plan([(1, (2, 3, 4), 384, 1000)], params, pointers, maps, zeros=[(4, 4096)])
    executor.LaunchPlan(ok)
    assert len(ok) == 32 + 40 + 16 * (len(pointers) + len(maps) + 1) + params.dtype.itemsize   # launch_plan.h sizes
    with pytest.raises(ValueError, match="bad header"):
        executor.LaunchPlan(b"XXXX" + ok[4:])
    with pytest.raises(ValueError, match="bad header"):
        executor.LaunchPlan(ok[:-1])
    with pytest.raises(ValueError, match="misaligned or outside"):
        executor.LaunchPlan(plans.pack_plan([], params, [(params.dtype.itemsize, 0, 0)], []))
    with pytest.raises(ValueError, match="misaligned or outside"):
        executor.LaunchPlan(plans.pack_plan([], params, [], [(8, 0, 0)]))
    with pytest.raises(ValueError, match="shorter than its header"):
        executor.LaunchPlan(b"DASH")


def test_the_executor_patches_as_pack_into():
    """launch_plan.c in inspect mode against bytearray + struct.pack_into on random templates, pointer patches
    (address + offset) and map patches (the address over the map's first 8 bytes), buffers in any order; and
    patched_block, the integer fields of one kernel's block outside a plan."""
    rng = np.random.default_rng(4)
    for _ in range(50):
        n = int(rng.integers(256, 2048)) // 64 * 64
        template = np.frombuffer(bytes(rng.integers(0, 256, n, dtype=np.uint8)), dtype=np.dtype((np.void, n)))
        num_buffers = int(rng.integers(1, 12))
        buffers = tuple(int(b) for b in rng.integers(0, 1 << 47, num_buffers) // 16 * 16)
        pointers = [(int(o), int(rng.integers(0, num_buffers)), int(rng.integers(0, 1 << 20)))
                    for o in rng.choice(n // 8, int(rng.integers(0, 20)), replace=False) * 8]
        maps = [(int(o), int(rng.integers(0, num_buffers)), 0)
                for o in rng.choice(n // 64 - 1, int(rng.integers(0, 4)), replace=False) * 64]
        got = plans.Parts((), template, tuple(pointers), tuple(maps)).plan().inspect(buffers)
        ref = bytearray(template.tobytes())
        for o, i, add in pointers + maps:           # pointers first, then maps (the executor's order)
            struct.pack_into("<Q", ref, o, buffers[i] + add)
        assert got == bytes(ref)
    assert executor.patched_block(bytes(16), (0, 8), (-2, 1 << 63)) == struct.pack("<qQ", -2, 1 << 63)
    with pytest.raises(ValueError, match="does not fit"):
        executor.patched_block(bytes(256), (252,), (1,))
    with pytest.raises(OverflowError):
        executor.patched_block(bytes(16), (0,), (1 << 64,))


def test_plans_are_built_once_per_call_and_go_with_their_tables():
    """A backward's plan is built once per distinct call and kept with the tables it reads (so it goes with them);
    a timeline build's is never kept; forward plans are kept by what they depend on."""
    p = problem()
    c = backward_launch(p)
    st = backward_strides(p)
    first = plans.backward_plan(c, st)
    assert plans.backward_plan(c, st) is first and list(c.tables.plans.values()) == [first]
    assert plans.backward_plan(c, st, plans.BWD_BUFFERS[:10], error=(0x8000, 0)) is not first
    assert len(c.tables.plans) == 2
    other = backward_launch(p)                                   # other tables: a plan of their own
    assert plans.backward_plan(other, st) is not first and len(other.tables.plans) == 1
    assert plans.backward_plan(c, st, timeline=0x1000) is not plans.backward_plan(c, st, timeline=0x1000)
    assert len(c.tables.plans) == 2
    spec, bm, bn = kernels.fwd_entry(p.dtype, p.D, True)
    fst = forward_parts(p)[1]
    f = plans.forward_plan(spec, launchers.fwd_grid(p, bm), bm, bn, p, (-1, 0), fst)
    assert plans.forward_plan(spec, launchers.fwd_grid(p, bm), bm, bn, p, (-1, 0), fst) is f
    assert plans.forward_plan(spec, launchers.fwd_grid(p, bm), bm, bn, p, (-1, 1), fst) is not f


@pytest.mark.parametrize("cu", ["buffers", "fixed"])
def test_varlen_forward_plans_take_their_lengths_as_buffers_or_fixed(cu):
    """A varlen forward's plan with its cu_seqlens among the buffers in any order (the JAX handler numbers its
    arguments q, k, v, cu_seqlens_q, cu_seqlens_k before its results out, lse), or fixed at plan time (a traced
    call with host lengths uploads them once): the block launchers packs for the same addresses."""
    p = problem(B=1, Sq=300, Sk=500)
    spec, bm, bn = kernels.fwd_entry(p.dtype, p.D, True)
    grid = (-(-200 // bm), p.H, 3)
    st = (strides((1, 300, p.H, p.D)), strides((1, 500, p.Hkv, p.D)), strides((1, 500, p.Hkv, p.D)))
    q, k, v, cq, ck, out, lse = (0x1000 * (i + 1) for i in range(7))
    if cu == "buffers":
        names, fixed, buffers = ("q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "out", "lse"), (0, 0), (
            q, k, v, cq, ck, out, lse)
    else:
        names, fixed, buffers = plans.FWD_BUFFERS[:5], (cq, ck), (q, k, v, out, lse)
    plan = plans.forward(spec, grid, bm, bn, p, (-1, 0), st, names, 3, fixed).plan()
    want = launchers.fwd_params(bm, bn, p, (-1, 0), tuple(zip((q, k, v), st)), out, lse, (3, cq, ck), grid)
    assert plan.inspect(buffers) == want.tobytes()


@pytest.mark.parametrize("compact", [False, True], ids=["per-visit", "compact"])
def test_a_rebased_plan_is_the_plan_of_its_packing(compact):
    """plans.rebased (a new varlen packing of the same tensors: the template's plan with the length-dependent fields
    patched in C and the blob spliced) gives the block, kernels and zeroing of a plan built afresh for the new
    packing, for the same kernels or (a packing large enough for compact records) the compact build's."""
    ptr = types.SimpleNamespace
    p = problem(B=1, Sq=3000, Sk=5000)
    st = backward_strides(p)

    def launch(num_seqs, max_q, base, specs):
        tile = kernels.bwd_tile(p.D, True)
        c = launchers.BwdLaunch(specs, tile.block_m, tile.block_n, p, True, 10**9, True, (-1, 0),
                                varlen=(num_seqs, max_q))
        c.tables = ptr(visits=ptr(data=ptr(ptr=base)), rank=ptr(data=ptr(ptr=base + 0x100)),
                       cta_start=ptr(data=ptr(ptr=base + 0x200)), num_ctas=11 + num_seqs, policy="fa3")
        return c
    per_visit = kernels.bwd_specs("bfloat16", p.D, True)
    c0 = launch(3, 1500, 0x100000, per_visit)
    base = plans.backward(c0, st, cu_seqlens=(0x8000, 0x8100)).plan()
    c1 = launch(7, 900, 0x200000, kernels.bwd_specs("bfloat16", p.D, True, compact=True) if compact else per_visit)
    rebased = plans.rebased(base, c0.specs, c1, (0x9000, 0x9100))
    fresh = plans.backward(c1, st, cu_seqlens=(0x9000, 0x9100))
    buffers = tuple(0x1000000 * (i + 1) for i in range(len(plans.BWD_BUFFERS)))
    assert rebased.inspect(buffers) == fresh.plan().inspect(buffers)
    assert rebased.parts.kernels == fresh.kernels and rebased.parts.zeros == fresh.zeros
    assert rebased.parts.pointers == fresh.pointers and rebased.parts.maps == fresh.maps
