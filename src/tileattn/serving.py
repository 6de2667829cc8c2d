"""Serving paths (issue 12, being built).

``flash_attn_with_kvcache``: flash-attn's signature.  Attention of a few query tokens per
sequence over a KV cache, contiguous or paged with any page size, after appending the new keys
and values in place, by split-KV decoding (csrc/dec_common.cuh; on Hopper dec_v5 for contiguous
caches and pages of a multiple of its tile, dec_v4 for other pages of at least its tile, dec_v3
below; dec_v1 on sm_80+; reference.attention_split_kv is their loop nest).
Layouts as flash-attn: q (B, Nq, H, D); a contiguous cache (B, Nk, H_kv, D), or a paged one
(num_pages, page_size, H_kv, D) with block_table (B, max_pages) int32.

``flash_attn_varlen_func``: packed sequences (v3.3 on Hopper, v3.1's varlen kernel on sm_80+), and
the score variants (sliding window, softcap, ALiBi) of it and of ``api.flash_attn_func``
(attention_variants; v3.3's variants kernel on Hopper, v3.1's on sm_80+): the kernels that take
every forward field, launched by _launch_packed.

Checked on the host without a device sync: every tensor's dtype, device, rank and shape,
window_size, softcap and the ALiBi slopes' shape.  Not checked (it would need a sync): the values
inside cache_seqlens and block_table, which must keep every key inside the cache.
"""

from __future__ import annotations

import functools
import math
import numbers
import operator

import numpy as np
import torch

from . import _params, api
from .versions import DEC_COMBINE, DEC_COMBINE_ROWS, DEC_VERSIONS

_MAX_SPLITS = 128


