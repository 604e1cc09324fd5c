"""cupy_dash.jax under ``jax.shard_map`` (its type check of how values vary over manual mesh axes on): the gradient
of the differentiable calls traces, each cotangent with its primal's type, and an operand replicated over the
mesh (k, v whole beside queries split over it) gets its gradient summed over it. Traced on the CPU (two host devices in a fresh
interpreter: the device count is fixed when JAX starts); no kernel runs."""
from __future__ import annotations

import pytest

from fresh_interpreter import run

pytest.importorskip("jax")

PRELUDE = """
    import os
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, PartitionSpec as P
    import cupy_dash.jax as cj
    mesh = Mesh(np.array(jax.devices()[:2]), ("data",))
    x = jnp.zeros((4, 128, 2, 64), jnp.bfloat16)

    def grads(call, q_spec, kv_spec):
        def loss(q, k, v):
            o = jax.shard_map(call, mesh=mesh, in_specs=(q_spec, kv_spec, kv_spec), out_specs=q_spec)(q, k, v)
            return o.astype(jnp.float32).sum()
        return jax.make_jaxpr(jax.grad(loss, argnums=(0, 1, 2)))(x, x, x)
"""


@pytest.mark.parametrize("kv", ["sharded", "replicated"])   # batch split over the mesh / queries split, k, v whole
@pytest.mark.parametrize("entry", ["attention", "attention_forward"])
def test_gradient_traces_under_shard_map(entry, kv):
    call = ("lambda q, k, v: cj.attention(q, k, v)" if entry == "attention" else
            "lambda q, k, v: cj.attention_forward(q, k, v)[0]")
    specs = 'P("data"), P("data")' if kv == "sharded" else 'P(None, "data"), P()'
    run(PRELUDE + f"""
    jaxpr = grads({call}, {specs})
    text = str(jaxpr)
    shapes = [v.aval.shape for v in jaxpr.jaxpr.outvars]
    assert shapes == [(4, 128, 2, 64)] * 3, shapes
    # a replicated k / v: its gradient is summed over the mesh axis (the transpose of the operands' cast)
    assert ("psum" in text) == ({kv == "replicated"}), text
    """)


def test_backward_results_vary_like_their_operands():
    run(PRELUDE + """
    def step(q, k, v):
        out, lse = cj.attention_forward(q, k, v)
        dq, dk, dv = cj.attention_backward(out, q, k, v, out, lse)
        return dq + dk + dv
    jax.make_jaxpr(jax.shard_map(step, mesh=mesh, in_specs=P("data"), out_specs=P("data")))(x, x, x)
    """)
