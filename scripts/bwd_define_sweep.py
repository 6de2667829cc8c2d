"""Sweep: a backward rung built under several sets of experiment macros, every build timed in one
process, interleaved in rounds (so clock and temperature drift fall on all of them alike), beside
cuDNN's backward (SDPA) on the same inputs, at the bwd suite's shapes (B = 32768 / N, H = 16).

    python scripts/bwd_define_sweep.py --variant none= --variant s4=TILEATTN_BWD_STAGGER=4 \\
        --variant s8=TILEATTN_BWD_STAGGER=8 [--rung bwd_v5] [--seqlen 8192 4096] [--headdim 64 128]
        [--dtype float16 bfloat16] [--causal] [--rounds 2]

Each --variant is NAME=MACRO[,MACRO...] (MACRO: NAME or NAME=VALUE; empty: the plain build).  All
builds are compiled first, in parallel; each row prints every variant's best median over the
rounds and its ratio to cuDNN, each timed at the power limit's steady clock (bench._time).
bench/results/sweeps/bwd_v5_stagger_sweep_00d8d1d.log came from an earlier form of this script
(100-ms windows), whose "sp" variants set TILEATTN_BWD_STAGGER_SPREAD=1 (starting points
n_blocks / S apart, now the only form; without it they were one Q block apart).
"""

import argparse
from concurrent.futures import ProcessPoolExecutor

import torch

from tileattn import _nvrtc, api, bench, versions
from tileattn.backward import attention_backward
from tileattn.versions import BWD_DQ_CONVERT, BWD_PREPROCESS, BWD_VERSIONS


def _compile(job):
    defines, file, expr, arch = job
    _nvrtc.EXPERIMENT_DEFINES[:] = defines
    _nvrtc.compile_kernel(file, expr, arch, announce=False)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--variant", action="append", required=True, help="NAME=MACRO[,MACRO...]")
    ap.add_argument("--rung", default="bwd_v5")
    ap.add_argument("--seqlen", type=int, nargs="+", default=[8192])
    ap.add_argument("--headdim", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--dtype", nargs="+", default=["float16", "bfloat16"])
    ap.add_argument("--causal", action="store_true", help="top-left causal (default: no mask)")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    variants = {}
    for spec in args.variant:
        name, _, macros = spec.partition("=")
        variants[name] = [m for m in macros.split(",") if m]

    # Every build of the rung, its D_i and dQ kernels, and the forward (plain), compiled in parallel.
    cc = torch.cuda.get_device_capability()
    arch = lambda e: _nvrtc.arch_string(cc, arch_specific=e.arch_specific)
    entries = (BWD_PREPROCESS, BWD_VERSIONS[args.rung], BWD_DQ_CONVERT)
    causal = args.causal
    jobs = [
        (d, e.file, e.name_expression(dt, D, causal and e is BWD_VERSIONS[args.rung]), arch(e))
        for d in variants.values()
        for e in entries
        for dt in args.dtype
        for D in args.headdim
    ]
    for dt in args.dtype:
        for D in args.headdim:
            f = versions.select(dt, D, cc[0] * 10 + cc[1])
            jobs.append(([], f.file, f.name_expression(dt, D, causal, cc[0] * 10 + cc[1]), arch(f)))
    with ProcessPoolExecutor(16) as pool:
        list(pool.map(_compile, jobs))

    mode = "top_left" if causal else None
    for N in args.seqlen:
        B, H = 32768 // N, 16
        for dt in args.dtype:
            for D in args.headdim:
                q, k, v, dO = (torch.randn(B, H, N, D, device="cuda", dtype=getattr(torch, dt)) for _ in range(4))
                _nvrtc.EXPERIMENT_DEFINES[:] = []
                api.entry_kernel.cache_clear()
                with torch.no_grad():
                    out, lse = api._call(q, k, v, None, mode, "bhnd", None, None, "scale", True)
                cudnn = bench._time(bench._peer_backward("sdpa_cudnn", q, k, v, dO, causal), steady=True)
                times = {name: [] for name in variants}
                for _ in range(args.rounds):
                    for name, defines in variants.items():
                        _nvrtc.EXPERIMENT_DEFINES[:] = defines
                        api.entry_kernel.cache_clear()  # (loaded kernels are keyed without the macros)
                        run = lambda: attention_backward(q, k, v, out, lse, dO, D**-0.5, mode, "bhnd", args.rung)
                        times[name].append(bench._time(run, steady=True))
                row = " ".join(f"{n} {min(t):.3f} ({cudnn / min(t):.3f}x)" for n, t in times.items())
                best = min(times, key=lambda n: min(times[n]))
                print(f"N={N} {dt} D={D} causal={causal} cudnn {cudnn:.3f} ms | {row} | best {best}", flush=True)


if __name__ == "__main__":
    main()
