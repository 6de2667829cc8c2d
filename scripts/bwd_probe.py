"""Probe: the 16-bit backward rungs (bwd_v2, bwd_v3, bwd_v4) at bf16 B=4 H=16 N=8192, D=64 and
128, causal and not, timed with triton's do_bench (median), with each rung's largest dQ difference
from the first as a sanity check (a build that leaves something out on purpose shows it here).

`--define NAME[=VALUE]` (repeatable) compiles every kernel with the macro defined, as
scripts/variants_probe.py (an experiment's switch in the CUDA sources; none is in them now: the
ones measured so far are in bench/NOTES.md).
"""

import argparse

import torch
from triton.testing import do_bench

from tileattn import _nvrtc, api, bench
from tileattn.backward import attention_backward

parser = argparse.ArgumentParser()
parser.add_argument("--define", action="append", default=[], help="NAME[=VALUE], defined in every kernel")
parser.add_argument("--versions", nargs="+", default=["bwd_v2", "bwd_v3", "bwd_v4"])
args = parser.parse_args()
_nvrtc.EXPERIMENT_DEFINES[:] = args.define
print(f"compiled with {_nvrtc.EXPERIMENT_DEFINES}")

B, H, N = 4, 16, 8192
for D in (64, 128):
    for causal in (False, True):
        q, k, v, dO = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
        mode = "top_left" if causal else None
        with torch.no_grad():
            out, lse = api._call(q, k, v, None, mode, "bhnd", None, None, "scale", True)
        flops = 2.5 * bench.Case(B, H, N, D, "bfloat16", causal).flops  # 5 products of the forward's 2
        base = None
        for name in args.versions:
            run = lambda name=name: attention_backward(q, k, v, out, lse, dO, D**-0.5, mode, "bhnd", version=name)
            dq = run()[0].float()
            base = dq if base is None else base
            ms = do_bench(run, warmup=25, rep=200, return_mode="median")
            diff = (dq - base).abs().max().item()
            print(
                f"D={D} causal={causal} {name}: {ms:.2f} ms {flops / ms / 1e9:.0f} TFLOP/s, max |dq - first| {diff:.1e}"
            )
