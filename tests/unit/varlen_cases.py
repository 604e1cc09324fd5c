"""Random packed batches for the varlen schedule tests (not a test module): shared by
test_schedule_varlen_fast.py and test_varlen_compact.py."""
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
