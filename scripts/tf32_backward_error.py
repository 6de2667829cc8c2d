"""How accurate would a TF32 tensor-core backward be?  A CPU experiment for the FP32-accurate
backward rung (issue 11): the backward's five products (S = Q K^T, dP = dO V^T, dV = P^T dO,
dQ = dS K, dK = dS^T Q) with their operands rounded as tensor cores would take them, against
float64, beside the plain FP32 products that bwd_v1 computes.

    python scripts/tf32_backward_error.py [--n 512] [--d 64 128] [--seed 0]

Per product, "fp32" multiplies FP32 operands, "tf32" rounds each operand to TF32 (10 explicit
mantissa bits, round to nearest as cvt.rna.tf32.f32), "3xtf32" splits each operand into a TF32
high part and a TF32 low part (x - hi) and adds hi*hi + hi*lo + lo*hi, as v2.2/v2.3 do in the
forward.  "3xtf32_trunc" is the split a kernel gets without rounding anything itself: the
tensor core reads an FP32 register or tile as TF32 by dropping its 13 low mantissa bits, so hi =
trunc(x) comes free (raw FP32 straight from a TMA copy) and lo = x - trunc(x) (exact in FP32) is
truncated again when read.  "3xfp16" is bwd_v2.3's split: each operand times a power of two
2^e that puts its max |x| just under 2^15, then hi = fp16(x 2^e) and lo = fp16(x 2^e - hi),
hi*hi + hi*lo + lo*hi, divided by the two scales ("3xfp16 tiny dO" runs it with dO scaled by
1e-9, as a float32 loss's gradients may be, to show that the scales take any magnitude).  Here
every operand's scale comes from its own max; the rung takes P's as 2^15 and dS's from a bound
(|dS| <= 2 D max|dO| max|v|), which leaves dS's halves a few bits further under 2^15.  The
products are summed in float64 (the hardware's FP32 accumulation adds a little on top), so this
measures what operand rounding costs.  The softmax, D_i and dS stay FP32.
"""

import argparse

import numpy as np


