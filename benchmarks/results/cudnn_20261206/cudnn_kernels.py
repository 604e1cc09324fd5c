"""The kernels torch SDPA's cuDNN backend launches for one backward call, with their GPU time (torch.profiler):
their names carry cuDNN's tile plan. Usage: python cudnn_kernels.py  (16k tokens; head dims 128, 192, 256)."""
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile

for D, H in ((128, 16), (192, 16), (256, 8)):
    for causal, S in ((False, 16384), (True, 16384), (True, 4096)):
        B = 16384 // S
        q, k, v, do = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
        for x in (q, k, v):
            x.requires_grad_(True)
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        for _ in range(3):
            torch.autograd.grad(out, (q, k, v), do, retain_graph=True)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                torch.autograd.grad(out, (q, k, v), do, retain_graph=True)
            torch.cuda.synchronize()
        print(f"== head dim {D}, {'causal' if causal else 'full'} {S}, B {B}, H {H}")
        for e in prof.key_averages():
            if str(e.device_type).endswith("CUDA") and e.count:
                print(f"  {e.count:3d} x {e.device_time_total / e.count / 1e3:8.3f} ms  {e.key[:220]}")
