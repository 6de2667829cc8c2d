"""Probe: plain causal (the default rung) vs the variants kernel with no variant on, and each
variant alone (bf16 causal N=8192).  No experiment is compiled in now (earlier ones: bench/NOTES.md).

`--define NAME[=VALUE]` (repeatable) compiles every kernel with the macro defined (an experiment's
switch in the CUDA sources; the kernel cache keys on the options, so every build stays cached).
`--version v3.8|v3.7|v3.6|v3.3|v3.1` runs the variants on that rung's kernel (default: the dispatch's), and
`--tile D=Br,Bc` (repeatable) runs v3.6's variants kernel at another tile.  `--backward` times the
backward instead: plain causal on the default rung and on bwd_v2, and each variant on
bwd_v2_variants (the same shapes; the forward's O and lse made once).  `--only REGEX` times the rows
whose names it finds, after plain causal, and skips the error checks.
"""

import argparse
import dataclasses
import re

import torch

from tileattn import _nvrtc, bench, flash_attn_func, reference, serving, versions

parser = argparse.ArgumentParser()
parser.add_argument("--define", action="append", default=[], help="NAME[=VALUE], defined in every kernel")
parser.add_argument("--version", default=None, help="the variants' rung (flash_attn_func's version=)")
parser.add_argument("--tile", action="append", default=[], help="D=Br,Bc: v3.6's variants kernel at another tile")
parser.add_argument("--backward", action="store_true", help="time the backward (bwd_v2_variants) instead")
parser.add_argument("--only", default=None, help="a regex: time only the rows it finds (and skip the error checks)")
args = parser.parse_args()
_nvrtc.EXPERIMENT_DEFINES[:] = args.define
if _nvrtc.EXPERIMENT_DEFINES:
    print(f"compiled with {_nvrtc.EXPERIMENT_DEFINES}")
if args.tile:
    e = versions.KERNEL_ENTRIES["v3.6_variants"]
    tiles = dict(e.tiles)
    for spec in args.tile:
        D, tile = spec.split("=")
        tiles[int(D)] = tuple(int(x) for x in tile.split(","))
    versions.KERNEL_ENTRIES[e.name] = dataclasses.replace(e, tiles=tiles)
    print(f"v3.6_variants tiles {tiles}")
VERSION = args.version


def max_error(D, softcap=0.0, alibi=False, window=(-1, 0)):
    """Causal bf16 at an awkward length against float64, softcap and ALiBi on or off (a build's
    sanity check): the largest |error| of O and of lse."""
    q, k, v = (torch.randn(1, 777, 2, D, device="cuda", dtype=torch.bfloat16) * 2 for _ in range(3))
    slopes = torch.tensor([0.5, 0.05], device="cuda") if alibi else None
    out, lse = flash_attn_func(
        q,
        k,
        v,
        causal=True,
        window_size=window,
        softcap=softcap,
        alibi_slopes=slopes,
        return_lse=True,
        version=VERSION,
    )
    heads = lambda t: t.double().cpu().numpy().transpose(0, 2, 1, 3)  # reference.py's (B, H, N, D)
    ref, ref_lse = reference.attention_serving(
        *map(heads, (q, k, v)),
        causal=True,
        window=window,
        softcap=softcap,
        alibi_slopes=None if slopes is None else slopes.cpu().numpy(),
    )
    return abs(out.double().cpu().numpy() - ref.transpose(0, 2, 1, 3)).max(), abs(
        lse.double().cpu().numpy() - ref_lse
    ).max()


B, H, N = 2, 16, 8192


