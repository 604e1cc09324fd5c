"""Random problems for the schedule tests (not a test module): packed batches (test_schedule_varlen_fast.py,
test_varlen_compact.py) and fixed-length problems (test_schedule_compact.py, test_schedule_one_builder.py)."""
import numpy as np


def random_problem(rng):
    """(seqlens_q, seqlens_k, build_varlen keywords) of a random packed batch: split token counts or free
    lengths (zeros included), Sq = Sk or not, causal or full, windows, GQA groups, tiles and CTA counts."""
    B = int(rng.choice([1, 2, 3, 4, 7, 16, 33, 64]))
    if rng.random() < 0.6:
        tokens = int(rng.choice([300, 2048, 16384]))
        cuts = np.sort(rng.choice(np.arange(1, tokens), min(B, tokens) - 1, replace=False))
        sq = np.diff(np.concatenate([[0], cuts, [tokens]]))
    else:
        sq = rng.integers(0, 2500, B)
    sk = sq if rng.random() < 0.7 else rng.integers(0, 2500, len(sq))
    causal = bool(rng.random() < 0.5)
    window = (-1, -1)
    if rng.random() < 0.4:
        window = (int(rng.integers(-1, 1500)), 0 if causal else int(rng.integers(-1, 1500)))
    g = int(rng.choice([1, 2, 4, 8]))
    kw = dict(block_m=int(rng.choice([32, 64, 128])), block_n=int(rng.choice([64, 128])),
              heads=g * int(rng.choice([1, 2, 4])), causal=causal, group_size=g, window=window,
              num_sms=int(rng.choice([1, 2, 7, 33, 132, 1000])))
    return sq, sk, kw


def random_fixed_problem(rng, policies):
    """(policy, seqlen_q, seqlen_k, block_m, block_n, num_heads, causal, num_sms, group_size, window) of a random
    fixed-length problem: odd lengths up to 3000, tiles of 16-128, GQA groups, windows, 1-1000 CTAs."""
    g = int(rng.choice([1, 2, 3, 8]))
    heads = g * int(rng.integers(1, 6))
    bm, bn = int(rng.choice([16, 64, 80, 128])), int(rng.choice([32, 64, 96, 128]))
    sq, sk = (int(x) for x in rng.integers(1, 3000, size=2))
    causal = bool(rng.integers(2))
    left = int(rng.choice([-1, rng.integers(0, 3000)]))
    right = 0 if causal else int(rng.choice([-1, rng.integers(0, 3000)]))
    sms = int(rng.choice([1, 2, 7, 33, 114, 132, 264, 1000]))
    return str(rng.choice(policies)), sq, sk, bm, bn, heads, causal, sms, g, (left, right)
