"""Probe: the backward rungs (by default the 16-bit bwd_v2 .. bwd_v5 at bf16 B=4 H=16; with
--dtype float32 the FP32 ones at H=8) at N=8192, D=64 and 128, causal and not, timed at the power
limit's steady clock (bench._time: a soak, then do_bench's median over 1 s), with each rung's
largest dQ difference from the first as a sanity check (a build that leaves something out on
purpose shows it here).

`--define NAME[=VALUE]` (repeatable) compiles every kernel with the macro defined, as
scripts/variants_probe.py (an experiment's switch in the CUDA sources); `--tile RUNG:D=Br,Bc` runs
a rung at a tile other than the registry's; `--kernels` lists each launch of one call of each rung
(torch.profiler: the rung, the D_i pass, the memsets and copies around it) with its device time;
`--peers` times cuDNN's and FA2's backward (SDPA; FP32: the memory-efficient one) on the same
inputs and prints each rung's ratio to them; `--seqlen N` runs B = 32768 / N (the bwd suite's
shapes) instead of N=8192; `--headdim` the head dims (64 and 128 by default); `--causal no|yes`
one of the two; `--no-tail` the rungs without their tail (backward._tail_plan), `--tail-min-q-blocks` its
threshold.
"""

import argparse
import dataclasses

import torch

from tileattn import _nvrtc, api, backward, bench
from tileattn.backward import attention_backward
from tileattn.versions import BWD_VERSIONS, KERNEL_ENTRIES

parser = argparse.ArgumentParser()
parser.add_argument("--define", action="append", default=[], help="NAME[=VALUE], defined in every kernel")
parser.add_argument("--versions", nargs="+", default=["bwd_v2", "bwd_v3", "bwd_v4", "bwd_v5"])
parser.add_argument("--tile", action="append", default=[], help="RUNG:D=Br,Bc, a tile other than the registry's")
parser.add_argument("--dtype", default="bfloat16", help="float32: the FP32 rungs, at H=8 as the bwd suite")
parser.add_argument("--kernels", action="store_true", help="each launch of one call, with its device time")
parser.add_argument("--peers", action="store_true", help="cuDNN and FA2 (SDPA) on the same inputs, and our ratios")
parser.add_argument("--seqlen", type=int, default=8192, help="N, with B = 32768 / N")
parser.add_argument("--headdim", type=int, nargs="+", default=[64, 128])
parser.add_argument("--no-tail", action="store_true", help="no tail (backward._tail_plan), for A/B runs")
parser.add_argument("--causal", choices=["both", "no", "yes"], default="both")
parser.add_argument("--tail-min-q-blocks", type=int, help="split K/V blocks of this many Q blocks or more")
args = parser.parse_args()
if args.no_tail:
    backward._tail_plan = lambda *a, **k: None
if args.tail_min_q_blocks:
    backward._TAIL_Q_BLOCKS = args.tail_min_q_blocks
_nvrtc.EXPERIMENT_DEFINES[:] = args.define
for spec in args.tile:  # the backward reads BWD_VERSIONS, the loader KERNEL_ENTRIES: both replaced
    rung, rest = spec.split(":")
    D, tile = rest.split("=")
    entry = BWD_VERSIONS[rung]
    entry = dataclasses.replace(entry, tiles={**entry.tiles, int(D): tuple(map(int, tile.split(",")))})
    BWD_VERSIONS[rung] = KERNEL_ENTRIES[rung] = entry
print(f"compiled with {_nvrtc.EXPERIMENT_DEFINES}, tiles {args.tile}")

B, H, N = 32768 // args.seqlen, 16 if args.dtype != "float32" else 8, args.seqlen
PEERS = (("sdpa_efficient",) if args.dtype == "float32" else ("sdpa_cudnn", "sdpa_flash")) if args.peers else ()
dt = getattr(torch, args.dtype)
for D in args.headdim:
    for causal in {"both": (False, True), "no": (False,), "yes": (True,)}[args.causal]:
        q, k, v, dO = (torch.randn(B, H, N, D, device="cuda", dtype=dt) for _ in range(4))
        mode = "top_left" if causal else None
        with torch.no_grad():
            out, lse = api._call(q, k, v, None, mode, "bhnd", None, None, "scale", True)
        flops = 2.5 * bench.Case(B, H, N, D, args.dtype, causal).flops  # 5 products of the forward's 2
        base, times = None, {}
        for peer in PEERS:  # autograd through SDPA's backend (the bwd suite's peers), its forward run once
            times[peer] = bench._time(bench._peer_backward(peer, q, k, v, dO, causal), steady=True)
            print(f"D={D} causal={causal} {peer}: {times[peer]:.2f} ms {flops / times[peer] / 1e9:.0f} TFLOP/s")
        for name in args.versions:
            p = "tf32" if BWD_VERSIONS[name].precision == "tf32" else None
            run = lambda name=name, p=p: attention_backward(
                q, k, v, out, lse, dO, D**-0.5, mode, "bhnd", version=name, precision=p
            )
            dq = run()[0].float()
            base = dq if base is None else base
            ms = bench._time(run, steady=True)
            diff = (dq - base).abs().max().item()
            ratios = "".join(f", {t / ms:.2f}x {peer}" for peer, t in times.items())
            print(
                f"D={D} causal={causal} {name}: {ms:.2f} ms {flops / ms / 1e9:.0f} TFLOP/s, max |dq - first| {diff:.1e}"
                + ratios
            )
            if args.kernels:
                with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                    run()
                    torch.cuda.synchronize()
                for e in prof.events():
                    if e.device_type == torch.autograd.DeviceType.CUDA:
                        print(f"    {e.device_time / 1e3:8.3f} ms  {e.name[:100]}")
