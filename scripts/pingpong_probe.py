"""Probe: v3.3 and its variants kernel with and without the inter-warpgroup ping-pong (the *_pp_fwd
kernels of csrc/v3_3_wgmma.cu), bf16 N=8192: outputs equal to the plain kernels' within bf16
rounding, and median ms."""
import dataclasses

import torch
from triton.testing import do_bench

from tileattn import api, flash_attn_func, serving, versions

B, H, N = 2, 16, 8192
t = lambda f: do_bench(f, warmup=25, rep=200, return_mode="median")


def use(pingpong: bool):
    v33 = versions.VERSIONS["v3.3"]
    versions.VERSIONS["v3.3"] = dataclasses.replace(v33, kernel="v3_3_pp_fwd" if pingpong else "v3_3_fwd")
    var = versions.KERNEL_ENTRIES["v3.3_variants"]
    name = "v3_3_variants_pp_fwd" if pingpong else "v3_3_variants_fwd"
    versions.KERNEL_ENTRIES["v3.3_variants"] = dataclasses.replace(var, kernel=name)
    api._PLANS.clear(), api._CALLS.clear(), api.entry_kernel.cache_clear(), serving._packed_kernel.cache_clear()


for D in (64, 128):
    q, k, v = (torch.randn(B, N, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    slopes = torch.rand(H, device="cuda") * 0.1
    calls = {
        "causal": lambda: flash_attn_func(q, k, v, causal=True),
        "non-causal": lambda: flash_attn_func(q, k, v),
        "window 4096": lambda: flash_attn_func(q, k, v, causal=True, window_size=(4096, 0)),
        "alibi": lambda: flash_attn_func(q, k, v, causal=True, alibi_slopes=slopes),
        "softcap": lambda: flash_attn_func(q, k, v, causal=True, softcap=50.0),
    }
    for name, f in calls.items():
        use(False)
        ref = f()
        ms0 = t(f)
        use(True)
        out = f()
        torch.cuda.synchronize()
        err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
        ms1 = t(f)
        print(f"D={D} {name:12s} plain {ms0:.3f} ms  ping-pong {ms1:.3f} ms  {ms0 / ms1:.3f}x  diff {err:.1e}", flush=True)
