"""Correctness harness shared by ``python -m tileattn check`` and the GPU tests: fresh random
inputs, NaN-poisoned outputs, a float64 reference computed by torch on the same device."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os

import torch

from . import _nvrtc, _params, api
from .reference import causal_offset
from .versions import VERSIONS, arch_number


def compile_archs(archs: list[str]) -> list[str]:
    """The archs ("sm_80", "sm_90a", ...) the CPU compile tests cover: all of ``archs``, or only those
    whose number TILEATTN_TEST_ARCHS lists (space-separated, e.g. "90": .ci/run's second pass, under
    the newest NVRTC, checks the Hopper instantiations, the first pass every arch)."""
    only = os.environ.get("TILEATTN_TEST_ARCHS", "").split()
    return [a for a in archs if not only or str(arch_number(a)) in only]


@contextlib.contextmanager
def forced_special_rung(entry):
    """backward.special_rung answering `entry` (a versions.KernelEntry) inside the block: the probes
    time the kernel Hopper ran before (bwd_v2_varlen, bwd_v2_variants) beside the default."""
    from . import backward

    chosen = backward.special_rung
    backward.special_rung = lambda *args: entry
    try:
        yield
    finally:
        backward.special_rung = chosen


def compile_dtypes(entry, arch: str) -> tuple:
    """The dtypes an entry's (versions.KernelEntry's) CPU compile tests cover at `arch` ("sm_80" or
    "sm_90").  A kernel that runs on both and takes both 16-bit types compiles fp16 for sm_80 and
    bf16 for sm_90, whatever TILEATTN_TEST_ARCHS keeps: both types still compile, every head dim and
    causal mode still compiles at every arch, and the GPU tests run both types.  The two differ
    only in the MMA's type and the conversions: all 264 pairs compiled before this rule (NVRTC
    13.0, sm_80 and sm_90) had the same registers, stack and spills, and compiling each twice was
    about a fifth of CI's minutes.  A kernel of one arch keeps both."""
    dtypes = entry.dtypes
    if not (entry.runs_on(80) and entry.runs_on(90)) or not {"float16", "bfloat16"} <= set(dtypes):
        return dtypes
    drop = "bfloat16" if arch_number(arch) < 90 else "float16"
    return tuple(dt for dt in dtypes if dt != drop)


def compile_in_parallel(jobs, disassemble=()) -> None:
    """Fill the kernel cache with (source file, name expression, arch) jobs, one NVRTC per core (up
    to 16), for a test module that then compiles them one by one: its tests read the cubins from
    disk (the cache's file locks keep two workers from compiling a kernel twice).  The jobs also
    in `disassemble` come back disassembled too (_nvrtc.sass's memo), cuobjdump in the workers."""
    import multiprocessing
    import os
    from concurrent.futures import ProcessPoolExecutor

    from .__main__ import _compile_for_tests

    disassemble = set(disassemble)
    work = [(job, job in disassemble) for job in sorted(set(jobs) | disassemble)]
    workers = max(1, min(len(os.sched_getaffinity(0)), 16))
    # spawn: a worker never inherits a CUDA context (on a GPU machine the parent may hold one).
    with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        _nvrtc._sass_memo.update(r for r in pool.map(_compile_for_tests, work) if r is not None)


def compile_entry_spill_free(entry, dtype: str, D: int, causal: bool, arch: str = "sm_90a"):
    """One instantiation of a kernel outside the ladder (versions.KernelEntry) compiled for arch,
    held to no stack and no spills, its parameter block the one the host packs (_params.packer
    raises otherwise).  Returns (cubin, SASS text) for the caller's instruction checks."""
    cubin = _nvrtc.compile_kernel(entry.file, entry.name_expression(dtype, D, causal), arch)
    res = cubin.resources
    assert res["stack_bytes"] == res["spill_stores"] == res["spill_loads"] == 0, res
    assert not cubin.wgmma_serialized, f"ptxas serialised the wgmma of {entry.name} D={D} (C7514)"
    _params.packer(cubin.data, cubin.lowered_name, entry.tensor_maps, _params.ENTRY_ARGS[entry.fields], [])
    return cubin, _nvrtc.sass(cubin)


