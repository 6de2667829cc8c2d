"""What e4m3 quantization costs attention's accuracy, with and without incoherent processing (q and
k rotated by the same random-sign Hadamard transform before quantization,
fp8.quantize_attention_inputs(rotate_qk=True)), on the CPU:
float64 attention of the dequantized inputs with P rounded to e4m3 against its row max (v3.5's
rounding, reference.round_e4m3) and O rounded to bf16, against float64 attention of the inputs.
No GPU needed: this is a property of the number format, not of the kernel (tests/test_fp8.py
holds the kernel to this model).

    python scripts/fp8_accuracy.py [--out bench/results/fp8_accuracy.json]
"""

import argparse
import json

import torch

from tileattn import fp8
from tileattn.reference import round_e4m3


def attention(q, k, v, p_e4m3: bool):
    """(B, N, H, D) float64 -> O; P rounded to e4m3 against its row's max when p_e4m3."""
    S = torch.einsum("bihd,bjhd->bhij", q, k) / q.shape[-1] ** 0.5
    P = torch.exp(S - S.amax(dim=-1, keepdim=True))
    l = P.sum(dim=-1, keepdim=True)
    if p_e4m3:
        P = torch.from_numpy(round_e4m3(P.numpy()))
    return torch.einsum("bhij,bjhd->bihd", P / l, v)


def inputs(kind: str, gen, B=1, N=1024, H=4, D=128):
    x = [torch.randn(B, N, H, D, generator=gen, dtype=torch.float64) for _ in range(3)]
    if kind == "outlier channels":  # a few channels 20x larger in q and k, as in LLM activations
        for t in x[:2]:
            t[..., :4] *= 20.0
    elif kind == "heavy tails":  # Student-t with 3 degrees of freedom
        chi = [torch.distributions.Chi2(3.0).sample((B, N, H, D)).double() for _ in range(3)]
        x = [t / (c / 3.0).sqrt() for t, c in zip(x, chi)]
    return x


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="bench/results/fp8_accuracy.json")
    args = p.parse_args()
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    rows = []
    for kind in ("gaussian", "outlier channels", "heavy tails"):
        q, k, v = inputs(kind, gen)
        exact = attention(q, k, v, False)
        for rotate in (False, True):
            q8, k8, v8, ds = fp8.quantize_attention_inputs(q, k, v, rotate_qk=rotate)
            deq = [t8.double() * d.double()[:, None, :, None] for t8, d in zip((q8, k8, v8), ds.values())]
            out = attention(*deq, True).bfloat16().double()
            err = ((out - exact).norm() / exact.norm()).item()
            rows.append(dict(inputs=kind, rotate=rotate, rel_err=err))
            print(f"{kind:17s} rotate={rotate!s:5s} rel. err of O vs float64: {err:.2e}", flush=True)
    result = dict(
        command="python scripts/fp8_accuracy.py",
        shape=dict(B=1, N=1024, H=4, D=128),
        model="e4m3 q, k, v per (batch, head) (fp8.quantize_e4m3), P rounded to e4m3, O to bf16",
        rows=rows,
    )
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
