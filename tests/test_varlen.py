"""flash_attn_varlen_func (serving.py; v3.3 reading cu_seqlens, csrc/common.cuh, and v3.1's
varlen and variants kernels on the mma.sync path): the mma.sync kernels compile within budget and
bad input raises naming the argument (CPU); packed sequences of awkward and zero lengths, Nq != Nk
per sequence, GQA, both causal alignments, strided and negatively scaled inputs and B*H past
gridDim.y (with the score variants too) against the float64 reference per sequence (GPU)."""

import numpy as np
import pytest
import torch

from tileattn import _nvrtc, _params, flash_attn_varlen_func, reference
from tileattn.testing import (
    assert_serving_output,
    assert_within_torch_error,
    compile_archs,
    compile_dtypes,
    compile_in_parallel,
    cu_seqlens,
    reference_grads,
)
from tileattn.versions import V3_1_VARIANTS, V3_1_VARLEN

ARCHS = compile_archs(["sm_80", "sm_90"])
MMA_INSTANCES = [  # one 16-bit type an arch (testing.compile_dtypes)
    (e, dt, D, c, a)
    for e in (V3_1_VARLEN, V3_1_VARIANTS)
    for a in ARCHS
    for dt, D, c in e.instantiations()
    if dt in compile_dtypes(e, a)
]


@pytest.fixture(scope="module")
def compiled_in_parallel():
    """The kernels below compiled and disassembled up front, one NVRTC and cuobjdump per core."""
    jobs = {(e.file, e.name_expression(dt, D, c), a) for e, dt, D, c, a in MMA_INSTANCES}
    compile_in_parallel(jobs, disassemble=jobs)


@pytest.mark.parametrize("entry,dtype,D,causal,arch", MMA_INSTANCES)
def test_mma_varlen_kernel_compiles_within_budget(compiled_in_parallel, entry, dtype, D, causal, arch):
    """v3.1's variable-length kernel and its variants kernel (the paths off Hopper): spill budget,
    parameter block, and the instructions they exist for (mma.sync, ldmatrix.trans, cp.async; the
    variants' softcap: tanh on the SFU, one MUFU.TANH a score, beside the softmax's MUFU.EX2)."""
    cubin = _nvrtc.compile_kernel(entry.file, entry.name_expression(dtype, D, causal), arch)
    res = cubin.resources
    budget = entry.spill_bytes.get(D, 0)
    assert res["stack_bytes"] <= budget and res["spill_stores"] <= budget and res["spill_loads"] <= budget, res
    _params.packer(cubin.data, cubin.lowered_name, False, _params.FWD_FIELDS, [])
    sass = _nvrtc.sass(cubin)
    assert "HMMA.16816.F32" in sass and "LDSM.16.MT88.4" in sass and "LDGSTS" in sass and "MUFU.EX2" in sass
    assert ("MUFU.TANH" in sass) == (entry is V3_1_VARIANTS)
    if budget == 0:
        assert "LDL" not in sass and "STL" not in sass


def _cpu(total=10, H=4, H_kv=2, D=64):
    q = torch.zeros(total, H, D, dtype=torch.float16)
    k = torch.zeros(total, H_kv, D, dtype=torch.float16)
    cu = torch.tensor([0, 4, 10], dtype=torch.int32)
    return dict(q=q, k=k, v=k.clone(), cu_seqlens_q=cu, cu_seqlens_k=cu.clone(), max_seqlen_q=6, max_seqlen_k=6)


BAD_INPUT = [
    (dict(dropout_p=0.1), NotImplementedError, "dropout_p must be 0.0"),
    (dict(window_size=(4, -2)), ValueError, "window_size entries must be >= -1"),
    (dict(softcap=-1.0), ValueError, "softcap must be finite and >= 0"),
    (
        dict(alibi_slopes=torch.zeros(2, 3)),
        ValueError,
        r"alibi_slopes must be a float32 tensor of shape \(4,\) or \(2, 4\)",
    ),
    (dict(q=torch.zeros(10, 4, 64)), TypeError, "q must be float16 or bfloat16"),
    (dict(q=torch.zeros(1, 10, 4, 64, dtype=torch.float16)), ValueError, "q must be a 3-D"),
    (dict(v=torch.zeros(10, 2, 64, dtype=torch.bfloat16)), ValueError, "v must be a tensor of q's dtype"),
    (dict(v=torch.zeros(9, 2, 64, dtype=torch.float16)), ValueError, "k and v must have one shape"),
    (dict(q=torch.zeros(10, 3, 64, dtype=torch.float16)), ValueError, r"multiple of k's and v's \(2\)"),
    (dict(cu_seqlens_q=torch.tensor([0, 4, 10])), ValueError, "cu_seqlens_q must be a 1-D int32"),
    (dict(cu_seqlens_k=torch.tensor([0, 10], dtype=torch.int32)), ValueError, r"cu_seqlens_k must have shape \(3\)"),
    (dict(max_seqlen_q=-1), ValueError, "max_seqlen_q must be an int >= 0"),
    (dict(causal="diagonal"), ValueError, "causal must be a bool or one of"),
    (dict(), ValueError, "must be CUDA tensors"),
    (dict(version="v2"), ValueError, r"version must be one of \(None, 'v3.3', 'v3.1'\)"),
]


