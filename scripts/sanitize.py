"""Every rung on small awkward shapes, causal and not, for compute-sanitizer:

    compute-sanitizer --tool memcheck|racecheck|synccheck|initcheck python scripts/sanitize.py
    compute-sanitizer --tool ... python scripts/sanitize.py --backward [RUNG ...] [--tail-only]
    compute-sanitizer --tool ... python scripts/sanitize.py --serving

Each case also checks its output against float64 (testing.run_case), so a clean sanitizer run is
also a correct one.  --backward: the backward rungs instead (the D_i kernel, then each rung, in
the default and the deterministic mode; only the rungs named after it, if any), gradients checked
against float64 autograd.  --serving: a sample of the serving tests (varlen forward and backward,
the variants, the KV cache; awkward lengths, zero-length sequences, grids past gridDim.y), each
checked against float64 by its test.  Kernels
should already be in the cache (`python -m tileattn compile`): compiling under the sanitizer works
but is slow."""

import sys

import torch

from tileattn.testing import Case, passed, reference_grads, run_case
from tileattn.versions import VERSIONS

cc = torch.cuda.get_device_capability()
arch = cc[0] * 10 + cc[1]
gen = torch.Generator(device="cuda").manual_seed(1)
failures = 0


def backward_cases(only=(), tail_only=False) -> int:
    """Each backward rung at its smallest, 64 and largest head dim, Nq = Nk = 67 (not a multiple of
    any tile), causal and not; GQA 2:1 with Nq < Nk; rows that see no key; deterministic mode;
    where the rung has one, shapes that take the tail (tail_only: those alone)."""
    from tileattn import api
    from tileattn.backward import attention_backward
    from tileattn.versions import BWD_VERSIONS

    failures = 0
    cc = torch.cuda.get_device_capability()
    for name, entry in BWD_VERSIONS.items():
        if not entry.runs_on(cc[0] * 10 + cc[1]) or (only and name not in only):
            continue
        precision = "tf32" if entry.precision == "tf32" else None
        tol = 3e-2 if precision else 1e-4 if entry.dtypes == ("float32",) else 2e-2
        dims = sorted({entry.head_dims[0], 64, entry.head_dims[-1]})
        shapes = [(1, 2, 2, 67, 67, D, c, False) for D in dims for c in (None, "top_left")]
        shapes += [
            (2, 4, 2, 33, 130, 64, "bottom_right", False),
            (1, 2, 2, 130, 33, 64, "bottom_right", entry.deterministic),
        ]
        if entry.tail_split:  # (backward._tail_plan) 4 K/V blocks of >= 32 Q blocks
            tail = [(1, 2, 2, 4100, 200, D, None, False) for D in dims]
            tail += [(1, 4, 2, 4100, 200, 128, None, False)]  # GQA: the parts add into the accumulators
            shapes = tail if tail_only else shapes + tail
        for dtype in entry.dtypes:
            dt = getattr(torch, dtype)
            for B, H, H_kv, Nq, Nk, D, causal, det in shapes:
                q = torch.randn(B, H, Nq, D, device="cuda", dtype=dt, generator=gen)
                k, v = (torch.randn(B, H_kv, Nk, D, device="cuda", dtype=dt, generator=gen) for _ in range(2))
                dO = torch.randn(q.shape, device="cuda", dtype=dt, generator=gen)
                with torch.no_grad():
                    out, lse = api._call(q, k, v, None, causal, "bhnd", None, None, "scale", True)
                    got = attention_backward(
                        q, k, v, out, lse, dO, D**-0.5, causal, "bhnd", name, det, precision=precision
                    )
                expected = reference_grads(q, k, v, dO, D**-0.5, causal)
                err = max(((g.double() - e).norm() / e.norm().clamp_min(1e-30)).item() for g, e in zip(got, expected))
                ok = err < tol and not any(g.isnan().any() for g in got)
                failures += not ok
                label = f"{name} {dtype} B={B} H={H}/{H_kv} Nq={Nq} Nk={Nk} D={D} {causal} det={det}"
                print(f"{'PASS' if ok else 'FAIL'} {label} rel_err {err:.1e}", flush=True)
    return failures


SERVING_TESTS = ["tests/test_varlen.py", "tests/test_variants.py", "tests/test_serving.py"]
SERVING_SAMPLE = (
    "awkward or scale_zero or past_grid_y or (varlen_variants and all) or (test_varlen_matches and 8-2)"
    " or (decode_matches and 32-8) or (test_variants_match and all)"
    " or (gradients_many_sequences and 96)"  # the one-launch varlen backward, and the per-sequence one
    " or (gradients_many_sequences and (False-False-128 or False-True-64))"  # bwd_v5_varlen's
    " or (gradients_match_float64 and None-all-bottom_right-64-dtype1)"  # its variants kernel
    " or (alibi_mma_matches and 300-457) or (alibi_mma_public_call and 4100)"  # v3.8 (causal ALiBi)
)

if "--serving" in sys.argv:
    import pytest

    sys.exit(pytest.main(["-q", "-m", "gpu", "-p", "no:cacheprovider", "-k", SERVING_SAMPLE, *SERVING_TESTS]))
if "--backward" in sys.argv:
    rungs = [a for a in sys.argv[sys.argv.index("--backward") + 1 :] if not a.startswith("--")]
    failures = backward_cases(rungs, tail_only="--tail-only" in sys.argv)
    print(f"sanitize cases: {failures} failed")
    sys.exit(1 if failures else 0)
for name, v in VERSIONS.items():
    if not v.runs_on(arch):
        continue
    dtype = v.dtypes[0]
    dims = sorted({v.head_dims[0], 64, v.head_dims[-1]} & set(v.head_dims))
    cases = [Case(name, B=1, H=2, Nq=67, D=D, causal=c, dtype=dtype) for D in dims for c in (None, "top_left")]
    cases += [
        Case(name, B=2, H=4, H_kv=2, Nq=33, Nk=130, D=64, causal="bottom_right", dtype=dtype),
        Case(name, B=1, H=2, Nq=130, Nk=33, D=64, causal="bottom_right", dtype=dtype),  # rows seeing no key
        Case(name, B=1, H=2, Nq=1, Nk=17, D=64, causal=None, dtype=dtype, layout="bnhd"),
    ]
    for case in cases:
        ok = passed(case, res := run_case(case, gen))
        failures += not ok
        print(f"{'PASS' if ok else 'FAIL'} {case.label()} rel_err {res['rel_err']:.1e}", flush=True)
print(f"sanitize cases: {failures} failed")
sys.exit(1 if failures else 0)
