"""Serving paths (issue 12), being built.  Not exported and not yet run on a GPU: the decode
kernels compile spill-checked under NVRTC (tests/test_serving.py); their GPU tests are written
and wait for a device session.

``decode_with_kvcache``: attention of a few query tokens per sequence over a KV cache,
contiguous or paged, by split-KV decoding (csrc/dec_v1_splitkv.cu; reference.attention_split_kv
is its loop nest).  flash-attn's layout: q (B, Nq, H, D); a contiguous cache (B, Nk, H_kv, D),
or a paged one (num_pages, page_size, H_kv, D) with block_table (B, max_pages) int32.
"""

from __future__ import annotations

import functools
import math

import torch

from . import api
from .versions import DEC_COMBINE, DEC_COMBINE_ROWS, DEC_V1

_WARPS = 4  # dec_v1's DEC_WARPS: tiles a split should give each of its warps


@functools.cache
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def _check_int32_vector(name: str, t, length: int, device):
    if t is None:
        return
    if not isinstance(t, torch.Tensor) or t.dtype != torch.int32 or t.device != device or t.dim() != 1:
        got = f"{t.dtype} {tuple(t.shape)} on {t.device}" if isinstance(t, torch.Tensor) else type(t).__name__
        raise ValueError(f"{name} must be a 1-D int32 tensor on {device}, got {got}")
    if t.shape[0] != length:
        raise ValueError(f"{name} must have B={length} entries, got {t.shape[0]}")


def decode_with_kvcache(
    q,
    k_cache,
    v_cache,
    cache_seqlens=None,
    block_table=None,
    softmax_scale=None,
    causal=False,
    num_splits: int = 0,
    return_lse: bool = False,
):
    """O (B, Nq, H, D) of q over the first cache_seqlens[b] keys of each sequence's cache
    (all Nk of a contiguous cache when None).  causal: bottom-right per sequence (token i of Nq
    sees keys j <= i + seqlen - Nq).  num_splits 0: chosen from the SM count and the work.
    Values inside cache_seqlens and block_table are not checked (that would need a device sync):
    they must be within the cache."""
    dtype = api._DTYPES.get(q.dtype)
    if dtype not in DEC_V1.dtypes:
        raise TypeError(f"q must be float16 or bfloat16 for decode_with_kvcache, got {q.dtype}")
    tensors = (("q", q), ("k_cache", k_cache), ("v_cache", v_cache))
    for name, t in tensors:
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise ValueError(f"{name} must be a 4-D tensor, got {getattr(t, 'shape', type(t).__name__)}")
    for name, t in tensors:
        if t.dtype != q.dtype or t.device != q.device or t.device.type != "cuda":
            raise ValueError(
                f"{name} must be a CUDA tensor of q's dtype and device ({q.dtype}, {q.device}), "
                f"got {t.dtype} on {t.device}"
            )
        if t.stride(-1) != 1 or not api._rows_aligned(t, (t.stride(0), t.stride(1), t.stride(2))):
            raise ValueError(f"{name} must have a contiguous head dim and 16-byte aligned rows")
    B, Nq, H, D = q.shape
    if k_cache.shape != v_cache.shape:
        raise ValueError(
            f"k_cache and v_cache must have one shape, got {tuple(k_cache.shape)} and {tuple(v_cache.shape)}"
        )
    _, rows, H_kv, Dk = k_cache.shape
    if Dk != D or D not in DEC_V1.tiles:
        raise ValueError(f"head dim must be one of {DEC_V1.head_dims} in q and the caches, got q {D}, caches {Dk}")
    if H % H_kv:
        raise ValueError(f"q's heads ({H}) must be a multiple of the caches' ({H_kv})")
    if block_table is None:
        if k_cache.shape[0] != B:
            raise ValueError(f"a contiguous cache must have B={B} sequences, got {k_cache.shape[0]}")
        Nk, page_size, bt_stride, max_keys = rows, 0, 0, rows
    else:
        if not isinstance(block_table, torch.Tensor) or block_table.dtype != torch.int32 or block_table.dim() != 2:
            raise ValueError("block_table must be a 2-D int32 tensor (B, max_pages)")
        if block_table.shape[0] != B or block_table.device != q.device or block_table.stride(1) != 1:
            raise ValueError(f"block_table must be (B={B}, max_pages) on {q.device} with contiguous rows")
        Nk, page_size, bt_stride = block_table.shape[1] * rows, rows, block_table.stride(0)
        max_keys = Nk
    _check_int32_vector("cache_seqlens", cache_seqlens, B, q.device)
    if block_table is not None and cache_seqlens is None:
        raise ValueError("a paged cache needs cache_seqlens (the keys in use per sequence)")
    scale = 1.0 / math.sqrt(D) if softmax_scale is None else api._scale(softmax_scale, "softmax_scale")
    if scale < 0:  # the kernels fold a scale >= 0 into the exponent (softmax.cuh): negate q instead
        q, scale = -q, -scale

    Bc = DEC_V1.tiles[D][1]
    row_blocks = -(-(H // H_kv) * Nq // 16)
    blocks = B * H_kv * row_blocks
    if blocks > api._GRID_Y_MAX:
        raise ValueError(f"B * H_kv * ceil(h_per_kv * Nq / 16) = {blocks} is above 65535")
    if num_splits <= 0:  # two waves of blocks, but no split under one tile per warp (none: no work)
        waves = -(-2 * _sm_count(q.device.index) // blocks) if blocks else 1
        num_splits = max(1, min(waves, -(-max_keys // (Bc * _WARPS)), 128))
    f32 = dict(dtype=torch.float32, device=q.device)
    o_part = torch.empty((num_splits, B, H, Nq, D), **f32)
    lse_part = torch.empty((num_splits, B, H, Nq), **f32)
    out = torch.empty((B, Nq, H, D), dtype=q.dtype, device=q.device)
    lse = torch.empty((B, H, Nq), **f32) if return_lse else None
    if B * Nq * H:
        device_index = q.device.index
        args = [
            q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), out.data_ptr(), 0 if lse is None else lse.data_ptr(),
            o_part.data_ptr(), lse_part.data_ptr(), 0 if cache_seqlens is None else cache_seqlens.data_ptr(),
            0 if block_table is None else block_table.data_ptr(),
            B, Nq, H, H // H_kv, Nk, num_splits, page_size, bt_stride,
            q.stride(0), q.stride(1), q.stride(2), *(k_cache.stride()[:3]), *(v_cache.stride()[:3]),
            out.stride(0), out.stride(1), out.stride(2), scale,
        ]  # fmt: skip
        stream = api._current_stream(device_index)
        for name, grid_x, grid_y in (
            (DEC_V1.name, num_splits, blocks),
            (DEC_COMBINE.name, -(-B * H * Nq // DEC_COMBINE_ROWS), 1),
        ):
            kern = api.entry_kernel(name, dtype, D, bool(causal) and name == DEC_V1.name, device_index)
            kern.launch(stream, grid_x, grid_y, args)
    return (out, lse) if return_lse else out
