"""Probe: v3.3 plain vs its variants kernel with no variant on, and each variant alone (bf16 causal N=8192).

`--define NAME[=VALUE]` (repeatable) compiles every kernel with the macro defined (an experiment's
switch in the CUDA sources; the kernel cache keys on the options, so every build stays cached).
"""

import argparse

import torch
from triton.testing import do_bench

from tileattn import _nvrtc, flash_attn_func, reference, serving

parser = argparse.ArgumentParser()
parser.add_argument("--define", action="append", default=[], help="NAME[=VALUE], defined in every kernel")
define = [tuple(d.split("=", 1)) if "=" in d else d for d in parser.parse_args().define]
if define:
    _plain_options = _nvrtc._program_options

    def _program_options(source_file, arch):
        opts = _plain_options(source_file, arch)
        opts.define_macro = define
        return opts

    _nvrtc._program_options = _program_options
    print(f"compiled with {define}")


def max_error(D, softcap):
    """Causal bf16 at an awkward length against float64, softcap on or off (a build's sanity check)."""
    q, k, v = (torch.randn(1, 777, 2, D, device="cuda", dtype=torch.bfloat16) * 2 for _ in range(3))
    out = flash_attn_func(q, k, v, causal=True, softcap=softcap).double().cpu().numpy()
    heads = lambda t: t.double().cpu().numpy().transpose(0, 2, 1, 3)  # reference.py's (B, H, N, D)
    ref, _ = reference.attention_serving(*map(heads, (q, k, v)), causal=True, softcap=softcap)
    return abs(out - ref.transpose(0, 2, 1, 3)).max()


B, H, N = 2, 16, 8192
for D in (64, 128):
    print(f"D={D} max |error| vs float64: plain causal {max_error(D, 0.0):.2e}, softcap 5 {max_error(D, 5.0):.2e}")
    q, k, v = (torch.randn(B, N, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    slopes = torch.rand(H, device="cuda") * 0.1
    t = lambda f: do_bench(f, warmup=25, rep=200, return_mode="median")
    base = t(lambda: flash_attn_func(q, k, v, causal=True))
    rows = {
        "variants kernel, none on": lambda: serving.attention_variants(
            q, k, v, D**-0.5, "bottom_right", (-1, 0), 0.0, None, False
        ),
        "window 4096": lambda: flash_attn_func(q, k, v, causal=True, window_size=(4096, 0)),
        "alibi": lambda: flash_attn_func(q, k, v, causal=True, alibi_slopes=slopes),
        "softcap": lambda: flash_attn_func(q, k, v, causal=True, softcap=50.0),
        "noncausal plain": lambda: flash_attn_func(q, k, v),
        "noncausal, window (-1,-1) variants kernel + alibi": lambda: flash_attn_func(q, k, v, alibi_slopes=slopes),
    }
    print(f"D={D} plain causal {base:.3f} ms")
    for name, f in rows.items():
        ms = t(f)
        print(f"  {name:50s} {ms:.3f} ms  {base / ms:.3f}x of plain causal time")
