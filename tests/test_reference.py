"""The NumPy loop nest of the kernels (attention_tiled) equals the float64 definition."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tileattn.reference import attention_backward_naive, attention_backward_tiled, attention_naive, attention_tiled


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


def _torch_grads(q, k, v, dO, scale, causal):
    """float64 autograd of PyTorch's own math attention: the backward's ground truth."""
    import torch

    t = [torch.tensor(x, dtype=torch.float64, requires_grad=True) for x in (q, k, v)]
    Nq, Nk = q.shape[2], k.shape[2]
    mask = None
    if causal is not None:
        offset = 0 if causal == "top_left" else Nk - Nq
        mask = torch.arange(Nk)[None, :] <= torch.arange(Nq)[:, None] + offset
    group = q.shape[1] // k.shape[1]
    kk, vv = (x.repeat_interleave(group, dim=1) for x in t[1:])
    S = (t[0] @ kk.transpose(-1, -2)) * scale
    if mask is not None:
        S = S.masked_fill(~mask, float("-inf"))
    P = torch.softmax(S, dim=-1).nan_to_num(0.0)  # a row with no key: 0, as in the kernels
    (P @ vv).backward(torch.tensor(dO, dtype=torch.float64))
    return [x.grad.numpy() for x in t]


@settings(max_examples=40, deadline=None)
@given(
    Nq=st.integers(1, 130),
    Nk=st.integers(1, 130),
    D=st.sampled_from([8, 32]),
    causal=st.sampled_from([None, "top_left", "bottom_right"]),
    group=st.sampled_from([1, 2, 4]),
    scale=st.sampled_from([None, 0.3, -0.7]),
    seed=st.integers(0, 2**32 - 1),
)
def test_backward_references_match_autograd(Nq, Nk, D, causal, group, scale, seed):
    """The float64 backward and the FA2 backward loop nest (float64 here) against autograd, with
    GQA groups, both causal alignments, negative scales and rows that see no key."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((2, 2 * group, Nq, D))
    k, v = (rng.standard_normal((2, 2, Nk, D)) for _ in range(2))
    dO = rng.standard_normal(q.shape)
    s = 1 / np.sqrt(D) if scale is None else scale
    expected = _torch_grads(q, k, v, dO, s, causal)
    naive = attention_backward_naive(q, k, v, dO, scale, causal)
    O, lse = attention_naive(q, k, v, scale, causal)
    tiled = attention_backward_tiled(q, k, v, O, lse, dO, scale, causal, Br=32, Bc=16, dtype=np.float64)
    for name, e, n, t in zip(("dQ", "dK", "dV"), expected, naive, tiled):
        np.testing.assert_allclose(n, e, rtol=1e-9, atol=1e-10, err_msg=name)
        np.testing.assert_allclose(t, e, rtol=1e-9, atol=1e-10, err_msg=name)


def test_backward_rows_without_keys_get_zero_gradient():
    rng = np.random.default_rng(3)
    q, k, v = rng.standard_normal((1, 1, 6, 8)), rng.standard_normal((1, 1, 2, 8)), rng.standard_normal((1, 1, 2, 8))
    dO = rng.standard_normal(q.shape)
    dQ, dK, dV = attention_backward_naive(q, k, v, dO, causal="bottom_right")  # rows 0..3 see nothing
    assert np.all(dQ[0, 0, :4] == 0) and np.all(np.isfinite(dK)) and np.all(np.isfinite(dV))


def test_float32_backward_loop_is_close_to_float64():
    rng = np.random.default_rng(4)
    q, k, v = (rng.standard_normal((1, 2, 200, 64)) for _ in range(3))
    dO = rng.standard_normal(q.shape)
    expected = attention_backward_naive(q, k, v, dO, causal="top_left")
    O, lse = attention_naive(q, k, v, causal="top_left")
    got = attention_backward_tiled(q, k, v, O, lse, dO, causal="top_left")
    for e, g in zip(expected, got):
        assert np.linalg.norm(g - e) / np.linalg.norm(e) < 1e-5