_DTYPE = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# Relative-error bound vs float64 per rung precision: FP32 rungs must stay at FP32 level.
# fp16/bf16 ("native") rungs: at most 2x PyTorch's own error at the same precision (its math
# backend on the same half-precision inputs, vs float64) plus this floor.
TOLERANCE = {"fp32": 1e-5, "tf32": 5e-3}
NATIVE_FLOOR = 1e-4
LSE_TOLERANCE = {"fp32": 1e-4, "tf32": 1e-2, "native": 1e-2}  # absolute, natural log


def tolerance(case, result: dict | None = None) -> float:
    precision = VERSIONS[case.version].precision
    if precision == "native":
        return 2 * result["torch_err"] + NATIVE_FLOOR
    return TOLERANCE[precision]


def lse_tolerance(case) -> float:
    """Absolute lse bound.  An error in a score S = scale * q.k is relative to |S|, so the lse's
    absolute error grows with the score's magnitude: the bounds are for scores at the default
    scale 1/sqrt(D) and grow with |softmax_scale| * sqrt(D) beyond it (the fuzz run found FP32
    rungs at 1.0-1.6e-4 with scale 1.5 at D=128, i.e. a relative error of ~3e-6 on lse ~ 50)."""
    precision = VERSIONS[case.version].precision
    if precision in ("fp32", "tf32") and case.scale is not None:
        return LSE_TOLERANCE[precision] * max(1.0, abs(case.scale) * math.sqrt(case.D))
    return LSE_TOLERANCE[precision]


def assert_serving_output(out, lse, o_ref, lse_ref, dtype) -> None:
    """The serving paths' check (flash_attn_with_kvcache, flash_attn_varlen_func) against float64
    (O, lse) on the CPU: no NaN, O within 1e-2 (bf16) / 2e-3 (fp16) relative, lse finite exactly
    where the reference's is (-inf: a row with no key) and within 1e-4 there."""
    assert not out.isnan().any()
    err = ((out.double().cpu() - o_ref).norm() / o_ref.norm()).item()
    assert err < (1e-2 if dtype == torch.bfloat16 else 2e-3), err
    finite = torch.isfinite(lse_ref)
    assert torch.equal(torch.isfinite(lse.cpu()), finite)
    torch.testing.assert_close(lse.cpu()[finite].double(), lse_ref[finite], rtol=1e-4, atol=1e-4)


def padded_prefill_and_step(model, impl: str, ids, mask, step) -> tuple[torch.Tensor, torch.Tensor]:
    """A transformers causal LM under attention implementation ``impl``: the float32 logits of a
    padded prefill (ids and its (B, N) attention mask) and of one decode step (step, (B, 1)) over
    the cache it left, with tileattn's warnings (a fallback) raised as errors."""
    import warnings

    model.set_attn_implementation(impl)
    with torch.no_grad(), warnings.catch_warnings():
        # tileattn's own warnings only (a fallback); transformers' deprecations differ by release
        warnings.filterwarnings("error", message="tileattn:")
        first = model(input_ids=ids, attention_mask=mask, use_cache=True)
        then = model(
            input_ids=step, attention_mask=torch.cat([mask, torch.ones_like(step)], 1),
            past_key_values=first.past_key_values,
        )  # fmt: skip
    return first.logits.float(), then.logits.float()


def attention_weight_grads(base, impl: str, dtype, **inputs) -> torch.Tensor:
    """A transformers causal LM's attention weights' gradients (its parameters under
    ``.self_attn.``, flattened, float32) after one ``loss.backward()`` on ``inputs`` (labels
    included), on a copy of ``base`` in ``dtype`` under attention implementation ``impl``, with
    tileattn's warnings (a fallback) raised as errors."""
    import copy
    import warnings

    model = copy.deepcopy(base).to(dtype)
    model.set_attn_implementation(impl)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="tileattn:")
        model(**inputs).loss.backward()
    return torch.cat([p.grad.float().flatten() for n, p in model.named_parameters() if ".self_attn." in n])


