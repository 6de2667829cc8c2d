"""Public entry points: validate -> plan (dispatch, compile and load once per key) -> allocate ->
fill the parameter struct -> launch.

Shape legend: B batch, Nq / Nk query / key length, H query heads, H_kv key/value heads
(H % H_kv == 0: GQA/MQA), D head dim.  ``flash_attn_func`` takes flash-attn's layout
(B, N, H, D); ``scaled_dot_product_attention`` takes PyTorch's (B, H, N, D).  Both are views onto
one core that works on (B, H, N, D) strided views, so neither layout is ever copied.

The core is the ``torch.library`` custom op ``tileattn::fwd`` (with a fake implementation for
torch.compile); eager calls skip the dispatcher and run the same function directly.

Supported: FP32 (CUDA-core rungs v1..v2.1; tensor-core rungs at FP32 accuracy: on sm_90's wgmma
v2.4 (3xFP16) and v2.5 (its Q split in the kernel), the default there at D = 64 and 128, and v2.3
(3xTF32), the default at D = 32; v2.2
(3xTF32) on mma.sync, the default elsewhere; v2.3_tf32 / v2.2_tf32 with precision="tf32") at head
dims 32, 64, 128; fp16/bf16 (tensor-core v3, v3.1; on sm_90 v3.2 with
TMA loads, v3.3 on wgmma, v3.4: v3.3 with ping-pong consumers at D=64, v3.6: v3.3 / v3.4 as a
persistent kernel, the default at D=128 and 256 and for causal calls under 2048 rows at D=64, and v3.7: v3.6
with three consumer warpgroups, the default at D=64 otherwise) at every head dim that is a multiple of 8 from 16
to 256; any Nq, Nk >= 1; any B*H; arbitrary strides with a contiguous
head dim; causal masks aligned top-left or bottom-right; GQA/MQA; the log-sum-exp of each row.
Gradients (backward.py, registered as the custom op's autograd formula) for FP32 (bwd_v2.2, 3xTF32;
bwd_v2.2_tf32 under precision="tf32") at head dims 32, 64, 128, fp16 and bf16 (bwd_v2; on sm_90 at
64 and 128 bwd_v5, at 256 bwd_v6) at multiples of 16 up to 128 and of 32 up to 256.
flash_attn_func's window_size, softcap and alibi_slopes run v3.3's variants kernel (serving.py);
its float8_e4m3fn inputs (with descale_q/k/v) run v3.5 on Hopper and return bf16 (fp8.py).
Variable-length batches and KV caches: serving.py.  Not yet: dropout, arbitrary masks.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
import struct

import numpy as np
import torch

from . import _nvrtc, _params
from .reference import CAUSAL_MODES
from .versions import SPLIT_BLOCKS, VERSIONS, Version, select, short_causal

_DTYPES = {
    torch.float32: "float32",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.float8_e4m3fn: "float8_e4m3fn",  # flash_attn_func only (fp8.py: v3.5, bf16 output)
}
_GRID_Y_MAX = 65535  # gridDim.y limit: B*H above it is split over several launches
_CAUSAL_CODE = {None: 0, "top_left": 1, "bottom_right": 2}  # how the custom op takes the mode
_CAUSAL_OF_CODE = {c: m for m, c in _CAUSAL_CODE.items()}


def flash_attn_func(
    q,
    k,
    v,
    softmax_scale=None,
    causal=False,
    *,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    version=None,
    return_lse=False,
    precision=None,
    deterministic=False,
    descale_q=None,
    descale_k=None,
    descale_v=None,
):
    """Attention in flash-attn's layout.

    Args:
        q: (B, Nq, H, D) CUDA tensor.
        k, v: (B, Nk, H_kv, D), same dtype and device as q; H % H_kv == 0.
        softmax_scale: multiplies q.k before the softmax; default 1/sqrt(D).
        causal: False, True (= "bottom_right", flash-attn's convention: query i sees keys
            j <= i + Nk - Nq), "bottom_right" or "top_left" (j <= i).
        window_size: (left, right), -1 unbounded (flash-attn's sliding window): query i sits at key
            position p = i + offset, offset as the causal alignment (Nk - Nq, bottom-right, without
            a causal mask, as flash-attn), and sees keys p - left .. p + right; blocks outside the
            window are skipped.
        softcap: > 0 caps each scaled score s at softcap * tanh(s / softcap) (Gemma 2).
        alibi_slopes: float32 (H,) or (B, H): adds -slope * |p - j| to the scaled score (BLOOM, MPT).
            The three variants run in fp16/bf16: v3.7's (ALiBi alone at D=64), v3.6's or v3.3's
            variants kernel on Hopper at head dims 64, 128, 192, 256, v3.1's (mma.sync) on sm_80+
            at head dims 32, 64, 80, 96, 128, 160, 192, 256 (Hopper's others included).
            Differentiable at bwd_v2's head dims (bwd_v5_variants on Hopper at 64 and 128, else
            bwd_v2_variants, mma.sync; not deterministic): an
            input that requires grad elsewhere, or with deterministic=True (or under
            torch.use_deterministic_algorithms(True)), raises.
        version: a rung name from ``tileattn.VERSIONS``; None picks the fastest that fits.  With
            a variant: None, "v3.9" (a causal window alone), "v3.8" (causal ALiBi alone), "v3.7",
            "v3.6", "v3.3" or "v3.1" (the
            mma.sync variants kernel, also on Hopper).
        return_lse: also return the float32 log-sum-exp of each row, (B, H, Nq); -inf for a row
            that sees no key (its output is 0).
        precision: FP32 inputs only.  None or "fp32" (default): FP32-level accuracy (relative error
            ~1e-6 vs float64; tensor-core rungs get it by 3xTF32).  "tf32": opt in to plain TF32
            tensor-core products, faster but with ~1e-3 relative error (10-bit mantissas).
        deterministic: the backward pass adds dQ in a fixed order, so gradients are
            bitwise-reproducible (also on under ``torch.use_deterministic_algorithms(True)``).
        descale_q, descale_k, descale_v: FP8 inputs only (q, k, v ``torch.float8_e4m3fn``, as
            FlashAttention-3): float32 (B, H_kv) factors (or one-element / Python numbers; None: 1)
            that an element of the tensor is multiplied by (``tileattn.fp8.quantize_e4m3`` makes
            them).  FP8 runs v3.5 on Hopper at head dims 64, 128, 256, forward only, causal or not,
            without window_size / softcap / alibi_slopes, and returns bf16.

    Returns:
        O (B, Nq, H, D) in q's dtype (bf16 for FP8 inputs), or (O, lse) when return_lse.

    Differentiable in q, k and v (lse is not) for the dtypes and head dims of
    ``tileattn.backward_head_dims``; elsewhere an input that requires grad raises.
    """
    mode = _causal_mode(causal, default_true="bottom_right")
    descales = (descale_q, descale_k, descale_v)
    if isinstance(q, torch.Tensor) and q.dtype == torch.float8_e4m3fn:
        out, lse = _fp8_call(q, k, v, softmax_scale, mode, version, precision, window_size, softcap, alibi_slopes,
                             descales, return_lse)  # fmt: skip
        return (out, lse) if return_lse else out
    if descales != (None, None, None):
        raise TypeError(f"descale_q, descale_k and descale_v apply to float8_e4m3fn inputs, got q of dtype {q.dtype}")
    if not (type(window_size) is tuple and window_size == (-1, -1)) or softcap or alibi_slopes is not None:
        variants = _variants_call(
            q, k, v, softmax_scale, mode, version, precision, window_size, softcap, alibi_slopes, return_lse,
            deterministic,
        )  # fmt: skip
        if variants is not None:
            return variants if return_lse else variants[0]
    out, lse = _call(
        q, k, v, softmax_scale, mode, "bnhd", version, precision, "softmax_scale", return_lse, False, deterministic
    )
    return (out, lse) if return_lse else out


def _fp8_call(q, k, v, softmax_scale, mode, version, precision, window_size, softcap, alibi_slopes, descales, with_lse):
    """flash_attn_func with float8_e4m3fn inputs: checks, then fp8.attention (v3.5)."""
    from . import fp8

    _check_rank(q=q, k=k, v=v)
    if not (type(window_size) is tuple and window_size == (-1, -1)) or softcap or alibi_slopes is not None:
        raise NotImplementedError(
            "window_size, softcap and alibi_slopes are not supported for float8_e4m3fn inputs yet"
        )
    fp8.check_inputs(q, k, v, version, precision)
    scale = 1.0 / math.sqrt(q.shape[-1]) if softmax_scale is None else _scale(softmax_scale, "softmax_scale")
    if torch.compiler.is_compiling():  # through the dispatcher: the custom op tileattn::fwd_fp8
        return torch.ops.tileattn.fwd_fp8(q, k, v, *fp8.descale_tensors(descales, q.device), scale, _CAUSAL_CODE[mode])
    return fp8.attention(q, k, v, scale, mode, "bnhd", descales, with_lse)


def _variants_call(
    q, k, v, softmax_scale, mode, version, precision, window_size, softcap, alibi_slopes, with_lse, deterministic=False
):
    """flash_attn_func with a window, softcap or ALiBi: (O, lse) from v3.3's or v3.1's variants
    kernel (serving.attention_variants, through the custom op tileattn::fwd_variants under
    torch.compile or when an input requires grad: its autograd formula is backward.py's), or None
    when the arguments amount to none of them (a window as wide as the sequences, softcap 0): then
    the plain path runs."""
    from . import serving

    _check_rank(q=q, k=k, v=v)
    B, Nq, H, D = q.shape
    window, softcap, slopes = serving._variants(
        window_size, softcap, alibi_slopes, mode is not None, B, H, Nq + k.shape[1], q.device
    )
    if not serving.any_variant(window, softcap, slopes, mode is not None):
        return None
    if version not in serving._VARIANTS_VERSIONS or precision is not None:  # (versions.V3_9_WINDOW .. V3_1_VARIANTS)
        raise ValueError(
            "window_size, softcap and alibi_slopes run on v3.9, v3.8, v3.7, v3.6, v3.3 or v3.1 (version=None, "
            "'v3.9', 'v3.8', 'v3.7', 'v3.6', 'v3.3' or 'v3.1', precision=None); "
            f"got version={version!r}, precision={precision!r}"
        )
    needs_grad = (q.requires_grad or k.requires_grad or v.requires_grad) and torch.is_grad_enabled()
    if needs_grad:
        _check_variants_backward(q, k, v, bool(deterministic) or torch.are_deterministic_algorithms_enabled())
    _validate(q, k, v, None, None, "bnhd")
    scale = 1.0 / math.sqrt(D) if softmax_scale is None else _scale(softmax_scale, "softmax_scale")
    if torch.compiler.is_compiling() or needs_grad:
        return torch.ops.tileattn.fwd_variants(q, k, v, slopes, scale, _CAUSAL_CODE[mode], *window, softcap, version)
    return serving.attention_variants(q, k, v, scale, mode, window, softcap, slopes, with_lse, version=version)


def scaled_dot_product_attention(
    query,
    key,
    value,
    attn_mask=None,
    dropout_p=0.0,
    is_causal=False,
    scale=None,
    enable_gqa=False,
    *,
    version=None,
    precision=None,
):
    """Attention with ``torch.nn.functional.scaled_dot_product_attention``'s signature and layout.

    Args:
        query: (B, H, Nq, D) CUDA tensor; key, value: (B, H_kv, Nk, D).
        attn_mask: must be None (arbitrary masks are not supported yet: NotImplementedError).
        dropout_p: must be 0.0 (no dropout yet: NotImplementedError).
        is_causal: False, True (= "top_left", SDPA's convention: query i sees keys j <= i),
            "top_left" or "bottom_right".
        scale: softmax scale, default 1/sqrt(D).
        enable_gqa: as in PyTorch: with False, key/value must have query's number of heads.
        version, precision: as in ``flash_attn_func``.

    Returns:
        O (B, H, Nq, D) in query's dtype; differentiable as ``flash_attn_func`` (deterministic
        under ``torch.use_deterministic_algorithms(True)``).
    """
    if attn_mask is not None:
        raise NotImplementedError(
            "tileattn.scaled_dot_product_attention: attn_mask is not supported yet (only "
            "None, with is_causal for causal masks); use torch's SDPA for arbitrary masks"
        )
    # (type() first: isinstance against numbers.Real costs a microsecond on every call.)
    if (
        type(dropout_p) is not float
        and (isinstance(dropout_p, bool) or not isinstance(dropout_p, numbers.Real))
        or dropout_p != 0.0
    ):
        raise NotImplementedError(
            f"tileattn.scaled_dot_product_attention: dropout_p must be 0.0 (no dropout yet), got {dropout_p!r}"
        )
    mode = _causal_mode(is_causal, default_true="top_left", arg="is_causal")
    out, _ = _call(query, key, value, scale, mode, "bhnd", version, precision, "scale", False, not enable_gqa)
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


def _check_variants_backward(q, k, v, deterministic: bool):
    """An input requires grad with a window, softcap or ALiBi: bwd_v2_variants must take q's dtype
    and head dim (bwd_v5_variants, which Hopper runs at 64 and 128, takes a subset), and neither
    has a deterministic mode; else the call raises (a gradient is never
    dropped silently)."""
    from .versions import BWD_V2_VARIANTS

    dtype, D = _DTYPES.get(q.dtype), q.shape[-1]
    needing = ", ".join(name for name, t in (("q", q), ("k", k), ("v", v)) if t.requires_grad)
    if dtype not in BWD_V2_VARIANTS.dtypes or D not in BWD_V2_VARIANTS.tiles:
        raise RuntimeError(
            f"tileattn has no backward pass for window_size, softcap or alibi_slopes with {dtype or q.dtype} at head "
            f"dim {D} (it has one for {' and '.join(BWD_V2_VARIANTS.dtypes)} at head dims "
            f"{', '.join(map(str, BWD_V2_VARIANTS.tiles))}), but {needing} require grad: the output would silently "
            "carry no gradient.  Call it under `with torch.no_grad():` for inference."
        )
    if deterministic:
        raise RuntimeError(
            "tileattn's backward pass for window_size, softcap and alibi_slopes has no deterministic mode (its dQ "
            f"is added with atomics), but {needing} require grad and deterministic=True (or "
            "torch.use_deterministic_algorithms(True)) was asked for"
        )


def _check_backward_exists(q, k, v):
    """An input requires grad (grad mode on): a backward rung must take q's dtype and head dim, or
    the call raises; a gradient is never dropped silently."""
    dtype, D = _DTYPES.get(q.dtype), q.shape[-1]
    dims = backward_head_dims(dtype) if dtype else ()
    if D not in dims:
        needing = [name for name, t in (("q", q), ("k", k), ("v", v)) if t.requires_grad]
        raise RuntimeError(
            f"tileattn has no backward pass for {dtype or q.dtype} at head dim {D} (it has one at head dims "
            f"{', '.join(map(str, dims)) or 'none'}), but {', '.join(needing)} require"
            f"{'s' if len(needing) == 1 else ''} grad: the output would silently carry no gradient.  For "
            "inference, call it under `with torch.no_grad():` (or torch.inference_mode()), or pass tensors "
            "detached with .detach(); to train at this head dim, use torch.nn.functional.scaled_dot_product_attention."
        )


@functools.cache
def backward_head_dims(dtype: str) -> tuple[int, ...]:
    """The head dims at which some backward rung takes ``dtype`` ("float32", "float16", "bfloat16")."""
    from .versions import BWD_VERSIONS

    return tuple(sorted({D for e in BWD_VERSIONS.values() if dtype in e.dtypes for D in e.tiles}))


_F32_ROUNDS_TO_INF = 2.0**128 - 2.0**103  # the smallest magnitude float32() rounds to infinity


def _scale(softmax_scale, arg: str) -> float:
    """The softmax scale as the kernels see it: a float32 that must be finite.  (Plain Python, so
    torch.compile traces it.)"""
    if isinstance(softmax_scale, (bool, np.bool_)) or not isinstance(softmax_scale, numbers.Real):
        raise TypeError(f"{arg} must be a real number or None, got {type(softmax_scale).__name__} ({softmax_scale!r})")
    value = float(softmax_scale)
    if not (abs(value) < _F32_ROUNDS_TO_INF):  # also catches nan
        raise ValueError(f"{arg} must be finite as a float32 (|scale| < 3.4e38), got {softmax_scale!r}")
    return value


def _call(
    q,
    k,
    v,
    softmax_scale,
    mode,
    layout: str,
    version,
    precision,
    scale_arg: str,
    with_lse: bool,
    same_heads=False,
    deterministic=False,
):
    """The public functions' shared tail: checks that need Python objects, then the custom op
    (for autograd and under torch.compile; it always returns lse) or its implementation (eager:
    no dispatcher round trip, and no lse buffer unless asked for).  same_heads: SDPA's
    enable_gqa=False, under which key must have query's number of heads.  deterministic: for
    the backward pass."""
    Tensor = torch.Tensor
    if not (
        isinstance(q, Tensor)
        and isinstance(k, Tensor)
        and isinstance(v, Tensor)
        and q.dim() == 4
        and k.dim() == 4
        and v.dim() == 4
    ):
        _check_rank(q=q, k=k, v=v)  # raises, naming the argument
    if q.dtype == torch.float8_e4m3fn:
        raise TypeError(
            "float8_e4m3fn inputs run through tileattn.flash_attn_func (with descale_q/k/v, as FlashAttention-3), "
            "not scaled_dot_product_attention"
        )
    if same_heads and q.shape[1] != k.shape[1]:  # (SDPA's layout: heads are dim 1)
        raise ValueError(
            f"key has {k.shape[1]} heads but query has {q.shape[1]}: pass enable_gqa=True "
            f"for grouped-query attention (as torch's SDPA asks); query {tuple(q.shape)}, key "
            f"{tuple(k.shape)} (B, H, N, D)"
        )
    needs_grad = (q.requires_grad or k.requires_grad or v.requires_grad) and torch.is_grad_enabled()
    if needs_grad:  # (the custom op below dispatches on the device: check it, and all else, first)
        _check_backward_exists(q, k, v)
        _validate(q, k, v, version, precision, layout)
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(q.shape[-1])
    else:
        softmax_scale = _scale(softmax_scale, scale_arg)
    if needs_grad or torch.compiler.is_compiling():  # through the dispatcher: autograd, tracing
        deterministic = bool(deterministic) or torch.are_deterministic_algorithms_enabled()
        return torch.ops.tileattn.fwd(
            q, k, v, softmax_scale, _CAUSAL_CODE[mode], layout, version, precision, deterministic
        )
    return _forward(q, k, v, softmax_scale, mode, layout, version, precision, with_lse)


@torch.library.custom_op("tileattn::fwd", mutates_args=(), device_types="cuda")
def _fwd_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    softmax_scale: float,
    causal: int,
    layout: str,
    version: str | None,
    precision: str | None,
    deterministic: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """tileattn::fwd(q, k, v, softmax_scale, causal, layout, version, precision, deterministic)
    -> (O, lse).  q, k, v in ``layout`` ("bnhd": flash-attn's, "bhnd": SDPA's); causal 0 (none),
    1 (top-left), 2 (bottom-right); O in ``layout``, lse (B, H, Nq) float32.  deterministic only
    matters to the autograd formula (backward.py): dQ added in a fixed order."""
    return _forward(q, k, v, softmax_scale, _CAUSAL_OF_CODE[causal], layout, version, precision, True)


@_fwd_op.register_fake
def _(q, k, v, softmax_scale, causal, layout, version, precision, deterministic=False):
    _, (B, H, Nq, D), *_ = _validate(q, k, v, version, precision, layout)
    out = q.new_empty(_out_shape(B, H, Nq, D, layout))
    return out, q.new_empty((B, H, Nq), dtype=torch.float32)


def _out_shape(B: int, H: int, Nq: int, D: int, layout: str) -> tuple:
    """O's shape in the caller's layout (q's shape)."""
    return (B, Nq, H, D) if layout == "bnhd" else (B, H, Nq, D)


def _outputs(out, lse, out_shape, dtype, lse_shape, with_lse: bool, device, no_work: bool):
    """O and lse as the packed / FP8 paths return them: the buffers given (the tests hand in
    NaN-poisoned ones) or new ones (lse only when asked for); with no work (no query row, or no
    key) O is zeroed and lse -inf, what a row that sees no key outputs."""
    if out is None:
        out = torch.empty(out_shape, dtype=dtype, device=device)
    if lse is None and with_lse:
        lse = torch.empty(lse_shape, dtype=torch.float32, device=device)
    if no_work:
        out.zero_()
        if lse is not None:
            lse.fill_(-math.inf)
    return out, lse


def _heads_view(q, k, v, layout: str):
    return (q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)) if layout == "bnhd" else (q, k, v)


def _validate(q, k, v, version, precision, layout: str):
    """Checks on the caller's tensors in their layout.  Returns the dtype name, for q, k, v
    (shape, strides) in (B, H, N, D) order, and the CUDA device index.  What depends only on
    (dtype, head dim, version, precision) is checked once per combination (_static_checks); the
    rest on every call.  The device comes last, so CPU tests reach the rest."""
    dtype = _DTYPES.get(q.dtype)
    if dtype is None:
        raise TypeError(f"q has dtype {q.dtype}; supported: {', '.join(map(str, _DTYPES))}")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        name, t = ("k", k) if k.dtype != q.dtype else ("v", v)
        raise TypeError(f"{name} must have q's dtype {q.dtype}, got {t.dtype}")
    (qsh, qst), (ksh, kst), (vsh, vst) = _bhnd(q, layout), _bhnd(k, layout), _bhnd(v, layout)
    B, H, Nq, D = qsh
    if ksh[0] != B or ksh[3] != D or ksh != vsh or ksh[1] == 0 or H % ksh[1] or Nq > _INT32_MAX or ksh[2] > _INT32_MAX:
        _shape_error(q, k, v, layout)
    if dtype != "float8_e4m3fn":  # (FP8's dtype-level checks: fp8.check_inputs)
        _static_checks(dtype, int(D), version, precision)
    if qst[3] != 1 or kst[3] != 1 or vst[3] != 1:
        for name, t in (("q", q), ("k", k), ("v", v)):
            if t.stride(-1) != 1 and t.shape[-1] > 1:
                raise ValueError(
                    f"{name} must have a contiguous last (head) dim, stride 1; got stride "
                    f"{t.stride(-1)} (strides {t.stride()}): call .contiguous() first"
                )
    index = q.get_device()  # -1 on the CPU; an int is cheaper to compare than torch.device objects
    if index < 0 or k.get_device() != index or v.get_device() != index:
        for name, t in (("q", q), ("k", k), ("v", v)):
            if t.device.type != _DEVICE_TYPE:
                raise ValueError(
                    f"{name} must be a CUDA tensor, got device '{t.device}'"
                    + ("" if torch.cuda.is_available() else " (and no CUDA device is present)")
                )
            if t.device != q.device:
                raise ValueError(f"{name} is on {t.device} but q is on {q.device}; all must share one device")
    return dtype, qsh, qst, ksh, kst, vst, index


_DEVICE_TYPE = "cuda"  # (scripts/host_overhead.py sets "cpu" to time the host path without a GPU)


def _shape_error(q, k, v, layout: str):
    """Raise the error that names the first shape mismatch, with shapes in the caller's layout."""
    legend = "(" + ", ".join(_LAYOUT_DIMS[layout]) + ")"
    q, k, v = _heads_view(q, k, v, layout)  # (B, H, N, D) views to index
    shown = lambda t: tuple(_heads_view(t, t, t, layout)[0].shape)  # back in the caller's layout
    B, H, Nq, D = q.shape
    for name, t in (("k", k), ("v", v)):  # each against q first, then v against k
        if t.shape[0] != B:
            raise ValueError(
                f"{name} must have q's batch size B={B}, got {t.shape[0]}: q {shown(q)}, {name} {shown(t)} {legend}"
            )
        if t.shape[-1] != D:
            raise ValueError(
                f"{name} must have q's head dim D={D}, got {t.shape[-1]}: q {shown(q)}, {name} {shown(t)} {legend}"
            )
    if k.shape != v.shape:
        raise ValueError(f"v must have k's shape {shown(k)}, got {shown(v)} {legend}")
    H_kv = k.shape[1]
    if H_kv == 0 or H % H_kv != 0:
        raise ValueError(
            f"q's number of heads H={H} must be a multiple of k/v's, got {H_kv}: q {shown(q)}, k {shown(k)} {legend}"
        )
    for name, t in (("q", q), ("k", k)):
        if t.shape[2] > _INT32_MAX:
            raise ValueError(
                f"{name}'s sequence length must be below 2^31, got {t.shape[2]}: {name} {shown(t)} {legend}"
            )
    raise AssertionError("unreachable: no shape error found")


@functools.cache
def head_dims(dtype: str) -> list[int]:
    """Every head dim some registered rung takes for this dtype ("float32", "float16", ...)."""
    return sorted({d for e in VERSIONS.values() if dtype in e.dtypes for d in e.head_dims})


@functools.cache
def _static_checks(dtype: str, D: int, version, precision) -> None:
    """The checks that depend on nothing but (dtype, head dim, version, precision): run once per
    combination that passes (an exception is not cached, so a bad call raises every time)."""
    dtype_dims = head_dims(dtype)
    if not dtype_dims:
        raise TypeError(f"no rung takes dtype {dtype} yet; supported: float32")
    torch_dtype = {v: k for k, v in _DTYPES.items()}[dtype]
    if D not in dtype_dims:
        raise ValueError(f"head dim {D} is not supported for {torch_dtype}; supported: {dtype_dims}")
    if precision not in (None, "fp32", "tf32"):
        raise ValueError(f"precision must be None, 'fp32' or 'tf32', got {precision!r}")
    if precision is not None and dtype != "float32":
        raise ValueError(f"precision applies to float32 inputs only, got precision={precision!r} with {torch_dtype}")
    if version is not None:
        if version not in VERSIONS:
            raise ValueError(f"unknown version {version!r}; known: {list(VERSIONS)}")
        entry = VERSIONS[version]
        if dtype not in entry.dtypes:
            raise TypeError(f"version {version!r} takes {entry.dtypes}, got {dtype}")
        if D not in entry.tiles:
            raise ValueError(f"version {version!r} supports head dims {list(entry.head_dims)}, got {D}")
        if entry.precision == "tf32" and precision != "tf32":
            raise ValueError(
                f"version {version!r} computes with TF32 products (~1e-3 error); pass precision='tf32' to opt in"
            )
        if entry.precision == "fp32" and precision == "tf32":
            raise ValueError(
                f"version {version!r} computes at FP32 precision; precision='tf32' asks for a "
                "TF32 rung: leave version=None or name one"
            )


def panel_widths(head_dim: int) -> list[int]:
    """Column widths of the panels of a SwizzledTile (mma.cuh) for this head dim, as one box width
    each: 64 for the full panels, then 32 or 16 for a narrow last one.  The head dim is padded to
    a multiple of 16, and a 48-column remainder to a whole 64-column panel, as in the kernels."""
    d_pad = -(-head_dim // 16) * 16
    d_smem = d_pad + 16 if d_pad % 64 == 48 else d_pad
    return ([64] if d_smem >= 64 else []) + ([d_smem % 64] if d_smem % 64 else [])


def _tensor_maps(
    q_ptr, k_ptr, v_ptr, q_layout, k_layout, v_layout, dtype: str, esize: int, Br: int, Bc: int, l2_promotion=128,
    o=None,
) -> bytes:  # fmt: skip
    """The kernel's TmaMaps argument (common.cuh): the TMA descriptors of q, k, v ((B, H, N, D)
    views given as pointer and (shape, strides)) with boxes of 64 columns x Br or Bc rows, then,
    when the padded head dim is not a multiple of 64, q, k, v with the last panel's 32 or 16
    columns (the panels of SwizzledTile, mma.cuh).  o = (pointer, layout): O's map for the
    persistent kernels' tensor stores (_o_map) at index 3, which a head dim of whole panels
    leaves free.  Host bytes (each prepared call keeps the ones of the pointers it saw); they
    travel by value in the launch's parameters, nothing lives on the device."""
    widths = panel_widths(q_layout[0][-1])
    maps = []
    for w in widths:
        for ptr, layout, rows in ((q_ptr, q_layout, Br), (k_ptr, k_layout, Bc), (v_ptr, v_layout, Bc)):
            maps.append(tensor_map(ptr, layout, dtype, esize, (w, rows), l2_promotion))
    if len(widths) == 1:  # index 3..5 unused by the loads: copies, or O's map at 3
        o_map = None if o is None else _o_map(*o, dtype, esize)
        maps += [o_map or maps[0], maps[1], maps[2]]
    return b"".join(maps)


O_STORE_ROWS = 16  # a consumer warp's rows of O, one tensor store a 64-column panel (mma.cuh fragment_store_rows_tma)


def _o_map(ptr: int, layout, dtype: str, esize: int) -> bytes | None:
    """O's TMA descriptor for the persistent kernels' tensor stores (boxes of 64 columns x
    O_STORE_ROWS rows), or None when O's base or strides are not on 16-byte boundaries: the kernel
    tests the same (v3_3_wgmma.cu o_tma_aligned) and stores directly then."""
    if not _aligned16(ptr, layout[1], esize):
        return None
    return tensor_map(ptr, layout, dtype, esize, (64, O_STORE_ROWS))


def stores_o_by_tma(persistent: bool, dtype: str) -> bool:
    """Whether a kernel stores O through the copy engine and so needs O's map (v3_3_wgmma.cu
    v3_3_stages_o: the persistent 16-bit kernels, v3.6's walk)."""
    return persistent and dtype in ("float16", "bfloat16")


def tensor_map(ptr, layout, dtype: str, esize: int, box: tuple[int, int], l2_promotion=128) -> bytes:
    """One TMA descriptor of a (B, H, N, D) view given as pointer and (shape, strides in elements):
    boxes of box = (columns, rows)."""
    shape, stride = layout
    return _nvrtc.tensor_map_4d(
        ptr,
        dtype,
        dims=tuple(reversed(shape)),
        strides_bytes=tuple(s * esize for s in reversed(stride[:3])),
        box=box,
        l2_promotion=l2_promotion,
    )


@dataclasses.dataclass
class Plan:
    """Everything about a launch that depends only on its key (dtype, head dim, causal, rung,
    precision, device, and the default dispatch's two shape rules: a short causal call, a long call
    without a mask): built once, then each call fills the parameter struct and launches."""

    function: int  # the kernel as a CUfunction of the device's primary context
    context: int  # that context
    Br: int
    Bc: int
    threads: int
    smem: int
    per_head: bool  # grid = B*H (K/V-outer rungs), else (Tr, B*H)
    workspace_per_row: int
    tma_offset: int | None  # where the TmaMaps parameter starts (TMA rungs), else None
    pack: object  # pack_into of the forward fields (_params.FWD_ARGS) at the compiler's parameter offsets
    params: _nvrtc.ParamBuffer  # a thread-local image of the parameter block, handed to the launch whole
    # Persistent rungs: the grid's CTAs at most (the device's SMs), the tiles a CTA takes at a time
    # (causal: pairs of equal work, csrc/common.cuh persistent_tile) and where bh_count sits in the block.
    persistent_ctas: int = 0
    persistent_unit: int = 1
    bh_count_offset: int = 0
    # 3xFP16 rungs (v2.4, v2.5): where split_amax sits in the block (None for the others), and
    # which of q, k, v the host splits (Version.split_operands).
    split_amax_offset: int | None = None
    split_operands: tuple[str, ...] = ()


_PLANS: dict[tuple, Plan] = {}


def _plan(dtype: str, D: int, causal: bool, version, precision, device_index: int, Nq: int) -> Plan:
    short = short_causal(causal, Nq)
    key = (dtype, D, causal, version, precision, device_index, short)
    plan = _PLANS.get(key)
    if plan is None:
        plan = _PLANS[key] = _make_plan(dtype, D, causal, version, precision, device_index, short)
    return plan


def _make_plan(dtype: str, D: int, causal: bool, version, precision, device_index: int, short: bool) -> Plan:
    entry = _dispatch(version, dtype, D, device_index, precision, short)
    cc = _nvrtc.device_arch(device_index)
    arch_num = cc[0] * 10 + cc[1]
    arch = _nvrtc.arch_string(cc, arch_specific=entry.arch_specific)
    k = load_kernel(
        f"version {entry.name!r} at head dim {D}",
        entry.file,
        entry.name_expression(dtype, D, causal, arch_num),
        arch,
        device_index,
        entry.tensor_maps,
    )
    Br, Bc = entry.tile(D, arch_num)
    return Plan(
        k.function,
        k.context,
        Br,
        Bc,
        k.threads,
        k.smem,
        entry.grid_style == "per_head",
        entry.workspace_per_row,
        k.layout.tma_offset,
        k.layout.pack,
        k.params,
        _nvrtc.sm_count(device_index) if entry.grid_style == "persistent" else 0,
        2 if causal else 1,  # v3_3_for_my_tiles's U
        k.layout.offsets[_BH_COUNT],
        k.layout.offsets[_SPLIT_AMAX] if entry.split_operands else None,
        entry.split_operands,
    )


@dataclasses.dataclass
class LaunchableKernel:
    """One instantiation compiled, loaded into a device's context, and described by its cubin:
    the CUfunction and context, block size, dynamic shared memory, parameter layout and a
    thread-local parameter buffer (forward plans and backward kernels alike)."""

    function: int
    context: int
    threads: int
    smem: int
    layout: _params.Layout
    params: _nvrtc.ParamBuffer

    def launch(self, stream: int, grid_x: int, grid_y: int, args, tmaps: bytes | None = None) -> None:
        """Pack ``args`` (the kernel's fields, in order) and, for a TMA kernel, its TmaMaps bytes
        into its parameter block and launch (grid_x, grid_y) blocks on ``stream``."""
        self.layout.pack(self.params.buf, 0, *args)
        if tmaps is not None:
            _TMA_PACK(self.params.buf, self.layout.tma_offset, tmaps)
        _nvrtc.launch(
            self.function, self.context, stream, grid_x, grid_y, self.threads, self.smem, self.params.extra_addr
        )


@functools.cache
def entry_kernel(name: str, dtype: str, head_dim: int, causal: bool, device_index: int) -> LaunchableKernel:
    """A kernel outside the forward ladder (versions.KERNEL_ENTRIES: backward, decode, the packed
    forward kernels), compiled and loaded for one device."""
    from .versions import KERNEL_ENTRIES

    entry = KERNEL_ENTRIES[name]
    arch = _nvrtc.arch_string(_nvrtc.device_arch(device_index), arch_specific=entry.arch_specific)
    expr = entry.name_expression(dtype, head_dim, causal)
    return load_kernel(
        f"{name} at head dim {head_dim}",
        entry.file,
        expr,
        arch,
        device_index,
        entry.tensor_maps,
        _params.ENTRY_ARGS[entry.fields],
        [],
    )


def load_kernel(
    what: str,
    file: str,
    name_expression: str,
    arch: str,
    device_index: int,
    tensor_maps: bool = False,
    args=None,
    room=None,
) -> LaunchableKernel:
    """Compile (cached), check the shared memory against the device (``what`` names the kernel in
    the error), load, and read the launch configuration back from the cubin.  args/room: the
    parameter fields (_params.packer)."""
    cubin = _nvrtc.compile_kernel(file, name_expression, arch)
    smem = _params.smem_bytes(cubin)  # the kernel's own TILEATTN_SMEM_BYTES
    limit = _nvrtc.max_dynamic_smem(device_index)
    if smem > limit:
        raise ValueError(f"{what} needs {smem} bytes of shared memory; this GPU allows {limit}")
    function, context = _nvrtc.function_in_context(_nvrtc.load(cubin), device_index, smem)
    layout = _params.packer(cubin.data, cubin.lowered_name, tensor_maps, args, room)
    return LaunchableKernel(
        function,
        context,
        _params.block_threads(cubin.data, cubin.lowered_name),
        smem,
        layout,
        _nvrtc.ParamBuffer(layout.init),
    )


def _dispatch(
    version,
    dtype: str,
    head_dim: int,
    device_index: int,
    precision: str | None,
    short_causal: bool = False,
) -> Version:
    cc = _nvrtc.device_arch(device_index)
    arch = cc[0] * 10 + cc[1]
    if version is None:
        entry = select(dtype, head_dim, arch, precision, short_causal)
        if entry is None:
            alternatives = sorted({v.name for v in VERSIONS.values() if dtype in v.dtypes})
            raise ValueError(
                f"no rung takes {dtype} at head dim {head_dim} on sm_{arch}"
                f"{f' with precision={precision!r}' if precision else ''}; rungs for {dtype}: "
                f"{alternatives} (see tileattn.VERSIONS for the archs each runs on)"
            )
        return entry
    entry = VERSIONS[version]
    if not entry.runs_on(arch):
        raise ValueError(f"version {version!r} runs on {entry.arch_range()}, this GPU is sm_{arch}")
    return entry


def _bhnd(t, layout: str) -> tuple[tuple, tuple]:
    """(shape, strides) of t as (B, H, N, D), without making a view (views cost a microsecond each)."""
    sh, st = t.shape, t.stride()
    if layout == "bnhd":
        return (sh[0], sh[2], sh[1], sh[3]), (st[0], st[2], st[1], st[3])
    return tuple(sh), st


def _rows_aligned(t, strides: tuple) -> bool:
    """The kernels copy 16-byte vectors (cp.async, TMA), so rows must start on 16-byte boundaries."""
    return _aligned16(t.data_ptr(), strides, t.element_size())


def _aligned16(ptr: int, strides: tuple, esize: int) -> bool:
    """Whether a (B, H, N, D) view at ptr with these (sb, sh, sn) strides (elements of esize bytes)
    starts every row on a 16-byte boundary."""
    return (ptr | (strides[0] | strides[1] | strides[2]) * esize) % 16 == 0


def _aligned_copies(tensors, layout: str) -> tuple:
    """Each tensor itself if its rows start on 16-byte boundaries, else a copy in fresh (aligned)
    memory: clone, since .contiguous() of a contiguous view at an odd offset returns the view."""
    return tuple(
        t if _rows_aligned(t, _bhnd(t, layout)[1]) else t.clone(memory_format=torch.contiguous_format) for t in tensors
    )


def _forward(
    q,
    k,
    v,
    softmax_scale: float,
    causal: str | None,
    layout: str,
    version,
    precision,
    with_lse: bool,
    out=None,
    lse=None,
):
    """The one core, behind both public functions and the custom op: q, k, v in ``layout``.
    Returns (O in ``layout``, lse (B, H, Nq), or None without ``with_lse``: the kernels then skip
    its store).  ``out``/``lse`` let the tests hand in NaN-poisoned buffers of the right shape.
    Shapes and strides are handled as tuples in (B, H, N, D) order: nothing is transposed, and
    nothing the caller passed is modified (a misaligned input is copied, a negative scale negates a
    copy of q).

    A call whose dtypes, shapes, strides, devices and options were seen before skips straight to
    its prepared launch (_CALLS): everything checked and computed from those is the same, so what
    is cached is the checking and arithmetic of what cannot change.  What can (the data pointers'
    alignment, grad mode) is checked on every call."""
    key = None
    if out is None and lse is None:
        key = (q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(), q.dtype, k.dtype, v.dtype,
               q.get_device(), k.get_device(), v.get_device(), softmax_scale, causal, layout, version, precision,
               with_lse)  # fmt: skip
        call = _CALLS.get(key)
        if call is not None:
            q_ptr, k_ptr, v_ptr = q.data_ptr(), k.data_ptr(), v.data_ptr()
            if not (q_ptr | k_ptr | v_ptr) & 15:  # else: the slow path copies the misaligned input
                return call.run(q, k, v, q_ptr, k_ptr, v_ptr)

    dtype, (B, H, Nq, D), qs, (_, H_kv, Nk, _), ks, vs, device_index = _validate(q, k, v, version, precision, layout)
    if B * H * Nq == 0 or Nk == 0:
        if out is None:
            out = torch.empty(_out_shape(B, H, Nq, D, layout), dtype=q.dtype, device=q.device)
        if lse is None and with_lse:
            lse = torch.empty((B, H, Nq), dtype=torch.float32, device=q.device)
        if Nk == 0:  # no key at all: every row's output is 0 and its lse -inf
            out.zero_()
            if lse is not None:
                lse.fill_(-math.inf)
        return out, lse

    # A negative scale goes onto q (a sign flip is exact in every float format), so kernels that
    # fold the scale into exp2(scale * S - m) may assume scale >= 0 (see softmax.cuh).
    cacheable = key is not None and softmax_scale >= 0
    if softmax_scale < 0:
        q, softmax_scale = -q, -softmax_scale
        qs = _bhnd(q, layout)[1]
    # The kernels copy 16-byte vectors (cp.async, TMA): rows must start on 16-byte boundaries.  A
    # view that breaks that (an odd offset or stride) is copied once, into fresh (aligned) memory:
    # clone, since .contiguous() of a contiguous view at an odd offset would return the view.
    elems = 16 // q.element_size()
    q_ptr, k_ptr, v_ptr = q.data_ptr(), k.data_ptr(), v.data_ptr()
    # (elems is a power of two: the OR of the strides is a multiple of it iff each stride is.)
    if (q_ptr | k_ptr | v_ptr) % 16 or (qs[0] | qs[1] | qs[2] | ks[0] | ks[1] | ks[2] | vs[0] | vs[1] | vs[2]) % elems:
        cacheable = False
        q, k, v = _aligned_copies((q, k, v), layout)
        qs, ks, vs = _bhnd(q, layout)[1], _bhnd(k, layout)[1], _bhnd(v, layout)[1]
        q_ptr, k_ptr, v_ptr = q.data_ptr(), k.data_ptr(), v.data_ptr()

    plan = _plan(dtype, D, causal is not None, version, precision, device_index, Nq)
    os_ = (Nq * H * D, D, H * D) if layout == "bnhd" else (H * Nq * D, Nq * D, D)
    call = _Launch(
        plan,
        device_index,
        dtype,
        (B, H, Nq, D, H_kv, Nk),
        (qs, ks, vs, os_ if out is None else _bhnd(out, layout)[1]),
        softmax_scale,
        0 if causal != "bottom_right" else Nk - Nq,  # query i sees key j iff j <= i + offset
        None if q.is_contiguous() else _out_shape(B, H, Nq, D, layout),
        with_lse,
    )
    if cacheable:
        remember(_CALLS, key, call, _CALLS_MAX)
    return call.run(q, k, v, q_ptr, k_ptr, v_ptr, out, lse)


_CALLS: dict[tuple, _Launch] = {}
_CALLS_MAX = 4096  # prepared calls kept (api's and fp8's)
_MAPS_MAX = 64  # tensor-map sets a prepared call keeps, by pointers


def remember(cache: dict, key, value, limit: int) -> None:
    """cache[key] = value; a cache already holding ``limit`` entries starts over first
    (many shapes, e.g. every decode length, or many buffers)."""
    if len(cache) >= limit:
        cache.clear()
    cache[key] = value


class _Launch:
    """One prepared call: the plan, the kernel arguments that follow from the shapes and strides
    (a template whose pointers each call fills in), O's and lse's allocation and the grid."""

    def __init__(self, plan: Plan, device_index, dtype, dims, strides, softmax_scale, offset, out_shape, with_lse):
        B, H, Nq, D, H_kv, Nk = dims
        qs, ks, vs, os_ = strides
        self.plan, self.device_index, self.out_shape, self.with_lse = plan, device_index, out_shape, with_lse
        self.lse_shape = (B, H, Nq)
        self.workspace_numel = B * H * Nq * plan.workspace_per_row
        # The forward fields of TILEATTN_FWD_PARAMS (_params.FWD_ARGS order); pointers at 0..5.
        self.args = _params.fwd_args(Nq, Nk, H, H_kv, strides, softmax_scale, offset)
        # The TMA rungs' descriptors depend on the pointers too: built once per (q, k, v) seen.
        self.maps_layout = (((B, H, Nq, D), qs), ((B, H_kv, Nk, D), ks), ((B, H_kv, Nk, D), vs), dtype)
        if plan.split_amax_offset is not None:  # 3xFP16 (v2.4, v2.5): fp16 halves of these operands (_split_blocks)
            self.split_which = tuple(i for i, name in enumerate("qkv") if name in plan.split_operands)
            self.split_layouts = [self.maps_layout[i] for i in self.split_which]
            # The halves each of the (q, k, v) maps reads: v2.5 splits q in the CTA, so k's stand
            # in for its unused map.
            self.split_maps_of = tuple(self.split_which.index(i if i in self.split_which else 1) for i in range(3))
            halves = lambda heads, N: ((B, 2 * heads, N, D), (2 * heads * N * D, N * D, D, 1))
            self.split_maps_layout = (
                *(halves(*self.split_layouts[j][0][1:3]) for j in self.split_maps_of),
                "float16",
            )
        # O's map (the persistent 16-bit kernels' tensor stores of O, v3_3_wgmma.cu v3_3_stages_o).
        stores_o = plan.tma_offset is not None and stores_o_by_tma(plan.persistent_ctas > 0, dtype)
        self.o_layout = ((B, H, Nq, D), os_) if stores_o else None
        self.maps: dict[tuple[int, ...], bytes] = {}
        # (grid x, grid y, bh_offset) per launch: K/V-outer rungs take B*H in gridDim.x (up to
        # 2^31 - 1), persistent ones a CTA per SM (at most one per tile), the others (Tr, B*H)
        # split over launches of at most 65535 in gridDim.y.
        BH = self.bh_count = B * H
        Tr = -(-Nq // plan.Br)
        if plan.per_head:
            self.grids = [(BH, 1, 0)]
        elif plan.persistent_ctas:
            # (Tr * B*H < 2^31: B*H*Nq rows of Q would be terabytes before it overflowed)
            units = -(-(Tr * BH) // plan.persistent_unit)
            self.grids = [(min(plan.persistent_ctas, units), 1, 0)]
        else:
            self.grids = [(Tr, min(_GRID_Y_MAX, BH - off), off) for off in range(0, BH, _GRID_Y_MAX)]

    def _maps(self, ptrs: tuple[int, ...], layouts, esize: int) -> bytes:
        """The TMA descriptors of q, k, v at these pointers (layouts: their (shape, strides) and
        the dtype), and of O at a fourth one (self.o_layout's), built once per pointers seen; at
        most _MAPS_MAX kept."""
        maps = self.maps.get(ptrs)
        if maps is None:
            o = (ptrs[3], self.o_layout) if len(ptrs) == 4 else None
            maps = _tensor_maps(*ptrs[:3], *layouts, esize, self.plan.Br, self.plan.Bc, o=o)
            remember(self.maps, ptrs, maps, _MAPS_MAX)
        return maps

    def run(self, q, k, v, q_ptr: int, k_ptr: int, v_ptr: int, out=None, lse=None):
        """(k and v are read through their pointers, except by a 3xFP16 plan, which splits them.)"""
        plan = self.plan
        if out is None:  # O in the caller's layout, contiguous: like q when q is
            shape = self.out_shape
            out = torch.empty_like(q) if shape is None else torch.empty(shape, dtype=q.dtype, device=q.device)
        if lse is None and self.with_lse:
            lse = torch.empty(self.lse_shape, dtype=torch.float32, device=q.device)
        workspace = 0
        if self.workspace_numel:
            workspace_t = torch.empty(self.workspace_numel, dtype=torch.float32, device=q.device)
            workspace = workspace_t.data_ptr()
        args = self.args.copy()
        args[0:6] = q_ptr, k_ptr, v_ptr, out.data_ptr(), 0 if lse is None else lse.data_ptr(), workspace
        buf = plan.params
        if plan.split_amax_offset is not None:  # fresh fp16 halves each call; their maps by pointer
            qkv = (q, k, v)
            halves, amax = _split_blocks([qkv[i] for i in self.split_which], self.split_layouts, self.device_index)
            ptrs = tuple(halves[j].data_ptr() for j in self.split_maps_of)
            _TMA_PACK(buf.buf, plan.tma_offset, self._maps(ptrs, self.split_maps_layout, 2))
            _PTR_PACK(buf.buf, plan.split_amax_offset, amax.data_ptr())
        elif plan.tma_offset is not None:  # (the persistent kernels store O through the copy engine too)
            ptrs = (q_ptr, k_ptr, v_ptr) if self.o_layout is None else (q_ptr, k_ptr, v_ptr, out.data_ptr())
            _TMA_PACK(buf.buf, plan.tma_offset, self._maps(ptrs, self.maps_layout, q.element_size()))
        if plan.persistent_ctas:  # a room field, packed by itself (the buffer is the plan's, per thread)
            _BH_COUNT_PACK(buf.buf, plan.bh_count_offset, self.bh_count)
        # Launch on torch's current stream of the inputs' device.
        stream = _current_stream(self.device_index)
        for grid_x, grid_y, bh_offset in self.grids:
            args[_BH_OFFSET] = bh_offset
            plan.pack(buf.buf, 0, *args)
            _nvrtc.launch(plan.function, plan.context, stream, grid_x, grid_y, plan.threads, plan.smem, buf.extra_addr)
        return out, lse


_BH_OFFSET = [n for n, _ in _params.FWD_ARGS].index("bh_offset")
_BH_COUNT = [n for n, _ in _params.FWD_FIELDS].index("bh_count")  # a room field: the persistent plans pack it
_SPLIT_AMAX = [n for n, _ in _params.FWD_FIELDS].index("split_amax")  # a room field: v2.4's plans pack it
_TMA_PACK = struct.Struct(f"{_params.TMA_MAPS_BYTES}s").pack_into
_BH_COUNT_PACK = struct.Struct("<i").pack_into
_PTR_PACK = struct.Struct("<Q").pack_into


SPLIT_BLOCK_ROWS = 64  # csrc/mma.cuh's SPLIT_BLOCK_ROWS


def _split_blocks(tensors, layouts, device_index: int):
    """The 3xFP16 rungs' operands (v2.4: q, k, v; bwd_v2.3: q, k, v, dO): each FP32 tensor, a
    (B, H, N, D) view given by its layouts entry (shape, strides), as x 2^e = hi + lo in fp16,
    (B, 2 H, N, D) contiguous (head h's hi at h, its lo at H + h), with an exponent e per block of
    SPLIT_BLOCK_ROWS rows that puts the block's largest |x| just under 2^15 (csrc/split_halves.cu).
    Returns the halves and the blocks' maxima, float32 on the device (the kernels derive every
    scale from them: no host sync): per batch b, each tensor's (heads, ceil(N / 64)) blocks in
    turn, so a kernel finds them from its own fields without B."""
    per_b = [H * -(-N // SPLIT_BLOCK_ROWS) for (_, H, N, _), _ in layouts]
    B = layouts[0][0][0]
    amax = torch.empty(B * sum(per_b), dtype=torch.float32, device=tensors[0].device)
    stream = _current_stream(device_index)
    halves = []
    for i, (t, ((B, H, N, D), strides)) in enumerate(zip(tensors, layouts)):
        out = torch.empty((B, 2 * H, N, D), dtype=torch.float16, device=t.device)
        args = [t.data_ptr(), out.data_ptr(), amax.data_ptr() + 4 * sum(per_b[:i]), sum(per_b), H, N, *strides[:3]]
        entry_kernel(SPLIT_BLOCKS.name, "float32", D, False, device_index).launch(stream, B * per_b[i], 1, args)
        halves.append(out)
    return halves, amax


def persistent_ctas(Tr: int, BH: int, causal: bool, device_index: int) -> int:
    """The grid of a kernel on v3.6's persistent walk launched outside the plans (FP8, the dense
    score variants): a CTA per SM, at most one per unit of work (a tile; causal: a pair of tiles,
    csrc/common.cuh persistent_tile)."""
    return min(_nvrtc.sm_count(device_index), -(-(Tr * BH) // (2 if causal else 1)))


def _current_stream(device_index: int) -> int:
    """The raw handle of torch's current stream on a device (the public torch.cuda.current_stream
    builds a Python Stream object per call, a few microseconds)."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return raw(device_index) if raw is not None else torch.cuda.current_stream(device_index).cuda_stream


def _attention(
    q, k, v, softmax_scale, causal: str | None, version, *, out_layout: str, precision=None, out=None, lse=None
):
    """(B, H, N, D) views in, O in ``out_layout``: the harness's entry (testing.run_case)."""
    if out_layout == "bnhd":
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    scale = 1.0 / math.sqrt(q.shape[-1]) if softmax_scale is None else _scale(softmax_scale, "softmax_scale")
    return _forward(q, k, v, scale, causal, out_layout, version, precision, True, out=out, lse=lse)
