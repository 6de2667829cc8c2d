"""The FP8 kernel's error against float64 of the values its e4m3 inputs stand for (GPU): O's
relative Frobenius error and lse's largest absolute error, per head dim, score spread (q and k
scaled by amp before quantization) and causal mode.  Run it under two builds (or two checkouts) to
compare a change to v3.5's numerics; tests/test_fp8.py holds the kernel to a model instead.

    python scripts/fp8_kernel_error.py
"""

import torch

from tileattn import flash_attn_func, fp8

torch.manual_seed(0)
B, N, H = 2, 1000, 4
for D in (64, 128, 256):
    for amp in (0.5, 1.0, 3.0):
        for causal in (False, True):
            q, k, v = (torch.randn(B, N, H, D, device="cuda") * s for s in (amp, amp, 1.0))
            (q8, dq), (k8, dk), (v8, dv) = (fp8.quantize_e4m3(t.bfloat16()) for t in (q, k, v))
            qd, kd, vd = (t.double() * d.double().view(B, 1, H, 1) for t, d in ((q8, dq), (k8, dk), (v8, dv)))
            descales = dict(descale_q=dq, descale_k=dk, descale_v=dv)
            o, lse = flash_attn_func(q8, k8, v8, causal=causal, return_lse=True, **descales)
            S = torch.einsum("bihd,bjhd->bhij", qd, kd) * D**-0.5
            if causal:
                S = S.masked_fill(torch.ones(N, N, dtype=torch.bool, device="cuda").triu(1), float("-inf"))
            ref = torch.einsum("bhij,bjhd->bihd", torch.softmax(S, -1), vd)
            err = ((o.double() - ref).norm() / ref.norm()).item()
            lse_err = (lse.double() - torch.logsumexp(S, -1)).abs().max().item()
            print(f"D={D} amp={amp} causal={int(causal)} O_rel={err:.3e} lse_max={lse_err:.2e}")