@pytest.mark.parametrize("change,error,match", BAD_INPUT)
def test_varlen_bad_input_names_the_argument(change, error, match):
    kwargs = _cpu()
    kwargs.update(change)
    with pytest.raises(error, match=match):
        flash_attn_varlen_func(**kwargs)


@pytest.mark.parametrize("D,change,match", [
    (40, {}, "no backward pass for float16 at head dim 40"),
    (40, dict(softcap=5.0), "no backward pass for window_size, softcap or alibi_slopes with float16 at head dim 40"),
    (64, dict(softcap=5.0, deterministic=True), "no deterministic mode"),
])  # fmt: skip
def test_varlen_refuses_gradients_it_cannot_give(D, change, match):
    """An input that requires grad where no backward rung takes the head dim, or with a variant
    and deterministic=True, raises before anything runs (here: before the CUDA check)."""
    kwargs = {**_cpu(D=D), **change}
    kwargs["k"].requires_grad_()
    with pytest.raises(RuntimeError, match=match):
        flash_attn_varlen_func(**kwargs)


def _packed(lens, H, D, dtype, gen, extra_heads=0):
    """(total, H, D) rows of all sequences, as a view of a wider buffer when extra_heads > 0."""
    buf = torch.randn(sum(lens), H + extra_heads, D, device="cuda", dtype=dtype, generator=gen)
    return buf[:, :H]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("version,D", [("v3.3", 64), ("v3.3", 128), ("v3.3", 256), ("v3.1", 64), ("v3.1", 96),
                                       ("v3.1", 128), ("v3.1", 256)])  # fmt: skip
