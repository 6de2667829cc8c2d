"""Time v3.5 (FP8) against tileattn's bf16 default at B*N = 32768, H = 16: the kernel alone (V^T
given), V^T's copy alone, the whole flash_attn_func call, and the kernel's O against float64 of
the e4m3 values (relative Frobenius error over batch 0's first two heads: a tile under `--tile`
must match the default's).  One line per case; run it again under TILEATTN_DEFINES="..." to
compare an experiment's build (bench/NOTES.md).

    python scripts/fp8_probe.py [--headdim 64 128 256] [--seqlen 8192] [--tile 128=128,256 ...] [--no-bf16]
"""

import argparse
import dataclasses

import torch
from triton.testing import do_bench

from tileattn import flash_attn_func, fp8, versions

p = argparse.ArgumentParser()
p.add_argument("--headdim", type=int, nargs="*", default=[64, 128, 256])
p.add_argument("--seqlen", type=int, nargs="*", default=[8192])
p.add_argument("--tile", nargs="*", default=[], help="D=Br,Bc: v3.5 at another tile")
p.add_argument("--no-bf16", action="store_true", help="FP8 alone (another build's bf16 is the same)")
args = p.parse_args()
tiles = dict(fp8.V3_5_FP8.tiles)
for spec in args.tile:
    D, tile = spec.split("=")
    tiles[int(D)] = tuple(int(x) for x in tile.split(","))
fp8.V3_5_FP8 = versions.KERNEL_ENTRIES["v3.5"] = dataclasses.replace(fp8.V3_5_FP8, tiles=tiles)
if args.tile:  # the tiles asked for at every length (no 192-key blocks for long calls without a mask)
    fp8.V3_5_FP8_WIDE = dataclasses.replace(fp8.V3_5_FP8_WIDE, tiles={})
ms = lambda fn: do_bench(fn, warmup=25, rep=100, return_mode="median")


def rel_err(out, q8, k8, v8, descales, causal: bool) -> float:
    """O (B, N, H, D) against float64 attention of the e4m3 values times their descale factors
    ((B, H) each), batch 0, heads 0 and 1."""
    num = den = 0.0
    for h in (0, 1):
        q, k, v = (t[0, :, h].double() * d[0, h].double() for t, d in zip((q8, k8, v8), descales))
        ref = torch.nn.functional.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=causal)[0]
        num += (out[0, :, h].double() - ref).square().sum().item()
        den += ref.square().sum().item()
    return (num / den) ** 0.5


for D in args.headdim:
    for N in args.seqlen:
        B, H = 32768 // N, 16
        gen = torch.Generator(device="cuda").manual_seed(0)
        x = [torch.randn(B, N, H, D, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(3)]
        (q8, dq), (k8, dk), (v8, dv) = (fp8.quantize_e4m3(t) for t in x)
        vt = fp8.v_transposed(v8.transpose(1, 2))
        for causal in (False, True):
            mode = "bottom_right" if causal else None
            flops = 4 * B * H * N * N * D / (2 if causal else 1)
            tile = fp8.kernel_entry(D, causal, N).tiles[D]
            kernel = lambda: fp8.attention(q8, k8, v8, D**-0.5, mode, "bnhd", (dq, dk, dv), False, vt=vt)
            err = rel_err(kernel()[0], q8, k8, v8, (dq, dk, dv), causal)
            t_kernel = ms(kernel)
            t_vt = ms(lambda: fp8.v_transposed(v8.transpose(1, 2)))
            t_call = ms(lambda: flash_attn_func(q8, k8, v8, causal=causal, descale_q=dq, descale_k=dk, descale_v=dv))
            t_bf16 = float("nan") if args.no_bf16 else ms(lambda: flash_attn_func(*x, causal=causal))
            tf = lambda t: flops / t / 1e9
            print(
                f"D={D} N={N} causal={causal} tile {tile}: kernel {t_kernel:.3f} ms ({tf(t_kernel):.0f} TF/s), "
                f"V^T {t_vt:.3f} ms, "
                f"call {t_call:.3f} ms ({tf(t_call):.0f}), bf16 {t_bf16:.3f} ms ({tf(t_bf16):.0f}); "
                f"call / bf16 {t_bf16 / t_call:.2f}x, kernel / bf16 {t_bf16 / t_kernel:.2f}x; err {err:.2e}",
                flush=True,
            )
