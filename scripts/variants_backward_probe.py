"""Speed of the score variants' backward (backward.special_rung: bwd_v5_variants on Hopper; the
"(bwd_v2_variants)" rows force the mma.sync kernel it replaced there) beside plain causal (dense
bwd_v5) at the same work, in one process: forward + backward of flash_attn_func with each of
bench.VARIANT_SPECS, bf16, B=2, H=16, N=8192, causal.  TFLOP/s count the visible (query, key)
pairs, forward + backward 3.5x the forward's.  max_rel_diff: the largest |dq, dk, dv| difference
of the two kernels over the gradient's largest value (both are checked against float64 by the GPU
tests; this is a sanity check of the timed calls).

    python3 scripts/variants_backward_probe.py [--out FILE.json]
"""

import argparse
import contextlib
import json

import torch

from tileattn import bench, flash_attn_func
from tileattn.testing import forced_special_rung
from tileattn.versions import BWD_V2_VARIANTS


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    args = ap.parse_args()
    B, H, N = bench.VARIANT_SHAPE["B"], bench.VARIANT_SHAPE["H"], bench.VARIANT_SHAPE["N"]
    rows = []
    for D in (64, 128):
        gen = torch.Generator(device="cuda").manual_seed(D)
        q, k, v = (
            torch.randn(B, N, H, D, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_()
            for _ in range(3)
        )
        dout = torch.randn_like(q)
        slopes = torch.tensor([2.0 ** (-8 * (h + 1) / H) for h in range(H)], device="cuda")  # BLOOM's slopes
        for variant, spec in bench.VARIANT_SPECS.items():
            kw = dict(softcap=spec.get("softcap", 0.0), window_size=spec.get("window", (-1, -1)),
                      alibi_slopes=slopes if spec.get("alibi") else None)  # fmt: skip
            flops = 3.5 * 4 * B * H * D * bench._visible_pairs(N, spec.get("window", (-1, 0))[0])
            impls = {"tileattn": contextlib.nullcontext}
            if spec:
                impls["tileattn (bwd_v2_variants)"] = lambda: forced_special_rung(BWD_V2_VARIANTS)
            grads = {}
            for name, rung in impls.items():

                def step(rung=rung):
                    with rung():
                        return torch.autograd.grad(flash_attn_func(q, k, v, causal=True, **kw), (q, k, v), dout)

                grads[name] = step()
                ms = bench._time(step)
                row = dict(D=D, variant=variant, impl=name, ms_fwd_bwd=ms, tflops_fwd_bwd=flops / 1e9 / ms)
                rows.append(row)
                print(row, flush=True)
            if len(grads) == 2:
                a, b = grads.values()
                rows[-2]["max_rel_diff"] = max(((x - y).abs().max() / y.abs().max()).item() for x, y in zip(a, b))
    for r in rows:
        for p in rows:
            if p["D"] == r["D"] and r["impl"] == "tileattn" and p is not r:
                if p["variant"] == r["variant"]:
                    r["vs_bwd_v2_variants"] = p["ms_fwd_bwd"] / r["ms_fwd_bwd"]
                if p["variant"] == "causal" and p["impl"] == "tileattn" and r["variant"] != "causal":
                    r["vs_causal"] = r["tflops_fwd_bwd"] / p["tflops_fwd_bwd"]  # same work rate
    print(f"\n{'D':>4} {'variant':12} {'impl':28} {'fwd+bwd ms':>10} {'TFLOP/s':>8}  ratios")
    for r in rows:
        ratios = " ".join(f"{k[3:]} {v:.2f}x" for k, v in r.items() if k.startswith("vs_"))
        diff = f" max_rel_diff {r['max_rel_diff']:.1e}" if "max_rel_diff" in r else ""
        head = f"{r['D']:>4} {r['variant']:12} {r['impl']:28} {r['ms_fwd_bwd']:10.3f} {r['tflops_fwd_bwd']:8.0f}"
        print(f"{head}  {ratios}{diff}")
    if args.out:
        json.dump(dict(gpu=torch.cuda.get_device_name(), rows=rows), open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()
