"""FP8 (e4m3) attention, v3.5 (csrc/v3_5_fp8.cu, tileattn/fp8.py).

CPU: every instantiation compiles without spills to 8-bit wgmma (QGMMA), e4m3 packing and TMA;
v3.3's plain kernels carry none of it; the key permutation of V^T matches the register layouts it
bridges (S's accumulator, the m64k32 A fragment); v_transposed, quantize_e4m3, round_e4m3 and the
NumPy reference; bad input raises naming the argument.
GPU: O and lse against float64 of the values the e4m3 inputs and descale factors stand for, with
O's error held to 2x that of a float64 model of the same rounding (P to e4m3, O to bf16) plus a
floor; awkward lengths, Nq != Nk both ways, GQA and MQA, every head dim, both causal alignments,
strided views, descale factors per (batch, KV head) and per tensor, NaN-poisoned outputs, B*H past
gridDim.y."""

import math

import numpy as np
import pytest
import torch

from tileattn import _nvrtc, _params, flash_attn_func, fp8, reference, scaled_dot_product_attention
from tileattn.testing import LSE_TOLERANCE, compile_entry_spill_free
from tileattn.versions import V3_5_FP8, V3_5_FP8_WIDE, V3_5_VT, VERSIONS

E4M3 = torch.float8_e4m3fn


@pytest.mark.parametrize("dtype,D,causal", V3_5_VT.instantiations())
def test_v_transpose_kernel_compiles(dtype, D, causal):
    cubin, sass = compile_entry_spill_free(V3_5_VT, dtype, D, causal)
    assert _params.block_threads(cubin.data, cubin.lowered_name) == 128
    assert "LDG.E.128" in sass and "STG.E.128" in sass  # 16-byte loads of V, stores of the assembled words
    assert "PRMT" in sass and "LDS.U8" not in sass  # byte transposes of shared words, no byte reads


@pytest.mark.parametrize(
    "entry,dtype,D,causal",
    [(e, *inst) for e in (V3_5_FP8, V3_5_FP8_WIDE) for inst in e.instantiations()],
    ids=lambda x: getattr(x, "name", str(x)),
)
def test_compiles_without_spills_to_8bit_wgmma(entry, dtype, D, causal):
    cubin, sass = compile_entry_spill_free(entry, dtype, D, causal)
    assert 0 < _params.smem_bytes(cubin) <= 227 * 1024
    # QGMMA: wgmma with 8-bit operands (S = Q K^T and P V, both E4M3); F2FP...E4M3: P rounded to
    # e4m3 two at a time; UTMALDG: the copy engine's tiles; bf16 output (F2FP.BF16).
    for op in ("QGMMA.64x", ".F32.E4M3.E4M3", "F2FP.SATFINITE.E4M3.F32", "UTMALDG", "USETMAXREG", "F2FP.BF16"):
        assert op in sass, f"no {op} in v3.5 D={D}"
    assert "HGMMA" not in sass and "LDL" not in sass and "STL" not in sass


def test_plain_v33_has_no_fp8_code():
    cubin = _nvrtc.compile_kernel("v3_3_wgmma.cu", VERSIONS["v3.3"].name_expression("bfloat16", 128, True), "sm_90a")
    sass = _nvrtc.sass(cubin)
    assert "QGMMA" not in sass and "E4M3" not in sass


