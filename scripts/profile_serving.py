"""One launch of each serving kernel for `ncu` (warm-up launches first, outside the profiled
range): the decode headline (bf16, B=16, 32 query heads over 8 K/V heads, one token, 16,384 keys,
D=128) by tileattn's default decode rung and by cuDNN, then v3.3 bf16 causal (B=2, H=16, N=8192,
D=128) plain, its variants kernel with no variant on, and each variant alone.

    ncu --profile-from-start off --clock-control none --metrics ... python3 scripts/profile_serving.py

(scripts/ncu_serving.sh runs it with the metrics that say where the time goes.)"""

import torch

from tileattn import flash_attn_func, flash_attn_with_kvcache, serving
from tileattn.bench import _peer_fn

gen = torch.Generator(device="cuda").manual_seed(0)
randn = lambda *s: torch.randn(*s, device="cuda", dtype=torch.bfloat16, generator=gen)
B, H, H_kv, Nk, D = 16, 32, 8, 16384, 128
q, k, v = randn(B, 1, H, D), randn(B, Nk, H_kv, D), randn(B, Nk, H_kv, D)
calls = {
    "decode": lambda: flash_attn_with_kvcache(q, k, v),
    "decode cudnn": _peer_fn("sdpa_cudnn", q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), False),
}
N = 8192
qp, kp, vp = (randn(2, N, 16, D) for _ in range(3))
slopes = torch.rand(16, device="cuda", generator=gen) * 0.1
calls |= {
    "causal plain": lambda: flash_attn_func(qp, kp, vp, causal=True),
    "variants none": lambda: serving.attention_variants(qp, kp, vp, D**-0.5, "bottom_right", (-1, 0), 0.0, None, False),
    "window 4096": lambda: flash_attn_func(qp, kp, vp, causal=True, window_size=(4096, 0)),
    "alibi": lambda: flash_attn_func(qp, kp, vp, causal=True, alibi_slopes=slopes),
    "softcap": lambda: flash_attn_func(qp, kp, vp, causal=True, softcap=50.0),
}
for fn in calls.values():  # compile, load, warm up
    fn(), fn()
torch.cuda.synchronize()
for name, fn in calls.items():
    print(f"=== {name}", flush=True)
    torch.cuda.cudart().cudaProfilerStart()
    fn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