@pytest.mark.parametrize("causal", [False, "top_left", "bottom_right"])
@pytest.mark.parametrize("H,H_kv", [(8, 8), (8, 2)])
def test_varlen_matches_float64(dtype, version, D, causal, H, H_kv):
    if version == "v3.3" and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("v3.3 runs on Hopper")
    gen = torch.Generator(device="cuda").manual_seed(D)
    lens_q = [0, 1, 17, 128, 129, 300, 1000, 5]
    lens_k = [3, 1, 40, 128, 100, 300, 1100, 0]  # Nq != Nk both ways, a sequence with no key
    q = _packed(lens_q, H, D, dtype, gen, extra_heads=2)  # strided: a view of a wider buffer
    # k, v with 37 rows of NaN past the last sequence (a preallocated buffer's unused tail)
    k, v = (torch.cat([_packed(lens_k, H_kv, D, dtype, gen), torch.full((37, H_kv, D), float("nan"), device="cuda",
                                                                        dtype=dtype)]) for _ in range(2))  # fmt: skip
    out, lse = flash_attn_varlen_func(
        q,
        k,
        v,
        cu_seqlens(lens_q),
        cu_seqlens(lens_k),
        max(lens_q),
        max(lens_k),
        causal=causal,
        return_lse=True,
        version=version,
    )
    as_np = lambda t: t.double().cpu().numpy()
    used = sum(lens_k)
    o_ref, lse_ref = reference.attention_varlen(
        as_np(q), as_np(k[:used]), as_np(v[:used]), cu_seqlens(lens_q).tolist(), cu_seqlens(lens_k).tolist(),
        softmax_scale=D**-0.5, causal=causal is not False, offset=0 if causal == "top_left" else None,
    )  # fmt: skip
    o_ref, lse_ref = torch.from_numpy(np.asarray(o_ref)), torch.from_numpy(np.asarray(lse_ref))
    assert_serving_output(out, lse, o_ref, lse_ref, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("version", ["v3.3", "v3.1"])
@pytest.mark.parametrize("causal", [False, True])
def test_varlen_offsets_past_zero(version, causal):
    """cu_seqlens that start past row 0 (a slice of a longer batch's offsets) and rows of q, k, v
    past the last sequence: the sequences' rows match float64 (the rows outside are not written,
    as in flash-attn)."""
    if version == "v3.3" and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("v3.3 runs on Hopper")
    gen = torch.Generator(device="cuda").manual_seed(11)
    lens_q, lens_k, start_q, start_k, H, D = [200, 0, 130, 1, 257], [150, 3, 300, 9, 257], 300, 41, 4, 64
    q = torch.randn(start_q + sum(lens_q) + 50, H, D, device="cuda", dtype=torch.bfloat16, generator=gen)
    k, v = (torch.randn(start_k + sum(lens_k) + 7, 2, D, device="cuda", dtype=torch.bfloat16, generator=gen)
            for _ in range(2))  # fmt: skip
    cu_q, cu_k = cu_seqlens(lens_q) + start_q, cu_seqlens(lens_k) + start_k
    out, lse = flash_attn_varlen_func(
        q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=causal, return_lse=True, version=version
    )
    as_np = lambda t: t.double().cpu().numpy()
    o_ref, lse_ref = reference.attention_varlen(
        as_np(q), as_np(k), as_np(v), cu_q.tolist(), cu_k.tolist(), softmax_scale=D**-0.5, causal=causal
    )
    rows = slice(start_q, start_q + sum(lens_q))
    o_ref, lse_ref = torch.from_numpy(np.asarray(o_ref)[rows]), torch.from_numpy(np.asarray(lse_ref)[:, rows])
    assert_serving_output(out[rows], lse[:, rows], o_ref, lse_ref, torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.parametrize("version", ["v3.3", "v3.1"])
def test_varlen_awkward(version):
    """A negative scale, and B*H = 65,600 (the heads of 4,100 one-token sequences): v3.1 in two
    launches (gridDim.y), whose second finds its own rows of O and of lse (H, total_q); v3.3 in one
    grid of 4,132 x 16 packed tiles, each found by three rounds of the scheduler's search."""
    if version == "v3.3" and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("v3.3 runs on Hopper")
    gen = torch.Generator(device="cuda").manual_seed(5)
    B, H, D = 4100, 16, 64
    q = torch.randn(B, H, D, device="cuda", dtype=torch.bfloat16, generator=gen)
    k, v = (torch.randn(2 * B, 4, D, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(2))
    cu_q = torch.arange(B + 1, device="cuda", dtype=torch.int32)
    out, lse = flash_attn_varlen_func(
        q, k, v, cu_q, 2 * cu_q, 1, 2, softmax_scale=-0.2, causal=True, version=version, return_lse=True
    )
    kk, vv = (t.view(B, 2, 4, D).repeat_interleave(4, dim=2).float() for t in (k, v))  # (B, 2, H, D)
    S = torch.einsum("bhd,bjhd->bhj", q.float(), kk) * -0.2
    torch.testing.assert_close(out.float(), torch.einsum("bhj,bjhd->bhd", torch.softmax(S, dim=-1), vv),
                               rtol=2e-2, atol=2e-2)  # fmt: skip
    torch.testing.assert_close(lse, torch.logsumexp(S, dim=-1).T, rtol=1e-3, atol=1e-3)  # (H, total_q)


@pytest.mark.gpu
@pytest.mark.parametrize("version", ["v3.3", "v3.1"])
def test_varlen_variants_past_grid_y(version):
    """B*H = 65,600 (4,100 sequences of 3 queries over 5 keys, bottom-right) with a window,
    softcap and (B, H) ALiBi slopes: v3.1 in two launches, whose second finds its own slopes row
    (the kernel moves the slopes with the sequence) and its rows of O and lse; v3.3 in one grid of
    packed tiles, each sequence found by the scheduler's search."""
    if version == "v3.3" and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("v3.3 runs on Hopper")
    gen = torch.Generator(device="cuda").manual_seed(7)
    B, H, H_kv, D, n_q, n_k, cap = 4100, 16, 4, 64, 3, 5, 2.0
    q = torch.randn(B * n_q, H, D, device="cuda", dtype=torch.bfloat16, generator=gen)
    k, v = (torch.randn(B * n_k, H_kv, D, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(2))
    slopes = torch.rand(B, H, device="cuda", generator=gen) * 0.3
    cu = torch.arange(B + 1, device="cuda", dtype=torch.int32)
    out, lse = flash_attn_varlen_func(
        q, k, v, n_q * cu, n_k * cu, n_q, n_k, causal=True, window_size=(2, 0), softcap=cap, alibi_slopes=slopes,
        return_lse=True, version=version,
    )  # fmt: skip
    qq = q.view(B, n_q, H, D).float()
    kk, vv = (t.view(B, n_k, H_kv, D).repeat_interleave(H // H_kv, dim=2).float() for t in (k, v))
    S = cap * torch.tanh(torch.einsum("bihd,bjhd->bhij", qq, kk) * D**-0.5 / cap)
    i = torch.arange(n_q, device="cuda")[:, None] + n_k - n_q  # query positions (bottom-right)
    j = torch.arange(n_k, device="cuda")[None, :]
    S = (S - slopes[:, :, None, None] * (i - j).abs()).masked_fill((j > i) | (j < i - 2), float("-inf"))
    ref = torch.einsum("bhij,bjhd->bihd", torch.softmax(S, dim=-1), vv).reshape(B * n_q, H, D)
    torch.testing.assert_close(out.float(), ref, rtol=2e-2, atol=2e-2)
    # (H, total_q); tanh.approx's 2^-11 relative error is not averaged away over 3 keys a row
    torch.testing.assert_close(lse, torch.logsumexp(S, dim=-1).permute(1, 0, 2).reshape(H, B * n_q), rtol=0, atol=2e-3)


_GRAD_VARIANTS = {
    "plain": {},
    "window": dict(window_size=(61, 29)),
    "softcap": dict(softcap=1.5),
    "alibi_bh": dict(alibi="BH"),
    "all": dict(window_size=(200, 7), softcap=3.0, alibi="BH"),
}


_LENS_Q, _LENS_K = [1, 130, 0, 77, 300, 45], [1, 64, 9, 0, 457, 45]


def test_varlen_backward_of_no_sequence_is_zero(monkeypatch):
    """cu_seqlens of one offset (no sequence) with rows in q, k, v: every gradient is 0 and no
    kernel runs (a one-launch kernel's search over the offsets would read past them; CPU)."""
    from tileattn import backward, serving

    monkeypatch.setattr(backward, "attention_backward", lambda *a, **kw: pytest.fail("a kernel would run"))
    q, k = torch.randn(5, 4, 64), torch.randn(3, 2, 64)
    cu = torch.zeros(1, dtype=torch.int32)
    grads = serving._varlen_backward(q, k, k.clone(), torch.zeros_like(q), torch.zeros(4, 5), cu, cu, q, 0.125,
                                     None, None, False)  # fmt: skip
    assert [g.shape for g in grads] == [q.shape, k.shape, k.shape] and not any(g.any() for g in grads)


@pytest.mark.parametrize("causal", [False, "top_left", "bottom_right"])
@pytest.mark.parametrize("variant", list(_GRAD_VARIANTS))
@pytest.mark.parametrize("scale", [0.125, -0.07])
def test_varlen_backward_composes_per_sequence(monkeypatch, causal, variant, scale):
    """serving._varlen_backward's bookkeeping on the CPU, the dense backward it calls played by
    float64 autograd (testing.reference_grads, which the GPU tests hold the rungs to): each
    sequence's rows and alignment, ALiBi's row of slopes per sequence, a negative scale (passed
    on as it is: attention_backward handles its sign), GQA, zeros where no sequence or no key reaches; against
    float64 autograd of each sequence alone."""
    from tileattn import backward, serving

    def dense(q, k, v, out, lse, dout, scale, mode, layout, deterministic=False, variants=None):
        assert out.shape == q.shape and lse.shape == (1, q.shape[2], q.shape[1])
        window, softcap, slopes = variants or ((-1, -1), 0.0, None)
        return reference_grads(q, k, v, dout, scale, mode, layout, window=window, softcap=softcap, alibi_slopes=slopes)

    monkeypatch.setattr(backward, "attention_backward", dense)
    gen = torch.Generator().manual_seed(len(variant) + len(str(causal)))
    H, H_kv, D, extra = 4, 2, 16, 3
    spec = dict(_GRAD_VARIANTS[variant])
    slopes = torch.rand(len(_LENS_Q), H, generator=gen) * 0.3 if spec.pop("alibi", None) else None
    q = torch.randn(sum(_LENS_Q) + extra, H, D, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(sum(_LENS_K), H_kv, D, generator=gen, dtype=torch.float64) for _ in range(2))
    dO = torch.randn(q.shape, generator=gen, dtype=torch.float64)
    cu_q, cu_k = cu_seqlens(_LENS_Q, "cpu"), cu_seqlens(_LENS_K, "cpu")
    mode = {False: None, True: "bottom_right"}.get(causal, causal)
    # the variants as flash_attn_varlen_func hands them on (grad_args)
    window, softcap, checked = serving._variants(
        spec.get("window_size", (-1, -1)), spec.get("softcap", 0.0), slopes, mode is not None, len(_LENS_Q), H,
        q.shape[0] + k.shape[0], q.device,
    )  # fmt: skip
    variants = (window, softcap, checked) if serving.any_variant(window, softcap, checked, mode is not None) else None
    out, lse = torch.zeros_like(q), torch.zeros(H, q.shape[0])
    dq, dk, dv = serving._varlen_backward(q, k, v, out, lse, cu_q, cu_k, dO, scale, mode, variants, False)
    assert not dq[sum(_LENS_Q) :].any()
    for b in range(len(_LENS_Q)):
        (q0, q1), (k0, k1) = cu_q[b : b + 2].tolist(), cu_k[b : b + 2].tolist()
        if q1 == q0 or k1 == k0:
            assert not dq[q0:q1].any() and not dk[k0:k1].any() and not dv[k0:k1].any(), f"sequence {b}"
            continue
        one = lambda t, r0, r1: t[r0:r1].unsqueeze(0)
        expected = reference_grads(
            one(q, q0, q1), one(k, k0, k1), one(v, k0, k1), one(dO, q0, q1), scale, mode, "bnhd",
            window=spec.get("window_size", (-1, -1)), softcap=spec.get("softcap", 0.0),
            alibi_slopes=None if slopes is None else slopes[b : b + 1].double(),
        )  # fmt: skip
        for got, want in zip((one(dq, q0, q1), one(dk, k0, k1), one(dv, k0, k1)), expected):
            torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9, msg=f"sequence {b}")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("causal", [False, "top_left", "bottom_right"])
@pytest.mark.parametrize("variant", list(_GRAD_VARIANTS))
@pytest.mark.parametrize("scale", [None, -0.07])
def test_varlen_gradients_match_float64(dtype, D, causal, variant, scale):
    """dq, dk, dv of flash_attn_varlen_func against float64 autograd of each sequence alone
    (testing.reference_grads of a dense batch of one), within twice PyTorch's own error plus the
    floor: awkward lengths, Nq != Nk per sequence (more queries than keys too), a sequence with no
    queries, one with no keys, N = 1, GQA 4:2, rows of q past cu_seqlens_q[-1], a negative scale,
    each variant (ALiBi per sequence); gradients 0 where no sequence reaches, inputs unchanged."""
    gen = torch.Generator(device="cuda").manual_seed(D + len(variant) + len(str(causal)))
    lens_q, lens_k = _LENS_Q, _LENS_K
    H, H_kv, extra = 4, 2, 3  # extra: rows of q past the last sequence
    spec = dict(_GRAD_VARIANTS[variant])
    slopes = None
    if spec.pop("alibi", None):
        slopes = torch.rand(len(lens_q), H, device="cuda", generator=gen) * 0.3
    q = torch.randn(sum(lens_q) + extra, H, D, device="cuda", dtype=dtype, generator=gen)
    k, v = (torch.randn(sum(lens_k), H_kv, D, device="cuda", dtype=dtype, generator=gen) for _ in range(2))
    dO = torch.randn_like(q)
    inputs = [t.clone() for t in (q, k, v, dO)]
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    cu_q, cu_k = cu_seqlens(lens_q), cu_seqlens(lens_k)
    out = flash_attn_varlen_func(
        *leaves, cu_q, cu_k, max(lens_q), max(lens_k), softmax_scale=scale, causal=causal, alibi_slopes=slopes, **spec
    )
    out.backward(dO)
    assert all(torch.equal(a, b) for a, b in zip(inputs, (q, k, v, dO))), "an input was modified"
    mode = {False: None, True: "bottom_right"}.get(causal, causal)
    scale = D**-0.5 if scale is None else scale
    _assert_varlen_grads((q, k, v, dO), [t.grad for t in leaves], cu_q, cu_k, scale, mode, spec, slopes)


def _assert_varlen_grads(inputs, grads, cu_q, cu_k, scale, mode, spec, slopes):
    """Each sequence's dq, dk, dv against float64 autograd of that sequence alone (testing.reference_grads
    of a dense batch of one), within twice PyTorch's own error plus the floor; 0 for rows of q past
    the last sequence and for every row of a sequence with no queries or no keys."""
    (q, k, v, dO), (dq, dk, dv), dtype = inputs, grads, inputs[0].dtype
    cu_q, cu_k = cu_q.tolist(), cu_k.tolist()
    assert not dq[cu_q[-1] :].any(), "rows past the last sequence"
    for b in range(len(cu_q) - 1):
        (q0, q1), (k0, k1) = cu_q[b : b + 2], cu_k[b : b + 2]
        if q1 == q0 or k1 == k0:  # nothing to attend: every gradient of the sequence's rows is 0
            assert not dq[q0:q1].any() and not dk[k0:k1].any() and not dv[k0:k1].any(), f"sequence {b}"
            continue
        one = lambda t, r0, r1: t[r0:r1].unsqueeze(0)
        args = (one(q, q0, q1), one(k, k0, k1), one(v, k0, k1), one(dO, q0, q1), scale, mode, "bnhd")
        variants = dict(window=spec.get("window_size", (-1, -1)), softcap=spec.get("softcap", 0.0),
                        alibi_slopes=None if slopes is None else slopes[b : b + 1])  # fmt: skip
        expected = reference_grads(*args, **variants)
        torch_grads = reference_grads(*args, dtype, **variants)
        got = [one(dq, q0, q1), one(dk, k0, k1), one(dv, k0, k1)]
        assert_within_torch_error(got, expected, torch_grads, str(dtype).removeprefix("torch."), f"sequence {b} ")


@pytest.mark.gpu
@pytest.mark.parametrize("D", [32, 64, 96, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("deterministic", [False, True])
def test_varlen_gradients_many_sequences(D, causal, deterministic):
    """The one-launch varlen backward (bwd_v5_varlen on Hopper at D = 64, 128, else bwd_v2_varlen;
    deterministic: the per-sequence fallback) over 70 sequences of 0..300 rows, q and k of
    different lengths, offsets from 17 on (a slice of a longer batch), GQA 6:2, at head dims with
    Bc = 64 and 32 (D = 256), against float64 autograd per sequence; rows of q, dO, k and v past the
    last sequence hold NaN (a preallocated buffer's unused tail: the TMA kernel's tiles read them
    and must not multiply them in); an understated max_seqlen_k must not drop keys from the gradient."""
    gen = torch.Generator(device="cuda").manual_seed(D + causal + 2 * deterministic)
    cpu = torch.Generator().manual_seed(D)
    lens_q, lens_k = (torch.randint(0, 301, (70,), generator=cpu) for _ in range(2))
    lens_q[::9], lens_k[3::11] = 0, 0
    H, H_kv, start = 6, 2, 17
    cu_q, cu_k = (
        torch.cumsum(torch.cat([torch.tensor([start]), n]), 0).to("cuda", torch.int32) for n in (lens_q, lens_k)
    )
    q = torch.randn(int(cu_q[-1]) + 5, H, D, device="cuda", dtype=torch.bfloat16, generator=gen)
    k, v = (torch.randn(int(cu_k[-1]) + 3, H_kv, D, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in "kv")
    dO = torch.randn_like(q)
    for t, end in ((q, cu_q[-1]), (dO, cu_q[-1]), (k, cu_k[-1]), (v, cu_k[-1])):
        t[int(end) :] = float("nan")
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = flash_attn_varlen_func(
        *leaves, cu_q, cu_k, int(lens_q.max()), 8, causal=causal, deterministic=deterministic
    )  # (max_seqlen_k = 8: understated)
    out.backward(dO)
    dq, dk, dv = (t.grad for t in leaves)
    assert not dq[:start].any() and not dk[:start].any() and not dv[:start].any(), "rows before the first sequence"
    assert not dk[int(cu_k[-1]) :].any(), "rows past the last sequence"
    mode = "bottom_right" if causal else None
    _assert_varlen_grads((q, k, v, dO), (dq, dk, dv), cu_q, cu_k, D**-0.5, mode, {}, None)
