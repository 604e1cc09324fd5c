#!/usr/bin/env python
"""Benchmark cupy_dash against torch SDPA (FA2 backend) on the standard shapes; see cupy_dash/bench.py.

    python benchmarks/bench_attention.py --quick            # about 2 minutes
    python benchmarks/bench_attention.py                     # every seqlen, head dim 64 and 128, both masks
    python benchmarks/bench_attention.py --seqlens 2048 8192 --hdims 128 --masks causal --no-torch

Writes benchmarks/results/bench_<time>.json and .md (or the path given with --out) and prints the table.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from cupy_dash.bench import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(prog="python benchmarks/bench_attention.py"))