def test_key_permutation_bridges_the_register_layouts():
    """Kernel side (v3_3_wgmma.cu, to_p_and_rescale under FP8): register r of k32 step c packs, as
    bytes j = 0..3, S's values i, i + 1, i + 4, i + 5 with i = 16 c + 8 (r / 2) + 2 (r % 2); S's
    value i of thread (g, t) is row g + 8 ((i % 4) / 2), key 8 (i / 4) + 2 t + (i % 2)
    (the accumulator layout).  The A fragment reads byte j of register r as row g + 8 (r % 2),
    k = 4 t + j + 16 (r / 2) (PTX ISA, wgmma m64k32 8-bit A).  So V^T's slot k of step c must
    hold the key S's value came from: key_permutation."""
    perm = fp8.key_permutation()
    assert sorted(perm) == list(range(32))
    for t in range(4):
        for c in range(4):  # Bc = 128: four k32 steps
            for r in range(4):
                for j, di in enumerate((0, 1, 4, 5)):
                    i = 16 * c + 8 * (r // 2) + 2 * (r % 2) + di
                    row, key = 8 * ((i % 4) // 2), 8 * (i // 4) + 2 * t + (i % 2)
                    slot = 4 * t + j + 16 * (r // 2)
                    assert row == 8 * (r % 2)
                    assert 32 * c + perm[slot] == key, (t, c, r, j)


@pytest.mark.parametrize("Nk", [1, 31, 32, 77])
def test_v_transposed(Nk):
    gen = torch.Generator().manual_seed(Nk)
    v = torch.randn(2, 3, Nk, 64, generator=gen).to(E4M3)
    vt = fp8.v_transposed(v.transpose(1, 2).contiguous().transpose(1, 2))  # strided (B, H, N, D) view
    pad = -Nk % 32
    assert vt.shape == (2, 3, 64, Nk + pad) and vt.dtype == torch.uint8 and vt.is_contiguous()
    keys = torch.as_tensor(np.arange(Nk + pad).reshape(-1, 32)[:, fp8.key_permutation()].reshape(-1))
    v8 = torch.cat([v.view(torch.uint8), torch.zeros(2, 3, pad, 64, dtype=torch.uint8)], dim=2)
    assert torch.equal(vt, v8[:, :, keys].transpose(2, 3))


def test_quantize_e4m3_and_round_e4m3():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 50, 4, 64, generator=gen) * torch.tensor([1e-3, 1.0, 30.0, 0.0]).view(1, 1, 4, 1)
    xq, descale = fp8.quantize_e4m3(x)
    assert xq.dtype == E4M3 and descale.shape == (2, 4) and descale.dtype == torch.float32
    back = xq.float() * descale.view(2, 1, 4, 1)
    amax = x.abs().amax(dim=(1, 3), keepdim=True).transpose(1, 2).clamp_min(1e-30)
    assert ((back - x).abs() <= amax.transpose(1, 2) * 2.0**-4 + 1e-30).all()  # half an ulp of 3 bits at the top
    assert (back[:, :, 3] == 0).all() and (descale[:, 3] == 1).all()  # an all-zero head
    y = torch.randn(10000, generator=gen).double() * 10.0 ** torch.randint(-4, 3, (10000,), generator=gen)
    y = y.clamp(-440, 440)
    assert np.array_equal(reference.round_e4m3(y.numpy()), y.to(E4M3).double().numpy())


def test_rotate_is_orthogonal_and_keeps_scores():
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 9, 3, 128, generator=gen, dtype=torch.float64), torch.randn(2, 9, 3, 128, generator=gen)
    S = torch.einsum("bihd,bjhd->bhij", q, k.double())
    Sr = torch.einsum("bihd,bjhd->bhij", fp8.rotate(q), fp8.rotate(k).double())
    assert fp8.rotate(k).dtype == torch.float32 and torch.allclose(S, Sr, atol=1e-4)
    assert not torch.allclose(fp8.rotate(q), fp8.rotate(q, seed=1))
    x = torch.zeros(1, 1, 1, 64)
    x[..., 5] = 8.0  # one outlier channel spreads over all 64: amax 8 -> 1
    assert torch.allclose(fp8.rotate(x).abs(), torch.ones(1, 1, 1, 64))
    with pytest.raises(ValueError, match="power-of-2 head dim"):
        fp8.rotate(torch.zeros(1, 1, 1, 96))


def test_quantize_attention_inputs():
    """Per (batch, KV head) factors, q's shared by its group; rotated, q and k give the same scores."""
    gen = torch.Generator().manual_seed(1)
    q, k, v = (
        torch.randn(2, 10, 8, 64, generator=gen),
        torch.randn(2, 12, 2, 64, generator=gen),
        torch.randn(2, 12, 2, 64, generator=gen),
    )
    for rotate_qk in (False, True):
        q8, k8, v8, ds = fp8.quantize_attention_inputs(q, k, v, rotate_qk=rotate_qk)
        assert q8.shape == q.shape and all(d.shape == (2, 2) for d in ds.values())
        deq = lambda t8, d: t8.float() * d.repeat_interleave(t8.shape[2] // 2, dim=1).view(2, 1, -1, 1)
        S = torch.einsum("bihd,bjhd->bhij", deq(q8, ds["descale_q"]), deq(k8, ds["descale_k"]).repeat_interleave(4, 2))
        S_ref = torch.einsum("bihd,bjhd->bhij", q, k.repeat_interleave(4, 2))
        assert ((S - S_ref).norm() / S_ref.norm()).item() < 0.1
        assert ((deq(v8, ds["descale_v"]) - v).norm() / v.norm()).item() < 0.05


def test_numpy_reference_dequantizes_per_kv_head():
    gen = np.random.default_rng(0)
    q, k, v = gen.standard_normal((2, 4, 5, 8)), gen.standard_normal((2, 2, 7, 8)), gen.standard_normal((2, 2, 7, 8))
    dq, dk, dv = (gen.uniform(0.5, 2, (2, 2)) for _ in range(3))
    O, lse = reference.attention_fp8(q, k, v, dq, dk, dv, 0.3, "bottom_right")
    rep = lambda d: np.repeat(d, 2, axis=1)[:, :, None, None]
    kv = lambda d: d[:, :, None, None]
    O2, lse2 = reference.attention_naive(q * rep(dq), k * kv(dk), v * kv(dv), 0.3, "bottom_right")
    assert np.allclose(O, O2) and np.allclose(lse, lse2)


def _fp8_inputs(B=1, N=16, H=2, D=64, device="cpu"):
    return tuple(torch.zeros(B, N, H, D, device=device).to(E4M3) for _ in range(3))


@pytest.mark.parametrize(
    "mutate,kwargs,exc,match",
    [
        (lambda q, k, v: (q, k.to(torch.bfloat16), v), {}, TypeError, "k must have q's dtype"),
        (lambda q, k, v: (q, k, v), dict(version="v3.3"), ValueError, "run on version 'v3.5'"),
        (lambda q, k, v: (q, k, v), dict(precision="tf32"), ValueError, "precision applies to float32"),
        (lambda q, k, v: (q, k, v), dict(softcap=30.0), NotImplementedError, "softcap"),
        (lambda q, k, v: (q, k, v), dict(window_size=(8, 0)), NotImplementedError, "window_size"),
        (lambda q, k, v: (q[..., :32], k[..., :32], v[..., :32]), {}, ValueError, "head dim 32 is not supported"),
        (lambda q, k, v: (q, k[:, :, :1, :8], v), {}, ValueError, "head dim"),
        (lambda q, k, v: (q[0], k, v), {}, ValueError, "q must have 4 dims"),
        (lambda q, k, v: (q, k, v), {}, ValueError, "q must be a CUDA tensor"),  # (CPU tensors)
    ],
)
def test_bad_input_raises(mutate, kwargs, exc, match):
    q, k, v = mutate(*_fp8_inputs())
    with pytest.raises(exc, match=match):
        flash_attn_func(q, k, v, **kwargs)


def test_other_entry_points_and_dtypes_refuse_fp8_arguments():
    q, k, v = _fp8_inputs()
    with pytest.raises(TypeError, match="flash_attn_func"):
        scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
    qb = torch.zeros(1, 16, 2, 64, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="descale_q, descale_k and descale_v apply to float8_e4m3fn"):
        flash_attn_func(qb, qb, qb, descale_q=torch.ones(1, 2))


def test_fp8_inputs_that_require_grad_raise():
    q, k, v = _fp8_inputs()
    try:
        q.requires_grad_()
    except RuntimeError:
        pytest.skip("this torch lets no float8 tensor require grad")
    with pytest.raises(RuntimeError, match="no FP8 backward"):
        flash_attn_func(q, k, v)


# ---- GPU ----------------------------------------------------------------------------------------


def _reference(q8, k8, v8, dq, dk, dv, scale, causal):
    """(O, lse, O_model, s_abs) in float64 on the GPU: the exact attention of the dequantized inputs,
    a model of v3.5's rounding (P to e4m3 against the row's final max, O to bf16), and per row the
    largest |s| sum_d |q_d k_jd| over the keys it sees ((B, H, Nq), the scale of S's rounding)."""
    B, Nq, H, D = q8.shape
    Nk, H_kv = k8.shape[1], k8.shape[2]
    g = H // H_kv
    kv = lambda d: d.double().reshape(B, 1, H_kv, 1)
    q = (q8.double() * kv(dq).repeat_interleave(g, dim=2)).transpose(1, 2)
    k = (k8.double() * kv(dk)).transpose(1, 2).repeat_interleave(g, dim=1)
    v = (v8.double() * kv(dv)).transpose(1, 2).repeat_interleave(g, dim=1)
    S = q @ k.transpose(-1, -2) * scale
    s_abs = q.abs() @ k.abs().transpose(-1, -2) * abs(scale)
    if causal is not None:
        offset = 0 if causal == "top_left" else Nk - Nq
        seen = torch.arange(Nk, device=S.device)[None, :] <= torch.arange(Nq, device=S.device)[:, None] + offset
        S = S.masked_fill(~seen, -math.inf)
        s_abs = s_abs.masked_fill(~seen, 0)
    m = S.amax(dim=-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    P = torch.exp(S - m)
    l = P.sum(dim=-1, keepdim=True)
    safe_l = torch.where(l > 0, l, torch.ones_like(l))
    O = (P @ v) / safe_l
    P8 = P.float().to(E4M3).double()  # (P <= 1: no saturation)
    O_model = ((P8 @ v) / safe_l).bfloat16().double()
    lse = torch.where(l[..., 0] > 0, m[..., 0] + torch.log(safe_l[..., 0]), torch.full_like(m[..., 0], -math.inf))
    return O.transpose(1, 2), lse, O_model.transpose(1, 2), s_abs.amax(dim=-1)


# (B, Nq, Nk, H, H_kv, D, causal, scale)
CASES = [
    (1, 1, 1, 1, 1, 128, None, None),
    (2, 17, 113, 4, 2, 64, None, None),
    (1, 203, 203, 2, 2, 128, "top_left", None),
    (2, 113, 17, 4, 4, 256, "bottom_right", None),  # Nq > Nk: the first rows see no key
    (1, 1023, 4224, 8, 1, 128, "bottom_right", None),  # MQA
    (1, 4224, 1023, 4, 1, 64, "top_left", 0.05),
    (2, 1000, 1000, 2, 2, 256, None, -0.2),  # a negative scale
    (1, 300, 2000, 8, 2, 128, "top_left", None),
    # long calls without a mask at D = 128 take 192-key blocks (v3.5_wide): Nk no multiple of 192
    (1, 77, 4111, 4, 2, 128, None, None),
    (2, 1000, 4100, 2, 1, 128, None, -0.1),
]


def _quantized(x, H_kv: int, form: str):
    """x (B, N, H, D) float as e4m3 with descale factors per (batch, KV head) (q's heads quantized
    per group, as FlashAttention-3 takes q's factor), per tensor (a one-element tensor) or as a
    Python number."""
    B, N, H, D = x.shape
    if form == "per_head":
        x8, d = fp8.quantize_e4m3(x.reshape(B, N, H_kv, H // H_kv * D))
        return x8.view(B, N, H, D), d
    d = x.abs().amax().clamp_min(1e-30) / fp8.E4M3_MAX
    x8 = (x / d).to(E4M3)
    return x8, (d.reshape(1) if form == "tensor" else d.item())


def _check(case, strided=False, form="per_head", jump=False):
    B, Nq, Nk, H, H_kv, D, causal, scale = case
    gen = torch.Generator(device="cuda").manual_seed(abs(hash((case, strided, form))) % 2**31)
    # heads of different magnitudes, so that the factors differ per (batch, KV head)
    spread = lambda n, h: (
        torch.randn(B, n, h, D, device="cuda", generator=gen)
        * (torch.rand(B, 1, h, 1, device="cuda", generator=gen) * 4 + 0.25)
    )
    if strided:  # q, k, v as views into one packed (B, N, 3, H, D) buffer: row stride 3 H D bytes
        assert Nq == Nk and H == H_kv
        x = spread(Nq, 3 * H).view(B, Nq, 3, H, D)
        (q8, dq), (k8, dk), (v8, dv) = (_quantized(x[:, :, i].contiguous(), H_kv, form) for i in range(3))
        buf = torch.stack([q8.view(torch.uint8), k8.view(torch.uint8), v8.view(torch.uint8)], dim=2).view(E4M3)
        q8, k8, v8 = buf.unbind(2)
        assert not q8.is_contiguous()
    else:
        q, k, v = spread(Nq, H), spread(Nk, H_kv), spread(Nk, H_kv)
        if jump:  # scores near 0 over the first 128 keys, of spread ~4 after them
            k[:, :128] *= 0.01
            k[:, 128:] *= 4.0
        (q8, dq), (k8, dk), (v8, dv) = (_quantized(x, H_kv, form) for x in (q, k, v))
    s = D**-0.5 if scale is None else scale
    out = torch.full((B, Nq, H, D), float("nan"), device="cuda", dtype=torch.bfloat16)
    lse = torch.full((B, H, Nq), float("nan"), device="cuda")
    copies = [t.clone() for t in (q8, k8, v8)]
    fp8.attention(q8, k8, v8, s, causal, "bnhd", (dq, dk, dv), True, out=out, lse=lse)
    assert all(torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in zip(copies, (q8, k8, v8)))
    full = lambda d: (
        torch.as_tensor(d, device="cuda", dtype=torch.float32).reshape(-1).expand(B * H_kv).reshape(B, H_kv)
        if not torch.is_tensor(d) or d.numel() == 1
        else d
    )
    O, lse_ref, O_model, s_abs = _reference(q8, k8, v8, full(dq), full(dk), full(dv), s, causal)
    assert not out.isnan().any() and not lse.isnan().any()
    norm = O.norm().clamp_min(1e-30)
    err, model_err = ((out.double() - O).norm() / norm).item(), ((O_model - O).norm() / norm).item()
    assert err <= 2 * model_err + 1e-3, (err, model_err)
    finite = torch.isfinite(lse_ref)
    assert torch.equal(torch.isfinite(lse), finite)
    if finite.any():
        # |lse - lse_ref| <= max_j |S_j - S_ref_j|: the bf16 rungs' bound, or a part in 2^10 of
        # |s| sum_d |q_d k_jd| where that is larger (8-bit wgmma keeps fewer bits in its FP32 sums).
        bound = LSE_TOLERANCE["native"] + 2.0**-10 * s_abs
        assert ((lse.double() - lse_ref).abs() <= bound)[finite].all(), (lse.double() - lse_ref)[finite].abs().max()
    unseen = ~finite.transpose(1, 2)  # (B, Nq, H): rows that see no key output 0
    assert (out[unseen] == 0).all()
    return err, model_err


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=str)
def test_matches_float64(case):
    _check(case)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "D,Nk,causal", [(64, 1000, None), (128, 1000, "bottom_right"), (128, 8300, None), (256, 700, None)]
)
def test_row_max_jumps_between_blocks(D, Nk, causal):
    """Keys whose first 128 give scores near 0 and the rest scores of spread ~4 (times the heads' own
    spread): a row's max climbs past its first K/V block, so the lazy rebase (softmax.cuh) must move
    P's base there before e4m3 saturates (and a speculative softmax, measured and dropped for FP8 in
    v3_3_wgmma.cu, would fail its check); 8300 keys without a mask take v3.5_wide's 192-key blocks."""
    _check((1, 300, Nk, 4, 2, D, causal, None), jump=True)


@pytest.mark.gpu
def test_long_calls_without_a_mask_take_the_wide_blocks(monkeypatch):
    """fp8.attention's shape rule (versions.long_plain): D = 128, no mask, at least LONG_KEYS keys
    run v3.5_wide (192-key blocks); shorter or causal calls and other head dims run v3.5."""
    from tileattn.versions import LONG_KEYS

    names = []
    fp8._CALLS.clear()  # (a prepared call would skip the lookup)
    entry_kernel = fp8.api.entry_kernel
    monkeypatch.setattr(fp8.api, "entry_kernel", lambda name, *a: names.append(name) or entry_kernel(name, *a))
    for D, Nk, causal, name in (
        (128, LONG_KEYS, None, "v3.5_wide"),
        (128, LONG_KEYS - 1, None, "v3.5"),
        (128, LONG_KEYS, "top_left", "v3.5"),
        (64, LONG_KEYS, None, "v3.5"),
    ):
        names.clear()
        (q8, dq), (k8, dk), (v8, dv) = (fp8.quantize_e4m3(torch.randn(1, n, 2, D, device="cuda")) for n in (5, Nk, Nk))
        fp8.attention(q8, k8, v8, D**-0.5, causal, "bnhd", (dq, dk, dv), False)
        assert [n for n in names if n != V3_5_VT.name][-1] == name, (D, Nk, causal, names)


@pytest.mark.gpu
@pytest.mark.parametrize("form", ["tensor", "number"])
def test_descale_per_tensor(form):
    _check((2, 300, 300, 4, 2, 128, "bottom_right", None), form=form)


@pytest.mark.gpu
@pytest.mark.parametrize("D", [64, 128, 256])
def test_strided_views_of_packed_qkv(D):
    _check((2, 257, 257, 4, 4, D, "top_left", None), strided=True)


@pytest.mark.gpu
def test_misaligned_views_are_copied():
    """Views whose rows do not start on 16-byte boundaries (TMA and the V^T copy read 16 bytes at
    a time) are copied once, the inputs left alone: the same output as from aligned copies."""
    gen = torch.Generator(device="cuda").manual_seed(3)
    x = [torch.randn(1, 70, 2, 64, device="cuda", generator=gen) for _ in range(3)]
    q8, k8, v8 = (fp8.quantize_e4m3(t)[0] for t in x)
    shifted = []
    for t in (q8, k8, v8):  # the same values at a storage offset of one byte
        buf = torch.empty(t.numel() + 1, dtype=torch.uint8, device="cuda")
        view = buf[1:].view(t.shape)
        view.copy_(t.view(torch.uint8))
        shifted.append(view.view(E4M3))
    assert shifted[0].data_ptr() % 16 == 1
    assert torch.equal(flash_attn_func(*shifted, causal=True), flash_attn_func(q8, k8, v8, causal=True))


@pytest.mark.gpu
def test_rotated_inputs_with_outlier_channels():
    """quantize_attention_inputs(rotate_qk=True) through the kernel: the same scores, and with
    outlier channels in q and k a smaller error than without the rotation (scripts/fp8_accuracy.py's
    CPU model: 0.39 -> 0.087 at D=128)."""
    gen = torch.Generator(device="cuda").manual_seed(4)
    q, k, v = (torch.randn(1, 512, 4, 128, device="cuda", generator=gen) for _ in range(3))
    q[..., :4] *= 20
    k[..., :4] *= 20
    ref = torch.nn.functional.scaled_dot_product_attention(*(t.double().transpose(1, 2) for t in (q, k, v)))
    errs = []
    for rotate_qk in (False, True):
        q8, k8, v8, ds = fp8.quantize_attention_inputs(q, k, v, rotate_qk=rotate_qk)
        out = flash_attn_func(q8, k8, v8, **ds).double().transpose(1, 2)
        errs.append(((out - ref).norm() / ref.norm()).item())
    assert errs[1] < errs[0] / 2, errs


@pytest.mark.gpu
def test_batch_heads_past_grid_y():
    _check((2, 3, 5, 32800, 8200, 64, "bottom_right", None))


@pytest.mark.gpu
@pytest.mark.parametrize("Nk,D", [(1, 64), (77, 128), (4096, 256), (1000, 128)])
def test_v_transpose_kernel_matches_torch(Nk, D):
    gen = torch.Generator(device="cuda").manual_seed(Nk)
    v = torch.randn(2, Nk, 3, D, device="cuda", generator=gen).to(E4M3).transpose(1, 2)  # strided (B, H, N, D)
    vt = fp8.v_transposed(v)
    assert torch.equal(vt, fp8._v_transposed_torch(v))


def test_descale_table_forms():
    """fp8._descale_table (on the CPU: the same torch calls): None is 1; numbers alone give one
    cached table (no host-to-device copy a call); numbers beside tensors become filled columns;
    a one-element tensor is one factor for every (batch, KV head); bad factors raise by name."""
    B, H_kv, cpu = 2, 3, torch.device("cpu")
    ones = fp8._descale_table(None, None, None, B, H_kv, cpu)
    assert torch.equal(ones, torch.ones(B * H_kv, 3)) and ones is fp8._descale_table(None, None, None, B, H_kv, cpu)
    numbers = fp8._descale_table(0.5, None, 2, B, H_kv, cpu)
    assert torch.equal(numbers, torch.tensor([[0.5, 1.0, 2.0]]).expand(B * H_kv, 3))
    assert numbers is fp8._descale_table(0.5, 1.0, 2.0, B, H_kv, cpu)
    dq = torch.arange(B * H_kv, dtype=torch.float32).view(B, H_kv)
    mixed = fp8._descale_table(dq, 0.25, torch.tensor([3.0]), B, H_kv, cpu)
    assert mixed.shape == (B * H_kv, 3) and mixed.is_contiguous()
    assert torch.equal(mixed, torch.stack([dq.reshape(-1), torch.full((6,), 0.25), torch.full((6,), 3.0)], 1))
    for bad, exc, match in (
        ((True, None, None), TypeError, "descale_q must be None, a finite number"),
        ((None, math.nan, None), TypeError, "descale_k must be None, a finite number"),
        ((None, None, dq.double()), TypeError, "descale_v must be float32"),
        ((torch.ones(3, 2), None, None), ValueError, r"descale_q must have shape \(B, H_kv\) = \(2, 3\)"),
    ):
        with pytest.raises(exc, match=match):
            fp8._descale_table(*bad, B, H_kv, cpu)


@pytest.mark.gpu
def test_public_function_and_lse():
    """flash_attn_func: bf16 O in q's layout, lse on request, descale factors as keywords; the
    same numbers as the core call."""
    gen = torch.Generator(device="cuda").manual_seed(1)
    x = [torch.randn(2, 129, 4, 128, device="cuda", generator=gen) for _ in range(3)]
    (q8, dq), (k8, dk), (v8, dv) = (fp8.quantize_e4m3(t) for t in x)
    out, lse = flash_attn_func(q8, k8, v8, causal=True, return_lse=True, descale_q=dq, descale_k=dk, descale_v=dv)
    assert out.dtype == torch.bfloat16 and out.shape == (2, 129, 4, 128) and lse.shape == (2, 4, 129)
    again, _ = fp8.attention(q8, k8, v8, 128**-0.5, "bottom_right", "bnhd", (dq, dk, dv), False)
    assert torch.equal(out, again)
    plain = flash_attn_func(q8, k8, v8)  # no factors: 1
    ref = flash_attn_func(*(t.float().bfloat16() for t in (q8, k8, v8)))
    assert ((plain.float() - ref.float()).norm() / ref.float().norm()).item() < 0.05


@pytest.mark.gpu
def test_prepared_call_matches_the_first():
    """A call seen before (same shapes, strides, options) runs its prepared launch (fp8._CALLS):
    new buffers, other descale factors (a tensor, then a number) and a misaligned view of the same
    shape (which takes the first path again, through a copy) give what the first path gives."""
    gen = torch.Generator(device="cuda").manual_seed(3)
    B, N, H, H_kv, D = 2, 300, 4, 2, 64

    def inputs():  # q8, dq, k8, dk, v8, dv (a factor per (batch, KV head))
        x = [torch.randn(B, N, h, D, device="cuda", generator=gen) for h in (H, H_kv, H_kv)]
        q8, k8, v8, descales = fp8.quantize_attention_inputs(*x)
        return q8, descales["descale_q"], k8, descales["descale_k"], v8, descales["descale_v"]

    def first_path(q8, k8, v8, descales):  # (an out buffer: never the prepared launch)
        out = torch.full((B, N, H, D), math.nan, device="cuda", dtype=torch.bfloat16)
        return fp8.attention(q8, k8, v8, D**-0.5, "bottom_right", "bnhd", descales, False, out=out)[0]

    fp8._CALLS.clear()
    for q8, dq, k8, dk, v8, dv in (inputs(), inputs()):
        for descales in ((dq, dk, dv), (0.5, None, 2.0)):
            out = flash_attn_func(q8, k8, v8, causal=True, descale_q=descales[0], descale_k=descales[1],
                                  descale_v=descales[2])  # fmt: skip
            assert len(fp8._CALLS) == 1
            assert torch.equal(out, first_path(q8, k8, v8, descales))
    raw = torch.empty(q8.numel() + 16, device="cuda", dtype=torch.uint8)
    shifted = raw[1 : 1 + q8.numel()].view(E4M3).view(q8.shape)  # same shape and strides, odd address
    shifted.copy_(q8)
    assert torch.equal(flash_attn_func(shifted, k8, v8, causal=True), first_path(q8, k8, v8, (None, None, None)))


@pytest.mark.gpu
@pytest.mark.parametrize(
    "kwargs,exc,match",
    [
        (dict(descale_q=torch.ones(3, 4)), ValueError, r"descale_q must have shape \(B, H_kv\) = \(2, 4\)"),
        (dict(descale_k=torch.ones(2, 4, dtype=torch.float64)), TypeError, "descale_k must be float32"),
        (dict(descale_v=torch.ones(2, 4)), ValueError, "descale_v is on cpu"),  # (a CPU tensor)
        (dict(descale_v="1"), TypeError, "descale_v must be None, a finite number"),
    ],
)
def test_bad_descale_raises(kwargs, exc, match):
    q = torch.zeros(2, 16, 4, 64, device="cuda").to(E4M3)
    kwargs = {n: (d.cuda() if torch.is_tensor(d) and "cpu" not in match else d) for n, d in kwargs.items()}
    with pytest.raises(exc, match=match):
        flash_attn_func(q, q, q, **kwargs)


@pytest.mark.gpu
def test_torch_compile_fullgraph_matches_eager():
    gen = torch.Generator(device="cuda").manual_seed(2)
    x = [torch.randn(2, 200, 4, 128, device="cuda", generator=gen) for _ in range(3)]
    (q8, dq), (k8, dk), (v8, dv) = (fp8.quantize_e4m3(t) for t in x)

    def f(q, k, v, dq, dk, dv):  # (elementwise after the op: inductor's reductions may add in another order)
        return flash_attn_func(q, k, v, causal=True, descale_q=dq, descale_k=dk, descale_v=dv) * 2

    eager = f(q8, k8, v8, dq, dk, dv)
    compiled = torch.compile(f, fullgraph=True)(q8, k8, v8, dq, dk, dv)
    assert torch.equal(eager, compiled)
    scalar = torch.compile(lambda q, k, v: flash_attn_func(q, k, v, descale_v=0.5), fullgraph=True)(q8, k8, v8)
    assert torch.equal(scalar, flash_attn_func(q8, k8, v8, descale_v=0.5))