def tf32(x):
    """Round float32 to TF32 (keep 10 explicit mantissa bits, round half away from zero)."""
    u = np.asarray(x, np.float32).view(np.uint32)
    return ((u + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32)


def trunc_tf32(x):
    """FP32 read as TF32 by dropping the 13 low mantissa bits (round toward zero)."""
    return (np.asarray(x, np.float32).view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32)


def split_fp16(x):
    """The 3xFP16 halves of x (float32) under one exponent for all of x (split_blocks takes one a
    block of 64 rows), and the scale 2^e they carry: max |x 2^e| in [2^14, 2^15)."""
    amax = float(np.abs(x).max())
    e = 15 - (np.frexp(amax)[1] if amax > 0 else 0)
    xs = np.ldexp(np.asarray(x, np.float32), e).astype(np.float32)
    hi = xs.astype(np.float16)
    lo = (xs - hi.astype(np.float32)).astype(np.float16)
    return hi.astype(np.float64), lo.astype(np.float64), 2.0**e


def matmul(a, b, mode: str):
    if mode == "f64":  # the reference
        return np.asarray(a, np.float64) @ np.asarray(b, np.float64)
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    if mode == "fp32":
        return (a.astype(np.float64) @ b.astype(np.float64)).astype(np.float32)
    if mode == "3xfp16":
        (a_hi, a_lo, sa), (b_hi, b_lo, sb) = split_fp16(a), split_fp16(b)
        return ((a_hi @ b_hi + a_hi @ b_lo + a_lo @ b_hi) / (sa * sb)).astype(np.float32)
    rnd = trunc_tf32 if mode == "3xtf32_trunc" else tf32
    a_hi, b_hi = rnd(a), rnd(b)
    prod = a_hi.astype(np.float64) @ b_hi.astype(np.float64)
    if mode in ("3xtf32", "3xtf32_trunc"):
        a_lo, b_lo = rnd(a - a_hi), rnd(b - b_hi)
        prod += a_hi.astype(np.float64) @ b_lo.astype(np.float64) + a_lo.astype(np.float64) @ b_hi.astype(np.float64)
    return prod.astype(np.float32)


def backward(q, k, v, dO, scale, modes, dt=np.float32):
    """dq, dk, dv with each product in modes[name] (one head, no mask), everything else in dt;
    lse and O computed in float64 and rounded to dt, as the forward hands them over."""
    q, k, v, dO = (x.astype(dt) for x in (q, k, v, dO))
    S64 = q.astype(np.float64) @ k.T.astype(np.float64) * scale
    m = S64.max(-1, keepdims=True)
    lse64 = m + np.log(np.exp(S64 - m).sum(-1, keepdims=True))
    O = (np.exp(S64 - lse64) @ v.astype(np.float64)).astype(dt)
    S = matmul(q, k.T, modes["S"]).astype(dt) * dt(scale)
    P = np.exp(S - lse64.astype(dt)).astype(dt)
    Di = (dO * O).sum(-1, keepdims=True, dtype=dt)
    dV = matmul(P.T, dO, modes["dV"]).astype(dt)
    dP = matmul(dO, v.T, modes["dP"]).astype(dt)
    dS = (P * (dP - Di)).astype(dt)
    dQ = matmul(dS, k, modes["dQ"]).astype(dt) * dt(scale)
    dK = matmul(dS.T, q, modes["dK"]).astype(dt) * dt(scale)
    return dQ, dK, dV


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=512)
    p.add_argument("--d", type=int, nargs="+", default=[64, 128])
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    names = ("S", "dP", "dV", "dQ", "dK")
    configs = {
        "fp32 (bwd_v1)": dict.fromkeys(names, "fp32"),
        "tf32 everywhere": dict.fromkeys(names, "tf32"),
        "3xtf32 everywhere": dict.fromkeys(names, "3xtf32"),
        "3xtf32_trunc everywhere": dict.fromkeys(names, "3xtf32_trunc"),
        "3xfp16 everywhere (bwd_v2.3)": dict.fromkeys(names, "3xfp16"),
        "3xtf32 for S, dP; tf32 for the rest": dict(S="3xtf32", dP="3xtf32", dV="tf32", dQ="tf32", dK="tf32"),
        "3xtf32 for S; tf32 for the rest": dict(S="3xtf32", dP="tf32", dV="tf32", dQ="tf32", dK="tf32"),
    }
    rng = np.random.default_rng(args.seed)
    print(f"relative error vs float64 (Frobenius), N = {args.n}, standard normal inputs, scale 1/sqrt(D)")
    print("| products | D | dq | dk | dv |\n|---|---|---|---|---|")
    for D in args.d:
        q, k, v, dO = (rng.standard_normal((args.n, D)).astype(np.float32) for _ in range(4))
        scale = D**-0.5
        exact = backward(q, k, v, dO, scale, dict.fromkeys(names, "f64"), np.float64)
        for label, modes in configs.items():
            got = backward(q, k, v, dO, scale, modes)
            errs = [np.linalg.norm(g - e) / np.linalg.norm(e) for g, e in zip(got, exact)]
            print(f"| {label} | {D} | " + " | ".join(f"{x:.1e}" for x in errs) + " |")
        tiny = (dO * np.float32(1e-9)).astype(np.float32)
        exact = backward(q, k, v, tiny, scale, dict.fromkeys(names, "f64"), np.float64)
        for label, mode in (("fp32 (bwd_v1), tiny dO", "fp32"), ("3xfp16 tiny dO", "3xfp16")):
            got = backward(q, k, v, tiny, scale, dict.fromkeys(names, mode))
            errs = [np.linalg.norm(g - e) / np.linalg.norm(e) for g, e in zip(got, exact)]
            print(f"| {label} | {D} | " + " | ".join(f"{x:.1e}" for x in errs) + " |")


if __name__ == "__main__":
    main()