def backward_probe():
    """ms of the backward alone at the forward probe's shapes: plain causal on the default rung
    and on bwd_v2 (the variants' loop nest without them), then each variant on bwd_v2_variants,
    with the ratio of plain bwd_v2's time to it (1.0: the variant costs nothing)."""
    from tileattn.backward import attention_backward

    for D in (64, 128):
        q, k, v, dO = (torch.randn(B, N, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
        slopes = torch.rand(H, device="cuda") * 0.1
        out, lse = flash_attn_func(q, k, v, causal=True, return_lse=True)
        t = lambda f: bench._time(f, steady=True)
        bwd = lambda **kw: lambda: attention_backward(q, k, v, out, lse, dO, D**-0.5, "bottom_right", "bnhd", **kw)
        print(f"D={D} backward, plain causal: default rung {t(bwd()):.3f} ms", flush=True)
        base = t(bwd(version="bwd_v2"))
        print(f"  bwd_v2 plain causal                  {base:.3f} ms", flush=True)
        for name, variants in (("none on", ((-1, 0), 0.0, None)), ("window 4096", ((4096, 0), 0.0, None)),
                               ("softcap 50", ((-1, 0), 50.0, None)), ("alibi", ((-1, 0), 0.0, slopes))):  # fmt: skip
            ms = t(bwd(variants=variants))
            print(f"  bwd_v2_variants {name:20s} {ms:.3f} ms  {base / ms:.3f}x of bwd_v2 plain causal time", flush=True)


if args.backward:
    backward_probe()
    raise SystemExit
for D in (64, 128):
    checks = (("plain", {}), ("softcap 5", dict(softcap=5.0)), ("softcap 50", dict(softcap=50.0)),
              ("alibi", dict(alibi=True)), ("alibi + softcap 5", dict(alibi=True, softcap=5.0)),
              ("window 300 + softcap 5", dict(window=(300, 0), softcap=5.0)))  # fmt: skip
    for name, kw in () if args.only else checks:
        o_err, lse_err = max_error(D, **kw)
        print(f"D={D} causal {name}: max |error| vs float64 O {o_err:.2e}, lse {lse_err:.2e}")
    q, k, v = (torch.randn(B, N, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    slopes = torch.rand(H, device="cuda") * 0.1
    t = lambda f: bench._time(f, steady=True)  # (the power limit's steady clock: bench._time)
    base = t(lambda: flash_attn_func(q, k, v, causal=True))
    rows = {
        "variants kernel, none on": lambda: serving.attention_variants(
            q, k, v, D**-0.5, "bottom_right", (-1, 0), 0.0, None, False, version=VERSION
        ),
        "window 4096": lambda: flash_attn_func(q, k, v, causal=True, window_size=(4096, 0), version=VERSION),
        # a causal window alone on the variants kernel the dispatch took before v3.9
        "window 4096, variants kernel": lambda: flash_attn_func(
            q, k, v, causal=True, window_size=(4096, 0), version="v3.6"
        ),
        "alibi": lambda: flash_attn_func(q, k, v, causal=True, alibi_slopes=slopes, version=VERSION),
        # causal ALiBi alone on the variants kernel the dispatch took before v3.8, and on v3.8
        "alibi, variants kernel": lambda: flash_attn_func(
            q, k, v, causal=True, alibi_slopes=slopes, version="v3.7" if D == 64 else "v3.6"
        ),
        "alibi, v3.8": lambda: flash_attn_func(q, k, v, causal=True, alibi_slopes=slopes, version="v3.8"),
        "softcap": lambda: flash_attn_func(q, k, v, causal=True, softcap=50.0, version=VERSION),
        "noncausal plain": lambda: flash_attn_func(q, k, v),
        **({"v3.4 causal": lambda: flash_attn_func(q, k, v, causal=True, version="v3.4")} if D == 64 else {}),
        "noncausal, window (-1,-1) variants kernel + alibi": lambda: flash_attn_func(
            q, k, v, alibi_slopes=slopes, version=VERSION
        ),
    }
    print(f"D={D} plain causal {base:.3f} ms")
    for name, f in rows.items():
        if args.only and not re.search(args.only, name):
            continue
        ms = t(f)
        print(f"  {name:50s} {ms:.3f} ms  {base / ms:.3f}x of plain causal time")
