"""dQ rows touched per lockstep window of W visits per CTA (MB of fp32) and the heads they span, per schedule, at
16k tokens: head dim 256 (64 x 64 tiles, 8 heads) and 128 (80 x 128, 16 heads), causal and full. CPU only:
    python benchmarks/results/experiments/round22_20261206/dq_footprint.py"""
import numpy as np
from cupy_dash import schedule as S
def run(policy, causal, bm, bn, heads, D, W, sec=0, sq=16384):
    p = S.build(policy, seqlen_q=sq, seqlen_k=sq, block_m=bm, block_n=bn, num_heads=heads, causal=causal, num_sms=132, head_section=sec)
    v, cs = p.visits, p.cta_start
    n = p.num_ctas
    L = int(max(cs[i+1]-cs[i] for i in range(n)))
    # step-major: visit t of each CTA (lockstep approximation)
    heads_distinct=[]; dq_bytes=[]; kv_heads=[]
    for t0 in range(0, L, W):
        rows=set(); hs=set()
        for c in range(n):
            a=cs[c]+t0; b=min(cs[c]+t0+W, cs[c+1])
            if a>=b: continue
            blk=v[a:b]
            for bh,m in zip(blk[:,1],blk[:,3]): rows.add((int(bh),int(m)))
            hs.update(blk[:,1].tolist())
        dq_bytes.append(len(rows)*bm*D*4); heads_distinct.append(len(hs))
    q=np.array(dq_bytes)/2**20
    print(f"{policy:16s} {'causal' if causal else 'full  '} d{D} W={W}: dQ MB touched per window median {np.median(q):6.1f} p90 {np.percentile(q,90):6.1f}; heads median {np.median(heads_distinct):.0f}")
for D,bm,bn,h in ((256,64,64,8),(128,80,128,16)):
    for causal in (False,True):
        for pol in ("symmetric_shift","fa3"):
            run(pol,causal,bm,bn,h,D,W=16)
