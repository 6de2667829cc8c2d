"""NumPy references.

``attention_naive`` is the float64 truth every kernel is compared with.  ``attention_tiled`` runs
the kernels' own loop nest (Q blocks of Br rows, K/V blocks of Bc keys, running m_i / l_i,
deferred normalisation, causal block skipping and diagonal-block masking), so the algorithm is
proven on the CPU independently of CUDA.

Shapes follow PyTorch's SDPA: q (B, H, Nq, D), k and v (B, H_kv, Nk, D) with H % H_kv == 0.
Causal alignment: query row i sees key j iff j <= i + offset, where offset = 0 for "top_left"
and Nk - Nq for "bottom_right".  A row that sees no key outputs 0 and has lse = -inf.
"""

from __future__ import annotations

import numpy as np

CAUSAL_MODES = ("top_left", "bottom_right")


def causal_offset(Nq: int, Nk: int, causal: str | None) -> int | None:
    if causal is None:
        return None
    if causal not in CAUSAL_MODES:
        raise ValueError(f"causal must be one of {CAUSAL_MODES} or None, got {causal!r}")
    return 0 if causal == "top_left" else Nk - Nq


def _safe(m):
    return np.where(np.isfinite(m), m, 0)


def _expand_kv(q, k, v):
    group = q.shape[1] // k.shape[1]
    return np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)


def attention_naive(q, k, v, softmax_scale=None, causal=None):
    """Returns (O, lse) in float64.  O: (B, H, Nq, D), lse: (B, H, Nq)."""
    q, k, v = (np.asarray(t, dtype=np.float64) for t in (q, k, v))
    k, v = _expand_kv(q, k, v)
    Nq, Nk, D = q.shape[2], k.shape[2], q.shape[3]
    scale = 1.0 / np.sqrt(D) if softmax_scale is None else softmax_scale
    S = np.einsum("bhid,bhjd->bhij", q, k) * scale
    offset = causal_offset(Nq, Nk, causal)
    if offset is not None:
        visible = np.arange(Nk)[None, :] <= np.arange(Nq)[:, None] + offset
        S = np.where(visible, S, -np.inf)
    m = S.max(axis=-1, keepdims=True)
    m_safe = _safe(m)
    P = np.exp(S - m_safe)
    l = P.sum(axis=-1, keepdims=True)
    O = np.einsum("bhij,bhjd->bhid", P, v) / np.where(l > 0, l, 1.0)
    with np.errstate(divide="ignore"):
        lse = np.where(l[..., 0] > 0, m_safe[..., 0] + np.log(l[..., 0]), -np.inf)
    return O, lse


def attention_tiled(q, k, v, softmax_scale=None, causal=None, Br=128, Bc=32, dtype=np.float32):
    """The FA2 forward loop nest of the v2 rung, block by block, in ``dtype``.

    Returns (O, lse) with the shapes of ``attention_naive``.
    """
    q, k, v = (np.asarray(t, dtype=dtype) for t in (q, k, v))
    k, v = _expand_kv(q, k, v)
    B, H, Nq, D = q.shape
    Nk = k.shape[2]
    scale = dtype(1.0 / np.sqrt(D) if softmax_scale is None else softmax_scale)
    offset = causal_offset(Nq, Nk, causal)
    O = np.zeros((B, H, Nq, D), dtype)
    lse = np.full((B, H, Nq), -np.inf, dtype)
    Tr = -(-Nq // Br)
    for i in range(Tr):  # Q blocks: the outer loop, one thread block each in the kernel
        q_start = i * Br
        rows = np.arange(q_start, min(q_start + Br, Nq))
        Qi = q[:, :, rows]
        m_i = np.full((B, H, len(rows), 1), -np.inf, dtype)
        l_i = np.zeros((B, H, len(rows), 1), dtype)
        acc = np.zeros((B, H, len(rows), D), dtype)  # unnormalised O~
        # Causal, block level: K/V blocks past the last row's diagonal are never visited.
        kv_limit = Nk if offset is None else min(Nk, max(0, q_start + Br + offset))
        for kv_start in range(0, kv_limit, Bc):
            cols = np.arange(kv_start, min(kv_start + Bc, Nk))
            S = (Qi @ np.swapaxes(k[:, :, cols], -1, -2)) * scale
            # Element mask only on the block straddling the diagonal.
            if offset is not None and kv_start + Bc - 1 > q_start + offset:
                S = np.where(cols[None, :] <= rows[:, None] + offset, S, -np.inf)
            m_tilde = S.max(axis=-1, keepdims=True)
            # P = exp(S - m~); a fully masked row has m~ = -inf and exp(-inf - -inf) would be NaN,
            # so the kernels subtract 0 instead (safe_max) and get P = 0.
            P = np.exp(S - _safe(m_tilde))
            l_tilde = P.sum(axis=-1, keepdims=True)
            m_new = np.maximum(m_i, m_tilde)
            scale_old = np.exp(m_i - _safe(m_new))
            scale_new = np.exp(m_tilde - _safe(m_new))
            l_i = scale_old * l_i + scale_new * l_tilde
            acc = scale_old * acc + scale_new * (P @ v[:, :, cols])
            m_i = m_new
        # Deferred normalisation: one reciprocal per row; rows that saw nothing stay 0.
        has_keys = l_i > 0
        O[:, :, rows] = acc * np.where(has_keys, 1 / np.where(has_keys, l_i, 1), 0)
        with np.errstate(divide="ignore"):
            lse[:, :, rows] = np.where(has_keys, m_i + np.log(np.where(has_keys, l_i, 1)), -np.inf)[..., 0]
    return O, lse
