"""Hypothesis-driven fuzzing: random cases (rung, dtype, head dim, shapes, GQA ratio, strides,
layout, causal mode, scale) checked against float64.

On a GPU (``python -m tileattn fuzz --cases 10000``) every case runs through the public API with
NaN-poisoned outputs (testing.run_case).  On the CPU, the same strategy drives the NumPy loop
nest of the kernels (reference.attention_tiled, at the rung's Br and Bc and float32) against the
float64 definition: CI runs a small seeded slice of that (tests/test_fuzz.py).

Every drawn case is checked and every failure recorded; nothing stops at the first one.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import time

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

from .reference import CAUSAL_MODES
from .testing import Case
from .versions import VERSIONS

# Per-rung limits that keep a case cheap: the K/V-outer rungs (v1*) are slow by design.
_MAX_LEN = {"simt": 700, "tensor_fp32": 1500, "mma": 2500}


@st.composite
def cases(draw, versions: list[str], max_len: int | None = None) -> Case:
    name = draw(st.sampled_from(versions))
    entry = VERSIONS[name]
    dtype = draw(st.sampled_from(entry.dtypes))
    D = draw(st.sampled_from(entry.head_dims))
    limit = _MAX_LEN[entry.kind] if not name.startswith("v1") else 300
    max_len = min(limit, max_len or limit)
    noncontiguous = draw(st.booleans())
    Nq = draw(st.integers(1, max_len))
    Nk = Nq if noncontiguous else draw(st.one_of(st.just(Nq), st.integers(1, max_len)))
    H_kv = draw(st.integers(1, 3))
    group = draw(st.sampled_from([1, 1, 2, 3, 4, 8]))
    scale = draw(st.one_of(st.none(), st.floats(-1.5, 1.5, allow_nan=False).map(lambda x: round(x, 3))))
    return Case(
        version=name,
        B=draw(st.integers(1, 3)),
        H=H_kv * group,
        H_kv=H_kv if group > 1 else None,
        Nq=Nq,
        Nk=Nk,
        D=D,
        causal=draw(st.sampled_from([None, *CAUSAL_MODES])),
        dtype=dtype,
        layout=draw(st.sampled_from(["bhnd", "bnhd"])),
        noncontiguous=noncontiguous,
        scale=scale,
        misaligned=not noncontiguous and draw(st.integers(0, 9)) == 0,
    )


def check_cpu(case: Case, seed: int) -> dict:
    """The kernels' loop nest (float32, the rung's tiles) against float64, in NumPy."""
    import numpy as np

    from .reference import attention_naive, attention_tiled

    rng = np.random.default_rng(seed)
    Nk = case.Nk if case.Nk is not None else case.Nq
    H_kv = case.H_kv or case.H
    q = rng.standard_normal((case.B, case.H, case.Nq, case.D))
    k, v = (rng.standard_normal((case.B, H_kv, Nk, case.D)) for _ in range(2))
    Br, Bc = VERSIONS[case.version].tile(case.D)
    O, lse = attention_naive(q, k, v, softmax_scale=case.scale, causal=case.causal)
    O_t, lse_t = attention_tiled(q, k, v, softmax_scale=case.scale, causal=case.causal, Br=Br, Bc=Bc)
    err = float(np.linalg.norm(O_t - O) / max(np.linalg.norm(O), 1e-30))
    finite = np.isfinite(lse)
    lse_err = float(np.abs(lse_t[finite] - lse[finite]).max()) if finite.any() else 0.0
    ok = err <= 1e-5 and lse_err <= 1e-4 and not np.isnan(O_t).any() and bool((np.isinf(lse_t) == ~finite).all())
    return dict(rel_err=err, lse_err=lse_err, ok=ok)


def check_gpu(case: Case, seed: int) -> dict:
    import torch

    from .testing import passed, run_case, tolerance

    gen = torch.Generator(device="cuda").manual_seed(seed)
    res = run_case(case, gen)
    return dict(rel_err=res["rel_err"], lse_err=res["lse_err"], tolerance=tolerance(case, res), ok=passed(case, res))


def run(
    n_cases: int,
    seed: int,
    versions: list[str],
    *,
    device: str,
    progress=None,
    time_limit_s: float | None = None,
    max_len: int | None = None,
) -> dict:
    """Draw n_cases cases (derandomised by seed) and check each; returns a summary with every
    failure.  device: "cpu" (the NumPy loop nest) or "cuda" (the kernels)."""
    check = check_gpu if device == "cuda" else check_cpu
    results: list[dict] = []
    t0 = time.time()

    @hypothesis_seed(seed)  # the same seed draws the same cases
    @settings(
        max_examples=n_cases,
        deadline=None,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=cases(versions, max_len), case_seed=st.integers(0, 2**32 - 1))
    def one(case, case_seed):
        if time_limit_s is not None and time.time() - t0 > time_limit_s:
            return
        try:
            res = check(case, case_seed)
        except Exception as e:  # a crash is a failure to record, not a reason to stop
            res = dict(ok=False, error=f"{type(e).__name__}: {e}")
        results.append(dict(case=dataclasses.asdict(case), seed=case_seed, **res))
        if progress:
            progress(1)

    one()
    failures = [r for r in results if not r["ok"]]
    by_version = dict(collections.Counter(r["case"]["version"] for r in results))
    worst = {}
    for r in results:
        if "rel_err" in r and math.isfinite(r["rel_err"]):
            v = r["case"]["version"]
            worst[v] = max(worst.get(v, 0.0), r["rel_err"])
    return dict(
        device=device,
        seed=seed,
        cases=len(results),
        failed=len(failures),
        seconds=round(time.time() - t0, 1),
        cases_per_version=by_version,
        worst_rel_err_per_version=worst,
        failures=failures[:200],
    )


def save(summary: dict, path) -> None:
    from pathlib import Path

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(summary, indent=1) + "\n")
