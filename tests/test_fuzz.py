"""A seeded slice of the fuzz run on the CPU: the same case strategy as the 10,000-case GPU run
(python -m tileattn fuzz), with the kernels' NumPy loop nest in place of the kernels."""

import pytest

from tileattn import fuzz
from tileattn.versions import VERSIONS


@pytest.mark.parametrize("version", list(VERSIONS))
def test_seeded_fuzz_slice_on_the_cpu_reference(version):
    summary = fuzz.run(12, seed=20261130, versions=[version], device="cpu", max_len=160)
    assert summary["cases"] == 12, summary
    assert summary["failed"] == 0, summary["failures"][:3]


def test_same_seed_draws_the_same_cases():
    a = fuzz.run(10, seed=7, versions=["v2", "v3.3"], device="cpu", max_len=50)
    b = fuzz.run(10, seed=7, versions=["v2", "v3.3"], device="cpu", max_len=50)
    assert [r["case"] for r in a["failures"] + []] == [r["case"] for r in b["failures"]]
    assert (
        a["cases_per_version"] == b["cases_per_version"]
        and a["worst_rel_err_per_version"] == b["worst_rel_err_per_version"]
    )
