"""Where the host time of one call goes: cProfile over 3000 calls at a tiny shape (bf16, D=64)."""

import cProfile
import pstats

import torch

import tileattn

q, k, v = (torch.randn(1, 16, 1, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
with torch.no_grad():
    for _ in range(100):
        tileattn.flash_attn_func(q, k, v)
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(3000):
        tileattn.flash_attn_func(q, k, v)
    prof.disable()
    torch.cuda.synchronize()
pstats.Stats(prof).sort_stats("tottime").print_stats(14)
