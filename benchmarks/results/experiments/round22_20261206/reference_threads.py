"""The float64 / low-precision references of five GQA-shaped cases (tests/gpu/test_gpu_gqa.py sizes), timed in one
process; run four at once with and without OPENBLAS_NUM_THREADS=1 to see what BLAS threads cost when processes share
the cores (2026-12-06, a 2-core machine: 25-26 s each with the default threads, 13 s with one):
    for i in 1 2 3 4; do python reference_threads.py & done; wait
    for i in 1 2 3 4; do OPENBLAS_NUM_THREADS=1 python reference_threads.py & done; wait"""
import time, numpy as np, ml_dtypes
from cupy_dash import reference
t=time.time()
for (d,sq,sk,causal,hk) in ((128,1000,300,True,8),(256,300,777,False,2),(64,255,255,True,16),(192,1000,300,False,1),(128,300,777,True,16)):
    rng=np.random.default_rng(0); dt=ml_dtypes.bfloat16
    q=rng.standard_normal((2,sq,16,d)).astype(dt); k=rng.standard_normal((2,sk,hk,d)).astype(dt); v=rng.standard_normal((2,sk,hk,d)).astype(dt); do=rng.standard_normal((2,sq,16,d)).astype(dt)
    o,l=reference.forward(q,k,v,causal=causal); ol,ll=reference.forward_lowp(q,k,v,causal=causal,dtype=dt)
    reference.backward(do,q,k,v,o,l,causal=causal); reference.backward_lowp(do,q,k,v,ol,ll,causal=causal,dtype=dt)
print('%.1f'%(time.time()-t))
