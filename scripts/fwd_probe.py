"""Probe: the forward's default dispatch (or `--version`) beside cuDNN at B*N = 32768, H = 16, one
line per shape (`--tokens`, `--heads`, `--kv-heads` for other shapes: the hf suite's model is
`--heads 32 --kv-heads 8`, its peer then gets k and v repeated per query head, as transformers'
SDPA path gives them to cuDNN).  Run it again under TILEATTN_DEFINES="..." to compare an experiment's build; the
peer is re-timed in each process, so compare the ratios (bench/NOTES.md).

    python scripts/fwd_probe.py [--headdim 64 128] [--seqlen 1024 8192] [--dtype bfloat16] [--version v3.6]
        [--tile v3.6:256=128,64 ...] [--tokens 32768] [--heads 16] [--kv-heads 16] [--causal 0 1]

`--tile` registers a rung at another (or a new) head dim's tile for this process, so the default
dispatch (or `--version`) can take it there.
"""

import argparse
import dataclasses

import torch

from tileattn import _nvrtc, bench, flash_attn_func, versions

p = argparse.ArgumentParser()
p.add_argument("--headdim", type=int, nargs="*", default=[64, 128])
p.add_argument("--seqlen", type=int, nargs="*", default=[1024, 8192])
p.add_argument("--dtype", default="bfloat16")
p.add_argument("--version", default=None)
p.add_argument("--peer", default="sdpa_cudnn")
p.add_argument("--tile", nargs="*", default=[], help="version:D=Br,Bc")
p.add_argument("--tokens", type=int, default=32768, help="B*N")
p.add_argument("--heads", type=int, default=16)
p.add_argument("--kv-heads", type=int, default=None, help="GQA: k, v heads (default: --heads)")
p.add_argument("--causal", type=int, nargs="*", default=[0, 1])
args = p.parse_args()
for spec in args.tile:
    name, rest = spec.split(":")
    D, tile = rest.split("=")
    v = versions.VERSIONS[name]
    versions.VERSIONS[name] = dataclasses.replace(v, tiles={**v.tiles, int(D): tuple(map(int, tile.split(",")))})
print(f"defines {_nvrtc.EXPERIMENT_DEFINES}, version {args.version or 'default'}, tiles {args.tile}, peer {args.peer}")
for D in args.headdim:
    for N in args.seqlen:
        B, H, H_kv = max(1, args.tokens // N), args.heads, args.kv_heads or args.heads
        gen = torch.Generator(device="cuda").manual_seed(0)
        dt = getattr(torch, args.dtype)
        q = torch.randn(B, H, N, D, device="cuda", dtype=dt, generator=gen)
        k, v = (torch.randn(B, H_kv, N, D, device="cuda", dtype=dt, generator=gen) for _ in range(2))
        qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))  # (B, N, H, D) views of the same data
        kr, vr = (t.repeat_interleave(H // H_kv, dim=1) for t in (k, v))  # GQA's heads for the peer
        for causal in map(bool, args.causal):
            flops = 4 * B * H * N * N * D / (2 if causal else 1)
            call = lambda: flash_attn_func(qt, kt, vt, causal=causal, version=args.version)
            err = bench.rel_err(call().transpose(1, 2), q, kr, vr, causal)
            ours = bench._time(call, steady=True)
            peer = bench._time(bench._peer_fn(args.peer, q, kr, vr, causal), steady=True)
            print(
                f"D={D} N={N} B={B} H={H}:{H_kv} causal={causal:d}: "
                f"ours {ours:.4f} ms ({flops / ours / 1e9:.0f} TF/s), "
                f"{args.peer} {peer:.4f} ms ({flops / peer / 1e9:.0f}); ratio {peer / ours:.3f}, err {err:.2e}",
                flush=True,
            )
