"""A training loop around cupy_dash attention under CUDA graphs, as a user writes it: a model of
two transformer blocks (q / kv / o projections around ``cupy_dash.torch.attention``, or
``cupy_dash.torch.attention_varlen`` on a fixed packing) compiled with ``torch.compile(model,
mode="reduce-overhead", fullgraph=True)``, then ``loss.backward()`` and an AdamW step, six steps from a fresh
process state of the shape (no eager call of it before); and one training step captured by hand with
``torch.cuda.graph`` after one eager step. Each runs twice from one seed: every loss and the final weights must be
bitwise equal, with no CUDA-graph skip. MHA and GQA (4:2), causal and full, head dim 64. The fixed packing's
cu_seqlens is a module buffer (a static input of the graphs: the recording run's backward reads the host copy its
warm-up took; a copied input could not be read on the host during capture). Skipped without a Hopper
GPU and torch with CUDA."""
from __future__ import annotations

import hashlib

import pytest

import cupy_dash

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
nn = torch.nn
from torch_helpers import torch_cuda  # noqa: E402, F401  (an autouse fixture)

B, S, DIM, HEAD_DIM, STEPS = 4, 512, 256, 64, 6
LENGTHS = (200, 512, 31, 281, 512, 512)          # one packing of B * S = 2048 tokens for the varlen model


class Block(nn.Module):
    """x ``(B, S, DIM)`` -> x + o(attention(q(x), k(x), v(x))) with ``heads`` query and ``kv_heads`` key/value
    heads of HEAD_DIM; ``cu`` (device int32 ``(n + 1,)``) and ``longest``: attend within the packed sequences."""

    def __init__(self, heads, kv_heads, causal, cu=None, longest=None):
        super().__init__()
        self.heads, self.kv_heads, self.causal, self.longest = heads, kv_heads, causal, longest
        # a buffer: CUDA graphs keep it in place, so the backward finds the lengths its eager warm-up copied
        self.register_buffer("cu", cu, persistent=False)
        self.q = nn.Linear(DIM, heads * HEAD_DIM, bias=False)
        self.kv = nn.Linear(DIM, 2 * kv_heads * HEAD_DIM, bias=False)
        self.o = nn.Linear(heads * HEAD_DIM, DIM, bias=False)

    def forward(self, x):
        b, s, _ = x.shape
        q = self.q(x).view(b, s, self.heads, HEAD_DIM)
        k, v = self.kv(x).view(b, s, 2, self.kv_heads, HEAD_DIM).unbind(2)
        if self.cu is None:
            a = cupy_dash.torch.attention(q, k, v, causal=self.causal)
        else:
            packed = [t.reshape(b * s, t.shape[2], HEAD_DIM) for t in (q, k, v)]
            a = cupy_dash.torch.attention_varlen(*packed, self.cu, self.cu, self.longest, self.longest,
                                                 causal=self.causal).view(b, s, self.heads, HEAD_DIM)
        return x + self.o(a.reshape(b, s, -1))


class Model(nn.Module):
    def __init__(self, heads, kv_heads, causal, varlen):
        super().__init__()
        cu = longest = None
        if varlen:
            starts = [0]
            for n in LENGTHS:
                starts.append(starts[-1] + n)
            cu, longest = torch.tensor(starts, dtype=torch.int32, device="cuda"), max(LENGTHS)
        self.emb = nn.Embedding(1000, DIM)
        self.blocks = nn.ModuleList(Block(heads, kv_heads, causal, cu, longest) for _ in range(2))
        self.head = nn.Linear(DIM, 1000, bias=False)

    def forward(self, tokens):
        x = self.emb(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(x).float()


def _batches():
    gen = torch.Generator(device="cuda").manual_seed(7)
    return [torch.randint(0, 1000, (B, S + 1), generator=gen, device="cuda") for _ in range(STEPS)]


def _digest(model) -> str:
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().float().cpu().numpy().tobytes())
    return h.hexdigest()


def _train_compiled(heads, kv_heads, causal, varlen):
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    model = Model(heads, kv_heads, causal, varlen).cuda().to(torch.bfloat16)
    step_fn = torch.compile(model, mode="reduce-overhead", fullgraph=True)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for tokens in _batches():
        torch.compiler.cudagraph_mark_step_begin()
        logits = step_fn(tokens[:, :-1])
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    assert counters["inductor"]["cudagraph_skips"] == 0, dict(counters["inductor"])
    return losses, _digest(model)


@pytest.mark.parametrize("varlen", [False, True], ids=["dense", "varlen"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (4, 2)], ids=["mha", "gqa4to2"])
def test_reduce_overhead_training_repeats_its_bits(heads, kv_heads, causal, varlen):
    first = _train_compiled(heads, kv_heads, causal, varlen)
    second = _train_compiled(heads, kv_heads, causal, varlen)
    assert all(torch.isfinite(torch.tensor(first[0])))
    assert first == second, f"losses {first[0]} vs {second[0]}"


def test_cuda_graph_captured_training_step_repeats_its_bits():
    """One eager step (warm-up), then forward + backward of a step captured with torch.cuda.graph on a side
    stream and replayed for every batch; the optimizer step stays eager. Twice from one seed."""

    def run():
        torch.manual_seed(0)
        model = Model(4, 2, True, False).cuda().to(torch.bfloat16)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        batches = _batches()
        static = batches[0].clone()

        def step():
            logits = model(static[:, :-1])
            loss = nn.functional.cross_entropy(logits.flatten(0, 1), static[:, 1:].flatten())
            loss.backward()
            return loss

        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            step()                                   # eager warm-up: kernels and tables
            opt.zero_grad(set_to_none=False)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_loss = step()
        losses = []
        for tokens in batches:
            static.copy_(tokens)
            graph.replay()
            opt.step()
            opt.zero_grad(set_to_none=False)
            losses.append(static_loss.item())
        return losses, _digest(model)

    first, second = run(), run()
    assert first == second, f"losses {first[0]} vs {second[0]}"
