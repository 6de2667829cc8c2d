"""Public entry points: validate -> allocate -> dispatch -> compile once -> launch.

Shape legend: B batch, Nq / Nk query / key length, H query heads, H_kv key/value heads
(H % H_kv == 0: GQA/MQA), D head dim.  ``flash_attn_func`` takes flash-attn's layout
(B, N, H, D); ``scaled_dot_product_attention`` takes PyTorch's (B, H, N, D).  Both are views onto
one core that works on (B, H, N, D) strided views, so neither layout is ever copied.

Supported: FP32 (CUDA-core rungs v1..v2.1; tensor-core rungs at FP32 accuracy by 3xTF32: v2.3 on
sm_90's wgmma, the default there, and v2.2 on mma.sync, the default elsewhere; v2.3_tf32 / v2.2_tf32
with precision="tf32") at head dims 32, 64, 128; fp16/bf16 (tensor-core v3,
v3.1; v3.2 with TMA loads on sm_90) at every head dim that is a multiple of 8 from 16 to 256; any
Nq, Nk >= 1; any B*H; arbitrary strides with a contiguous head dim; causal masks aligned top-left
or bottom-right; GQA/MQA; the log-sum-exp of each row.
Not yet: backward, dropout, arbitrary masks, variable-length batches, KV cache.
"""

from __future__ import annotations

import functools
import math
import numbers

import numpy as np
import torch

from . import _nvrtc
from .reference import CAUSAL_MODES, causal_offset
from .versions import VERSIONS, Version, select

_DTYPES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}
_GRID_Y_MAX = 65535  # gridDim.y limit: B*H above it is split over several launches


def flash_attn_func(q, k, v, softmax_scale=None, causal=False, *, version=None, return_lse=False, precision=None):
    """Attention in flash-attn's layout.

    Args:
        q: (B, Nq, H, D) CUDA tensor.
        k, v: (B, Nk, H_kv, D), same dtype and device as q; H % H_kv == 0.
        softmax_scale: multiplies q.k before the softmax; default 1/sqrt(D).
        causal: False, True (= "bottom_right", flash-attn's convention: query i sees keys
            j <= i + Nk - Nq), "bottom_right" or "top_left" (j <= i).
        version: a rung name from ``tileattn.VERSIONS``; None picks the fastest that fits.
        return_lse: also return the float32 log-sum-exp of each row, (B, H, Nq); -inf for a row
            that sees no key (its output is 0).
        precision: FP32 inputs only.  None or "fp32" (default): FP32-level accuracy (relative error
            ~1e-6 vs float64; tensor-core rungs get it by 3xTF32).  "tf32": opt in to plain TF32
            tensor-core products, faster but with ~1e-3 relative error (10-bit mantissas).

    Returns:
        O (B, Nq, H, D) in q's dtype, or (O, lse) when return_lse.

    Forward only: with grad mode on, an input that requires grad raises (no gradient is dropped
    silently); call under ``torch.no_grad()`` or ``torch.inference_mode()``.
    """
    mode = _causal_mode(causal, default_true="bottom_right")
    _check_rank(q=q, k=k, v=v)
    _check_no_grad(q=q, k=k, v=v)
    out, lse = _attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), softmax_scale, mode,
                          version, out_layout="bnhd", precision=precision)
    return (out, lse) if return_lse else out


def scaled_dot_product_attention(q, k, v, is_causal=False, scale=None, *, version=None, precision=None):
    """Attention in PyTorch's SDPA layout.

    Args:
        q: (B, H, Nq, D) CUDA tensor; k, v: (B, H_kv, Nk, D).
        is_causal: False, True (= "top_left", SDPA's convention: query i sees keys j <= i),
            "top_left" or "bottom_right".
        scale: softmax scale, default 1/sqrt(D).
        version, precision: as in ``flash_attn_func``.

    Returns:
        O (B, H, Nq, D) in q's dtype.
    """
    mode = _causal_mode(is_causal, default_true="top_left", arg="is_causal")
    _check_rank(q=q, k=k, v=v)
    _check_no_grad(q=q, k=k, v=v)
    out, _ = _attention(q, k, v, scale, mode, version, out_layout="bhnd", precision=precision, scale_arg="scale")
    return out


# ---------------------------------------------------------------------------------------------

# The dims of each layout, as the caller sees them (error messages speak this language).
_LAYOUT_DIMS = {"bnhd": ("B", "N", "H", "D"), "bhnd": ("B", "H", "N", "D")}
_INT32_MAX = 2**31 - 1  # kernels index rows and lengths with 32-bit ints


