"""Run one rung (or a PyTorch backend: "sdpa_flash", "sdpa_cudnn", "sdpa_efficient") once on one
shape after a warm-up launch, for `ncu` to profile, e.g.
    ncu --clock-control none -k regex:v3_1_fwd --launch-skip 1 -c 1 python3 scripts/profile_one.py v3.1 bfloat16 64
    ncu --clock-control none -k regex:flash_fwd --launch-skip 1 -c 1 \
        python3 scripts/profile_one.py sdpa_flash bfloat16 64
FP8: "v3.5" (its dtype argument is ignored: bf16 inputs quantized to e4m3).
Backward: "bwd_v2" (a BWD_VERSIONS rung) or a PyTorch backend's, "sdpa_flash_bwd" / "sdpa_cudnn_bwd" /
"sdpa_efficient_bwd", with -k regex:bwd_v2 / regex:flash_bwd / regex:bprop (cuDNN's kernel names).
Optional B H N [causal] after D pick another shape, e.g. a small one under compute-sanitizer:
    compute-sanitizer --tool racecheck python3 scripts/profile_one.py v2.3 float32 128 1 2 300 causal
A last argument "softcap" (after causal) runs flash_attn_func with softcap 50 (the variants
kernels, -k regex:variants), e.g. for the SFU's share against plain causal:
    ncu ... -k regex:v3_6_variants python3 scripts/profile_one.py v3.6 bfloat16 64 2 16 8192 causal softcap
"window" in its place a causal 4096-key window on the named rung ("v3.9", -k regex:v3_9_window; "v3.6",
-k regex:v3_6_variants):
    ncu ... -k regex:v3_9_window python3 scripts/profile_one.py v3.9 bfloat16 64 2 16 8192 causal window
"""

import sys

import torch

import tileattn
from tileattn.backward import attention_backward
from tileattn.versions import BWD_VERSIONS

version, dtype, D = sys.argv[1], getattr(torch, sys.argv[2]), int(sys.argv[3])
B, H, N = map(int, sys.argv[4:7]) if len(sys.argv) > 6 else (4, 16, 8192)
causal = sys.argv[7:8] == ["causal"]
softcap = 50.0 if sys.argv[8:9] == ["softcap"] else 0.0
window = sys.argv[8:9] == ["window"]
q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=dtype) for _ in range(3))
dO = torch.randn_like(q)
for _ in range(2):  # the first launch compiles/loads; ncu skips it
    if version in BWD_VERSIONS:  # the backward rung (the forward and D_i kernels run first)
        with torch.no_grad():
            out, lse = tileattn.api._call(q, k, v, None, "top_left" if causal else None, "bhnd", None, None, "", True)
            attention_backward(q, k, v, out, lse, dO, D**-0.5, "top_left" if causal else None, "bhnd", version=version)
    elif version.endswith("_bwd"):  # a PyTorch backend's backward (its forward runs first)
        from torch.nn.attention import SDPBackend, sdpa_kernel

        qkv = [t.detach().requires_grad_() for t in (q, k, v)]
        with sdpa_kernel([getattr(SDPBackend, version[5:-4].upper() + "_ATTENTION")]):
            out = torch.nn.functional.scaled_dot_product_attention(*qkv, is_causal=causal)
        torch.autograd.grad(out, qkv, dO)
    elif version in ("sdpa_flash", "sdpa_cudnn", "sdpa_efficient"):  # PyTorch's backends, the peers
        from torch.nn.attention import SDPBackend, sdpa_kernel

        backend = {"sdpa_flash": SDPBackend.FLASH_ATTENTION, "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION,
                   "sdpa_efficient": SDPBackend.EFFICIENT_ATTENTION}[version]  # fmt: skip
        with sdpa_kernel([backend]):
            torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    elif version == "v3.5":  # FP8: q, k, v quantized per (batch, head), V^T's copy included
        q8 = [tileattn.fp8.quantize_e4m3(t, "bhnd") for t in (q, k, v)]
        vt = tileattn.fp8.v_transposed(q8[2][0])
        tileattn.fp8.attention(*(x for x, _ in q8), D**-0.5, "top_left" if causal else None, "bhnd",
                               tuple(d for _, d in q8), False, vt=vt)  # fmt: skip
    elif softcap or window:  # (B, N, H, D) views; softcap: the dispatch picks the variants kernel
        qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
        kw = dict(window_size=(4096, 0), version=version) if window else dict(softcap=softcap)
        tileattn.flash_attn_func(qt, kt, vt, causal="top_left" if causal else False, **kw)
    else:
        tileattn.scaled_dot_product_attention(q, k, v, is_causal=causal, version=version)
torch.cuda.synchronize()
