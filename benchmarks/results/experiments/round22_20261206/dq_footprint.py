"""dQ rows touched per lockstep window of W visits per CTA (MB of fp32) and the heads they span, per schedule, at
16k tokens: head dim 256 (64 x 64 tiles, 8 heads) and 128 (80 x 128, 16 heads), causal and full. CPU only:
    python benchmarks/results/experiments/round22_20261206/dq_footprint.py"""
import numpy as np

from cupy_dash import schedule


def footprint(policy, causal, block_m, block_n, heads, hdim, window, seqlen=16384, num_sms=132):
    """Print the median and p90 over windows of the MB of dQ rows (head, m_block) the CTAs touch together, assuming
    every CTA runs its t-th visit at the same time, and the median number of heads."""
    plan = schedule.build(policy, seqlen_q=seqlen, seqlen_k=seqlen, block_m=block_m, block_n=block_n,
                          num_heads=heads, causal=causal, num_sms=num_sms)
    visits, start = plan.visits, plan.cta_start               # visits: (cta, head, n_block, m_block) rows
    longest = int(np.diff(start).max())
    mbytes, nheads = [], []
    for t0 in range(0, longest, window):
        rows, hs = set(), set()
        for c in range(plan.num_ctas):
            block = visits[start[c] + t0:min(start[c] + t0 + window, start[c + 1])]
            rows.update(zip(block[:, 1].tolist(), block[:, 3].tolist()))
            hs.update(block[:, 1].tolist())
        mbytes.append(len(rows) * block_m * hdim * 4 / 2**20)
        nheads.append(len(hs))
    mask = "causal" if causal else "full  "
    print(f"{policy:16s} {mask} d{hdim} W={window}: dQ MB touched per window median {np.median(mbytes):6.1f} "
          f"p90 {np.percentile(mbytes, 90):6.1f}; heads median {np.median(nheads):.0f}")


for hdim, block_m, block_n, heads in ((256, 64, 64, 8), (128, 80, 128, 16)):
    for causal in (False, True):
        for policy in ("symmetric_shift", "fa3"):
            footprint(policy, causal, block_m, block_n, heads, hdim, window=16)