def _causal_mode(causal, *, default_true: str, arg: str = "causal") -> str | None:
    if isinstance(causal, str):
        if causal not in CAUSAL_MODES:
            raise ValueError(f"{arg} must be a bool or one of {CAUSAL_MODES}, got {causal!r}")
        return causal
    if isinstance(causal, (bool, np.bool_)):
        return default_true if causal else None
    raise TypeError(f"{arg} must be a bool or one of {CAUSAL_MODES}, got {type(causal).__name__}")


def _check_rank(**tensors):
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must have 4 dims, got {t.dim()} (shape {tuple(t.shape)})")


def _check_no_grad(**tensors):
    """There is no backward pass yet: a gradient must never be dropped silently."""
    if not torch.is_grad_enabled():
        return
    needing = [name for name, t in tensors.items() if t.requires_grad]
    if needing:
        raise RuntimeError(
            f"tileattn has no backward pass yet, but {', '.join(needing)} require{'s' if len(needing) == 1 else ''} "
            "grad: the output would silently carry no gradient.  For inference, call it under "
            "`with torch.no_grad():` (or torch.inference_mode()), or pass tensors detached with .detach(); "
            "to train, use torch.nn.functional.scaled_dot_product_attention for now.")


def _scale(softmax_scale, head_dim: int, arg: str) -> float:
    """The softmax scale as the kernels see it: a float32 that must be finite."""
    if softmax_scale is None:
        return 1.0 / math.sqrt(head_dim)
    if isinstance(softmax_scale, (bool, np.bool_)) or not isinstance(softmax_scale, numbers.Real):
        raise TypeError(f"{arg} must be a real number or None, got {type(softmax_scale).__name__} "
                        f"({softmax_scale!r})")
    with np.errstate(over="ignore", invalid="ignore"):
        as_f32 = np.float32(softmax_scale)
    if not np.isfinite(as_f32):
        raise ValueError(f"{arg} must be finite as a float32 (|scale| < 3.4e38), got {softmax_scale!r}")
    return float(softmax_scale)


