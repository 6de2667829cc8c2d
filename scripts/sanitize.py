"""Every rung on small awkward shapes, causal and not, for compute-sanitizer:

    compute-sanitizer --tool memcheck|racecheck|synccheck|initcheck python scripts/sanitize.py

Each case also checks its output against float64 (testing.run_case), so a clean sanitizer run is
also a correct one.  Kernels should already be in the cache (`python -m tileattn compile`):
compiling under the sanitizer works but is slow."""

import sys

import torch

from tileattn.testing import Case, passed, run_case
from tileattn.versions import VERSIONS

cc = torch.cuda.get_device_capability()
arch = cc[0] * 10 + cc[1]
gen = torch.Generator(device="cuda").manual_seed(1)
failures = 0
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
