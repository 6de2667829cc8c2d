"""FP8 (e4m3) attention on Hopper: ``flash_attn_func`` with ``torch.float8_e4m3fn`` q, k, v runs
v3.5 (csrc/v3_5_fp8.cu: v3.3's body on 8-bit wgmma, walked as v3.6's persistent kernel) and
returns bf16.

As FlashAttention-3's FP8 forward: q, k, v carry descale factors (the value of an element is its
e4m3 number times its (batch, KV head)'s factor), given as ``descale_q``, ``descale_k``,
``descale_v`` of shape (B, H_kv) float32 (or a scalar / one-element tensor for one factor per
tensor; None means 1).  ``quantize_e4m3`` makes such a pair from a float tensor,
``quantize_attention_inputs`` all three, optionally with q and k rotated (incoherent processing).

What the kernel needs of the host: V^T.  8-bit wgmma reads both shared-memory operands K-major,
so P V takes V as (B, H_kv, D, keys): one copy per call (``v_transposed``), with the keys of each
group of 32 permuted so that P's A fragment comes straight from S's accumulator registers
(``key_permutation``; the product sums over keys, so their order is free).  The copy reads and
writes Nk D bytes per (batch, KV head): on an H200 0.07 ms for 64 MB, 2-4% of the call at N=8192
and up to 20% at N=1024 (bench --suite fp8 times the call with and without it).

Forward only: an FP8 input that requires grad raises (there is no FP8 backward).
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch

from . import _params, api
from .versions import V3_5_FP8, V3_5_FP8_WIDE, V3_5_VT, long_plain

E4M3_MAX = 448.0  # the largest finite e4m3 magnitude
KEY_GROUP = 32  # keys per k32 step of P V: V^T's keys are permuted within groups of this many
VT_KEYS = 128  # keys per block of the V^T copy (VT_KEYS in csrc/v3_5_fp8.cu)


def key_permutation() -> np.ndarray:
    """slot -> key inside a group of 32 keys of V^T: slot 16 h + 4 t + 2 a + b holds key
    16 h + 8 a + 2 t + b.  A thread t of a quad holds S's keys 2t, 2t + 1 of each n8 tile; the
    m64k32 A fragment of 8-bit wgmma wants keys 4t .. 4t + 3 in a register (16 on for its second
    pair of registers): packing keys (2t, 2t + 1, 8 + 2t, 9 + 2t) there means slot 4t + j holds
    those keys, and V^T is written in the same order (csrc/v3_5_fp8.cu)."""
    h, t, a, b = np.meshgrid(range(2), range(4), range(2), range(2), indexing="ij")
    return (16 * h + 8 * a + 2 * t + b).reshape(-1)


def v_transposed(v) -> torch.Tensor:
    """V (B, H_kv, Nk, D) (any strides with a contiguous last dim, e4m3) as v3.5 reads it:
    (B, H_kv, D, Nk_pad) bytes, Nk_pad = Nk rounded up to 32 (zeros past Nk), the keys of each
    group of 32 in key_permutation's order.  On a GPU, v3.5_vt's copy kernel; elsewhere (and as
    its reference in the tests) the same bytes by torch's permute-copy."""
    B, H_kv, Nk, D = v.shape
    if v.is_cuda:
        Nk_pad = Nk + -Nk % KEY_GROUP
        vt = torch.empty((B, H_kv, D, Nk_pad), dtype=torch.uint8, device=v.device)
        kern = api.entry_kernel(V3_5_VT.name, "float8_e4m3fn", D, False, v.device.index)
        sb, sh, sn, _ = v.stride()
        args = [v.data_ptr(), vt.data_ptr(), Nk, Nk_pad, H_kv, sb, sh, sn]
        tiles = -(-Nk_pad // VT_KEYS)  # (csrc/v3_5_fp8.cu: a block per 128 keys)
        kern.launch(api._current_stream(v.device.index), B * H_kv * tiles, 1, args)
        return vt
    return _v_transposed_torch(v)


def _v_transposed_torch(v) -> torch.Tensor:
    B, H_kv, Nk, D = v.shape
    v8 = v.view(torch.uint8)  # (the copy kernels below have no float8 instantiations)
    pad = -Nk % KEY_GROUP
    if pad:
        v8 = torch.cat([v8, v8.new_zeros(B, H_kv, pad, D)], dim=2)
    # key = 32 g + 16 h + 8 a + 2 t + b  ->  slot = 32 g + 16 h + 4 t + 2 a + b
    groups = v8.unflatten(2, (-1, 2, 2, 4, 2))  # (B, H_kv, g, h, a, t, b, D)
    return groups.permute(0, 1, 7, 2, 3, 5, 4, 6).reshape(B, H_kv, D, Nk + pad)


def quantize_e4m3(x: torch.Tensor, layout: str = "bnhd") -> tuple[torch.Tensor, torch.Tensor]:
    """x (float) as e4m3 with one descale factor per (batch, head): amax / 448 (1 for an all-zero
    head), so that each head uses e4m3's whole range.  Returns (x_e4m3, descale (B, heads) float32);
    x ~= x_e4m3.float() * descale.  layout: "bnhd" (flash-attn's (B, N, H, D)) or "bhnd"."""
    heads_dim = 2 if layout == "bnhd" else 1
    dims = [d for d in range(4) if d not in (0, heads_dim)]
    amax = x.detach().abs().amax(dim=dims).float()
    descale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
    shape = [x.shape[0], 1, 1, 1]
    shape[heads_dim] = x.shape[heads_dim]
    xq = (x.float() / descale.view(shape)).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return xq, descale


def quantize_attention_inputs(q, k, v, rotate_qk: bool = False):
    """q, k, v in flash-attn's layout (B, N, H, D), any float dtype, as flash_attn_func's FP8 call
    takes them: (q8, k8, v8, descales), descales the keyword arguments descale_q/k/v, one factor
    per (batch, KV head) (q quantized per group of the query heads that share a KV head).
    rotate_qk: q and k rotated first by the same orthogonal matrix (``rotate``), which leaves the
    scores as they are and spreads outlier channels: on the CPU (scripts/fp8_accuracy.py, D=128)
    O's error with 4 channels 20x larger in q and k falls from 0.39 to 0.087, Student-t inputs
    0.108 -> 0.073, Gaussian inputs unchanged (0.052).  Usage:
        q8, k8, v8, descales = fp8.quantize_attention_inputs(q, k, v, rotate_qk=True)
        o = tileattn.flash_attn_func(q8, k8, v8, causal=True, **descales)"""
    if rotate_qk:
        q, k = rotate(q), rotate(k)
    B, N, H, D = q.shape
    H_kv = k.shape[2]
    q8, dq = quantize_e4m3(q.reshape(B, N, H_kv, H // H_kv * D))
    (k8, dk), (v8, dv) = quantize_e4m3(k), quantize_e4m3(v)
    return q8.view(B, N, H, D), k8, v8, dict(descale_q=dq, descale_k=dk, descale_v=dv)


def rotate(x: torch.Tensor, seed: int = 0) -> torch.Tensor:
    """x times a fixed orthogonal D x D matrix along its last dim: random signs (from seed), then
    the normalised Hadamard matrix, FlashAttention-3's incoherent processing.  Rotate q and k by the
    same matrix before quantize_e4m3 (q k^T is unchanged) to spread outlier channels over all D
    entries, so each head's amax, and with it its e4m3 step, shrinks.  D a power of 2.  Computed
    in float32 (float64 for float64 inputs), returned in x's dtype."""
    D = x.shape[-1]
    if D & (D - 1) or D == 0:
        raise ValueError(f"rotate needs a power-of-2 head dim (a Hadamard matrix), got {D}")
    work = torch.float64 if x.dtype == torch.float64 else torch.float32
    return (x.to(work) @ _rotation(D, seed, x.device, work)).to(x.dtype)


@functools.lru_cache(maxsize=16)
def _rotation(D: int, seed: int, device, dtype) -> torch.Tensor:
    H = torch.ones(1, 1, dtype=torch.float64)
    while H.shape[0] < D:  # Sylvester's construction: [[H, H], [H, -H]]
        H = torch.cat([torch.cat([H, H], 1), torch.cat([H, -H], 1)], 0)
    signs = torch.randint(0, 2, (D, 1), generator=torch.Generator().manual_seed(seed)).double() * 2 - 1
    return (signs * H / D**0.5).to(device=device, dtype=dtype)


def _descale_table(descale_q, descale_k, descale_v, B: int, H_kv: int, device) -> torch.Tensor:
    """The kernel's descale field: float32 [B * H_kv][3] (q's, k's, v's factor per (batch, KV head)).
    Factors given as numbers (or None: 1) never travel from the host per call: a table of numbers
    alone is made once and cached (a Python number made into a CUDA tensor each call would be a
    copy that waits for the GPU), a number beside tensors becomes a filled column on the device."""
    rows, factors = B * H_kv, []
    for name, d in (("descale_q", descale_q), ("descale_k", descale_k), ("descale_v", descale_v)):
        if d is None:
            d = 1.0
        if not isinstance(d, torch.Tensor):
            if isinstance(d, bool) or not isinstance(d, (int, float)) or not math.isfinite(d):
                raise TypeError(f"{name} must be None, a finite number or a float32 tensor, got {d!r}")
            d = float(d)
        elif d.dtype != torch.float32:
            raise TypeError(f"{name} must be float32, got {d.dtype}")
        elif d.device != device:
            raise ValueError(f"{name} is on {d.device} but q is on {device}")
        elif d.numel() != 1 and tuple(d.shape) != (B, H_kv):
            raise ValueError(f"{name} must have shape (B, H_kv) = ({B}, {H_kv}) or one element, got {tuple(d.shape)}")
        factors.append(d)
    if not any(isinstance(d, torch.Tensor) for d in factors):
        return _constant_table(rows, tuple(factors), device)
    cols = [
        torch.full((rows,), d, dtype=torch.float32, device=device) if not isinstance(d, torch.Tensor)
        else d.reshape(-1).expand(rows) if d.numel() == 1 else d.reshape(rows)
        for d in factors
    ]  # fmt: skip
    return torch.stack(cols, dim=1).contiguous()


@functools.lru_cache(maxsize=64)
def _constant_table(rows: int, factors: tuple[float, float, float], device) -> torch.Tensor:
    """A descale table of the same three factors in every row (read only by the kernel)."""
    return torch.tensor(factors, dtype=torch.float32, device=device).expand(rows, 3).contiguous()


def check_inputs(q, k, v, version, precision) -> None:
    """What only FP8 calls need checked before api._validate's shapes and devices."""
    if k.dtype != q.dtype or v.dtype != q.dtype:
        name, t = ("k", k) if k.dtype != q.dtype else ("v", v)
        raise TypeError(f"{name} must have q's dtype {q.dtype}, got {t.dtype}")
    if version not in (None, V3_5_FP8.name):
        raise ValueError(f"float8_e4m3fn inputs run on version {V3_5_FP8.name!r} (or None), got {version!r}")
    if precision is not None:
        raise ValueError(f"precision applies to float32 inputs only, got precision={precision!r} with {q.dtype}")
    if (q.requires_grad or k.requires_grad or v.requires_grad) and torch.is_grad_enabled():
        raise RuntimeError(
            "tileattn has no FP8 backward pass: float8_e4m3fn inputs that require grad would silently carry no "
            "gradient.  Call it under `with torch.no_grad():`, or train in bf16."
        )
    if q.shape[-1] not in V3_5_FP8.tiles:
        raise ValueError(
            f"head dim {q.shape[-1]} is not supported for float8_e4m3fn; supported: {list(V3_5_FP8.head_dims)}"
        )


def kernel_entry(D: int, causal: bool, Nk: int):
    """v3.5's entry for a call: 192-key blocks at D = 128 for long calls without a mask
    (versions.V3_5_FP8_WIDE, versions.long_plain), else V3_5_FP8's tiles."""
    return V3_5_FP8_WIDE if long_plain(causal, Nk) and D in V3_5_FP8_WIDE.tiles else V3_5_FP8


def attention(q, k, v, softmax_scale: float, causal: str | None, layout: str, descales, with_lse: bool, out=None,
              lse=None, vt=None):  # fmt: skip
    """O (bf16, q's layout) and lse ((B, H, Nq) float32, or None) of e4m3 q, k, v in ``layout``.
    descales: (descale_q, descale_k, descale_v) as flash_attn_func takes them.  out / lse: buffers
    to write (the tests hand in NaN-poisoned ones).  vt: V already as v_transposed made it (the
    benchmark times the kernel without the copy).

    As api._forward's prepared calls: a call whose shapes, strides, devices and options were seen
    before (and whose pointers are 16-byte aligned) goes straight to its _Launch, skipping the
    checks and arithmetic that cannot change; the descales are checked on every call."""
    key = None
    if out is None and lse is None and vt is None:
        key = (q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(), q.get_device(), k.get_device(),
               v.get_device(), softmax_scale, causal, layout, with_lse)  # fmt: skip
        call = _CALLS.get(key)
        if call is not None and not (q.data_ptr() | k.data_ptr() | v.data_ptr()) & 15:
            return call.run(q, k, v, descales)
    _, (B, H, Nq, D), qs, (_, H_kv, Nk, _), ks, _, device_index = api._validate(q, k, v, None, None, layout)
    cc = api._nvrtc.device_arch(device_index)
    if not V3_5_FP8.runs_on(cc[0] * 10 + cc[1]):
        raise ValueError(
            f"float8_e4m3fn inputs run on sm_90 (Hopper's 8-bit wgmma, v3.5); this GPU is sm_{cc[0]}{cc[1]}"
        )
    if B * H * Nq == 0 or Nk == 0:
        _descale_table(*descales, B, H_kv, q.device)  # (checked all the same)
        return api._outputs(out, lse, api._out_shape(B, H, Nq, D, layout), torch.bfloat16, (B, H, Nq), with_lse,
                            q.device, True)  # fmt: skip
    # 16-byte rows: TMA reads q and k, the V^T copy reads v by 16-byte loads (a view that breaks
    # that is copied once, into fresh memory, as the other paths do).
    if not all(api._rows_aligned(t, api._bhnd(t, layout)[1]) for t in (q, k) + (() if vt is not None else (v,))):
        key = None
        q, k, v = api._aligned_copies((q, k, v), layout)
        qs, ks = api._bhnd(q, layout)[1], api._bhnd(k, layout)[1]
    call = _Launch((B, H, Nq, D, H_kv, Nk), qs, ks, softmax_scale, causal, layout, with_lse, device_index)
    if key is not None:
        api.remember(_CALLS, key, call, api._CALLS_MAX)
    return call.run(q, k, v, descales, out, lse, vt)


class _Launch:
    """One prepared FP8 call: v3.5's kernel for the shape, its grid and the template of its
    arguments; each run fills in the pointers, the descale table and O's strides, and looks up
    the tensor maps by pointer (the caching allocator hands V^T's copy the same memory call after
    call, so the maps are encoded once per set of buffers)."""

    def __init__(self, dims, qs, ks, softmax_scale, causal, layout, with_lse, device_index):
        B, H, Nq, D, H_kv, Nk = dims
        entry = kernel_entry(D, causal is not None, Nk)
        self.kern = api.entry_kernel(entry.name, "float8_e4m3fn", D, causal is not None, device_index)
        self.Br, self.Bc = entry.tiles[D]
        self.B, self.H_kv, self.layout, self.device_index = B, H_kv, layout, device_index
        self.q_layout, self.k_layout = ((B, H, Nq, D), qs), ((B, H_kv, Nk, D), ks)
        self.out_shape, self.lse_shape, self.with_lse = api._out_shape(B, H, Nq, D, layout), (B, H, Nq), with_lse
        # Persistent (v3.6's walk), the kernel reading B * H from bh_count.
        Tr, BH = -(-Nq // self.Br), B * H
        self.grid = api.persistent_ctas(Tr, BH, causal is not None, device_index)
        offset = 0 if causal != "bottom_right" else Nk - Nq
        # V^T's and O's strides, like the pointers, are filled in per call
        self.args = _params.fwd_args(Nq, Nk, H, H_kv, (qs, ks, (0, 0, 0), (0, 0, 0)), softmax_scale, offset)
        self.args += _params.room(descale=0, bh_count=BH)
        self.maps: dict[tuple[int, int, int], bytes] = {}

    def run(self, q, k, v, descales, out=None, lse=None, vt=None):
        table = _descale_table(*descales, self.B, self.H_kv, q.device)
        out, lse = api._outputs(out, lse, self.out_shape, torch.bfloat16, self.lse_shape, self.with_lse, q.device,
                                False)  # fmt: skip
        if vt is None:
            vt = v_transposed(api._heads_view(v, v, v, self.layout)[0])
        ptrs = q.data_ptr(), k.data_ptr(), vt.data_ptr()
        maps = self.maps.get(ptrs)
        if maps is None:
            maps = _tensor_maps(*ptrs, self.q_layout, self.k_layout, (vt.shape, vt.stride()), self.Br, self.Bc)
            api.remember(self.maps, ptrs, maps, api._MAPS_MAX)
        args = self.args.copy()
        args[0:5] = *ptrs, out.data_ptr(), 0 if lse is None else lse.data_ptr()
        args[_VT_STRIDES] = vt.stride()[:3]
        args[_O_STRIDES] = api._bhnd(out, self.layout)[1][:3]
        args[_DESCALE] = table.data_ptr()
        self.kern.launch(api._current_stream(self.device_index), self.grid, 1, args, maps)
        return out, lse


_CALLS: dict[tuple, _Launch] = {}
_FIELDS = [name for name, _ in _params.FWD_FIELDS]
_VT_STRIDES = slice(_FIELDS.index("v_sb"), _FIELDS.index("v_sn") + 1)  # (v's strides carry V^T's)
_O_STRIDES = slice(_FIELDS.index("o_sb"), _FIELDS.index("o_sn") + 1)
_DESCALE = _FIELDS.index("descale")


def _tensor_maps(q_ptr, k_ptr, vt_ptr, q_layout, k_layout, vt_layout, Br: int, Bc: int) -> bytes:
    """v3.5's TmaMaps: q and k as (B, H, N, D / 2) 16-bit tensors (the copy engine moves bytes; as
    16-bit columns the boxes and swizzles are v3.3's: min(D, 128) bytes wide, the 128-byte swizzle,
    or the 64-byte one at D = 64) with Br and Bc rows, then V^T (B, H_kv, D, Nk_pad / 2) with boxes
    of 128 key bytes x D rows (a panel, the 128-byte swizzle; Bc / 128 of them a K/V block; 64 bytes
    and the 64-byte swizzle where Bc is no multiple of 128); maps 3..5 (v3.3's narrow
    panels) repeat them, unused.  Layouts: (shape, strides in elements) in (B, H, N, D) order."""
    D = q_layout[0][3]
    cols = min(D, 128) // 2
    vt_panel = 128 if Bc % 128 == 0 else 64  # key bytes a V^T panel (v3_3_wgmma.cu's VT_PANEL)
    half = lambda layout: ((*layout[0][:3], layout[0][3] // 2), layout[1])
    maps = [
        api.tensor_map(q_ptr, half(q_layout), "bfloat16", 1, (cols, Br)),
        api.tensor_map(k_ptr, half(k_layout), "bfloat16", 1, (cols, Bc)),
        api.tensor_map(vt_ptr, half(vt_layout), "bfloat16", 1, (vt_panel // 2, D)),
    ]
    return b"".join(maps * 2)


def descale_tensors(descales, device) -> list:
    """The descale factors as the custom op takes them: None or a float32 tensor (a Python number
    becomes a one-element tensor)."""
    return [
        d if d is None or isinstance(d, torch.Tensor) else torch.tensor([float(d)], device=device) for d in descales
    ]


@torch.library.custom_op("tileattn::fwd_fp8", mutates_args=(), device_types="cuda")
def _fwd_fp8_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    descale_q: torch.Tensor | None,
    descale_k: torch.Tensor | None,
    descale_v: torch.Tensor | None,
    softmax_scale: float,
    causal: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """tileattn::fwd_fp8: flash_attn_func's FP8 path under torch.compile (flash-attn's layout;
    causal coded as tileattn::fwd's) -> (O bf16, lse (B, H, Nq))."""
    check_inputs(q, k, v, None, None)  # (flash_attn_func checked it; a direct call has not)
    mode = api._CAUSAL_OF_CODE[causal]
    return attention(q, k, v, softmax_scale, mode, "bnhd", (descale_q, descale_k, descale_v), True)


@_fwd_fp8_op.register_fake
def _(q, k, v, descale_q, descale_k, descale_v, softmax_scale, causal):
    B, Nq, H, _ = q.shape
    return q.new_empty(q.shape, dtype=torch.bfloat16), q.new_empty((B, H, Nq), dtype=torch.float32)