def _validate(q, k, v, softmax_scale, version, precision, layout: str, scale_arg: str) -> tuple[str, float]:
    """Checks on (B, H, N, D) views; every message shows shapes in the caller's layout.  The
    device is checked last, so CPU tests reach every other check."""
    dims = _LAYOUT_DIMS[layout]
    shown = lambda t: tuple(t.transpose(1, 2).shape) if layout == "bnhd" else tuple(t.shape)  # noqa: E731
    legend = "(" + ", ".join(dims) + ")"
    if q.dtype not in _DTYPES:
        raise TypeError(f"q has dtype {q.dtype}; supported: {', '.join(map(str, _DTYPES))}")
    for name, t in (("k", k), ("v", v)):
        if t.dtype != q.dtype:
            raise TypeError(f"{name} must have q's dtype {q.dtype}, got {t.dtype}")
    dtype = _DTYPES[q.dtype]
    B, H, Nq, D = q.shape
    for name, t in (("k", k), ("v", v)):  # each against q first, then v against k
        if t.shape[0] != B:
            raise ValueError(f"{name} must have q's batch size B={B}, got {t.shape[0]}: q {shown(q)}, "
                             f"{name} {shown(t)} {legend}")
        if t.shape[-1] != D:
            raise ValueError(f"{name} must have q's head dim D={D}, got {t.shape[-1]}: q {shown(q)}, "
                             f"{name} {shown(t)} {legend}")
    if k.shape != v.shape:
        raise ValueError(f"v must have k's shape {shown(k)}, got {shown(v)} {legend}")
    H_kv = k.shape[1]
    if H_kv == 0 or H % H_kv != 0:
        raise ValueError(f"q's number of heads H={H} must be a multiple of k/v's, got {H_kv}: q {shown(q)}, "
                         f"k {shown(k)} {legend}")
    for name, n in (("q", Nq), ("k", k.shape[2])):
        if n > _INT32_MAX:
            raise ValueError(f"{name}'s sequence length must be below 2^31, got {n}: {name} "
                             f"{shown(q if name == 'q' else k)} {legend}")
    dtype_dims = sorted({d for e in VERSIONS.values() if dtype in e.dtypes for d in e.head_dims})
    if not dtype_dims:
        raise TypeError(f"no rung takes dtype {q.dtype} yet; supported: float32")
    if D not in dtype_dims:
        raise ValueError(f"head dim {D} is not supported for {q.dtype}; supported: {dtype_dims}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.stride(-1) != 1 and t.shape[-1] > 1:
            raise ValueError(f"{name} must have a contiguous last (head) dim, stride 1; got stride "
                             f"{t.stride(-1)} (strides {t.transpose(1, 2).stride() if layout == 'bnhd' else t.stride()}): "
                             "call .contiguous() first")
    if precision not in (None, "fp32", "tf32"):
        raise ValueError(f"precision must be None, 'fp32' or 'tf32', got {precision!r}")
    if precision is not None and dtype != "float32":
        raise ValueError(f"precision applies to float32 inputs only, got precision={precision!r} with {q.dtype}")
    if version is not None:
        if version not in VERSIONS:
            raise ValueError(f"unknown version {version!r}; known: {list(VERSIONS)}")
        entry = VERSIONS[version]
        if dtype not in entry.dtypes:
            raise TypeError(f"version {version!r} takes {entry.dtypes}, got {dtype}")
        if D not in entry.tiles:
            raise ValueError(f"version {version!r} supports head dims {list(entry.head_dims)}, got {D}")
        if entry.precision == "tf32" and precision != "tf32":
            raise ValueError(f"version {version!r} computes with TF32 products (~1e-3 error); "
                             "pass precision='tf32' to opt in")
        if entry.precision == "fp32" and precision == "tf32":
            raise ValueError(f"version {version!r} computes at FP32 precision; precision='tf32' asks for a "
                             "TF32 rung: leave version=None or name one")
    softmax_scale = _scale(softmax_scale, D, scale_arg)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.device.type != "cuda":
            raise ValueError(f"{name} must be a CUDA tensor, got device '{t.device}'"
                             + ("" if torch.cuda.is_available() else " (and no CUDA device is present)"))
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but q is on {q.device}; all must share one device")
    return dtype, softmax_scale


def _aligned(t: torch.Tensor) -> torch.Tensor:
    """The kernels copy 16-byte vectors (cp.async), so rows must start on 16-byte boundaries.
    A view that breaks that (an odd offset or stride) is copied once; the user's tensor is untouched."""
    elems = 16 // t.element_size()
    ok = t.data_ptr() % 16 == 0 and all(s % elems == 0 for s in t.stride()[:-1])
    return t if ok else t.contiguous()


@functools.cache
def _kernel(version: str, dtype: str, head_dim: int, causal: bool, device_index: int):
    """Compile (or fetch from cache) and load one instantiation; check it fits this device."""
    entry = VERSIONS[version]
    cc = _nvrtc.device_arch(device_index)
    arch_num = cc[0] * 10 + cc[1]
    smem = entry.smem(head_dim, arch_num)
    limit = _nvrtc.max_dynamic_smem(device_index)
    if smem > limit:
        raise ValueError(f"version {version!r} at head dim {head_dim} needs {smem} bytes of shared memory; "
                         f"this GPU allows {limit}")
    arch = _nvrtc.arch_string(cc, arch_specific=entry.arch_specific)
    cubin = _nvrtc.compile_kernel(entry.file, entry.name_expression(dtype, head_dim, causal, arch_num), arch)
    return _nvrtc.load(cubin), smem, entry.tile(head_dim, arch_num), entry.threads(head_dim, arch_num)


def panel_widths(head_dim: int) -> list[int]:
    """Column widths of the panels of a SwizzledTile (mma.cuh) for this head dim, as one box width
    each: 64 for the full panels, then 32 or 16 for a narrow last one.  The head dim is padded to
    a multiple of 16, and a 48-column remainder to a whole 64-column panel, as in the kernels."""
    d_pad = -(-head_dim // 16) * 16
    d_smem = d_pad + 16 if d_pad % 64 == 48 else d_pad
    return ([64] if d_smem >= 64 else []) + ([d_smem % 64] if d_smem % 64 else [])


def _tensor_maps(q, k, v, dtype: str, Br: int, Bc: int) -> _nvrtc.Blob:
    """The kernel's TmaMaps argument (common.cuh), by value: the TMA descriptors of q, k, v
    ((B, H, N, D) views) with boxes of 64 columns x Br or Bc rows, then, when the padded head dim
    is not a multiple of 64, q, k, v with the last panel's 32 or 16 columns (the panels of
    SwizzledTile, mma.cuh).  Each descriptor's encoding is cached on the host by pointer, shape,
    strides and box (_nvrtc.tensor_map_4d); nothing lives on the device."""
    widths = panel_widths(q.shape[-1])
    size = q.element_size()
    return _nvrtc.Blob(b"".join(
        _nvrtc.tensor_map_4d(t.data_ptr(), dtype, dims=tuple(reversed(t.shape)),
                             strides_bytes=tuple(s * size for s in reversed(t.stride()[:3])), box=(w, rows))
        for w in (widths if len(widths) == 2 else widths * 2)  # narrow maps at index 3..5 (a copy if unused)
        for t, rows in ((q, Br), (k, Bc), (v, Bc))))


def _dispatch(version, dtype: str, head_dim: int, device: torch.device, precision: str | None) -> Version:
    cc = _nvrtc.device_arch(device.index)
    arch = cc[0] * 10 + cc[1]
    if version is None:
        entry = select(dtype, head_dim, arch, precision)
        if entry is None:
            alternatives = sorted({v.name for v in VERSIONS.values() if dtype in v.dtypes})
            raise ValueError(f"no rung takes {dtype} at head dim {head_dim} on sm_{arch}"
                             f"{f' with precision={precision!r}' if precision else ''}; rungs for {dtype}: "
                             f"{alternatives} (see tileattn.VERSIONS for the archs each runs on)")
        return entry
    entry = VERSIONS[version]
    if not entry.runs_on(arch):
        raise ValueError(f"version {version!r} runs on {entry.arch_range()}, this GPU is sm_{arch}")
    return entry


def _attention(q, k, v, softmax_scale, causal: str | None, version, *, out_layout: str, precision=None, out=None,
               lse=None, scale_arg: str = "softmax_scale"):
    """The one core: q (B, H, Nq, D), k/v (B, H_kv, Nk, D) views.  Returns (O, lse), O in out_layout.
    ``out``/``lse`` let the tests hand in NaN-poisoned buffers of the right shape."""
    dtype, softmax_scale = _validate(q, k, v, softmax_scale, version, precision, out_layout, scale_arg)
    B, H, Nq, D = q.shape
    H_kv, Nk = k.shape[1], k.shape[2]

    # Allocate.  O is written in the caller's layout through a (B, H, N, D) view of it.
    shape = (B, Nq, H, D) if out_layout == "bnhd" else (B, H, Nq, D)
    if out is None:
        out = torch.empty(shape, dtype=q.dtype, device=q.device)
    o = out.transpose(1, 2) if out_layout == "bnhd" else out
    if lse is None:
        lse = torch.empty((B, H, Nq), dtype=torch.float32, device=q.device)
    if B * H * Nq == 0:
        return out, lse
    if Nk == 0:  # no key at all: every row's output is 0 and its lse -inf
        return out.zero_(), lse.fill_(-math.inf)

    # A negative scale goes onto q (a sign flip is exact in every float format), so kernels that
    # fold the scale into exp2(scale * S - m) may assume scale >= 0 (see fa2_mma.cuh).
    if softmax_scale < 0:
        q, softmax_scale = -q, -softmax_scale

    # Dispatch and compile (cached per instantiation and device).
    entry = _dispatch(version, dtype, D, q.device, precision)
    offset = causal_offset(Nq, Nk, causal)
    lk, smem, (Br, Bc), threads = _kernel(entry.name, dtype, D, causal is not None, q.device.index)
    q, k, v = _aligned(q), _aligned(k), _aligned(v)
    tail_args = (_tensor_maps(q, k, v, dtype, Br, Bc),) if entry.tensor_maps else ()
    if entry.workspace_per_row:
        workspace = torch.empty(B * H * Nq * entry.workspace_per_row, dtype=torch.float32, device=q.device)
    else:
        workspace = lse  # unused

    # Launch on torch's current stream of the inputs' device.
    i32, i64 = np.int32, np.int64
    head_args = (q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), lse.data_ptr(), workspace.data_ptr(),
                 i32(Nq), i32(Nk), i32(H), i32(H // H_kv),
                 *(i64(s) for t in (q, k, v, o) for s in t.stride()[:3]),
                 np.float32(softmax_scale), i32(offset or 0))
    dev = q.device.index
    stream = torch.cuda.current_stream(q.device).cuda_stream
    BH = B * H
    if entry.grid_style == "per_head":  # gridDim.x reaches 2^31 - 1: one launch
        _nvrtc.launch(lk, dev, stream, (BH,), (threads,), smem, (*head_args, i32(0), *tail_args))
    else:
        Tr = -(-Nq // Br)
        for bh_offset in range(0, BH, _GRID_Y_MAX):
            grid = (Tr, min(_GRID_Y_MAX, BH - bh_offset))
            _nvrtc.launch(lk, dev, stream, grid, (threads,), smem, (*head_args, i32(bh_offset), *tail_args))
    return out, lse
