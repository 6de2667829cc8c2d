"""NumPy references.

``attention_naive`` is the float64 truth every kernel is compared with.  ``attention_tiled`` runs
the kernels' own loop nest (Q blocks of Br rows, K/V blocks of Bc keys, running m_i / l_i,
deferred normalisation, causal block skipping and diagonal-block masking), so the algorithm is
proven on the CPU independently of CUDA.  ``attention_backward_naive`` and
``attention_backward_tiled`` do the same for the gradients (FlashAttention-2's backward: D_i
preprocessing, K/V blocks outer, P rebuilt from the forward's lse, dQ accumulated across blocks),
checked against PyTorch's float64 autograd in tests/test_reference.py.

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


def _scores(q, k, softmax_scale, causal):
    """scale * q k^T in float64 (k already expanded to q's heads), -inf where a key is not visible."""
    Nq, Nk, D = q.shape[2], k.shape[2], q.shape[3]
    scale = 1.0 / np.sqrt(D) if softmax_scale is None else softmax_scale
    S = np.einsum("bhid,bhjd->bhij", q, k) * scale
    offset = causal_offset(Nq, Nk, causal)
    if offset is not None:
        S = np.where(np.arange(Nk)[None, :] <= np.arange(Nq)[:, None] + offset, S, -np.inf)
    return S, scale


def attention_naive(q, k, v, softmax_scale=None, causal=None):
    """Returns (O, lse) in float64.  O: (B, H, Nq, D), lse: (B, H, Nq)."""
    q, k, v = (np.asarray(t, dtype=np.float64) for t in (q, k, v))
    k, v = _expand_kv(q, k, v)
    S, _ = _scores(q, k, softmax_scale, causal)
    return _softmax_times_v(S, v)


def round_e4m3(x):
    """x rounded to FP8 e4m3 (round to nearest even; 3 mantissa bits, normals from 2^-6, subnormals
    in steps of 2^-9, saturating at +-448), in float64: what v3.5 does to P before P V."""
    x = np.asarray(x, dtype=np.float64)
    mag = np.abs(x)
    e = np.floor(np.log2(np.where(mag > 0, mag, 1.0)))
    step = 2.0 ** (np.maximum(e, -6) - 3)  # the spacing of e4m3 numbers around |x|
    return np.sign(x) * np.minimum(np.round(mag / step) * step, 448.0)  # (np.round: half to even)


def attention_fp8(q, k, v, descale_q, descale_k, descale_v, softmax_scale=None, causal=None):
    """The truth for FP8 inputs: the float64 attention of the values q, k, v stand for, each
    element times its (batch, KV head)'s descale factor (arrays (B, H_kv); FlashAttention-3's
    convention, q's factor taken by the KV head of its group).  Returns (O, lse) as attention_naive."""
    q, k, v = (np.asarray(t, dtype=np.float64) for t in (q, k, v))
    group = q.shape[1] // k.shape[1]
    per_kv = lambda d: np.asarray(d, dtype=np.float64).reshape(k.shape[0], k.shape[1], 1, 1)
    q = q * np.repeat(per_kv(descale_q), group, axis=1)
    return attention_naive(q, k * per_kv(descale_k), v * per_kv(descale_v), softmax_scale, causal)


def _softmax_times_v(S, v):
    """(softmax(S) v, lse) in float64; a row of S that is all -inf, or has no key at all,
    outputs 0 with lse -inf."""
    m_safe = _safe(S.max(axis=-1, keepdims=True, initial=-np.inf))
    P = np.exp(S - m_safe)
    l = P.sum(axis=-1, keepdims=True)
    O = np.einsum("bhij,bhjd->bhid", P, v) / np.where(l > 0, l, 1.0)
    with np.errstate(divide="ignore"):
        lse = np.where(l[..., 0] > 0, m_safe[..., 0] + np.log(l[..., 0]), -np.inf)
    return O, lse


def kv_block_range(q_start: int, Br: int, Bc: int, Nk: int, offset: int, causal: bool, window=(-1, -1)):
    """The K/V blocks [j_lo, j_hi) of Bc keys that the Q block of rows q_start .. q_start + Br - 1
    visits, as v3.3 computes them: query row i sits at key position i + offset; a causal mask
    stops at the last row's position, a window (left, right) (-1: unbounded; right ignored under
    a causal mask) bounds the keys from both sides, so blocks no row sees are skipped."""
    left, right = window
    kv_hi = min(Nk, max(0, q_start + Br + offset)) if causal else Nk
    if not causal and right >= 0:
        kv_hi = min(kv_hi, max(0, q_start + Br + offset + right))
    kv_lo = min(kv_hi, max(0, q_start + offset - left)) if left >= 0 else 0
    return kv_lo // Bc, -(-kv_hi // Bc)


def attention_tiled(q, k, v, softmax_scale=None, causal=None, Br=128, Bc=32, dtype=np.float32, window=(-1, -1)):
    """The FA2 forward loop nest of the v2 rung, block by block, in ``dtype``; with a sliding
    ``window`` (left, right), v3.3's variants kernel's: only the K/V blocks of kv_block_range,
    positions aligned as the causal mask (bottom-right, Nk - Nq, without one).

    Returns (O, lse) with the shapes of ``attention_naive``.
    """
    q, k, v = (np.asarray(t, dtype=dtype) for t in (q, k, v))
    k, v = _expand_kv(q, k, v)
    B, H, Nq, D = q.shape
    Nk = k.shape[2]
    scale = dtype(1.0 / np.sqrt(D) if softmax_scale is None else softmax_scale)
    offset = causal_offset(Nq, Nk, causal)
    pos = Nk - Nq if offset is None else offset  # query row i sits at key position i + pos
    left, right = window
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
        # Causal (and window), block level: K/V blocks no row of the block sees are never visited.
        j_lo, j_hi = kv_block_range(q_start, Br, Bc, Nk, pos, offset is not None, window)
        for kv_start in range(j_lo * Bc, min(j_hi * Bc, Nk), Bc):
            cols = np.arange(kv_start, min(kv_start + Bc, Nk))
            S = (Qi @ np.swapaxes(k[:, :, cols], -1, -2)) * scale
            # Element mask only on the block straddling the diagonal.
            if offset is not None and kv_start + Bc - 1 > q_start + offset:
                S = np.where(cols[None, :] <= rows[:, None] + offset, S, -np.inf)
            if left >= 0:  # the window's edges (the kernel masks only the blocks crossing them)
                S = np.where(cols[None, :] >= rows[:, None] + pos - left, S, -np.inf)
            if right >= 0 and offset is None:
                S = np.where(cols[None, :] <= rows[:, None] + pos + right, S, -np.inf)
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


# ---- backward ---------------------------------------------------------------------------------
# With S = scale * Q K^T (masked to -inf), P = exp(S - lse) row-wise and O = P V:
#   dV = P^T dO,  dP = dO V^T,  D_i = rowsum(dO * O) = rowsum(P * dP),  dS = P * (dP - D_i),
#   dQ = scale * dS K,  dK = scale * dS^T Q.
# Under GQA each K/V head's dK, dV is the sum over the query heads of its group.  A row that sees
# no key has P = 0, so it contributes nothing and its dQ is 0.


def _reduce_groups(x, H_kv):
    """Sum (B, H, N, D) over each group of H / H_kv consecutive query heads -> (B, H_kv, N, D)."""
    B, H, N, D = x.shape
    return x.reshape(B, H_kv, H // H_kv, N, D).sum(axis=2)


def _probabilities(S, lse):
    """P = exp(S - lse) with the row of lse = -inf (no key) giving 0, not NaN."""
    lse = lse[..., None]
    with np.errstate(invalid="ignore"):
        return np.where(np.isfinite(lse), np.exp(S - np.where(np.isfinite(lse), lse, 0)), 0.0)


def attention_backward_naive(q, k, v, dO, softmax_scale=None, causal=None):
    """Returns (dQ, dK, dV) in float64 for the loss sum(O * dO), O = attention(q, k, v)."""
    q, k, v, dO = (np.asarray(t, dtype=np.float64) for t in (q, k, v, dO))
    H_kv = k.shape[1]
    O, lse = attention_naive(q, k, v, softmax_scale, causal)
    k_, v_ = _expand_kv(q, k, v)
    S, scale = _scores(q, k_, softmax_scale, causal)
    P = _probabilities(S, lse)
    dV = np.einsum("bhij,bhid->bhjd", P, dO)
    dP = np.einsum("bhid,bhjd->bhij", dO, v_)
    Di = (dO * O).sum(axis=-1, keepdims=True)
    dS = P * (dP - Di)
    dQ = scale * np.einsum("bhij,bhjd->bhid", dS, k_)
    dK = scale * np.einsum("bhij,bhid->bhjd", dS, q)
    return dQ, _reduce_groups(dK, H_kv), _reduce_groups(dV, H_kv)


def variants_q_range(kv_start, Nq, offset, causal, left, right, Br, Bc):
    """bwd_common.cuh's variants_q_range: [q_begin, q_end) covering the Q blocks (from q_begin, a
    multiple of Br) whose rows (at positions i + offset) see a key of kv_start .. kv_start + Bc - 1
    under the causal mask and the window (left, right; right unused under the causal mask)."""
    q_begin = max(0, kv_start - offset) // Br * Br if causal else 0
    q_end = Nq
    if right >= 0 and not causal:
        q_begin = max(q_begin, max(0, kv_start - offset - right) // Br * Br)
    if left >= 0:
        q_end = min(Nq, max(0, kv_start + Bc + left - offset))
    return q_begin, q_end


def attention_backward_tiled(
    q, k, v, O, lse, dO, softmax_scale=None, causal=None, Br=64, Bc=64, dtype=np.float32,
    window=(-1, -1), softcap=0.0, alibi_slopes=None,
):  # fmt: skip
    """FlashAttention-2's backward loop nest, block by block, in ``dtype``: first D_i =
    rowsum(dO * O) per query row (the preprocessing kernel), then K/V blocks outer (one thread
    block each: dK_j, dV_j stay on chip and are written once), Q blocks inner (P rebuilt from the
    forward's lse, no N x N matrix anywhere), dQ accumulated across K/V blocks (atomics on the
    GPU, an in-order sum here).  Each K/V block visits only the Q blocks whose rows see one of its
    keys (variants_q_range: causal, Q blocks entirely above the diagonal are skipped), and the
    keys a row does not see are masked.  Returns (dQ, dK, dV) like ``attention_backward_naive``.
    window, softcap, alibi_slopes: attention_serving's score variants in flash_attn_func's
    alignment (row i at position i + offset: the causal offset, else Nk - Nq), as bwd_v2_variants
    takes them back (bwd_common.cuh frag_p_ds_variants): P = exp(score - lse) of the forward's
    score (softcap c tanh(s S / c), then -slope |p - j|), and dS = P (dP - D_i) times 1 - tanh^2
    under a softcap (s with dQ's, dK's scale)."""
    q, k, v, O, dO = (np.asarray(t, dtype=dtype) for t in (q, k, v, O, dO))
    lse = np.asarray(lse, dtype=dtype)
    H_kv = k.shape[1]
    k_, v_ = _expand_kv(q, k, v)
    B, H, Nq, D = q.shape
    Nk = k_.shape[2]
    scale = dtype(1.0 / np.sqrt(D) if softmax_scale is None else softmax_scale)
    offset = causal_offset(Nq, Nk, causal)
    pos_offset = Nk - Nq if offset is None else offset  # the rows' positions on the key axis
    left, right = window[0], (-1 if causal else window[1])
    slopes = None if alibi_slopes is None else np.broadcast_to(np.asarray(alibi_slopes, dtype), (B, H))
    Di = (dO * O).sum(axis=-1)  # (B, H, Nq)
    dQ = np.zeros((B, H, Nq, D), dtype)
    dK = np.zeros((B, H, Nk, D), dtype)
    dV = np.zeros((B, H, Nk, D), dtype)
    for kv_start in range(0, Nk, Bc):  # K/V blocks: the outer loop, one thread block each
        cols = np.arange(kv_start, min(kv_start + Bc, Nk))
        Kj, Vj = k_[:, :, cols], v_[:, :, cols]
        dKj = np.zeros_like(Kj)
        dVj = np.zeros_like(Vj)
        for q_start in range(*variants_q_range(kv_start, Nq, pos_offset, causal, left, right, Br, Bc), Br):
            rows = np.arange(q_start, min(q_start + Br, Nq))
            Qi, dOi = q[:, :, rows], dO[:, :, rows]
            S = (Qi @ np.swapaxes(Kj, -1, -2)) * scale
            if softcap > 0:
                tanh_S = np.tanh(S / dtype(softcap))
                S = dtype(softcap) * tanh_S
            dist = rows[:, None] + pos_offset - cols[None, :]  # p - j
            if slopes is not None:
                S = S - slopes[:, :, None, None] * np.abs(dist).astype(dtype)
            seen = np.ones(dist.shape, bool) if offset is None else dist >= 0
            if left >= 0:
                seen &= dist <= left
            if right >= 0:
                seen &= dist >= -right
            P = _probabilities(np.where(seen, S, -np.inf), lse[:, :, rows]).astype(dtype)
            dVj += np.swapaxes(P, -1, -2) @ dOi
            dP = dOi @ np.swapaxes(Vj, -1, -2)
            dS = P * (dP - Di[:, :, rows, None])
            if softcap > 0:
                dS = dS * (1 - tanh_S**2)
            dQ[:, :, rows] += scale * (dS @ Kj)
            dKj += scale * (np.swapaxes(dS, -1, -2) @ Qi)
        dK[:, :, cols], dV[:, :, cols] = dKj, dVj
    return dQ, _reduce_groups(dK, H_kv), _reduce_groups(dV, H_kv)


# ---- serving (issue 12): window, softcap, ALiBi, variable-length batches, paged KV caches -------
# flash-attn's conventions, so that its users' arguments mean the same here.  Positions are
# bottom-right aligned: query i of Nq and key j of Nk are at distance i + Nk - Nq - j.


def attention_serving(
    q, k, v, softmax_scale=None, causal=False, window=(-1, -1), softcap=0.0, alibi_slopes=None, offset=None
):
    """float64 (O, lse) of (B, H, Nq, D) q and (B, H_kv, Nk, D) k, v, query i at key position
    p = i + offset (default Nk - Nq: bottom-right, as flash-attn; 0: top-left), with:
      window (left, right): query i sees keys p - left .. p + right inclusive, -1 for no bound on
          that side; causal=True is right = 0;
      softcap > 0: scores s (already scaled) become softcap * tanh(s / softcap) (Gemma 2);
      alibi_slopes (H,) or (B, H): scores get -slope * |p - j| (BLOOM, MPT).
    A row that sees no key outputs 0 with lse -inf."""
    return _softmax_times_v(*_serving_scores(q, k, v, softmax_scale, causal, window, softcap, alibi_slopes, offset))


def _serving_scores(q, k, v, softmax_scale, causal, window, softcap, alibi_slopes, offset=None):
    """attention_serving's scores (-inf where a key is not visible) and v expanded to q's heads."""
    q, k, v = (np.asarray(t, dtype=np.float64) for t in (q, k, v))
    k, v = _expand_kv(q, k, v)
    B, H, Nq, D = q.shape
    Nk = k.shape[2]
    scale = 1.0 / np.sqrt(D) if softmax_scale is None else softmax_scale
    S = np.einsum("bhid,bhjd->bhij", q, k) * scale
    if softcap > 0:
        S = softcap * np.tanh(S / softcap)
    offset = Nk - Nq if offset is None else offset
    dist = np.arange(Nq)[:, None] + offset - np.arange(Nk)[None, :]  # p - j
    if alibi_slopes is not None:
        slopes = np.broadcast_to(np.asarray(alibi_slopes, dtype=np.float64), (B, H))
        S = S - slopes[:, :, None, None] * np.abs(dist)
    left, right = window
    right = 0 if causal else right
    visible = np.ones((Nq, Nk), bool)
    if left >= 0:
        visible &= dist <= left
    if right >= 0:
        visible &= dist >= -right
    return np.where(visible, S, -np.inf), v


def merge_partials(outs, lses):
    """Attention over the union of disjoint key sets from each set's own (O_c, lse_c): the merge
    of split-KV decoding (FlashDecoding) and of ring attention.  With lse = log sum_c exp(lse_c),
    O = sum_c exp(lse_c - lse) O_c.  A part that saw no key (lse_c = -inf) weighs 0; a row no part
    saw outputs 0 with lse -inf.  outs: C arrays (..., D); lses: C arrays (...)."""
    outs, lses = (
        np.stack([np.asarray(o, np.float64) for o in outs]),
        np.stack([np.asarray(x, np.float64) for x in lses]),
    )
    m_safe = _safe(lses.max(axis=0))
    w = np.exp(lses - m_safe)  # exp(-inf) = 0
    total = w.sum(axis=0)
    O = np.einsum("c...,c...d->...d", w, outs) / np.where(total > 0, total, 1.0)[..., None]
    with np.errstate(divide="ignore"):
        lse = np.where(total > 0, m_safe + np.log(total), -np.inf)
    return O, lse


def attention_split_kv(
    q, k, v, num_splits: int, softmax_scale=None, causal=False, window=(-1, -1), softcap=0.0, alibi_slopes=None
):
    """attention_serving computed as split-KV decoding does: the keys cut into ``num_splits``
    contiguous chunks of ceil(Nk / num_splits) (trailing chunks may be empty: O 0, lse -inf), each
    chunk's (O_c, lse_c) on its own, then merge_partials.  Masks, softcap and ALiBi use each key's
    global position, so a chunk can be wholly masked for some rows."""
    S, v = _serving_scores(q, k, v, softmax_scale, causal, window, softcap, alibi_slopes)
    chunk = -(-S.shape[-1] // num_splits)
    parts = []
    for c in range(num_splits):
        parts.append(_softmax_times_v(S[..., c * chunk : (c + 1) * chunk], v[:, :, c * chunk : (c + 1) * chunk]))
    return merge_partials([o for o, _ in parts], [lse for _, lse in parts])


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, **kwargs):
    """Packed variable-length batches, flash-attn's varlen layout: q (total_q, H, D), k and v
    (total_k, H_kv, D); sequence b is rows cu_seqlens_q[b]:cu_seqlens_q[b + 1] of q and
    cu_seqlens_k[b]:cu_seqlens_k[b + 1] of k, v, attended to on its own (``attention_serving``'s
    keyword arguments apply per sequence; (B, H) ALiBi slopes give sequence b row b).  Returns
    O (total_q, H, D), lse (H, total_q)."""
    q, k, v = (np.asarray(t, dtype=np.float64) for t in (q, k, v))
    O = np.zeros_like(q)
    lse = np.full((q.shape[1], q.shape[0]), -np.inf)
    slopes = kwargs.pop("alibi_slopes", None)
    for b in range(len(cu_seqlens_q) - 1):
        qs, qe, ks, ke = cu_seqlens_q[b], cu_seqlens_q[b + 1], cu_seqlens_k[b], cu_seqlens_k[b + 1]
        if qe == qs:
            continue
        heads = lambda t: t.transpose(1, 0, 2)[None]  # (n, H, D) -> (1, H, n, D)
        slopes_b = slopes if slopes is None or np.ndim(slopes) == 1 else np.asarray(slopes)[b : b + 1]
        o, l = attention_serving(heads(q[qs:qe]), heads(k[ks:ke]), heads(v[ks:ke]), alibi_slopes=slopes_b, **kwargs)
        O[qs:qe] = o[0].transpose(1, 0, 2)
        lse[:, qs:qe] = l[0]
    return O, lse


def packed_tile_schedule(
    cu_seqlens_q, Br: int, causal: bool, total_q: int | None = None
) -> list[tuple[int, int] | None]:
    """v3.3's tile scheduler over packed sequences (csrc/common.cuh's packed_tile), tile by tile:
    the (sequence b, Q block) each of the floor(total_q / Br) + B tiles takes, None for an empty
    one.  Sequence b's blocks are tiles first(b) .. first(b) + ceil(len_b / Br) - 1, first(b) =
    floor((cu_seqlens_q[b] - cu_seqlens_q[0]) / Br) + b; a warp finds b by a 32-way search (32
    lanes probe first() at a stride, a ballot keeps the last probe at or below the tile).
    total_q: q's rows (default cu_seqlens_q[-1]; more when q has rows past the last sequence)."""
    cu = [int(c) for c in cu_seqlens_q]
    B = len(cu) - 1
    total_q = cu[-1] if total_q is None else total_q
    first = lambda b: (cu[b] - cu[0]) // Br + b
    schedule = []
    for tile in range(total_q // Br + B):
        lo, n = 0, B
        while n > 1:
            step = -(-n // 32)
            below = [lane for lane in range(32) if lo + lane * step < lo + n and first(lo + lane * step) <= tile]
            lo, n = lo + below[-1] * step, min(step, n - below[-1] * step)
        blocks, i = -(-(cu[lo + 1] - cu[lo]) // Br), tile - first(lo)
        schedule.append(None if i >= blocks else (lo, blocks - 1 - i if causal else i))
    return schedule


def persistent_tile(tile: int, Tr: int, bh_count: int, causal: bool) -> tuple[int, int]:
    """csrc/common.cuh persistent_tile (its default order): the (bh, Q block) of tile number
    `tile` of the persistent walk.  Causal: a head's Q blocks in pairs from both ends (Tr - 1, 0,
    Tr - 2, 1, ...), its middle block, for odd Tr, after every head's pairs."""
    if not causal:
        return divmod(tile, Tr)
    W = Tr - 1 if Tr % 2 else Tr
    if W < Tr and tile >= W * bh_count:
        return tile - W * bh_count, Tr // 2
    bh, r = divmod(tile, W)
    return bh, Tr - 1 - r // 2 if r % 2 == 0 else r // 2


def sorted_tail_start(T: int, ctas: int, sorted_tail: int) -> int:
    """csrc/common.cuh sorted_tail_start: the first tile of the sorted tail (a whole round of pairs
    before it), for common.cuh sorted_tail_rounds = sorted_tail."""
    rounds = (T + 1) // 2 // ctas - sorted_tail
    return 2 * rounds * ctas if rounds > 0 else 0


def persistent_schedule(
    Tr: int, bh_count: int, ctas: int, causal: bool, sorted_tail: int = 0
) -> list[list[tuple[int, int]]]:
    """The persistent rungs' tiles (persistent_tile's order, v3_3_wgmma.cu v3_3_for_my_tiles), CTA
    by CTA: the (bh, Q block) each of `ctas` CTAs takes, in its order.  Tiles blockIdx.x, + ctas,
    ... (in pairs under the causal mask); with sorted_tail = R (causal; common.cuh
    sorted_tail_rounds: 2 for 192-row tiles) the pairs stop R rounds before the end and the rest
    go one at a time, the most keys first, dealt to the CTAs in a snake."""
    T = Tr * bh_count
    U = 2 if causal else 1
    # Without a sorted tail the tail is empty (t0 = T) and the units run to the end.
    t0 = sorted_tail_start(T, ctas, sorted_tail) if causal and sorted_tail else T
    # The tail from t0 in decreasing Q block order (common.cuh sorted_tail_tile, written out).
    tail = sorted((persistent_tile(t, Tr, bh_count, causal) for t in range(t0, T)), key=lambda x: -x[1])
    out = []
    for c in range(ctas):
        tiles = [
            persistent_tile(t, Tr, bh_count, causal)
            for u in range(c, -(-t0 // U), ctas)
            for t in range(u * U, min(t0, u * U + U))
        ]
        r = 0
        while (k := r * ctas + (c if r % 2 == 0 else ctas - 1 - c)) < T - t0:
            tiles.append(tail[k])
            r += 1
        out.append(tiles)
    return out


def varlen_kv_blocks(cu_seqlens_k, Bc: int, total_k: int) -> list[tuple[int, int] | None]:
    """The varlen backward's grid (csrc/bwd_common.cuh's bwd_varlen_sequence), block by block: the
    (sequence b, first key of its K/V block) each of the ceil(total_k / Bc) + B thread blocks of a
    head takes, None for one with no work.  Sequence b's K/V blocks are the blocks from
    start(b) = (cu_seqlens_k[b] - cu_seqlens_k[0]) // Bc + b on; a block finds b by a binary
    search for the last start(b) <= its index.  bwd_v5_varlen numbers its dQ chunks of Br query
    rows over cu_seqlens_q the same way (csrc/bwd_common.cuh's varlen_block; testing.dq_from_blocks)."""
    cu = [int(c) for c in cu_seqlens_k]
    B = len(cu) - 1
    start = lambda b: (cu[b] - cu[0]) // Bc + b
    grid = []
    for L in range(-(-total_k // Bc) + B):
        lo, hi = 0, B - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if start(mid) <= L else (lo, mid - 1)
        kv_start = (L - start(lo)) * Bc
        grid.append((lo, kv_start) if kv_start < cu[lo + 1] - cu[lo] else None)
    return grid


def paged_kv(k_cache, v_cache, page_table, seqused_k):
    """The keys and values a paged KV cache holds for each sequence: k_cache, v_cache
    (num_pages, page_size, H_kv, D), page_table (B, max_pages) page indices, seqused_k (B,) the
    number of keys in use.  Returns per sequence (k, v) of shape (seqused_k[b], H_kv, D)."""
    page_size = k_cache.shape[1]
    out = []
    for b, n in enumerate(seqused_k):
        pages = page_table[b, : -(-int(n) // page_size)]
        out.append(tuple(c[pages].reshape(-1, *c.shape[2:])[:n] for c in (k_cache, v_cache)))
    return out
