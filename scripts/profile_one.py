"""Run one rung (or PyTorch's flash backend, "sdpa_flash") once on one shape after a warm-up launch,
for `ncu` to profile, e.g.
    ncu --clock-control none -k regex:v3_1_fwd --launch-skip 1 -c 1 python3 scripts/profile_one.py v3.1 bfloat16 64
    ncu --clock-control none -k regex:flash_fwd --launch-skip 1 -c 1 python3 scripts/profile_one.py sdpa_flash bfloat16 64
"""
import sys

import torch

import tileattn

version, dtype, D = sys.argv[1], getattr(torch, sys.argv[2]), int(sys.argv[3])
B, H, N = 4, 16, 8192
q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=dtype) for _ in range(3))
for _ in range(2):  # the first launch compiles/loads; ncu skips it
    if version == "sdpa_flash":
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            torch.nn.functional.scaled_dot_product_attention(q, k, v)
    else:
        tileattn.scaled_dot_product_attention(q, k, v, version=version)
torch.cuda.synchronize()
