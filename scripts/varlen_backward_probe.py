"""Speed of flash_attn_varlen_func's backward (serving._varlen_backward: backward.special_rung's kernel
in one launch, bwd_v5_varlen on Hopper; "tileattn (bwd_v2_varlen)" forces the mma.sync kernel it
replaced there) beside varlen_attn's (FA2's varlen kernels) and FlexAttention's with a document
mask, in one process: forward + backward of the packed
documents, bf16, H=16, causal within each document. Two batches: the varlen suite's 16 documents of
256..8192 tokens, and 128 short ones of 128..1024 (where a per-sequence loop pays its launches
most). TFLOP/s count each document's own causal work: forward + backward 3.5x the forward's (two
matmuls forward; five backward, S rebuilt, dV, dP, dQ, dK).

    python3 scripts/varlen_backward_probe.py [--out FILE.json]
"""

import argparse
import contextlib
import json

import torch

from tileattn import bench
from tileattn.serving import flash_attn_varlen_func
from tileattn.testing import cu_seqlens, forced_special_rung
from tileattn.versions import BWD_V2_VARLEN


def _grad(fwd, inputs, dout, rung):
    with rung():
        return torch.autograd.grad(fwd(), inputs, dout)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    args = ap.parse_args()
    rows = []
    batches = {
        "16 docs 256..8192": bench._document_lengths(),
        "128 docs 128..1024": bench._document_lengths(n=128, lo=128, hi=1024, seed=1),
    }
    for label, lens in batches.items():
        cu = cu_seqlens(lens)
        for D in (64, 128):
            gen = torch.Generator(device="cuda").manual_seed(D)
            q, k, v = (
                torch.randn(sum(lens), 16, D, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_()
                for _ in range(3)
            )
            dout = torch.randn_like(q)
            fwd_flops = sum(2 * 16 * D * n * n for n in lens)
            impls = {"tileattn": lambda: flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), causal=True)}
            impls["tileattn (bwd_v2_varlen)"] = impls["tileattn"]
            peers, errors = bench.varlen_peers(q, k, v, cu, lens)
            impls.update(peers)
            for name, why in errors.items():
                print(f"{name}: {why}")
            for name, fwd in impls.items():
                if name == "flex_document_mask":  # (1, H, total, D) out: back to packed
                    f = fwd
                    fwd = lambda f=f: f()[0].transpose(0, 1)
                forced = name == "tileattn (bwd_v2_varlen)"
                rung = (lambda: forced_special_rung(BWD_V2_VARLEN)) if forced else contextlib.nullcontext
                step = lambda fwd=fwd, rung=rung: _grad(fwd, (q, k, v), dout, rung)
                try:
                    step()
                    ms_fwd = bench._time(lambda fwd=fwd: fwd())
                    ms = bench._time(step)
                except Exception as e:
                    print(f"{label} D={D} {name}: {type(e).__name__}: {e}"[:300])
                    continue
                row = dict(batch=label, D=D, impl=name, ms_fwd_bwd=ms, ms_fwd=ms_fwd,
                           tflops_fwd_bwd=3.5 * fwd_flops / 1e9 / ms)  # fmt: skip
                rows.append(row)
                print(row, flush=True)
    for r in rows:
        for p in rows:
            if p["batch"] == r["batch"] and p["D"] == r["D"] and r["impl"] == "tileattn" and p is not r:
                r[f"vs_{p['impl']}"] = p["ms_fwd_bwd"] / r["ms_fwd_bwd"]
    print(f"\n{'batch':22} {'D':>4} {'impl':20} {'fwd+bwd ms':>10} {'fwd ms':>8} {'TFLOP/s':>8}  ratios")
    for r in rows:
        ratios = " ".join(f"{k[3:]} {v:.2f}x" for k, v in r.items() if k.startswith("vs_"))
        print(f"{r['batch']:22} {r['D']:>4} {r['impl']:20} {r['ms_fwd_bwd']:10.3f} {r['ms_fwd']:8.3f} "
              f"{r['tflops_fwd_bwd']:8.0f}  {ratios}")  # fmt: skip
    if args.out:
        json.dump(dict(gpu=torch.cuda.get_device_name(), rows=rows), open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()
