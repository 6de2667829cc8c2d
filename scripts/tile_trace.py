"""Trace: where a persistent forward tile's time goes, phase by phase, from the SM clock stamps of
v3_3_wgmma.cu's TILEATTN_TRACE build (bench/NOTES.md "Where N=1024's time goes").

    TILEATTN_DEFINES=TILEATTN_TRACE=1 python scripts/tile_trace.py [--headdim 64] [--seqlen 1024]
        [--version v3.6 v3.7]

For each shape (bf16, H = 16, B·N = 32768, without and with the causal mask) one traced call; per
consumer warpgroup and tile, in SM clocks (medians over the CTAs' tiles):
  q_wait   tile start -> Q arrived        first   block 0's S and softmax
  block    the loop's time a K/V block    last    the last P V (its wait)
  store    O and lse stored               gap     O stored -> the next tile's start
and the producer's wait for Q's buffer (q_free: tile start -> the consumers' last S of the tile
before).  `fixed` = the tile's time less Tc blocks at the loop's rate: its cost beyond its blocks.
"""

import argparse

import numpy as np
import torch
from cuda.bindings import driver

from tileattn import _nvrtc, flash_attn_func

if "TILEATTN_TRACE=1" not in _nvrtc.EXPERIMENT_DEFINES:
    raise SystemExit("run under TILEATTN_DEFINES=TILEATTN_TRACE=1 (the kernels are built with the trace then)")

p = argparse.ArgumentParser()
p.add_argument("--headdim", type=int, nargs="*", default=[64])
p.add_argument("--seqlen", type=int, nargs="*", default=[1024])
p.add_argument("--version", nargs="*", default=["v3.6"])
args = p.parse_args()

CTAS, TILES = 160, 48  # v3_3_wgmma.cu TRACE_CTAS, TRACE_TILES


def traces():
    """Every loaded library's tileattn_trace, as (pointer, bytes)."""
    out = []
    for lk in _nvrtc._loaded.values():
        err, ptr, size = driver.cuLibraryGetGlobal(lk.library, b"tileattn_trace")
        if err == driver.CUresult.CUDA_SUCCESS:
            out.append((ptr, size))
    return out


def read(ptr, size):
    host = np.zeros((CTAS, TILES, 4, 8), dtype=np.int64)
    assert host.nbytes == size
    _nvrtc._check(driver.cuMemcpyDtoH(host.ctypes.data, ptr, size), "cuMemcpyDtoH")
    return host


def summarise(t, label):
    rows = {k: [] for k in ("q_wait", "first", "block", "last", "store", "gap", "fixed", "tile", "q_free")}
    for cta in range(CTAS):
        for i in range(TILES):
            for w in range(3):
                e = t[cta, i, w]
                if e[0] == 0 or e[5] == 0:
                    continue
                Tc = int(e[7])
                rows["q_wait"].append(e[1] - e[0])
                rows["store"].append(e[5] - e[4])
                if Tc >= 1:
                    rows["first"].append(e[2] - e[1])
                    rows["last"].append(e[4] - e[3])
                block = (e[3] - e[2]) / (Tc - 1) if Tc >= 2 else None
                if block is not None:
                    rows["block"].append(block)
                if i + 1 < TILES and t[cta, i + 1, w, 0] != 0:
                    tile = t[cta, i + 1, w, 0] - e[0]
                    rows["gap"].append(t[cta, i + 1, w, 0] - e[5])
                    rows["tile"].append(tile)
                    if block is not None:
                        rows["fixed"].append(tile - Tc * block)
            pe = t[cta, i, 3]
            if i > 0 and pe[0] != 0:
                rows["q_free"].append(pe[1] - pe[0])
    med = {k: float(np.median(v)) if v else float("nan") for k, v in rows.items()}
    print(label + "  " + "  ".join(f"{k} {v:7.0f}" for k, v in med.items()), flush=True)
    return med


for version in args.version:
    for D in args.headdim:
        for N in args.seqlen:
            B, H = max(1, 32768 // N), 16
            gen = torch.Generator(device="cuda").manual_seed(0)
            q, k, v = (torch.randn(B, N, H, D, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(3))
            for causal in (False, True):
                call = lambda: flash_attn_func(q, k, v, causal=causal, version=version)
                for _ in range(4):  # compile, load, warm up
                    call()
                torch.cuda.synchronize()
                for ptr, size in traces():
                    _nvrtc._check(driver.cuMemsetD8(ptr, 0, size), "cuMemsetD8")
                call()
                torch.cuda.synchronize()
                # the library the call ran: the one trace written to
                written = [a for a in (read(ptr, size) for ptr, size in traces()) if a.any()]
                assert len(written) == 1, len(written)
                summarise(written[0], f"{version} D={D} N={N} B={B} causal={causal:d}:")
