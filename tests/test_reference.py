"""The NumPy loop nest of the kernels (attention_tiled) equals the float64 definition."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tileattn.reference import attention_naive, attention_tiled


@settings(max_examples=60, deadline=None)
@given(
    Nq=st.integers(1, 150),
    Nk=st.integers(1, 150),
    D=st.sampled_from([8, 32, 64]),
    Br=st.sampled_from([16, 32, 48, 128]),
    Bc=st.sampled_from([16, 32, 64]),
    causal=st.sampled_from([None, "top_left", "bottom_right"]),
    group=st.sampled_from([1, 2]),
    seed=st.integers(0, 2**32 - 1),
)
def test_tiled_matches_naive(Nq, Nk, D, Br, Bc, causal, group, seed):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((2, 2 * group, Nq, D))
    k, v = (rng.standard_normal((2, 2, Nk, D)) for _ in range(2))
    O, lse = attention_naive(q, k, v, causal=causal)
    O_t, lse_t = attention_tiled(q, k, v, causal=causal, Br=Br, Bc=Bc, dtype=np.float64)
    np.testing.assert_allclose(O_t, O, rtol=1e-10, atol=1e-12)
    np.testing.assert_array_equal(np.isinf(lse_t), np.isinf(lse))
    finite = np.isfinite(lse)
    np.testing.assert_allclose(lse_t[finite], lse[finite], rtol=1e-10, atol=1e-12)  # an lse can be ~0


def test_rows_without_keys_are_zero_with_minus_inf_lse():
    rng = np.random.default_rng(1)
    q, k, v = rng.standard_normal((1, 1, 5, 8)), rng.standard_normal((1, 1, 2, 8)), rng.standard_normal((1, 1, 2, 8))
    for fn in (attention_naive, attention_tiled):
        O, lse = fn(q, k, v, causal="bottom_right")  # offset -3: rows 0..2 see nothing
        assert np.all(O[0, 0, :3] == 0) and np.all(np.isneginf(lse[0, 0, :3]))
        assert np.all(np.isfinite(lse[0, 0, 3:]))


def test_float32_tiled_is_close_to_float64():
    rng = np.random.default_rng(2)
    q, k, v = (rng.standard_normal((1, 2, 300, 64)) for _ in range(3))
    O, _ = attention_naive(q, k, v)
    O32, _ = attention_tiled(q, k, v)
    assert np.linalg.norm(O32 - O) / np.linalg.norm(O) < 1e-6
