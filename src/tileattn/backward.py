"""The backward pass's launch path: D_i preprocessing, then a backward rung (versions.BWD_VERSIONS),
then the float32 accumulators converted to the inputs' dtype and layout.

Registered as the autograd formula of the forward custom op tileattn::fwd: the forward saves q,
k, v, O and lse (nothing N x N), the backward runs tileattn::bwd.  lse is a non-differentiable
output (as in flash-attn).  Extra memory beyond the gradients: D_i (B*H*Nq floats) and the float32
dQ/dK/dV accumulators, converted to the inputs' dtype and layout at the end (deterministic GQA
keeps dK/dV per query head until torch sums each group).
"""

from __future__ import annotations

import torch

from . import _nvrtc, api, serving
from ._params import BWD_ARGS
from .versions import (
    BWD_DQ_CONVERT,
    BWD_PRE_ROWS,
    BWD_PREPROCESS,
    BWD_V2_VARIANTS,
    BWD_V2_VARIANTS_VARLEN,
    BWD_V2_VARLEN,
    BWD_V5_VARIANTS,
    BWD_V5_VARIANTS_VARLEN,
    BWD_V5_VARLEN,
    BWD_VERSIONS,
    KERNEL_ENTRIES,
)


def attention_backward(
    q,
    k,
    v,
    out,
    lse,
    dout,
    softmax_scale: float,
    causal: str | None,
    layout: str,
    version: str | None = None,
    deterministic: bool = False,
    float32_grads: bool = False,
    precision: str | None = None,
    variants: tuple | None = None,
    varlen: tuple | None = None,
):
    """dq, dk, dv of attention(q, k, v) for the upstream gradient ``dout``, given the forward's
    ``out`` and ``lse`` ((B, H, Nq) float32).  All in ``layout`` ("bnhd" or "bhnd"), dq like q,
    dk and dv like k and v.  GQA: dk, dv are summed over each group of query heads.
    deterministic: dQ is added in a fixed K/V-block order and dK, dV are kept per query head and
    summed by torch, so two calls give bitwise-identical gradients (bwd_common.cuh).
    float32_grads: return the float32 accumulators (for a caller that sums several calls' gradients,
    as the ring of tileattn.distributed does) instead of rounding them to the inputs' dtype.
    precision: the forward's (FP32 inputs): "tf32" picks, and is needed by, the TF32 rung.
    variants: the forward's score variants as the kernels take them, ((left, right), softcap,
    alibi_slopes) from serving._variants with softcap through serving._kernel_softcap:
    special_rung's kernel runs (bwd_v5_variants on Hopper at D = 64, 128), or the one ``version``
    names.
    varlen: (cu_seqlens_q, cu_seqlens_k) int32 on q's device: q, k, v, out, dout are packed
    sequences as a "bnhd" batch of one, (1, total, heads, D), and lse (1, H, total_q); special_rung's
    kernel (or the one ``version`` names) runs over every sequence in one launch
    (csrc/bwd_common.cuh's bwd_varlen_sequence), each with its own lengths and, bottom-right, its
    own causal offset.  Not deterministic.  Rows that no sequence holds get gradient 0."""
    if variants is not None and softmax_scale < 0:
        # bwd_v2_variants folds a scale >= 0 into its exponent, as the forward (which ran on -q at
        # |scale|, serving._prepare_scale_and_rows): the same here, then dq negated back (exact).
        dq, dk, dv = attention_backward(
            -q, k, v, out, lse, dout, -softmax_scale, causal, layout, version, deterministic, float32_grads,
            precision, variants, varlen,
        )  # fmt: skip
        return -dq, dk, dv
    dtype, (B, H, Nq, D), _, (_, H_kv, Nk, _), _, _, device_index = api._validate(q, k, v, None, None, layout)
    if varlen is not None or variants is not None:
        # (no deterministic mode: the variants' window K/V blocks do not all add into a Q block
        # from j = 0, which dq_semaphore's ordered adds wait for; serving runs deterministic
        # variable-length calls a sequence at a time)
        what = "variable-length" if varlen is not None else "score variants'"
        if deterministic or (varlen is not None and B != 1):
            raise ValueError(f"the {what} backward has no deterministic mode (and packed rows are a batch of one)")
        kinds = (varlen is not None, variants is not None)
        rungs = [e.name for e in _SPECIAL_RUNGS[kinds]]
        if version is not None and version not in rungs:
            raise ValueError(f"the {what} backward runs one of {rungs}, got version={version!r}")
        entry = KERNEL_ENTRIES[version] if version else special_rung(dtype, D, *kinds, device_index)
        name = entry.name
    else:
        name = version or default_rung(dtype, D, deterministic, device_index, precision)
        entry = BWD_VERSIONS[name]
    if dtype not in entry.dtypes or D not in entry.tiles:
        raise ValueError(
            f"backward rung {name!r} takes {entry.dtypes} at head dims {entry.head_dims}, got {dtype} D={D}"
        )
    if entry.precision == "tf32" and precision != "tf32":
        raise ValueError(f"backward rung {name!r} computes with TF32 products (~1e-3 error): pass precision='tf32'")
    if deterministic and not entry.deterministic:
        have = [n for n, e in BWD_VERSIONS.items() if e.deterministic]
        raise ValueError(f"backward rung {name!r} has no deterministic mode ({', '.join(have)} have)")
    for arg, t in (("out", out), ("dout", dout)):
        if t.shape != q.shape or t.dtype != q.dtype or t.device != q.device or t.stride(-1) != 1:
            raise ValueError(f"{arg} must match q (shape {tuple(q.shape)}, {q.dtype}, head dim contiguous)")
    if lse.shape != (B, H, Nq) or lse.dtype != torch.float32 or not lse.is_contiguous():
        raise ValueError(f"lse must be a contiguous float32 tensor of shape {(B, H, Nq)}, got {tuple(lse.shape)}")
    # The kernels copy 16-byte vectors (cp.async): a tensor whose rows do not start on 16-byte
    # boundaries (an odd offset or stride) is copied once into fresh memory, as in the forward.
    q, k, v, out, dout = api._aligned_copies((q, k, v, out, dout), layout)
    qs, ks, vs, os_, dos = (api._bhnd(t, layout)[1] for t in (q, k, v, out, dout))
    f32 = dict(dtype=torch.float32, device=q.device)
    Br, Bc = entry.tiles[D]
    launched = B * H * Nq > 0 and Nk > 0
    cu_q, cu_k = varlen if varlen is not None else (None, None)
    num_seqs = 0 if cu_q is None else cu_q.shape[0] - 1
    # A blocked rung's dQ chunks cover whole Q blocks: Br rows each, padding past Nq included
    # (packed sequences: whole Q blocks of each, numbered as bwd_common.cuh's varlen_block, at most
    # ceil(Nq / Br) + num_seqs).  Zeroed by the D_i kernel where the rung runs (bwd_preprocess).
    chunks = -(-Nq // Br) + num_seqs
    dq_acc = (torch.empty if launched else torch.zeros)((B, H, chunks * Br if entry.dq_blocked else Nq, D), **f32)
    # dK, dV: without GQA (and unless float32 is asked for) the kernels write the gradients
    # themselves, in k's dtype and the caller's layout (one writer each: bwd_common.cuh's
    # store_dkdv); otherwise float32 accumulators, zeroed where a GQA group's query heads add into one
    # K/V head's slice (or where no kernel runs).
    direct = H == H_kv and not float32_grads
    if direct:
        shape = (B, Nk, H, D) if layout == "bnhd" else (B, H, Nk, D)
        # (variable-length: zeros, for the rows no sequence holds)
        alloc = torch.empty if launched and varlen is None else torch.zeros
        dk_out, dv_out = (alloc(shape, dtype=k.dtype, device=q.device) for _ in "kv")
        acc_ptrs, out_fields = (0, 0), (dk_out.data_ptr(), dv_out.data_ptr(), *api._bhnd(dk_out, layout)[1][:3])
    else:
        alloc = torch.empty if launched and varlen is None and (H == H_kv or deterministic) else torch.zeros
        dk_acc, dv_acc = (alloc((B, H if deterministic else H_kv, Nk, D), **f32) for _ in "kv")
        acc_ptrs, out_fields = (dk_acc.data_ptr(), dv_acc.data_ptr()), (0,) * 5
    semaphore = torch.zeros(B * H * -(-Nq // Br), dtype=torch.int32, device=q.device) if deterministic else None
    split_amax = None
    if launched and entry.split_operands:  # bwd_v2.3: q, k, v, dO as scaled fp16 halves
        (q_split, k_split, v_split, do_split), split_amax = api._split_blocks(
            (q, k, v, dout), [api._bhnd(t, layout) for t in (q, k, v, dout)], device_index
        )
    if launched:
        Di = torch.empty((B, H, Nq), **f32)
        # The forward's alignment: the variants place rows at i + Nk - Nq without a causal mask too.
        bottom_right = not (causal == "top_left" or (causal is None and variants is None))
        offset = Nk - Nq if bottom_right and varlen is None else 0  # (variable-length: the kernel's, per sequence)
        (left, right), softcap, slopes = variants if variants is not None else ((-1, -1), 0.0, None)
        tail = None if varlen else _tail_plan(entry, causal, deterministic, direct or H != H_kv, B * H, Nq, Nk, Br, Bc,
                                              device_index)  # fmt: skip
        # The tail's parts add dK, dV into a float32 [dK | dV] tile a K/V block, then one int count
        # each (bwd_tail_finish), zeroed by the D_i kernel (its length rounded up to whole float4s).
        tail_acc = torch.empty(-(-tail[2] * (2 * Bc * D + 1) // 4) * 4 if tail and direct else 0, **f32)
        # fmt: off
        args = [q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), dout.data_ptr(), lse.data_ptr(),
                Di.data_ptr(), dq_acc.data_ptr(), *acc_ptrs, 0 if semaphore is None else semaphore.data_ptr(),
                0 if split_amax is None else split_amax.data_ptr(), Nq, Nk, H, H // H_kv,
                *qs[:3], *ks[:3], *vs[:3], *os_[:3], *dos[:3], *out_fields, softmax_scale, offset, 0, 0, 0,
                tail_acc.data_ptr(), dq_acc[0, 0].numel(), tail_acc.numel(),
                left, right, softcap, 0 if slopes is None else slopes.data_ptr(), serving._alibi_stride(slopes),
                0 if cu_q is None else cu_q.data_ptr(), 0 if cu_k is None else cu_k.data_ptr(), num_seqs,
                int(bottom_right)]
        # fmt: on
        stream = api._current_stream(device_index)
        # D_i over query rows (its CAUSAL template argument is unused: one instantiation), then the
        # rung over K/V blocks of Bc keys.
        launches = (
            (BWD_PREPROCESS.name, False, -(-Nq // BWD_PRE_ROWS)),
            (name, causal is not None, -(-Nk // Bc)),
        )
        maps = None
        if entry.split_operands:  # (B, 2 x heads, N, D) fp16: the maps' head h_lo holds head h's lo half
            split_strides = [api._bhnd(t, "bhnd")[1] for t in (q_split, k_split, v_split, do_split)]
            maps = _tensor_maps(
                q_split, k_split, v_split, do_split, (B, 2 * H, Nq, D), (B, 2 * H_kv, Nk, D), *split_strides, Br, Bc
            )
        elif entry.tensor_maps:  # bwd_v4 .. bwd_v6 load Q, dO, K, V through the copy engine
            maps = _tensor_maps(q, k, v, dout, (B, H, Nq, D), (B, H_kv, Nk, D), qs, ks, vs, dos, Br, Bc)
        for kernel, is_causal, grid_x in launches:
            kern = api.entry_kernel(kernel, dtype, D, is_causal, device_index)
            rung = kernel == name
            tmaps = maps if rung else None
            if rung and varlen is not None:  # every sequence's K/V blocks (bwd_varlen_sequence), a row a head
                kern.launch(stream, -(-Nk // Bc) + num_seqs, H, args, tmaps)
                continue
            if rung and tail:  # one 1-D launch: the main order's blocks, then the parts of its last ones
                tail_from, segments, blocks = tail
                args[_TAIL_FROM], args[_TAIL_SEGMENTS] = tail_from, segments
                kern.launch(stream, tail_from + blocks * segments, 1, args, tmaps)
                continue
            for bh_offset in range(0, B * H, api._GRID_Y_MAX):
                args[_BH_OFFSET] = bh_offset
                kern.launch(stream, grid_x, min(api._GRID_Y_MAX, B * H - bh_offset), args, tmaps)

    if deterministic and H != H_kv:  # per query head -> per K/V head, summed by torch in a fixed order
        dk_acc, dv_acc = (a.view(B, H_kv, H // H_kv, Nk, D).sum(2) for a in (dk_acc, dv_acc))

    def like(acc, t):  # (B, H, N, D) float32 -> t's dtype (or float32), in the caller's layout: one copy at most
        acc = acc.transpose(1, 2) if layout == "bnhd" else acc
        dtype = torch.float32 if float32_grads else t.dtype
        # (.to of the same dtype returns a transposed view as it is, whatever the memory format asked)
        return acc.contiguous() if acc.dtype == dtype else acc.to(dtype, memory_format=torch.contiguous_format)

    if entry.dq_blocked:
        dq_dtype = torch.float32 if float32_grads else q.dtype
        dq_acc = _dq_from_blocks(dq_acc, Nq, layout, dq_dtype, device_index, cu_q, Br)
    if direct:
        return like(dq_acc, q), dk_out, dv_out
    return like(dq_acc, q), like(dk_acc, k), like(dv_acc, v)


_BWD_NAMES = [n for n, _ in BWD_ARGS]
_BH_OFFSET, _TAIL_FROM, _TAIL_SEGMENTS = (_BWD_NAMES.index(n) for n in ("bh_offset", "tail_from", "tail_segments"))
# A tail part takes at least _TAIL_PART_Q_BLOCKS Q blocks, and only K/V blocks of at least
# _TAIL_Q_BLOCKS are split: at N=1024 (8 or 16 Q blocks a K/V block) the tail measured 1-3% slower
# than none on an H200 as a second launch, with parts of one or two Q blocks and of four, and
# inside the main launch 4% slower at D=64, the same at D=128 (bench/NOTES.md): the parts' extra
# prologues and dK / dV adds cost about what a short block's wave saves.
_TAIL_PART_Q_BLOCKS, _TAIL_Q_BLOCKS = 4, 32


def _tail_plan(entry, causal, deterministic, adds_dkdv, BH, Nq, Nk, Br, Bc, device_index):
    """The tail (csrc/bwd_common.cuh's bwd_work) as (tail_from, segments, blocks), or None.
    Without a causal mask every K/V block takes the same time, so where the last of the
    ceil(B*H*Tc / SMs) waves is at most half full (4 blocks of 132 at every shape of the bwd
    suite), its `blocks` blocks (from `tail_from` in the launch's linear order) run, after the
    others in the same launch, each over `segments` thread blocks of 1/segments of its Q blocks (at least
    _TAIL_PART_Q_BLOCKS each, and only K/V blocks of at least _TAIL_Q_BLOCKS), and the SMs no
    longer idle for a block's time at the end.  Only where the parts can add their dK, dV
    (adds_dkdv: the rung writes the gradients, through bwd_tail_finish, or a GQA group's zeroed
    accumulators), not in deterministic mode (the adds' order), and for one chunk of heads
    (B*H <= 65535)."""
    if not entry.tail_split or causal is not None or deterministic or not adds_dkdv or BH > api._GRID_Y_MAX:
        return None
    sms = _nvrtc.sm_count(device_index)
    Tc, Tr = -(-Nk // Bc), -(-Nq // Br)
    blocks = BH * Tc % sms
    segments = min(sms // blocks, Tr // _TAIL_PART_Q_BLOCKS) if blocks else 0
    if blocks == 0 or 2 * blocks > sms or segments < 2 or Tr < _TAIL_Q_BLOCKS:
        return None
    return BH * Tc - blocks, segments, blocks


def _dq_from_blocks(
    acc: torch.Tensor, Nq: int, layout: str, dtype: torch.dtype, device_index: int, cu_seqlens_q=None, Br: int = 64
) -> torch.Tensor:
    """A blocked rung's dQ accumulator, (B, H, Q blocks x Br rows, D) float32 holding each Q block's
    64 x 64 tiles in the wgmma accumulator's order (csrc/bwd_dq_convert.cu), as (B, H, Nq, D) of
    ``dtype`` (for "bnhd" a view of (B, Nq, H, D) memory, which like() turns back without copying),
    by bwd_dq_convert (testing.dq_from_blocks is its model).  cu_seqlens_q: bwd_v5_varlen's packed
    sequences (a batch of one), whose chunks of Br rows are numbered as reference.varlen_kv_blocks
    numbers K/V blocks; rows no sequence holds are 0."""
    B, H, Npad, D = acc.shape
    alloc = torch.empty if cu_seqlens_q is None else torch.zeros
    out = alloc((B, Nq, H, D) if layout == "bnhd" else (B, H, Nq, D), dtype=dtype, device=acc.device)
    strides = api._bhnd(out, layout)[1]
    tiles_per_bh = Npad // 64 * (D // 64)
    if B * H * Nq:
        kern = api.entry_kernel(BWD_DQ_CONVERT.name, str(dtype).removeprefix("torch."), D, False, device_index)
        varlen = (0, 0) if cu_seqlens_q is None else (cu_seqlens_q.data_ptr(), cu_seqlens_q.shape[0] - 1)
        args = [acc.data_ptr(), out.data_ptr(), Nq, H, tiles_per_bh, *strides[:3], *varlen, Br]
        kern.launch(api._current_stream(device_index), B * H * tiles_per_bh, 1, args)
    return out.transpose(1, 2) if layout == "bnhd" else out


def default_rung(dtype: str, D: int, deterministic: bool, device_index: int, precision: str | None = None) -> str:
    """The rung autograd runs: on sm_90 at D = 64 and 128 bwd_v5 (wgmma, warp-specialised, dQ by
    bulk reduction: 1.1-1.4x bwd_v4 on an H200, and its deterministic mode 3-6x faster than
    bwd_v3's, bench/results/bwd_n8192.json), at D = 256 bwd_v6 (the head dim split between its
    warpgroups) unless ``deterministic`` (it has no such mode); bwd_v2 (mma.sync) elsewhere for
    fp16 / bf16; for FP32 bwd_v2.3 (3xFP16 on wgmma) on sm_90 at D = 64 and 128 unless
    ``deterministic``, else bwd_v2.2 (3xTF32 on mma.sync), and bwd_v2.2_tf32 when the forward ran
    with precision="tf32"."""
    cc = _nvrtc.device_arch(device_index)
    arch = cc[0] * 10 + cc[1]
    if dtype == "float32":
        if precision == "tf32":
            return "bwd_v2.2_tf32"
        entry = BWD_VERSIONS["bwd_v2.3"]
        return "bwd_v2.3" if entry.runs_on(arch) and D in entry.tiles and not deterministic else "bwd_v2.2"
    for name in ("bwd_v5", "bwd_v6"):
        entry = BWD_VERSIONS[name]
        if entry.runs_on(arch) and D in entry.tiles and (entry.deterministic or not deterministic):
            return name
    return "bwd_v2"


# (varlen, variants) -> (the Hopper kernel, the mma.sync one for every other arch and head dim)
_SPECIAL_RUNGS = {
    (True, False): (BWD_V5_VARLEN, BWD_V2_VARLEN),
    (True, True): (BWD_V5_VARIANTS_VARLEN, BWD_V2_VARIANTS_VARLEN),
    (False, True): (BWD_V5_VARIANTS, BWD_V2_VARIANTS),
}


def special_rung(dtype: str, D: int, varlen: bool, variants: bool, device_index: int):
    """The backward kernel of packed sequences (flash_attn_varlen_func) and of the score variants
    (a window, softcap, ALiBi), which the ladder's rungs do not take: bwd_v5's body (wgmma, TMA;
    bwd_v5_varlen, bwd_v5_variants, bwd_v5_variants_varlen) on sm_90 at its head dims (64, 128),
    else bwd_v2's (mma.sync; bwd_v2_varlen, bwd_v2_variants, bwd_v2_variants_varlen) at every head
    dim of the forward paths."""
    hopper, other = _SPECIAL_RUNGS[varlen, variants]
    cc = _nvrtc.device_arch(device_index)
    if hopper.runs_on(cc[0] * 10 + cc[1]) and dtype in hopper.dtypes and D in hopper.tiles:
        return hopper
    return other


def _tensor_maps(q, k, v, dout, q_shape, kv_shape, qs, ks, vs, dos, Br, Bc) -> bytes:
    """A TMA backward rung's TmaMaps (common.cuh; bwd_v4_ws.cu's body reads them): q (map 0) and dO
    (map 3) in boxes of 64 columns x Br rows, k (1) and v (2) of Bc rows; maps 4, 5 repeat k, v
    (the rungs take whole 64-column panels, so no narrow maps)."""
    dtype, esize = api._DTYPES[q.dtype], q.element_size()
    one = lambda t, shape, stride, rows: api.tensor_map(t.data_ptr(), (shape, stride), dtype, esize, (64, rows))
    k_map, v_map = one(k, kv_shape, ks, Bc), one(v, kv_shape, vs, Bc)
    return b"".join((one(q, q_shape, qs, Br), k_map, v_map, one(dout, q_shape, dos, Br), k_map, v_map))


@torch.library.custom_op("tileattn::bwd", mutates_args=(), device_types="cuda")
def _bwd_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    dout: torch.Tensor,
    softmax_scale: float,
    causal: int,
    layout: str,
    deterministic: bool,
    precision: str | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """tileattn::bwd(q, k, v, O, lse, dO, softmax_scale, causal, layout, deterministic, precision) ->
    (dq, dk, dv), arguments as tileattn::fwd's; dq, dk, dv contiguous in ``layout``."""
    mode = api._CAUSAL_OF_CODE[causal]
    return attention_backward(
        q, k, v, out, lse, dout, softmax_scale, mode, layout, deterministic=deterministic, precision=precision
    )


@_bwd_op.register_fake
def _(q, k, v, out, lse, dout, softmax_scale, causal, layout, deterministic, precision):
    return tuple(t.new_empty(t.shape) for t in (q, k, v))


def _setup_context(ctx, inputs, output):
    q, k, v, softmax_scale, causal, layout, _version, precision, deterministic = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.args = (softmax_scale, causal, layout, deterministic, precision)
    ctx.mark_non_differentiable(lse)


def _backward(ctx, dout, _dlse):
    q, k, v, out, lse = ctx.saved_tensors
    softmax_scale, causal, layout, deterministic, precision = ctx.args
    if dout.stride(-1) != 1:  # the kernels read dO rows with a contiguous head dim
        dout = dout.contiguous()
    dq, dk, dv = torch.ops.tileattn.bwd(
        q, k, v, out, lse, dout, softmax_scale, causal, layout, deterministic, precision
    )
    return dq, dk, dv, None, None, None, None, None, None


api._fwd_op.register_autograd(_backward, setup_context=_setup_context)


@torch.library.custom_op("tileattn::bwd_variants", mutates_args=(), device_types="cuda")
def _bwd_variants_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    dout: torch.Tensor,
    alibi_slopes: torch.Tensor | None,
    softmax_scale: float,
    causal: int,
    window_left: int,
    window_right: int,
    softcap: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """tileattn::bwd_variants: the gradients of tileattn::fwd_variants (its arguments, then O, lse,
    dO as tileattn::bwd's) by bwd_v2_variants; dq, dk, dv contiguous in flash-attn's layout."""
    mode, window, softcap, slopes = serving._op_variants(q, k, causal, window_left, window_right, softcap, alibi_slopes)
    variants = (window, serving._kernel_softcap(softcap, softmax_scale), slopes)
    return attention_backward(q, k, v, out, lse, dout, softmax_scale, mode, "bnhd", variants=variants)


@_bwd_variants_op.register_fake
def _(q, k, v, out, lse, dout, alibi_slopes, softmax_scale, causal, window_left, window_right, softcap):
    return tuple(t.new_empty(t.shape) for t in (q, k, v))


def _setup_variants_context(ctx, inputs, output):
    q, k, v, alibi_slopes, softmax_scale, causal, window_left, window_right, softcap, _version = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, alibi_slopes)
    ctx.args = (softmax_scale, causal, window_left, window_right, softcap)
    ctx.mark_non_differentiable(lse)


def _backward_variants(ctx, dout, _dlse):
    q, k, v, out, lse, alibi_slopes = ctx.saved_tensors
    if dout.stride(-1) != 1:
        dout = dout.contiguous()
    dq, dk, dv = torch.ops.tileattn.bwd_variants(q, k, v, out, lse, dout, alibi_slopes, *ctx.args)
    return dq, dk, dv, None, None, None, None, None, None, None


serving._fwd_variants_op.register_autograd(_backward_variants, setup_context=_setup_variants_context)