@functools.cache
def _device_slots(device_index: int, smem: int, threads: int) -> int:
    """How many blocks of a kernel (smem bytes, threads) are resident at once on the device."""
    props = torch.cuda.get_device_properties(device_index)
    per_sm_smem = getattr(props, "shared_memory_per_multiprocessor", 228 * 1024)
    per_sm_threads = getattr(props, "max_threads_per_multi_processor", 2048)
    per_sm = max(1, min(per_sm_smem // (smem + 1024), per_sm_threads // threads, 32))
    return per_sm * props.multi_processor_count


@functools.lru_cache(maxsize=4096)  # a decode step asks the same question every call: 16 us of Python
def num_splits_heuristic(blocks: int, tiles: int, slots: int) -> int:
    """Splits of each sequence's keys so that blocks x splits fills the device's slots evenly:
    1 once the blocks alone fill most of a wave; otherwise the fewest splits within 85% of the
    best wave efficiency (blocks x s / slots over its ceiling), never more splits than tiles."""
    if blocks == 0 or blocks >= 0.8 * slots:
        return 1
    limit = max(1, min(_MAX_SPLITS, tiles))
    eff = [(blocks * s / slots) / math.ceil(blocks * s / slots) for s in range(1, limit + 1)]
    best = max(eff)
    return next(s for s, e in enumerate(eff, 1) if e >= 0.85 * best)


def _entries(version):
    names = [e.name for e in DEC_VERSIONS]
    if version is not None and version not in names:
        raise ValueError(f"version must be one of {names} or None, got {version!r}")
    return [e for e in DEC_VERSIONS if version in (None, e.name)]


def _takes_pages(entry, D: int, page_size: int, tensor_copies: bool) -> bool:
    """Whether entry's page rule (versions.KernelEntry.page_rule) lets the default choice run it
    at this page size (0: a contiguous cache).  tensor_copies: the caches can be described to
    the copy engine (strides > 0)."""
    Bc = entry.tiles[D][1]
    if entry.page_rule == "copy_engine":
        return tensor_copies and (page_size % Bc == 0 or (page_size % 8 == 0 and Bc % page_size == 0))
    return not (entry.page_rule == "tile" and 0 < page_size < Bc)


def _decode_entry(dtype: str, D: int, device_index: int, version=None, page_size: int = 0, tensor_copies=True):
    """The newest decode kernel (or the one named) this device runs at this head dim whose page
    rule takes page_size, or None.  dec_v5's tensor copies take contiguous caches, pages of a
    multiple of its tile and pages of a multiple of 8 rows that divide it; other pages go to
    dec_v4, and pages shorter than dec_v4's tile to dec_v3: at 16-token pages dec_v4 ran at
    0.86x its contiguous speed where dec_v3 keeps 0.97x (H200, bf16, B=16, GQA 32:8, 16k keys,
    D=128; measured, not yet explained: both look the block table up per row).  A kernel named
    by version runs unless its rule is "copy_engine" and it cannot take the pages (ValueError)."""
    from . import _nvrtc

    cc = _nvrtc.device_arch(device_index)
    arch = cc[0] * 10 + cc[1]
    fits = [e for e in _entries(version) if dtype in e.dtypes and D in e.tiles and e.min_arch <= arch]
    if version is None:
        fits = [e for e in fits if _takes_pages(e, D, page_size, tensor_copies)] or fits[:1]
    elif fits and fits[-1].page_rule == "copy_engine" and not _takes_pages(fits[-1], D, page_size, tensor_copies):
        Bc = fits[-1].tiles[D][1]
        divisors = [p for p in range(8, Bc, 8) if Bc % p == 0]
        raise ValueError(
            f"{version} copies tiles of {Bc} rows through the copy engine: it needs cache strides > 0 and a "
            f"contiguous cache or a page size that is a multiple of {Bc} or one of {divisors}; got page_size="
            f"{page_size}{'' if tensor_copies else ' and a cache stride of 0'}"
        )
    return fits[-1] if fits else None


def head_dims(version=None) -> tuple[int, ...]:
    """Head dims the decode kernels (or the one named) take; the device's arch may narrow them."""
    return tuple(sorted({D for e in _entries(version) for D in e.tiles}))


def _fail(name: str, expected: str, t) -> None:
    got = f"{t.dtype} {tuple(t.shape)} on {t.device}" if isinstance(t, torch.Tensor) else type(t).__name__
    raise ValueError(f"{name} must be {expected}, got {got}")


def _check_index_tensor(name: str, t, shape: tuple, device) -> None:
    """An int32 tensor of this exact shape on q's device (None passes)."""
    if t is None:
        return
    if not isinstance(t, torch.Tensor) or t.dtype != torch.int32 or t.device != device or t.dim() != len(shape):
        _fail(name, f"a {len(shape)}-D int32 tensor on {device}", t)
    if any(want is not None and got != want for got, want in zip(t.shape, shape)):
        want = ", ".join("*" if w is None else str(w) for w in shape)
        raise ValueError(f"{name} must have shape ({want}), got {tuple(t.shape)}")
    if t.stride(-1) != 1:  # the kernels index it as contiguous
        raise ValueError(f"{name} must be contiguous along its last dim, got strides {t.stride()}")


def _window(window_size) -> tuple[int, int]:
    try:
        if any(isinstance(w, (bool, np.bool_)) for w in window_size):
            raise TypeError
        left, right = (operator.index(w) for w in window_size)  # ints (numpy's too), not floats
    except (TypeError, ValueError):
        raise TypeError(f"window_size must be a pair of ints (left, right), got {window_size!r}") from None
    if left < -1 or right < -1:
        raise ValueError(f"window_size entries must be >= -1 (-1: unbounded), got {window_size!r}")
    return left, right


def _variants(window_size, softcap, alibi_slopes, causal: bool, B: int, H: int, n_max: int, device):
    """Checked score variants, as the kernels take them: (left, right) with right = 0 under a causal
    mask and -1 for a bound at or past ``n_max`` (no bound; it keeps the kernels' arithmetic inside
    int32), softcap as a float (0: off), and the ALiBi slopes (float32 (H,) or (B, H) on ``device``,
    last dim contiguous)."""
    left, right = _window(window_size)
    if causal:
        right = 0
    left, right = (-1 if w >= n_max else w for w in (left, right))
    if isinstance(softcap, bool) or not isinstance(softcap, numbers.Real):
        raise TypeError(f"softcap must be a float >= 0 (0: off), got {type(softcap).__name__}")
    softcap = float(softcap)
    if not softcap >= 0.0 or math.isinf(softcap):
        raise ValueError(f"softcap must be finite and >= 0 (0: off), got {softcap!r}")
    if alibi_slopes is not None:
        if (
            not isinstance(alibi_slopes, torch.Tensor)
            or alibi_slopes.dtype != torch.float32
            or alibi_slopes.device != device
            or alibi_slopes.shape not in ((H,), (B, H))
        ):
            _fail("alibi_slopes", f"a float32 tensor of shape ({H},) or ({B}, {H}) on {device}", alibi_slopes)
        if alibi_slopes.stride(-1) != 1:
            alibi_slopes = alibi_slopes.contiguous()
    return (left, right), softcap, alibi_slopes


def _alibi_stride(alibi_slopes) -> int:
    """The kernels' alibi_sb: the batch stride of (B, H) slopes, 0 for (H,) ones or none."""
    return alibi_slopes.stride(0) if alibi_slopes is not None and alibi_slopes.dim() == 2 else 0


_LOG2E = 1.4426950408889634


def _kernel_softcap(softcap: float, scale: float) -> float:
    """softcap as the kernels take it.  They divide it by the scale their folded exponent uses
    (softmax.cuh folded_scale: |scale| clamped at 1e-30 / log2 e); where that overflows float32
    (softcap above ~2.4e8 at scale 0, or no float32 at all) the cap cannot bind: each score S
    meets tanh at S s / c < 2^-126 S, where tanh(x) = x in float32, so softcap off is exact."""
    if softcap <= 0.0:
        return 0.0
    f32 = np.float32
    s = f32(max(f32(abs(scale)) * f32(_LOG2E), f32(1e-30))) / f32(_LOG2E)
    with np.errstate(over="ignore"):
        return softcap if np.isfinite(f32(softcap) / s) else 0.0


def any_variant(window, softcap: float, alibi_slopes, causal: bool) -> bool:
    """Whether _variants' output asks for any score variant (under a causal mask, right = 0 is
    the mask itself, not a window)."""
    return window[0] != -1 or (not causal and window[1] != -1) or softcap > 0 or alibi_slopes is not None


def flash_attn_with_kvcache(
    q,
    k_cache,
    v_cache,
    k=None,
    v=None,
    cache_seqlens=None,
    block_table=None,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    num_splits: int = 0,
    return_lse: bool = False,
    *,
    version: str | None = None,
):
    """Attention of q over each sequence's KV cache, flash-attn's ``flash_attn_with_kvcache``.

    Args:
        q: (B, Nq, H, D), float16 or bfloat16, CUDA.  Nq is small (decode, speculative tokens,
            chunks); whole prompts belong to flash_attn_func.
        k_cache, v_cache: (B, Nk, H_kv, D) contiguous cache, or (num_pages, page_size, H_kv, D)
            pages when block_table is given; any page size >= 1.  H must be a multiple of H_kv.
        k, v: optional (B, Nnew, H_kv, D) keys and values appended in place at positions
            cache_seqlens[b] .. cache_seqlens[b] + Nnew - 1 of each sequence (through
            block_table when paged); attention then covers cache_seqlens[b] + Nnew keys.
            cache_seqlens itself is not changed (as flash-attn: the caller advances it).
        cache_seqlens: (B,) int32 tensor or an int: keys in use per sequence before the append;
            None: the whole contiguous cache.  Needed with k/v and with a paged cache.
        block_table: (B, max_pages) int32, page indices of each sequence's keys in order.
        softmax_scale: default 1/sqrt(D); any finite value.
        causal: token i of Nq sits at key position i + seqlen - Nq (bottom-right) and sees keys
            up to it.
        window_size: (left, right), -1 unbounded: token at position p sees keys
            [p - left, p + right] (with causal, right is 0).  Keys outside are skipped.
        softcap: > 0 caps each scaled score s at softcap * tanh(s / softcap).
        alibi_slopes: float32 (H,) or (B, H): adds -slope * |p - j| to the scaled score.
        num_splits: 0 picks from the SM count and the work; n > 0 cuts each sequence's keys into
            n chunks merged through their log-sum-exp.
        return_lse: also return the float32 log-sum-exp, (B, H, Nq); -inf for a row with no key.
        version: a decode kernel by name ("dec_v1" .. "dec_v5"); default the newest this GPU runs
            that takes the pages (dec_v5: a contiguous cache, pages of a multiple of its tile of 64
            rows (32 at D=256) or of 8, 16 or 32 rows; dec_v4 other pages of at least 32 rows;
            dec_v3 shorter ones).

    Not differentiable: an input that requires grad while grad mode is on raises.
    """
    dtype = api._DTYPES.get(getattr(q, "dtype", None))
    if not isinstance(q, torch.Tensor) or dtype not in {d for e in DEC_VERSIONS for d in e.dtypes}:
        raise TypeError(f"q must be a float16 or bfloat16 tensor, got {getattr(q, 'dtype', type(q).__name__)}")
    tensors = [("q", q), ("k_cache", k_cache), ("v_cache", v_cache)]
    if (k is None) != (v is None):
        raise ValueError("k and v must be given together (the keys and values to append), got only one")
    if k is not None:
        tensors += [("k", k), ("v", v)]
    for name, t in tensors:
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            _fail(name, "a 4-D tensor", t)
        if t.dtype != q.dtype or t.device != q.device:
            _fail(name, f"a tensor of q's dtype and device ({q.dtype}, {q.device})", t)
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must have a contiguous last (head) dim, got strides {t.stride()}")
    if torch.is_grad_enabled() and any(t.requires_grad for _, t in tensors):
        raise RuntimeError(
            "flash_attn_with_kvcache has no backward: call it under torch.no_grad() or "
            "torch.inference_mode(), or train through flash_attn_func"
        )
    B, Nq, H, D = q.shape
    if k_cache.shape != v_cache.shape:
        raise ValueError(
            f"k_cache and v_cache must have one shape, got {tuple(k_cache.shape)} and {tuple(v_cache.shape)}"
        )
    _, rows, H_kv, Dk = k_cache.shape
    if Dk != D:
        raise ValueError(f"q and the caches must have one head dim, got q {D} and caches {Dk}")
    if H_kv == 0 or H % H_kv:
        raise ValueError(f"q's heads ({H}) must be a multiple of the caches' ({H_kv})")
    if D not in head_dims(version):
        raise ValueError(f"head dim must be one of {head_dims(version)}, got {D}")
    if k is not None and (k.shape != v.shape or k.shape[0] != B or k.shape[2:] != (H_kv, D)):
        raise ValueError(
            f"k and v must be (B={B}, Nnew, H_kv={H_kv}, D={D}), got {tuple(k.shape)} and {tuple(v.shape)}"
        )
    paged = block_table is not None
    if paged:
        _check_index_tensor("block_table", block_table, (B, None), q.device)
        if block_table.stride(1) != 1:
            raise ValueError(f"block_table must have contiguous rows, got strides {block_table.stride()}")
        Nk, page_size = block_table.shape[1] * rows, rows
    else:
        if k_cache.shape[0] != B:
            raise ValueError(f"a contiguous cache must have B={B} sequences, got {k_cache.shape[0]}")
        Nk, page_size = rows, 0
    Nnew = 0 if k is None else k.shape[1]
    if isinstance(cache_seqlens, int) and not isinstance(cache_seqlens, bool):
        if not 0 <= cache_seqlens <= Nk - Nnew:  # (a host int: checked, unlike a tensor's values)
            raise ValueError(f"cache_seqlens must be in [0, {Nk - Nnew}] (the cache's {Nk} rows), got {cache_seqlens}")
        cache_seqlens = torch.full((B,), cache_seqlens, dtype=torch.int32, device=q.device)
    _check_index_tensor("cache_seqlens", cache_seqlens, (B,), q.device)
    if cache_seqlens is None and (paged or k is not None):
        raise ValueError("cache_seqlens is needed with a paged cache or with k/v to append (keys in use per sequence)")
    (left, right), softcap, alibi_slopes = _variants(
        window_size, softcap, alibi_slopes, bool(causal), B, H, Nk + Nq, q.device
    )
    if isinstance(num_splits, bool) or not isinstance(num_splits, int) or num_splits < 0:
        raise ValueError(f"num_splits must be an int >= 0 (0: chosen), got {num_splits!r}")
    scale = 1.0 / math.sqrt(D) if softmax_scale is None else api._scale(softmax_scale, "softmax_scale")
    if q.device.type != "cuda":
        raise ValueError(f"q, k_cache and v_cache must be CUDA tensors, got {q.device}")
    tensor_copies = all(s > 0 for s in k_cache.stride()[:3] + v_cache.stride()[:3])
    entry = _decode_entry(dtype, D, q.device.index, version, page_size, tensor_copies)
    if entry is None:
        cc = torch.cuda.get_device_capability(q.device)
        raise ValueError(
            f"no decode kernel{'' if version is None else ' ' + version} runs head dim {D} on sm_{cc[0]}{cc[1]}"
        )

    if not (api._rows_aligned(k_cache, k_cache.stride()[:3]) and api._rows_aligned(v_cache, v_cache.stride()[:3])):
        raise ValueError("k_cache and v_cache rows must start on 16-byte boundaries (a copy would lose the append)")
    if not api._rows_aligned(q, q.stride()[:3]):  # a view at an odd offset: its copy is aligned
        q = q.clone(memory_format=torch.contiguous_format)
    # Everything that can still raise, before the append writes into the caller's cache.
    row_blocks = -(-(H // H_kv) * Nq // entry.tiles[D][0])
    if H_kv * row_blocks > api._GRID_Y_MAX:
        raise ValueError(
            f"H_kv * ceil(H / H_kv * Nq / 16) = {H_kv * row_blocks} is above 65535: Nq={Nq} query tokens are a "
            "prompt, not a decode step (flash_attn_func takes those)"
        )
    kern = api.entry_kernel(entry.name, dtype, D, bool(causal), q.device.index)  # compiled and loaded
    combine = api.entry_kernel(DEC_COMBINE.name, dtype, D, False, q.device.index)
    seqlens = cache_seqlens
    if k is not None and k.shape[1]:
        seqlens = _append(k_cache, v_cache, k, v, cache_seqlens, block_table, page_size)
    if scale < 0:  # the kernels fold a scale >= 0 into the exponent (softmax.cuh): negate q instead
        q, scale = -q, -scale
    return _decode((kern, combine), entry.tiles[D][1], row_blocks, q, k_cache, v_cache, seqlens, block_table,
                   Nk, page_size, scale, (left, right), softcap, alibi_slopes, num_splits,
                   return_lse)  # fmt: skip


def _append(k_cache, v_cache, k, v, cache_seqlens, block_table, page_size):
    """Write k, v (B, Nnew, H_kv, D) at positions cache_seqlens[b] + i in place (index_put_, no
    host sync) and return the new key counts cache_seqlens + Nnew."""
    B, Nnew = k.shape[:2]
    pos = cache_seqlens[:, None].long() + torch.arange(Nnew, device=k.device)  # (B, Nnew)
    if block_table is None:
        where = (torch.arange(B, device=k.device)[:, None].expand(B, Nnew), pos)
    else:
        where = (block_table.gather(1, pos // page_size).long(), pos % page_size)
    k_cache.index_put_(where, k)
    v_cache.index_put_(where, v)
    return cache_seqlens + Nnew


def _cache_maps(k_cache, v_cache, rows: int) -> bytes:
    """The TmaMaps of a decode kernel with tensor copies: K at map 1 and V at map 2 (map 0, q's
    slot, repeats K), boxes of `rows` rows (its tile, or a page shorter than the tile), no L2
    promotion (4.32 against 4.29 TB/s with the 128-byte fills, scripts/decode_sweep.py); zeros
    for an empty cache (no tile is copied)."""
    if k_cache.numel() == 0:
        return bytes(_params.TMA_MAPS_BYTES)
    layout = lambda t: ((t.shape[0], t.shape[2], t.shape[1], t.shape[3]), (t.stride(0), t.stride(2), t.stride(1)))
    return _tensor_maps(
        k_cache.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), layout(k_cache), layout(k_cache),
        layout(v_cache), api._DTYPES[k_cache.dtype], k_cache.element_size(), rows, rows, l2_promotion=0,
    )  # fmt: skip


# Descriptors depend on the pointer and the layout alone, and a decode step reuses the same caches.
_tensor_maps = functools.lru_cache(maxsize=256)(api._tensor_maps)


def _decode(kernels, Bc, row_blocks, q, k_cache, v_cache, seqlens, block_table, Nk, page_size, scale, window,
            softcap, alibi_slopes, num_splits, return_lse):  # fmt: skip
    """Allocate, choose the splits and launch the decode kernel and the merge (kernels: both,
    loaded; Bc: the decode kernel's keys per tile; row_blocks: its blocks per K/V head)."""
    B, Nq, H, D = q.shape
    H_kv = k_cache.shape[2]
    blocks = B * H_kv * row_blocks
    if blocks > api._GRID_Y_MAX:  # gridDim.y's limit: the batch in slices (views), results joined
        step = max(1, api._GRID_Y_MAX // (H_kv * row_blocks))
        parts = []
        for b0 in range(0, B, step):
            sl = slice(b0, b0 + step)
            parts.append(
                _decode(
                    kernels, Bc, row_blocks, q[sl], k_cache if block_table is not None else k_cache[sl],
                    v_cache if block_table is not None else v_cache[sl], None if seqlens is None else seqlens[sl],
                    None if block_table is None else block_table[sl], Nk, page_size, scale, window, softcap,
                    alibi_slopes if alibi_slopes is None or alibi_slopes.dim() == 1 else alibi_slopes[sl],
                    num_splits, True,
                )
            )  # fmt: skip
        out, lse = torch.cat([o for o, _ in parts]), torch.cat([lse for _, lse in parts])
        return (out, lse) if return_lse else out
    device_index = q.device.index
    kern, combine = kernels
    if num_splits == 0:
        slots = _device_slots(device_index, kern.smem, kern.threads)
        num_splits = num_splits_heuristic(blocks, -(-Nk // Bc), slots)
    num_splits = min(num_splits, _MAX_SPLITS)
    softcap = _kernel_softcap(softcap, scale)
    f32 = dict(dtype=torch.float32, device=q.device)
    parts = num_splits > 1  # (one split: the kernel writes out and lse itself, no partial rows)
    o_part = torch.empty((num_splits, B, H, Nq, D) if parts else (0,), **f32)
    lse_part = torch.empty((num_splits, B, H, Nq) if parts else (0,), **f32)
    out = torch.empty((B, Nq, H, D), dtype=q.dtype, device=q.device)
    lse = torch.empty((B, H, Nq), **f32) if return_lse else None
    if B * Nq * H:
        ptr = lambda t: 0 if t is None else t.data_ptr()
        args = [
            q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), out.data_ptr(), ptr(lse), o_part.data_ptr(),
            lse_part.data_ptr(), ptr(seqlens), ptr(block_table), ptr(alibi_slopes),
            B, Nq, H, H // H_kv, Nk, num_splits, page_size, *window,
            0 if block_table is None else block_table.stride(0), _alibi_stride(alibi_slopes),
            *(q.stride()[:3]), *(k_cache.stride()[:3]), *(v_cache.stride()[:3]), *(out.stride()[:3]),
            scale, softcap,
        ]  # fmt: skip
        maps = None
        if kern.layout.tma_offset is not None:  # dec_v5: K and V as (batch or page, head, row, column)
            maps = _cache_maps(k_cache, v_cache, Bc if block_table is None else min(Bc, page_size))
        stream = api._current_stream(device_index)
        kern.launch(stream, num_splits, blocks, args, maps)
        if parts:  # dec_common.cuh's DecSink
            combine.launch(stream, -(-B * H * Nq // DEC_COMBINE_ROWS), 1, args)
    return (out, lse) if return_lse else out


# ---- the kernels with every forward field: variable-length batches and the score variants ------

_VARLEN = "v3.3_packed"  # v3.3 reading cu_seqlens (csrc/common.cuh), on Hopper (versions.py)
_VARIANTS = "v3.3_variants"  # the same body compiled with the score variants (versions.py)
_VARIANTS_DENSE = "v3.6_variants"  # the variants on v3.6's persistent walk, dense calls (versions.py)
_VARIANTS_THREE = "v3.7_variants"  # ... on v3.7's three consumers: ALiBi alone at D=64 (versions.py)
_ALIBI_MMA = "v3.8_alibi"  # causal ALiBi alone, its key term on the tensor core (versions.py)
_WINDOW_PLAIN = "v3.9_window"  # a causal window alone on the plain causal kernel (versions.py)
_VARLEN_MMA = "v3.1_varlen"  # variable-length batches on the mma.sync path, sm_80+ (versions.py)
_VARIANTS_MMA = "v3.1_variants"  # its body compiled with the score variants, packed or dense (versions.py)
_PACKED_VERSIONS = (None, "v3.3", "v3.1")  # flash_attn_varlen_func's version=
_VARIANTS_VERSIONS = (None, "v3.9", "v3.8", "v3.7", "v3.6", "v3.3", "v3.1")  # flash_attn_func's version= with variants


def _packed_kernel(dtype: str, D: int, causal: bool, kernel: str, device_index: int):
    """One of the kernels that take every forward field packed per call (_packed_path), loaded;
    with its (Br, Bc)."""
    from .versions import KERNEL_ENTRIES

    return api.entry_kernel(kernel, dtype, D, causal, device_index), KERNEL_ENTRIES[kernel].tiles[D]


def _packed_path(
    what: str, dtype, D: int, device, variants: bool, version=None, dense: bool = False, three: bool = False,
    alibi: bool = False, window_only: bool = False,
) -> str:  # fmt: skip
    """The kernel a packed (or, with variants, dense) call runs: v3.3's (its variants kernel with
    variants) on Hopper at its head dims, else v3.1's variable-length kernel or its variants kernel
    (sm_80+, Hopper's other head dims included); dense calls with variants on Hopper take v3.6's
    variants kernel (persistent) at its head dims, or with ``three`` (no window, no softcap, not a
    short causal call: attention_variants) v3.7's at its one, and with ``alibi`` (causal ALiBi
    alone) v3.8's at D = 128, or at D = 64 where ``three`` holds too; ``window_only`` (a causal
    window alone) v3.9's at D = 64 and 128.  ``version`` ("v3.9", "v3.8", "v3.7",
    "v3.6", "v3.3" or "v3.1") forces one.  Raises NotImplementedError naming what runs
    where."""
    from . import _nvrtc
    from .versions import KERNEL_ENTRIES

    v33 = KERNEL_ENTRIES[_VARIANTS if variants else _VARLEN]
    mma = KERNEL_ENTRIES[_VARIANTS_MMA if variants else _VARLEN_MMA]
    cc = _nvrtc.device_arch(device.index)
    arch = cc[0] * 10 + cc[1]
    half = dtype in (torch.float16, torch.bfloat16)
    if version == "v3.8" and not alibi:
        raise NotImplementedError(f"version='v3.8' runs causal ALiBi alone (no window, no softcap); got {what}")
    if version == "v3.9" and not window_only:
        raise NotImplementedError(f"version='v3.9' runs a causal window alone (no softcap, no ALiBi); got {what}")
    v38 = [(_ALIBI_MMA, "v3.8", D != 64 or three)] if alibi else []
    # v3.9 ran a causal window 1-2% faster than the variants kernel (docs/serving.md)
    v39 = [(_WINDOW_PLAIN, "v3.9", True)] if window_only else []
    for name, rung, default in (*v39, *v38, (_VARIANTS_THREE, "v3.7", three), (_VARIANTS_DENSE, "v3.6", True)):
        entry = KERNEL_ENTRIES[name]
        fits = variants and dense and half and entry.runs_on(arch) and D in entry.head_dims
        if fits and (version == rung or (version is None and default)):
            return name
        if version == rung:
            raise NotImplementedError(
                f"version={rung!r} runs {what} on Hopper (sm_90) in float16/bfloat16 at head dims "
                f"{entry.head_dims} (dense calls); got {dtype} at head dim {D} on sm_{arch}"
            )
    if half:
        if version in (None, "v3.3") and v33.runs_on(arch) and D in v33.head_dims:
            return v33.name
        if version in (None, "v3.1") and mma.runs_on(arch) and D in mma.head_dims:
            return mma.name
    raise NotImplementedError(
        f"{what} run in float16/bfloat16 on Hopper (sm_90; v3.3) at head dims {v33.head_dims}, and on "
        f"sm_80+ (v3.1) at head dims {mma.head_dims}; got {dtype} at head dim {D} on sm_{arch}"
        + (f" with version={version!r}" if version else "")
    )


def _launch_packed(
    q, k, v, out, lse, *, kernel, causal, dims, strides, grid, scale, causal_offset,
    cu_seqlens=(None, None), bottom_right=False, window=(-1, -1), softcap=0.0, alibi_slopes=None,
):  # fmt: skip
    """One call of ``kernel`` (_packed_path) with every forward field; out and lse are written.
    dims = (B, H, Nq, H_kv, Nk, D) as the kernel sees q, k, v: with cu_seqlens, B = 1 and Nq, Nk
    the packed totals.  strides: (sb, sh, sn) of q, k, v and out.  grid = (sequences, longest
    query length): the grid is (Q blocks, sequences x H), or with cu_seqlens on a kernel that
    schedules packed tiles (v3.3), (total_q // Br + sequences, H): a tile per (sequence, Q block)."""
    from .versions import KERNEL_ENTRIES

    dtype = api._DTYPES[q.dtype]
    B, H, Nq, H_kv, Nk, D = dims
    kern, (Br, Bc) = _packed_kernel(dtype, D, causal, kernel, q.device.index)
    softcap = _kernel_softcap(softcap, scale)
    qs, ks, vs, os_ = strides
    entry = KERNEL_ENTRIES[kernel]
    maps = None
    if entry.tensor_maps:  # the v3.3 kernels load through the copy engine (v3.1's by cp.async)
        layouts = [((B, H, Nq, D), qs), ((B, H_kv, Nk, D), ks), ((B, H_kv, Nk, D), vs)]
        # v3.6's walk stores O through the copy engine too (v3_3_wgmma.cu v3_3_stages_o)
        o = (out.data_ptr(), ((B, H, Nq, D), os_)) if api.stores_o_by_tma(entry.persistent, dtype) else None
        maps = api._tensor_maps(
            q.data_ptr(), k.data_ptr(), v.data_ptr(), *layouts, dtype, q.element_size(), Br, Bc, o=o
        )
    ptr = lambda t: 0 if t is None else t.data_ptr()
    stream = api._current_stream(q.device.index)
    if cu_seqlens[0] is not None and entry.packed_tiles:
        BH, Tr = H, Nq // Br + grid[0]  # tiles of csrc/common.cuh's packed_tile, by heads
    else:
        BH, Tr = grid[0] * H, -(-grid[1] // Br)
    ptrs = q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), ptr(lse), 0
    args = lambda off: [
        *_params.fwd_args(Nq, Nk, H, H_kv, strides, scale, causal_offset, ptrs, off),
        *_params.room(
            cu_seqlens_q=ptr(cu_seqlens[0]), cu_seqlens_k=ptr(cu_seqlens[1]), window_left=window[0],
            window_right=window[1], softcap=softcap, bottom_right=int(bottom_right), alibi_slopes=ptr(alibi_slopes),
            alibi_sb=_alibi_stride(alibi_slopes), bh_count=BH if entry.persistent else 0,
        ),
    ]  # fmt: skip
    if entry.persistent:
        assert cu_seqlens[0] is None, "persistent kernels take dense calls only"
        kern.launch(stream, api.persistent_ctas(Tr, BH, causal, q.device.index), 1, args(0), maps)
        return
    for off in range(0, BH, api._GRID_Y_MAX):
        kern.launch(stream, Tr, min(api._GRID_Y_MAX, BH - off), args(off), maps)


def _prepare_scale_and_rows(q, k, v, scale, rows_of):
    """The kernels fold a scale >= 0 into the exponent (softmax.cuh): a negative one negates q
    (exact).  Rows must start on 16-byte boundaries (TMA): a view that breaks that is copied.
    rows_of(t): t's strides as the copy engine sees them."""
    if scale < 0:
        q, scale = -q, -scale
    q, k, v = (
        t if api._rows_aligned(t, rows_of(t)) else t.clone(memory_format=torch.contiguous_format) for t in (q, k, v)
    )
    return q, k, v, scale


def flash_attn_varlen_func(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q: int,
    max_seqlen_k: int,
    dropout_p: float = 0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap: float = 0.0,
    alibi_slopes=None,
    deterministic: bool = False,
    return_lse: bool = False,
    *,
    version=None,
):
    """Attention over a batch of sequences of different lengths packed into one tensor,
    flash-attn's ``flash_attn_varlen_func``.

    Args:
        q: (total_q, H, D); k, v: (total_k, H_kv, D), H a multiple of H_kv (GQA/MQA); fp16 or
            bf16 on one CUDA device, contiguous head dim.
        cu_seqlens_q, cu_seqlens_k: (B + 1,) int32 row offsets: sequence b is rows
            cu_seqlens_q[b] .. cu_seqlens_q[b + 1] - 1 of q (of k, v: cu_seqlens_k); lengths may
            differ between q and k and may be 0.
        max_seqlen_q, max_seqlen_k: the longest sequences (v3.1's grid; v3.3 schedules tiles
            from total_q and B; no host sync reads the offsets).
        causal: True (bottom-right per sequence, flash-attn's convention), "top_left" or
            "bottom_right".
        window_size: (left, right), -1 unbounded: query i of a sequence sits at key position
            p = i + offset (the causal alignment; bottom-right, Nk_b - Nq_b, without a causal
            mask, as flash-attn) and sees keys p - left .. p + right; blocks outside are skipped.
        softcap: > 0 caps each scaled score s at softcap * tanh(s / softcap) (tanh on the SFU,
            relative error about 2^-11).
        alibi_slopes: float32 (H,) or (B, H): adds -slope * |p - j| to the scaled score.
        return_lse: also return the float32 log-sum-exp, (H, total_q); -inf for a row with no key.

        version: None (the fastest that fits), "v3.3" or "v3.1" (the mma.sync path).

    Runs on Hopper (sm_90) at head dims 64, 128, 192 and 256 on the v3.3 rung, and on sm_80+
    (Hopper's other head dims included) at head dims 32, 64, 80, 96, 128, 160, 192, 256 on v3.1's
    (mma.sync); with a window, softcap or ALiBi, on the same rung's variants kernel.  Other dtypes
    or head dims raise NotImplementedError, and so does dropout.  Differentiable in q, k and v
    (lse is not) where a backward rung takes the dtype and head dim (with a variant:
    bwd_v2_variants' head dims, not deterministic); elsewhere an input that requires grad raises.
    The backward is one launch over every sequence (bwd_v5_varlen, bwd_v5_variants_varlen on
    Hopper at D = 64 and 128, else bwd_v2_varlen, bwd_v2_variants_varlen: no host sync), or with
    deterministic=True the dense rungs one sequence at a time (reading the offsets on the host
    once).  Rows of q past cu_seqlens_q[-1] have unspecified output; the offsets' values are not
    checked (that would need a sync)."""
    if dropout_p:
        raise NotImplementedError(f"dropout_p must be 0.0 (tileattn has no dropout), got {dropout_p!r}")
    if version not in _PACKED_VERSIONS:
        raise ValueError(f"version must be one of {_PACKED_VERSIONS}, got {version!r}")
    mode = api._causal_mode(causal, default_true="bottom_right")
    tensors = (("q", q), ("k", k), ("v", v))
    for name, t in tensors:
        if not isinstance(t, torch.Tensor) or t.dim() != 3:
            _fail(name, "a 3-D (total, heads, head dim) tensor", t)
    if q.dtype not in (torch.float16, torch.bfloat16):
        raise TypeError(f"q must be float16 or bfloat16, got {q.dtype}")
    for name, t in tensors[1:]:
        if t.dtype != q.dtype or t.device != q.device:
            _fail(name, f"a tensor of q's dtype and device ({q.dtype}, {q.device})", t)
    for name, t in tensors:
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must have a contiguous last (head) dim, got strides {t.stride()}")
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for _, t in tensors)
    total_q, H, D = q.shape
    total_k, H_kv, Dk = k.shape
    if v.shape != k.shape:
        raise ValueError(f"k and v must have one shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    if Dk != D:
        raise ValueError(f"q and k must have one head dim, got {D} and {Dk}")
    if H_kv == 0 or H % H_kv:
        raise ValueError(f"q's heads ({H}) must be a multiple of k's and v's ({H_kv})")
    if not isinstance(cu_seqlens_q, torch.Tensor):
        _fail("cu_seqlens_q", "a 1-D int32 tensor", cu_seqlens_q)
    _check_index_tensor("cu_seqlens_q", cu_seqlens_q, (None,), q.device)
    _check_index_tensor("cu_seqlens_k", cu_seqlens_k, (cu_seqlens_q.shape[0],), q.device)
    if cu_seqlens_q.shape[0] < 1:
        raise ValueError("cu_seqlens_q must have B + 1 >= 1 entries, got 0")
    for name, n in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"{name} must be an int >= 0, got {n!r}")
    B = cu_seqlens_q.shape[0] - 1
    # (the totals bound every sequence's positions without a sync; max_seqlen_* are the caller's word)
    window, softcap, alibi_slopes = _variants(
        window_size, softcap, alibi_slopes, mode is not None, B, H, total_q + total_k, q.device
    )
    scale = 1.0 / math.sqrt(D) if softmax_scale is None else api._scale(softmax_scale, "softmax_scale")
    variants = any_variant(window, softcap, alibi_slopes, mode is not None)
    deterministic = bool(deterministic) or torch.are_deterministic_algorithms_enabled()
    if needs_grad:  # a gradient this call cannot give raises here, never silently later
        if variants:
            api._check_variants_backward(q, k, v, deterministic)
        else:
            api._check_backward_exists(q, k, v)
    if q.device.type != "cuda":
        raise ValueError(f"q, k and v must be CUDA tensors, got {q.device}")
    what = "variable-length batches" + (" with a window, softcap or ALiBi" if variants else "")
    kernel = _packed_path(what, q.dtype, D, q.device, variants, version)
    forward = functools.partial(
        _varlen_forward, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale, mode, window, softcap,
        alibi_slopes, variants, kernel,
    )  # fmt: skip
    if needs_grad:  # (the backward needs lse)
        grad_args = (scale, mode, (window, softcap, alibi_slopes) if variants else None, deterministic)
        with_lse = functools.partial(forward, True)
        out, lse = _VarlenAttention.apply(q, k, v, cu_seqlens_q, cu_seqlens_k, with_lse, grad_args)
    else:
        out, lse = forward(return_lse)
    return (out, lse) if return_lse else out


def _varlen_forward(
    q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale, mode, window, softcap, alibi_slopes,
    variants, kernel, return_lse,
):  # fmt: skip
    """flash_attn_varlen_func's launch, its arguments checked: (O, lse or None)."""
    total_q, H, D = q.shape
    total_k, H_kv, _ = k.shape
    B = cu_seqlens_q.shape[0] - 1
    no_key = total_k == 0 or max_seqlen_k == 0  # no key anywhere: O = 0, lse -inf
    out, lse = api._outputs(None, None, (total_q, H, D), q.dtype, (H, total_q), return_lse, q.device, no_key)
    if B == 0 or total_q == 0 or max_seqlen_q == 0 or no_key:
        return out, lse
    q, k, v, scale = _prepare_scale_and_rows(q, k, v, scale, lambda t: (0, *t.stride()[:2]))
    # One "batch" of total rows to the kernel: (sb, sh, sn) = (0, stride(1), stride(0)).
    strides = [(0, t.stride(1), t.stride(0)) for t in (q, k, v, out)]
    _launch_packed(
        q, k, v, out, lse, kernel=kernel, causal=mode is not None,
        dims=(1, H, total_q, H_kv, total_k, D), strides=strides, grid=(B, max_seqlen_q), scale=scale,
        causal_offset=0, cu_seqlens=(cu_seqlens_q, cu_seqlens_k),
        bottom_right=mode == "bottom_right" or (mode is None and variants), window=window, softcap=softcap,
        alibi_slopes=alibi_slopes,
    )  # fmt: skip
    return out, lse


class _VarlenAttention(torch.autograd.Function):
    """flash_attn_varlen_func with inputs that require grad: the forward as without them (``run``,
    O and lse), the backward by _varlen_backward."""

    @staticmethod
    def forward(ctx, q, k, v, cu_seqlens_q, cu_seqlens_k, run, grad_args):
        out, lse = run()
        ctx.save_for_backward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k)
        ctx.grad_args = grad_args
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        return *_varlen_backward(*ctx.saved_tensors, dout, *ctx.grad_args), None, None, None, None


def _varlen_backward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, dout, scale, mode, variants, deterministic):
    """dq, dk, dv of flash_attn_varlen_func.  Where bwd_v2_varlen (bwd_v2_variants_varlen with a
    variant) takes the head dim and no deterministic mode is asked for: one launch over every
    sequence (backward.attention_backward's varlen: backward.special_rung's kernel, bwd_v5_varlen or
    bwd_v5_variants_varlen on Hopper at D = 64 and 128), no host sync.
    Otherwise sequence b's rows of q, k, v, O, dO and lse as a dense batch of one (views, lse's
    (H, rows) slice copied) through attention_backward, the default rungs (or bwd_v2_variants), with
    the same alignment (bottom-right per sequence, or top-left): reading the offsets is then one
    host sync.  Rows no sequence holds, and every row of a sequence without keys, get gradient 0."""
    from .backward import attention_backward
    from .versions import BWD_V2_VARIANTS_VARLEN, BWD_V2_VARLEN

    if cu_seqlens_q.shape[0] == 1:  # no sequence (the forward returned zeros): no kernel may search the offsets
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    if dout.stride(-1) != 1:  # the kernels read dO rows with a contiguous head dim
        dout = dout.contiguous()
    window, softcap, slopes = variants if variants is not None else (None, 0.0, None)
    kernel_variants = None if variants is None else (window, _kernel_softcap(softcap, scale), slopes)
    rung = BWD_V2_VARLEN if variants is None else BWD_V2_VARIANTS_VARLEN
    if not deterministic and q.shape[-1] in rung.tiles:
        batch = lambda t: t.unsqueeze(0)  # (1, total, heads, D): the packed rows as a "bnhd" batch of one
        dq, dk, dv = attention_backward(
            batch(q), batch(k), batch(v), batch(out), batch(lse), batch(dout), scale, mode, "bnhd",
            variants=kernel_variants, varlen=(cu_seqlens_q, cu_seqlens_k),
        )  # fmt: skip
        return dq[0], dk[0], dv[0]
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    offsets_q, offsets_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    one = lambda t, r0, r1: t[r0:r1].unsqueeze(0)  # (1, rows, heads, D): a dense "bnhd" batch of one
    for b in range(len(offsets_q) - 1):
        (q0, q1), (k0, k1) = offsets_q[b : b + 2], offsets_k[b : b + 2]
        if q1 <= q0 or k1 <= k0:
            continue
        seq_variants = kernel_variants  # (B, H) ALiBi slopes: this sequence's row
        if slopes is not None and slopes.dim() == 2:
            seq_variants = (*kernel_variants[:2], slopes[b])
        grads = attention_backward(
            one(q, q0, q1), one(k, k0, k1), one(v, k0, k1), one(out, q0, q1), lse[:, q0:q1].contiguous().unsqueeze(0),
            one(dout, q0, q1), scale, mode, "bnhd", deterministic=deterministic, variants=seq_variants,
        )  # fmt: skip
        dq[q0:q1] += grads[0][0]
        dk[k0:k1] += grads[1][0]
        dv[k0:k1] += grads[2][0]
    return dq, dk, dv


def attention_variants(
    q, k, v, softmax_scale, mode, window, softcap, alibi_slopes, return_lse, out=None, lse=None, version=None
):
    """flash_attn_func with a window, softcap or ALiBi: (B, Nq, H, D) q, (B, Nk, H_kv, D) k, v,
    already checked by api._validate (dtype, shapes, devices, strides), and the variants by
    _variants.  Returns (O, lse or None); out / lse: buffers to write (the tests hand in
    NaN-poisoned ones).  version: None, "v3.9", "v3.8", "v3.7", "v3.6", "v3.3" or "v3.1" (_packed_path's choice, or
    the one named)."""
    from .versions import short_causal

    B, Nq, H, D = q.shape
    Nk, H_kv = k.shape[1], k.shape[2]
    # v3.7's three consumers for ALiBi alone where the plain dispatch takes v3.7: not under a
    # softcap (its two SFU operations a score bind there) nor a window (its 192-row tiles ran 5%
    # slower); csrc/v3_7_three_consumers.cu has the measurements.
    windowed = window[0] >= 0 or (mode is None and window[1] >= 0)
    three = softcap == 0.0 and not windowed and not short_causal(mode is not None, Nq)
    # v3.8 for causal ALiBi alone: the plain causal kernel with the key term on the tensor core.
    alibi = alibi_slopes is not None and softcap == 0.0 and not windowed and mode is not None
    # v3.9 for a causal window alone: the plain causal kernel with the window's left edge.
    window_only = windowed and softcap == 0.0 and alibi_slopes is None and mode is not None
    kernel = _packed_path(
        "a window, softcap and ALiBi", q.dtype, D, q.device, True, version, dense=True, three=three, alibi=alibi,
        window_only=window_only,
    )  # fmt: skip
    no_work = B * H * Nq == 0 or Nk == 0
    out, lse = api._outputs(out, lse, (B, Nq, H, D), q.dtype, (B, H, Nq), return_lse, q.device, no_work)
    if no_work:
        return out, lse
    bhn = lambda t: (t.stride(0), t.stride(2), t.stride(1))  # (B, N, H, D) strides as (sb, sh, sn)
    q, k, v, softmax_scale = _prepare_scale_and_rows(q, k, v, softmax_scale, bhn)
    # Positions: query i at key position i + offset, the causal alignment's (bottom-right without
    # a causal mask, as flash-attn).
    offset = 0 if mode == "top_left" else Nk - Nq
    _launch_packed(
        q, k, v, out, lse, kernel=kernel, causal=mode is not None, dims=(B, H, Nq, H_kv, Nk, D),
        strides=[bhn(t) for t in (q, k, v, out)], grid=(B, Nq), scale=softmax_scale, causal_offset=offset,
        window=window, softcap=softcap, alibi_slopes=alibi_slopes,
    )  # fmt: skip
    return out, lse


def _op_variants(q, k, causal: int, window_left: int, window_right: int, softcap: float, alibi_slopes):
    """tileattn::fwd_variants's and tileattn::bwd_variants's variant arguments as the kernels take
    them: (mode, window, softcap, alibi_slopes) through _variants."""
    mode = api._CAUSAL_OF_CODE[causal]
    B, Nq, H, _ = q.shape
    window, softcap, alibi_slopes = _variants(
        (window_left, window_right), softcap, alibi_slopes, mode is not None, B, H, Nq + k.shape[1], q.device
    )
    return mode, window, softcap, alibi_slopes


@torch.library.custom_op("tileattn::fwd_variants", mutates_args=(), device_types="cuda")
def _fwd_variants_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    alibi_slopes: torch.Tensor | None,
    softmax_scale: float,
    causal: int,
    window_left: int,
    window_right: int,
    softcap: float,
    version: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """tileattn::fwd_variants: attention_variants for torch.compile (flash-attn's layout; causal as
    tileattn::fwd codes it; version as attention_variants takes it) -> (O, lse (B, H, Nq))."""
    # (flash_attn_func checked all of it; a direct call has not)
    api._validate(q, k, v, None, None, "bnhd")
    mode, window, softcap, alibi_slopes = _op_variants(q, k, causal, window_left, window_right, softcap, alibi_slopes)
    return attention_variants(q, k, v, softmax_scale, mode, window, softcap, alibi_slopes, True, version=version)


@_fwd_variants_op.register_fake
def _(q, k, v, alibi_slopes, softmax_scale, causal, window_left, window_right, softcap, version=None):
    B, Nq, H, _ = q.shape
    return q.new_empty(q.shape), q.new_empty((B, H, Nq), dtype=torch.float32)
