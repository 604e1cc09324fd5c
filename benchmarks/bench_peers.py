"""Peers measured beside cupy_dash by benchmarks/bench.py, on the same input buffers.

* torch SDPA with the FlashAttention-2 backend: forward, and the backward with and without
  ``torch.use_deterministic_algorithms(True)`` (its deterministic backward); layout (B, H, S, D) as transposed
  views of the (B, S, H, D) buffers. Timed with CUDA events, like cupy_dash.
* FlashAttention-3 through the ``flash-attn3-jax`` wheel (prebuilt FA3 for sm90, head dim 128 in that wheel),
  when importable: its backward FFI target called with ``deterministic`` True and False on cupy_dash's
  forward ``out``/``lse``, shared with JAX through DLPack. JAX exposes no CUDA events, so FA3 is timed as the
  wall time of ``repeats`` calls dispatched back to back, ended by one ``block_until_ready`` (the median of 3
  such loops): no host gaps, which if anything favours it. Each configuration runs in a fresh process
  (:func:`fa3_subprocess`, the same seeded inputs) under a timeout: in a long-lived process that had used the
  GPU for other work, FA3's deterministic backward hung on our H200 (2026-12-01, d128 full S=1024 B=16 H=16).

Each deterministic implementation is also checked for bitwise repeatability: two backward calls on the same
inputs, every byte of dq, dk, dv compared (``repeats_bits`` in the result).
"""
from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import time

__all__ = ["TorchPeer", "Fa3Peer", "same_bits", "load_peers", "fa3_subprocess"]


def same_bits(first, second) -> bool:
    """Whether two tuples of GPU arrays (CuPy, torch or JAX) hold identical bytes."""
    import cupy
    for a, b in zip(first, second):
        a, b = cupy.from_dlpack(a), cupy.from_dlpack(b)
        if a.shape != b.shape or a.dtype != b.dtype:
            return False
        if a.size and bool(cupy.any(a.view(cupy.uint16) != b.view(cupy.uint16))):
            return False
    return True


class _TorchEvents:
    def __init__(self, torch):
        self.torch = torch

    def event(self):
        return self.torch.cuda.Event(enable_timing=True)

    def record(self, ev):
        ev.record()

    def synchronize(self, ev):
        ev.synchronize()

    def elapsed_ms(self, start, end):
        return float(start.elapsed_time(end))


class TorchPeer:
    """torch SDPA, FlashAttention-2 backend: keys torch_fwd, torch_bwd_det, torch_bwd_nondet."""
    name = "torch"

    def __init__(self, torch):
        self.torch = torch
        self.version = torch.__version__

    def measure(self, sets, causal, flops, measure, time_calls, summary, flush, timing, fwd_only=False):
        torch = self.torch
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel

        ev = _TorchEvents(torch)
        tsets = [{n: torch.from_dlpack(s[n]) for n in ("q", "k", "v", "do")} for s in sets]

        def sdpa(t):
            return F.scaled_dot_product_attention(t["q"].transpose(1, 2), t["k"].transpose(1, 2),
                                                  t["v"].transpose(1, 2), is_causal=causal)

        def fwd():
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION), torch.no_grad():
                calls = [lambda t=t: sdpa(t) for t in tsets]
                return summary(time_calls(calls, events=ev, flush=flush, **timing), flops["fwd"])

        measure("torch_fwd", fwd)
        if fwd_only:
            return
        previous = (torch.are_deterministic_algorithms_enabled(),
                    torch.is_deterministic_algorithms_warn_only_enabled())
        for deterministic, key in ((True, "torch_bwd_det"), (False, "torch_bwd_nondet")):
            def bwd(deterministic=deterministic):
                torch.use_deterministic_algorithms(deterministic)
                graphs = []
                with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                    for t in tsets:
                        leaves = [t[n].detach().requires_grad_(True) for n in ("q", "k", "v")]
                        out = F.scaled_dot_product_attention(*(x.transpose(1, 2) for x in leaves),
                                                             is_causal=causal)
                        graphs.append((out, leaves, t["do"].transpose(1, 2)))
                    calls = [lambda g=g: torch.autograd.grad(g[0], g[1], g[2], retain_graph=True) for g in graphs]
                    res = summary(time_calls(calls, events=ev, flush=flush, **timing), flops["bwd"])
                    if deterministic:
                        res["repeats_bits"] = same_bits(calls[0](), calls[0]())
                return res

            try:
                measure(key, bwd)
            finally:
                torch.use_deterministic_algorithms(previous[0], warn_only=previous[1])
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