def assert_grads_as_close_as(ours, peer, reference):
    """Our gradients' relative error against ``reference`` (a float32 run) within 1.5x the peer's
    at our precision, plus 1e-3."""
    error = lambda g: ((g - reference).norm() / reference.norm()).item()
    assert error(ours) <= 1.5 * error(peer) + 1e-3, (error(ours), error(peer))


def cu_seqlens(lens, device="cuda") -> torch.Tensor:
    """flash_attn_varlen_func's (B + 1,) int32 row offsets of sequences of these lengths."""
    return torch.tensor([0, *torch.tensor(lens, dtype=torch.long).cumsum(0).tolist()], dtype=torch.int32, device=device)


def torch_error(q, k, v, softmax_scale: float, causal: str | None, ref_o) -> float:
    """PyTorch's own error at the inputs' precision: SDPA's math backend vs float64."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    k, v = _expand_kv(q, k, v)
    mask = _visible(q.shape[2], k.shape[2], causal, q.device)
    with sdpa_kernel([SDPBackend.MATH]):
        o = sdpa(q, k, v, attn_mask=mask, scale=softmax_scale)
    o = torch.nan_to_num(o.double(), nan=0.0)  # PyTorch gives NaN for rows that see no key
    return ((o - ref_o).norm() / ref_o.norm().clamp_min(1e-30)).item()


@dataclasses.dataclass(frozen=True)
class Case:
    version: str
    B: int = 2
    H: int = 3
    Nq: int = 128
    Nk: int | None = None  # None: same as Nq
    D: int = 64
    causal: str | None = None  # None, "top_left", "bottom_right"
    H_kv: int | None = None
    dtype: str = "float32"
    layout: str = "bhnd"  # "bhnd" (SDPA) or "bnhd" (flash-attn)
    noncontiguous: bool = False  # q/k/v as strided views into one packed qkv tensor
    scale: float | None = None  # softmax_scale; None: 1/sqrt(D)
    misaligned: bool = False  # q/k/v contiguous but one element past a 16-byte boundary

    def label(self) -> str:
        nk = self.Nk if self.Nk is not None else self.Nq
        return (
            f"{self.version} B={self.B} H={self.H}{'/' + str(self.H_kv) if self.H_kv else ''} "
            f"Nq={self.Nq} Nk={nk} D={self.D} {self.dtype} {self.causal or 'full'} {self.layout}"
            f"{' strided' if self.noncontiguous else ''}{' misaligned' if self.misaligned else ''}"
            f"{'' if self.scale is None else f' scale={self.scale}'}"
        )


def _expand_kv(q, k, v):
    """k, v with each K/V head repeated for its group of query heads ((B, H, N, D) layout)."""
    group = q.shape[1] // k.shape[1]
    return k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)


def _visible(Nq: int, Nk: int, causal: str | None, device):
    """(Nq, Nk) bool: which keys each query row sees (None when every row sees every key)."""
    offset = causal_offset(Nq, Nk, causal)
    if offset is None:
        return None
    i = torch.arange(Nq, device=device)[:, None]
    return torch.arange(Nk, device=device)[None, :] <= i + offset


def _scores(q, k, softmax_scale: float, causal: str | None, dtype=None):
    """scale * q k^T (k already expanded), in ``dtype`` (default q's), -inf where not visible."""
    S = (q @ k.transpose(-1, -2)).to(dtype or q.dtype) * softmax_scale
    visible = _visible(q.shape[2], k.shape[2], causal, q.device)
    return S if visible is None else S.masked_fill(~visible, -math.inf)


def reference(q, k, v, softmax_scale: float, causal: str | None):
    """float64 (O, lse) for (B, H, N, D) inputs; GQA by repeating k/v heads."""
    q, k, v = (t.double() for t in (q, k, v))
    k, v = _expand_kv(q, k, v)
    S = _scores(q, k, softmax_scale, causal)
    lse = torch.logsumexp(S, dim=-1)
    P = torch.exp(S - lse[..., None].nan_to_num(neginf=0.0))
    P = torch.where(torch.isfinite(lse)[..., None], P, torch.zeros_like(P))  # rows seeing no key: 0
    return P @ v, lse


# The floor under "2x PyTorch's own error", on RMS errors: a part relative to the gradient's RMS
# and an absolute part for exact gradients of 0 (N=1: dq = dk = 0; PyTorch's math backward gets 0
# exactly, FA2's dS = P (dP - D_i) gets the rounding of dO.v - dO.O).  The relative part is what
# FA2's backward inherits from the forward, which PyTorch's math backward does not: P rebuilt as
# exp(S - lse) from a float32 lse (~|lse| 6e-8) and D_i = rowsum(dO O) from the forward's O
# (~2e-6 relative in FP32), whose error reaches dS = P (dP - D_i) undivided; at scale 0.7, D=128
# (logits of ~8 standard deviations) dq's error measured 2e-5 of its RMS on an H200.  The absolute
# part grows with the head dim (dO.v - dO.O sums D products): at N=1, D=128 dq's RMS error
# measured 1.06e-6 on an H200 (9b67c3a) for an exact 0, so FP32's is 4e-6.
FLOOR = {"float32": (5e-5, 4e-6), "float16": (1e-3, 1e-4), "bfloat16": (1e-3, 1e-4)}  # relative, absolute


def rms(x) -> float:
    return (x.double().norm() / max(x.numel(), 1) ** 0.5).item()


def assert_within_torch_error(got, expected, torch_grads, dtype: str, what: str = ""):
    """Each of dq, dk, dv has the inputs' dtype and shape, no NaN, and an RMS error vs float64 at
    most twice PyTorch's math backward's at the same precision, plus FLOOR (issue 11)."""
    for name, g, e, r in zip(("dq", "dk", "dv"), got, expected, torch_grads):
        assert g.shape == e.shape and g.dtype == getattr(torch, dtype), f"{what}{name}: {g.shape} {g.dtype}"
        assert not g.isnan().any(), f"{what}{name} has NaN"
        err, torch_err = rms(g.double() - e), rms(r.double() - e)
        rel, absolute = FLOOR[dtype]
        limit = 2 * torch_err + rel * rms(e) + absolute
        assert err <= limit, f"{what}{name}: RMS error {err:.2e}, PyTorch's {torch_err:.2e}, limit {limit:.2e}"


def poison_allocator(nbytes: int):
    """Fill memory the caching allocator will hand out next with NaN, so a buffer the backward
    allocates (D_i, the converted gradients) and a kernel fails to write shows up as NaN."""
    torch.empty(nbytes // 4 + 1, device="cuda").fill_(float("nan"))


def _score_variants(S, causal: str | None, window, softcap: float, alibi_slopes):
    """flash_attn_func's score variants on (B, H, Nq, Nk) scaled scores S (-inf where the causal
    mask hides a key): row i at position p = i + offset (0 top-left, else Nk - Nq, also without a
    causal mask), softcap * tanh(S / softcap), then -slope |p - j|, then keys outside [p - left,
    p + right] hidden."""
    Nq, Nk = S.shape[-2:]
    pos = torch.arange(Nq, device=S.device)[:, None] + (0 if causal == "top_left" else Nk - Nq)
    key = torch.arange(Nk, device=S.device)[None, :]
    hidden = torch.isinf(S)
    if softcap:
        S = softcap * torch.tanh(S / softcap)
    if alibi_slopes is not None:
        slopes = alibi_slopes.to(S.device, S.dtype)
        slopes = slopes[None, :, None, None] if slopes.dim() == 1 else slopes[:, :, None, None]
        S = S - slopes * (pos - key).abs().to(S.dtype)
    left, right = window
    if left >= 0:
        hidden = hidden | (key < pos - left)
    if right >= 0 and causal is None:
        hidden = hidden | (key > pos + right)
    return S.masked_fill(hidden, -math.inf)


def reference_grads(
    q, k, v, dO, softmax_scale: float, causal: str | None, layout: str = "bhnd", dtype=None,
    window=(-1, -1), softcap: float = 0.0, alibi_slopes=None,
):  # fmt: skip
    """(dq, dk, dv) by autograd of PyTorch's math attention, in the tensors' layout ("bhnd" or
    "bnhd"): in float64 (dtype None, the ground truth) or in ``dtype`` with the softmax in at
    least float32, as SDPA's math backend computes it (PyTorch's own error at that precision).
    GQA by repeating k/v heads; a row that sees no key gets gradient 0 (masked_fill's backward).
    window, softcap, alibi_slopes: flash_attn_func's score variants (_score_variants)."""
    t = [x.detach().to(dtype or torch.float64).requires_grad_() for x in (q, k, v)]
    qq, kk, vv = (x.transpose(1, 2) for x in t) if layout == "bnhd" else t
    kk, vv = _expand_kv(qq, kk, vv)
    S = _scores(qq, kk, softmax_scale, causal, torch.promote_types(qq.dtype, torch.float32))
    if tuple(window) != (-1, -1) or softcap or alibi_slopes is not None:
        S = _score_variants(S, causal, window, softcap, alibi_slopes)
    O = torch.softmax(S, dim=-1).nan_to_num(0.0).to(vv.dtype) @ vv
    O = O.transpose(1, 2) if layout == "bnhd" else O
    O.backward(dO.to(O.dtype))
    return [x.grad for x in t]


def dq_from_blocks(
    acc: torch.Tensor, Nq: int, layout: str, dtype: torch.dtype, cu_seqlens_q=None, Br: int = 64
) -> torch.Tensor:
    """The model of csrc/bwd_dq_convert.cu in torch: a blocked dQ accumulator (B, H, padded rows, D),
    float32 64 x 64 tiles (row strips, then column tiles) in the wgmma accumulator's order
    [n8][warp][g][t][hh][e], as (B, H, Nq, D) of ``dtype`` (for "bnhd" a view of (B, Nq, H, D)).
    cu_seqlens_q (a batch of one: bwd_v5_varlen): chunk L of Br rows holds the rows of the
    sequence and first row reference.varlen_kv_blocks gives it, rows no sequence holds are 0."""
    B, H, Npad, D = acc.shape
    tiles = acc.view(B, H, Npad // 64, D // 64, 8, 4, 8, 4, 2, 2)  # b h strip wc | n8 warp g t hh e
    rows_cols = tiles.permute(0, 1, 2, 5, 8, 6, 3, 4, 7, 9).reshape(B, H, Npad, D)  # (warp hh g) (wc n8 t e)
    if cu_seqlens_q is not None:
        from .reference import varlen_kv_blocks

        cu = [int(c) for c in cu_seqlens_q]
        packed = torch.zeros(B, H, Nq, D, dtype=acc.dtype, device=acc.device)
        for L, block in enumerate(varlen_kv_blocks(cu, Br, Nq)):
            if block is not None:
                b, first = block
                n = min(Br, cu[b + 1] - cu[b] - first)
                packed[:, :, cu[b] + first : cu[b] + first + n] = rows_cols[:, :, L * Br : L * Br + n]
        rows_cols = packed
    out = rows_cols[:, :, :Nq].to(dtype)
    return out.transpose(1, 2).contiguous().transpose(1, 2) if layout == "bnhd" else out.contiguous()


def make_inputs(case: Case, generator: torch.Generator | None = None):
    """Fresh random q, k, v as (B, H, N, D) views, laid out as the case asks."""
    Nk = case.Nk if case.Nk is not None else case.Nq
    H_kv = case.H_kv or case.H
    dt = _DTYPE[case.dtype]
    kw = dict(device="cuda", dtype=dt, generator=generator)
    if case.noncontiguous:
        # One packed (B, N, H + 2*H_kv, D) buffer, with an extra padding head: q, k, v are
        # strided views of it (the layout of a fused QKV projection).
        assert case.Nq == Nk
        qkv = torch.randn(case.B, case.Nq, case.H + 2 * H_kv + 1, case.D, **kw)
        q, k, v = qkv[:, :, : case.H], qkv[:, :, case.H : case.H + H_kv], qkv[:, :, case.H + H_kv : -1]
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    shapes = ((case.B, case.H, case.Nq, case.D), (case.B, H_kv, Nk, case.D), (case.B, H_kv, Nk, case.D))
    if case.misaligned:  # contiguous views one element into their buffers: the API must copy them
        return tuple(torch.randn(math.prod(s) + 1, **kw)[1:].view(s) for s in shapes)
    return tuple(torch.randn(s, **kw) for s in shapes)


def run_case(case: Case, generator: torch.Generator | None = None) -> dict:
    """Run one case through the public API with NaN-poisoned outputs.  Returns errors vs float64."""
    q, k, v = make_inputs(case, generator)
    scale = 1.0 / math.sqrt(case.D) if case.scale is None else case.scale
    B, H, Nq, D = q.shape
    if case.layout == "bnhd":
        out = torch.full((B, Nq, H, D), math.nan, dtype=q.dtype, device="cuda")
    else:
        out = torch.full((B, H, Nq, D), math.nan, dtype=q.dtype, device="cuda")
    lse = torch.full((B, H, Nq), math.nan, dtype=torch.float32, device="cuda")
    inputs_before = [t.clone() for t in (q, k, v)]
    precision = "tf32" if VERSIONS[case.version].precision == "tf32" else None
    o, lse = api._attention(
        q, k, v, case.scale, case.causal, case.version, out_layout=case.layout, precision=precision, out=out, lse=lse
    )
    torch.cuda.synchronize()
    o = o.transpose(1, 2) if case.layout == "bnhd" else o
    ref_o, ref_lse = reference(q, k, v, scale, case.causal)
    finite = torch.isfinite(ref_lse)
    err = ((o.double() - ref_o).norm() / ref_o.norm().clamp_min(1e-30)).item()
    lse_err = (lse.double()[finite] - ref_lse[finite]).abs().max().item() if finite.any() else 0.0
    native = VERSIONS[case.version].precision == "native"
    return dict(
        rel_err=err,
        torch_err=torch_error(q, k, v, scale, case.causal, ref_o) if native else None,
        lse_err=lse_err,
        nan=bool(torch.isnan(o).any() or torch.isnan(lse).any()),
        lse_inf_ok=bool((torch.isinf(lse) == ~finite).all()),
        inputs_unchanged=all(torch.equal(a, b) for a, b in zip(inputs_before, (q, k, v))),
    )


def passed(case: Case, result: dict) -> bool:
    return (
        not result["nan"]
        and result["rel_err"] <= tolerance(case, result)
        and result["lse_err"] <= lse_tolerance(case)
        and result["lse_inf_ok"]
        and result["inputs_unchanged"]
    )


def check_cases(versions) -> list[Case]:
    """The awkward shapes ``python -m tileattn check`` runs for each rung (and each of its dtypes;
    for a rung with many head dims: the smallest, 64, 128 and the largest)."""
    cases = []
    for name in versions:
        entry = VERSIONS[name]
        dims = entry.head_dims
        if len(dims) > 4:
            dims = sorted({dims[0], 64, 128, dims[-1]} & set(dims))
        for dtype in entry.dtypes:
            for D in dims:
                for N in (1, 17, 129, 1000):
                    for causal in (None, "top_left"):
                        cases.append(Case(name, Nq=N, D=D, causal=causal, dtype=dtype))
            D = 64 if 64 in entry.head_dims else entry.head_dims[0]  # v3.6_wide: 128 only
            cases += [
                Case(name, Nq=100, Nk=300, D=D, causal="bottom_right", dtype=dtype),
                Case(name, Nq=300, Nk=100, D=D, causal="bottom_right", dtype=dtype),  # rows < 200: 0 and -inf
                Case(name, Nq=257, D=D, causal="top_left", layout="bnhd", noncontiguous=True, dtype=dtype),
                Case(name, B=1, H=8, H_kv=2, Nq=200, D=D, causal=None, dtype=dtype),
            ]
    return cases
