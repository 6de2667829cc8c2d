"""The FP8 kernel's error against float64 of the values its e4m3 inputs stand for
(reference.attention_fp8): O's relative Frobenius error and lse's largest absolute error, per head
dim, score spread (q and k scaled by amp before quantization) and causal mode.  Needs a GPU.  Run
it under two builds (or two checkouts) to compare a change to v3.5's numerics; tests/test_fp8.py
holds the kernel to a model instead.

    python scripts/fp8_kernel_error.py
"""

import numpy as np
import torch

from tileattn import flash_attn_func, fp8, reference

torch.manual_seed(0)
B, N, H = 2, 1000, 4
bhnd = lambda t: t.float().cpu().numpy().transpose(0, 2, 1, 3)  # (B, N, H, D) -> (B, H, N, D)
for D in (64, 128, 256):
    for amp in (0.5, 1.0, 3.0):
        for causal in (False, True):
            q, k, v = (torch.randn(B, N, H, D, device="cuda") * s for s in (amp, amp, 1.0))
            (q8, dq), (k8, dk), (v8, dv) = (fp8.quantize_e4m3(t.bfloat16()) for t in (q, k, v))
            descales = dict(descale_q=dq, descale_k=dk, descale_v=dv)
            o, lse = flash_attn_func(q8, k8, v8, causal=causal, return_lse=True, **descales)
            mode = "bottom_right" if causal else None
            ds = (d.cpu().numpy() for d in descales.values())
            O_ref, lse_ref = reference.attention_fp8(bhnd(q8), bhnd(k8), bhnd(v8), *ds, None, mode)
            err = np.linalg.norm(bhnd(o) - O_ref) / np.linalg.norm(O_ref)
            lse_err = np.abs(lse.cpu().numpy() - lse_ref).max()
            print(f"D={D} amp={amp} causal={int(causal)} O_rel={err:.3e} lse_max={lse_err:.2e}")