class Fa3Peer:
    """FlashAttention-3 (flash-attn3-jax wheel): keys fa3_fwd, fa3_bwd_det, fa3_bwd_nondet (head dim 128
    only)."""
    name = "fa3"
    HEAD_DIMS = (128,)

    def __init__(self):
        import flash_attn3_jax  # registers the FFI targets
        import jax
        self.jax = jax
        self.version = getattr(flash_attn3_jax, "__version__", "?")
        self.device = jax.devices("gpu")[0]
        self._fns = {}

    def _bwd_fn(self, causal, deterministic):
        """jit(dout, q, k, v, out, lse) -> (dq, dk, dv): the wheel's own backward FFI call, with the
        ``deterministic`` attribute that its public wrapper fixes to False."""
        key = (causal, deterministic)
        if key not in self._fns:
            jax = self.jax
            import jax.numpy as jnp

            def bwd(dout, q, k, v, out, lse):
                n, lq, hq, d = q.shape
                rounded = -(-lq // 128) * 128
                types = [jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct(k.shape, k.dtype),
                         jax.ShapeDtypeStruct(v.shape, v.dtype),
                         jax.ShapeDtypeStruct((n, hq, rounded), jnp.float32),
                         jax.ShapeDtypeStruct((n, hq, rounded), jnp.float32)]
                empty = jnp.array([], dtype=jnp.int32)
                dq, dk, dv, _, _ = jax.ffi.ffi_call(
                    "flash_mha_bwd", result_shape_dtypes=types, has_side_effect=False,
                    input_layouts=[None] * 10, output_layouts=[None] * 5)(
                    dout, q, k, v, out, lse, empty, empty, empty, empty,
                    max_seqlen_q_val=lq, max_seqlen_q_has_value=True, max_seqlen_k_val=k.shape[1],
                    max_seqlen_k_has_value=True, softmax_scale_val=1.0 / math.sqrt(d), softmax_scale_has_value=True,
                    is_causal=causal, window_size_left=-1, window_size_right=-1, softcap=0.0,
                    deterministic=deterministic, sm_margin=0)
                return dq, dk, dv

            self._fns[key] = jax.jit(bwd)
        return self._fns[key]

    def _loop_time(self, fn, jsets, repeats, warmup, flops, warmup_s=0.0):
        """Median over 3 loops of ``repeats`` calls (ms per call), after ``warmup`` calls that also compile and
        more until ``warmup_s`` seconds have passed since the first compiled call (a steady clock, as
        benchmarks/measure.py's time_calls)."""
        jax = self.jax
        jax.block_until_ready(fn(*jsets[0]))
        t0, i = time.perf_counter(), 1
        while i < warmup or time.perf_counter() - t0 < warmup_s:
            jax.block_until_ready(fn(*jsets[i % len(jsets)]))
            i += 1
        loops = []
        for _ in range(3):
            t0 = time.perf_counter()
            res = None
            for i in range(repeats):
                res = fn(*jsets[i % len(jsets)])
            jax.block_until_ready(res)
            loops.append((time.perf_counter() - t0) / repeats * 1e3)
        med = statistics.median(loops)
        return dict(median_ms=med, min_ms=min(loops), max_ms=max(loops), n=3 * repeats,
                    tflops=flops / (med * 1e-3) / 1e12, timing="loop")

    def measure_fwd(self, sets, causal, flops, measure, repeats, warmup, log=print, warmup_s=0.0):
        """Key fa3_fwd: the wheel's public forward (flash_mha) on the CuPy q, k, v of ``sets``."""
        jax = self.jax
        from flash_attn3_jax import flash_mha
        jsets = [tuple(jax.dlpack.from_dlpack(s[n]) for n in ("q", "k", "v")) for s in sets]
        fn = jax.jit(lambda q, k, v: flash_mha(q, k, v, is_causal=causal))

        def fwd():
            log("    (FA3 forward: compile and warm up)")
            return self._loop_time(fn, jsets, repeats, warmup, flops["fwd"], warmup_s)

        measure("fa3_fwd", fwd)

    def measure_bwd(self, sets, causal, flops, measure, repeats, warmup, log=print, warmup_s=0.0):
        """``sets``: input sets with CuPy q, k, v, do, out, lse (cupy_dash's forward)."""
        jax = self.jax
        jsets = [tuple(jax.dlpack.from_dlpack(s[n]) for n in ("do", "q", "k", "v", "out", "lse")) for s in sets]
        for deterministic, key in ((True, "fa3_bwd_det"), (False, "fa3_bwd_nondet")):
            fn = self._bwd_fn(causal, deterministic)

            def bwd(fn=fn, deterministic=deterministic):
                log(f"    (FA3 backward, deterministic={deterministic}: compile and warm up)")
                out = self._loop_time(fn, jsets, repeats, warmup, flops["bwd"], warmup_s)
                if deterministic:
                    first = jax.block_until_ready(fn(*jsets[0]))
                    out["repeats_bits"] = same_bits(first, jax.block_until_ready(fn(*jsets[0])))
                return out

            measure(key, bwd)


_FA3_SCRIPT = r"""
import json, os, sys
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
sys.path.insert(0, sys.argv[2])
import cupy
import cupy_dash
from cupy_dash.cli.measure import attention_flops, random_tensor
from bench_peers import Fa3Peer
p = json.loads(sys.argv[1])
B, S, H, D, causal = p["batch"], p["seqlen"], p["heads"], p["hdim"], p["causal"]
n = p["tokens"] * p["hidden"]
sets = []
for i in range(p["input_sets"]):
    s = {name: random_tensor((n,), p["dtype"], seed=10 * i + j).reshape(B, S, H, D)
         for j, name in enumerate(("q", "k", "v", "do"))}
    s["out"], s["lse"] = cupy_dash.attention_forward(s["q"], s["k"], s["v"], causal=causal)
    sets.append(s)
cupy.cuda.Device().synchronize()
flops = dict(fwd=attention_flops(B, H, S, S, D, causal, "fwd"), bwd=attention_flops(B, H, S, S, D, causal, "bwd"))
results = {}
def measure(key, fn):
    try:
        results[key] = fn()
    except Exception as exc:
        results[key] = dict(error=f"{type(exc).__name__}: {exc}")
peer = Fa3Peer()
log = lambda m: print(m, file=sys.stderr, flush=True)
peer.measure_fwd(sets, causal, flops, measure, p["repeats"], p["warmup"], log, p["warmup_s"])
print("@@RESULT@@" + json.dumps(results), flush=True)
if not p["fwd_only"]:
    peer.measure_bwd(sets, causal, flops, measure, p["repeats"], p["warmup"], log, p["warmup_s"])
print("@@RESULT@@" + json.dumps(results))
"""


def fa3_subprocess(cfg: dict, opts: dict, timeout: float = 150.0) -> dict:
    """FA3 measurements (keys fa3_fwd, fa3_bwd_det, fa3_bwd_nondet) of one configuration, in a fresh process
    on the benchmark's seeded inputs (cupy_dash.cli.measure.random_tensor, seeds 10 i + j). The process prints its
    results after the forward and again at the end, so a backward that hangs keeps the forward's figure; a
    timeout or a crash becomes an error entry naming it for every key without a result."""
    params = dict(batch=cfg["batch"], seqlen=cfg["seqlen"], heads=cfg["heads"], hdim=cfg["hdim"],
                  causal=cfg["causal"], tokens=opts["tokens"], hidden=opts["hidden"], dtype=opts["dtype"],
                  input_sets=opts["input_sets"], repeats=opts["repeats"], warmup=opts["warmup"],
                  warmup_s=opts.get("warmup_s", 0.0),
                  fwd_only=opts.get("fwd_only", False))
    env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false")
    keys = ("fa3_fwd",) if opts.get("fwd_only") else ("fa3_fwd", "fa3_bwd_det", "fa3_bwd_nondet")
    try:
        here = os.path.dirname(os.path.abspath(__file__))          # the script imports bench_peers from here
        proc = subprocess.run([sys.executable, "-c", _FA3_SCRIPT, json.dumps(params), here], env=env,
                              capture_output=True, text=True, timeout=timeout)
        stdout, why = proc.stdout, None
        if proc.returncode:
            tail = " | ".join((proc.stderr or proc.stdout or "").strip().splitlines()[-3:])
            why = f"FA3 process exited with {proc.returncode}: {tail}"
    except subprocess.TimeoutExpired as exc:
        stdout = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        why = f"no result within {timeout:.0f} s (FA3 hung or was too slow)"
    results = {}
    for line in stdout.splitlines():
        if line.startswith("@@RESULT@@"):
            results = json.loads(line[len("@@RESULT@@"):])
    for k in keys:
        if k not in results:
            results[k] = dict(error=why or "FA3 process gave no result")
    return results


def fa3_available() -> str | None:
    """None if the flash-attn3-jax wheel and JAX are importable, else why not (no GPU work, no JAX start-up)."""
    import importlib.util
    for mod in ("flash_attn3_jax", "jax"):
        if importlib.util.find_spec(mod) is None:
            return f"{mod} is not installed"
    return None


def load_peers(want_torch: bool, want_fa3: bool, log) -> tuple:
    """(list of in-process peers, {peer name: why it is missing}, whether FA3 can run in a subprocess)."""
    peers, missing = [], {}
    if want_torch:
        try:
            import torch
            if torch.cuda.is_available():
                peers.append(TorchPeer(torch))
            else:
                missing["torch"] = "torch has no CUDA device"
        except ImportError as exc:
            missing["torch"] = f"not importable ({exc})"
    fa3 = False
    if want_fa3:
        why = fa3_available()
        if why is None:
            fa3 = True
        else:
            missing["fa3"] = why
    for name, why in missing.items():
        log(f"peer {name} missing: {why}")
    return peers, missing, fa3
