"""The case of the framework GPU tests (torch ops, JAX under jit; not a test module, imports no framework): sizes,
mask, dtype and window of one attention call, and its test id."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Case:
    hdim: int
    causal: bool
    seqlen_q: int = 320
    seqlen_k: int = 320
    heads: int = 4
    heads_kv: int = 4
    batch: int = 2
    dtype: str = "bfloat16"        # a torch / numpy dtype name
    window: tuple = (-1, -1)

    @property
    def id(self) -> str:
        text = f"{self.dtype}-d{self.hdim}-{'causal' if self.causal else 'full'}-sq{self.seqlen_q}-sk{self.seqlen_k}"
        text += f"-h{self.heads}-hkv{self.heads_kv}" if self.heads_kv != self.heads else ""
        return text + (f"-w{self.window[0]}_{self.window[1]}" if self.window != (-1, -1) else "")
