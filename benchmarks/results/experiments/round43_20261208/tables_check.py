"""Which rotations the imported cupy_dash builds (call 3's legs): its compact records against benchmarks/hop_model.py's
plain and spread ones at an 80-query full mask and a 64-query causal one."""
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import hop_model  # noqa: E402

import cupy_dash  # noqa: E402
from cupy_dash import schedule  # noqa: E402

found = []
for S, bm, H, causal, ctas in [(1280, 80, 5, False, 10), (4096, 64, 4, True, 20)]:
    tree = schedule.build_compact("symmetric_shift", seqlen_q=S, seqlen_k=S, block_m=bm, block_n=128, num_heads=H,
                                  causal=causal, num_sms=ctas)
    for spread in (False, True):
        if np.array_equal(hop_model.column_records(S, bm, 128, H, causal, num_sms=ctas, spread=spread).records,
                          tree.records):
            found.append("spread" if spread else "plain")
print(f"{Path(cupy_dash.__file__).parent}: {' '.join(found)} rotations")
