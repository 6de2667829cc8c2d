"""The backward pass: every backward instantiation compiles under NVRTC
without spills, its parameter block is the host's BWD_ARGS, and its SASS holds what the rung is
for (CPU); gradients against float64 autograd (GPU)."""

import re

import pytest

from tileattn import _nvrtc, _params
from tileattn.testing import (
    FLOOR,
    compile_archs,
    compile_dtypes,
    compile_in_parallel,
    poison_allocator,
    reference_grads,
)
from tileattn.testing import assert_within_torch_error as _assert_within_torch_error
from tileattn.testing import rms as _rms
from tileattn.versions import (
    BWD_DQ_CONVERT,
    BWD_PREPROCESS,
    BWD_V2_VARIANTS,
    BWD_V2_VARIANTS_VARLEN,
    BWD_V2_VARLEN,
    BWD_V5_VARIANTS,
    BWD_V5_VARIANTS_VARLEN,
    BWD_V5_VARLEN,
    BWD_VERSIONS,
    SPLIT_BLOCKS,
)

ARCHS = compile_archs(["sm_80", "sm_90"])
# The kernels of packed sequences and of the score variants (backward.special_rung), beside the ladder's
_SPECIAL = (BWD_V2_VARLEN, BWD_V2_VARIANTS_VARLEN, BWD_V5_VARLEN, BWD_V5_VARIANTS, BWD_V5_VARIANTS_VARLEN)


def _cpu_dtypes(entry, arch: str, causal: bool) -> tuple:
    """testing.compile_dtypes, and for bwd_v5's packed and variants kernels (its body, one arch)
    one 16-bit type a causal mode: fp16 without the mask, bf16 with it.  All 12 pairs had the same
    registers, stack and spills (NVRTC 13.0, 7af4806); the GPU tests run both types."""
    if entry.file == "bwd_v5_dq_bulk.cu" and entry.name != "bwd_v5":
        return ("bfloat16",) if causal else ("float16",)
    return compile_dtypes(entry, arch)


INSTANCES = [
    (entry, dtype, D, causal, arch + ("a" if entry.arch_specific else ""))
    for entry in [BWD_PREPROCESS, *BWD_VERSIONS.values(), BWD_V2_VARIANTS, *_SPECIAL, BWD_DQ_CONVERT, SPLIT_BLOCKS]
    for dtype, D, causal in entry.instantiations()
    for arch in ARCHS
    if entry.runs_on(int(arch[3:])) and dtype in _cpu_dtypes(entry, arch, causal)  # one 16-bit type an arch
]


def test_compile_dtypes_splits_the_16bit_types_and_drops_none():
    """testing.compile_dtypes: fp16 on sm_80 and bf16 on sm_90 for a kernel built for both, both
    types where a kernel has one arch; fp32 always."""
    both = ("float16", "bfloat16")
    assert BWD_VERSIONS["bwd_v2"].dtypes == both and BWD_VERSIONS["bwd_v5"].dtypes == both
    assert compile_dtypes(BWD_VERSIONS["bwd_v2"], "sm_80") == ("float16",)
    assert compile_dtypes(BWD_VERSIONS["bwd_v2"], "sm_90") == ("bfloat16",)
    assert compile_dtypes(BWD_VERSIONS["bwd_v5"], "sm_90") == both  # sm_90a only
    assert BWD_PREPROCESS.dtypes == ("float32", *both)
    assert compile_dtypes(BWD_PREPROCESS, "sm_80") == ("float32", "float16")


@pytest.fixture(scope="module")
def compiled_in_parallel():
    """Every instantiation below compiled once up front, one NVRTC per core: serially they were
    the longest part of CI's two runs of this file; each is disassembled there too."""
    jobs = {(e.file, e.name_expression(dt, D, causal), arch) for e, dt, D, causal, arch in INSTANCES}
    compile_in_parallel(jobs, disassemble=jobs)


@pytest.mark.parametrize("entry,dtype,D,causal,arch", INSTANCES, ids=lambda x: getattr(x, "name", str(x)))
def test_backward_compiles_without_spills(compiled_in_parallel, entry, dtype, D, causal, arch):
    cubin = _nvrtc.compile_kernel(entry.file, entry.name_expression(dtype, D, causal), arch)
    res = cubin.resources
    budget = entry.spill_bytes.get(D, 0)  # documented in versions.py
    assert res["stack_bytes"] <= budget and res["spill_stores"] <= budget and res["spill_loads"] <= budget, res
    threads = _params.block_threads(cubin.data, cubin.lowered_name)
    assert res["registers"] * threads <= 65536
    assert not cubin.wgmma_serialized, "ptxas serialised the kernel's wgmma (C7514)"
    assert _params.smem_bytes(cubin) <= (163 if arch == "sm_80" else 227) * 1024
    layout = _params.packer(cubin.data, cubin.lowered_name, entry.tensor_maps, _params.ENTRY_ARGS[entry.fields], [])
    assert layout.offsets[0] == 0 and (layout.tma_offset is not None) == entry.tensor_maps
    sass = _nvrtc.sass(cubin)
    # dQ, dK, dV reduced with fire-and-forget RED (bwd_common.cuh's red_add), never ATOMG, whose
    # unused result still stalls the warp; sm_90 adds dQ's adjacent pairs in one (F32x2).
    float_atomics = re.search(r"\bREDG?\.E\.ADD\.F32", sass) and not re.search(r"\bATOMG?\.E\.ADD\.F32", sass)
    if entry.name == "bwd_preprocess":  # O and dO rows by 16-byte loads, 4-32 lanes a row
        assert "LDG.E.128" in sass and "SHFL.BFLY" in sass
    if entry.name == "bwd_dq_convert":  # 16-byte loads of the tiles, 16-byte stores of the rows
        assert "LDG.E.128" in sass and "STG.E.128" in sass and "STS.64" in sass
    if entry.name == "split_blocks":  # per 8 floats (D / 32 a thread) two 16-byte loads, a 16-byte store a
        # half; the block's max through shuffles and shared memory
        assert sass.count("LDG.E.128") == 2 * D // 32 and sass.count("STG.E.128") == 2 * D // 32
        assert "SHFL.BFLY" in sass and "BAR.SYNC" in sass
    mma_sync = entry.file == "bwd_v2_mma.cu"  # bwd_v2 and its variants / varlen kernels
    if mma_sync and arch == "sm_90":
        assert "REDG.E.ADD.F32x2" in sass
    if "_variants" in entry.kernel:  # softcap's tanh on the SFU (its derivative from the same value)
        assert "MUFU.TANH" in sass
    if mma_sync:
        assert "HMMA.16816.F32" in sass and "LDSM.16.MT88.4" in sass and float_atomics  # mma, ldmatrix.trans
    elif entry.name == "bwd_v3":  # every product on wgmma: S^T, dP^T, dV, dK and dQ per D/64 part, per k16 step
        assert sass.count("HGMMA") == 2 * D // 16 + 2 * 4 + 4 * D // 64 and "HMMA" not in sass
        assert "REDG.E.ADD.F32x2" in sass and float_atomics
    elif entry.file == "bwd_v5_dq_bulk.cu" or entry.name == "bwd_v4":  # bwd_v3's products (dQ: all 128 keys
        # where the warpgroups share dS, at D=128 and Br=128, else its own 64), the producer's tensor
        # copies (K, V once; Q, dO per block) and the register hand-over.  At D=64, Br=64 the PIPE
        # order (bwd_v4_ws.cu) issues S^T and dP^T at two sites: a tile's first block, and block
        # n+1's under block n's dQ.  bwd_v5's packed kernels: four loops of 16-byte shared stores
        # more, the rows of Q, dO, K and V past a sequence zeroed.
        Br, Bc = entry.tiles[D]
        sites = 2 if D == 64 and Br == 64 else 1
        dq_keys = Bc if D == 128 or Br == 128 else 64
        assert sass.count("HGMMA") == sites * 2 * D // 16 + 2 * Br // 16 + dq_keys // 16 and "HMMA" not in sass
        assert sass.count("UTMALDG") == 4 * D // 64 and "USETMAXREG" in sass
        assert float_atomics  # dK, dV
        if entry.name == "bwd_v4":
            assert "REDG.E.ADD.F32x2" in sass
        else:  # dQ: eight 16-byte shared stores a thread and one bulk reduction, no RED of its own
            assert "REDG.E.ADD.F32x2" not in sass and sass.count("UBLKRED") == 1
            if entry.kernel.endswith("_varlen"):  # (ptxas unrolls the zeroing loops: 8 + 24 under NVRTC 13.0)
                assert sass.count("STS.128") >= 8 + 4
            else:
                assert sass.count("STS.128") == 8
    elif entry.name == "bwd_v6":  # S^T, dP^T (m64n32: a warpgroup's 32 rows) over D / 16 k-steps;
        # dV, dK (both operands MN-major) and dQ (m64n128: a warpgroup's half of the head dim) over
        # the block's 64 rows, 64 keys; dQ's adds four floats a RED; P and dS stored by stmatrix
        Br, Bc = entry.tiles[D]
        assert sass.count("HGMMA.64x32x16") == 2 * D // 16 and sass.count("HGMMA.64x128x16") == 2 * Br // 16 + Bc // 16
        assert sass.count("UTMALDG") == 4 * D // 64 and "USETMAXREG" in sass and "HMMA" not in sass
        assert sass.count("REDG.E.ADD.F32x4") == D // 2 // 8 and sass.count("STSM.16.MT88.4") == 2 * 2 * Br // 2 // 16
        assert float_atomics  # dK, dV under GQA
    elif entry.name == "bwd_v2.3":  # bwd_v6's products on fp16 halves, three per multiply: S^T, dP^T
        # (m64n32, a warpgroup's 32 rows) over D; D=128: dQ over 64 keys, dV and dK (m64n64: a
        # warpgroup's half of the head dim); D=64: dQ over 32 keys and one of dV, dK (all 64
        # columns).  Hi and lo tiles by TMA; dQ's adds four floats a RED; P, dS hi / lo by stmatrix.
        Br, Bc = entry.tiles[D]
        dq_keys, products = (Bc, 2) if D == 128 else (Bc // 2, 1)
        assert sass.count("HGMMA.64x32x16.F32") == 3 * 2 * D // 16 and "HMMA" not in sass
        assert sass.count("HGMMA.64x64x16.F32") == 3 * (dq_keys // 16 + products * Br // 16)
        assert sass.count("UTMALDG") == 2 * 4 * D // 64 and "USETMAXREG" in sass
        assert sass.count("REDG.E.ADD.F32x4") == 8 and sass.count("STSM.16.MT88.4") == 2 * 4 * Br // 2 // 16
        assert float_atomics  # dK, dV under GQA
    elif not entry.name.startswith("bwd_v2.2"):
        assert "HMMA" not in sass  # CUDA cores only
    if entry.name == "bwd_v1":
        assert "FFMA" in sass and float_atomics
    if entry.name.startswith("bwd_v2.2"):  # every product on TF32 mma.sync: 3 per multiply, or 1 (tf32)
        per_k8 = 1 if entry.precision == "tf32" else 3  # 5 products of D x Bc x Br/64 m16n8k8 each, per warp
        Bc = entry.tiles[D][1]
        assert sass.count("HMMA.1688.F32.TF32") == per_k8 * 5 * D * Bc // 64 and "LDSM.16.M88.4" in sass
        assert float_atomics and "LDGSTS" in sass


# The forward's awkward shapes: N in {1, 17, 113, 203, 1023, 4224}, Nq != Nk both ways, GQA 2:1
# and 8:1, MQA, both layouts, scales other than 1/sqrt(D) (negative too).
SHAPES = [  # B, H, H_kv, Nq, Nk, causal, scale, layout
    (1, 1, 1, 1, 1, None, None, "bnhd"),
    (2, 3, 3, 17, 17, "top_left", None, "bnhd"),
    (1, 4, 2, 113, 203, "bottom_right", None, "bnhd"),
    (1, 4, 1, 203, 113, "bottom_right", -0.3, "bhnd"),  # MQA; rows 0..89 see no key
    (2, 2, 2, 130, 67, None, 0.7, "bhnd"),
    (1, 8, 1, 1023, 1023, "top_left", None, "bnhd"),
    (1, 2, 2, 4224, 4224, None, None, "bhnd"),
]


def _check_backward(
    dtype, D, B, H, H_kv, Nq, Nk, causal, scale, layout, deterministic=False, version=None, precision=None
):
    import torch

    import tileattn
    from tileattn.backward import attention_backward

    dt = getattr(torch, dtype)
    shape = lambda N, heads: (B, N, heads, D) if layout == "bnhd" else (B, heads, N, D)
    q = torch.randn(shape(Nq, H), device="cuda", dtype=dt)
    k, v = (torch.randn(shape(Nk, H_kv), device="cuda", dtype=dt) for _ in range(2))
    dO = torch.randn_like(q)
    s = D**-0.5 if scale is None else scale
    inputs = [x.clone() for x in (q, k, v, dO)]
    with torch.no_grad():
        out, lse = tileattn.api._call(q, k, v, s, causal, layout, None, None, "scale", True)
        poison_allocator(4 * (3 * q.numel() + 3 * k.numel()))
        got = attention_backward(
            q, k, v, out, lse, dO, s, causal, layout, version=version, deterministic=deterministic, precision=precision
        )
    assert all(torch.equal(a, b) for a, b in zip(inputs, (q, k, v, dO))), "an input was modified"
    expected = reference_grads(q, k, v, dO, s, causal, layout)
    if precision == "tf32":  # one TF32 product per multiply: a bound relative to the gradients' scale
        scale = max(_rms(e) for e in expected)  # (N=1: dq = dk = 0 exactly, TF32's dS is not)
        for name, g, e in zip(("dq", "dk", "dv"), got, expected):
            assert not g.isnan().any(), f"{name} has NaN"
            err = _rms(g.double() - e)
            assert err <= TF32_REL * scale, f"{name}: RMS error {err:.2e}, gradients' RMS {scale:.2e}"
        return
    torch_grads = reference_grads(q, k, v, dO, s, causal, layout, q.dtype)
    _assert_within_torch_error(got, expected, torch_grads, dtype)


# The FP32 rungs at every head dim they take and every shape.  bwd_v2.2_tf32 (one TF32 product per
# multiply, operands truncated to 10 mantissa bits) is held to a relative RMS bound instead of
# PyTorch's FP32 error: dS = P (dP - D_i) subtracts nearly equal terms, and dq's error measured
# 1.0e-2 and 1.4e-2 of its RMS at scale 0.7, D = 64 and 128 (H200, 402ad7b; 3e-3 at N=8192 and
# the default scale in the bwd suite).
TF32_REL = 3e-2
FP32_CASES = [
    (name, D, *shape)
    for name, entry in BWD_VERSIONS.items()
    if "float32" in entry.dtypes
    for D in entry.head_dims
    for shape in SHAPES
]


@pytest.mark.gpu
@pytest.mark.parametrize("version,D,B,H,H_kv,Nq,Nk,causal,scale,layout", FP32_CASES)
def test_backward_fp32_matches_float64(request, version, D, B, H, H_kv, Nq, Nk, causal, scale, layout):
    """The FP32 rungs (bwd_v1, bwd_v2.2, bwd_v2.3) against float64 autograd, within 2x PyTorch's FP32
    math backward's error; bwd_v2.2_tf32 within TF32_REL."""
    if BWD_VERSIONS[version].tensor_maps:  # bwd_v2.3: sm_90, after its pipeline's first calls
        request.getfixturevalue("ws_rungs_finish")
    precision = BWD_VERSIONS[version].precision
    _check_backward("float32", D, B, H, H_kv, Nq, Nk, causal, scale, layout, version=version, precision=precision)


@pytest.mark.gpu
@pytest.mark.parametrize("version", [n for n, e in BWD_VERSIONS.items() if e.precision == "fp32" and n != "bwd_v1"])
@pytest.mark.parametrize(
    "q_mag,k_mag,v_mag,do_mag",
    [
        (1e3, 1e-3, 3e-7, 1e-9),  # dO of a float32 loss's size, v small
        (1e-6, 1e6, 1e5, 7e3),  # large v and dO
        (1.0, 1.0, 1.0, 0.0),  # dO = 0: every gradient exactly 0
        ((1e-3, 1.0, 0.1), (0.1, 1.0, 1e-2), (1e-4, 1.0, 1e4), (1e4, 1e-4, 1.0)),  # per head, 1e8 apart
    ],
)
def test_backward_fp32_any_magnitude(request, version, q_mag, k_mag, v_mag, do_mag):
    """The FP32 rungs hold their error relative to the gradients whatever the inputs' magnitudes,
    whole tensors' or (tuples) each head's, checked head by head (bwd_v2.3 scales its fp16 halves
    by powers of two from each 64-row block's max): no absolute floor here, which would hide
    gradients of 1e-12."""
    import torch

    import tileattn
    from tileattn.backward import attention_backward

    entry = BWD_VERSIONS[version]
    if entry.tensor_maps:
        request.getfixturevalue("ws_rungs_finish")
    B, H, N, D = 2, 3, 333, 128
    mag = lambda m: torch.tensor(m, device="cuda").view(1, 1, -1, 1)  # a number or one per head (B, N, H, D)
    q, k, v, dO = (mag(m) * torch.randn(B, N, H, D, device="cuda") for m in (q_mag, k_mag, v_mag, do_mag))
    with torch.no_grad():
        out, lse = tileattn.api._call(q, k, v, D**-0.5, "bottom_right", "bnhd", None, None, "scale", True)
    q.requires_grad_()  # (called directly, as the bench does, on a leaf that requires grad)
    got = attention_backward(q, k, v, out, lse, dO, D**-0.5, "bottom_right", "bnhd", version=version)
    q = q.detach()
    expected = reference_grads(q, k, v, dO, D**-0.5, "bottom_right", "bnhd")
    torch_grads = reference_grads(q, k, v, dO, D**-0.5, "bottom_right", "bnhd", torch.float32)
    for name, g, e, r in zip(("dq", "dk", "dv"), got, expected, torch_grads):
        if do_mag == 0:
            assert not g.any(), f"{name} is not 0 for dO = 0"
            continue
        for head in range(H):
            ge, ee, re_ = (x[:, :, head] for x in (g.double(), e, r.double()))
            err, torch_err = _rms(ge - ee), _rms(re_ - ee)
            assert err <= 2 * torch_err + FLOOR["float32"][0] * _rms(ee), (
                f"{name} head {head}: {err:.2e} vs PyTorch's {torch_err:.2e}"
            )


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["bnhd", "bhnd"])
@pytest.mark.parametrize("D", SPLIT_BLOCKS.head_dims)
def test_split_blocks(layout, D):
    """split_blocks: each 64-row block of each (b, h) under its own exponent from its own max |x|
    (written where the rungs read it: per batch, each tensor's (heads, blocks) in turn); hi is x 2^e
    rounded to fp16, hi + lo within fp16's rounding of the rest, e putting the block's max |x| in
    [2^14, 2^15); head h's halves at h and heads + h; rows past N left alone (the last block is
    partial); strided inputs read in place."""
    import torch

    from tileattn import api

    B, N = 3, 77
    heads = (5, 1)  # a query tensor and an MQA key tensor: the maxima of both in one buffer
    ts = []
    for H in heads:
        shape = (B, N, H, D) if layout == "bnhd" else (B, H, N, D)
        t = torch.randn(shape[:-1] + (2 * D,), device="cuda")[..., :D]  # rows 2 D apart
        n_axis = 1 if layout == "bnhd" else 2
        rows = torch.logspace(-9, 6, N, device="cuda").reshape([N if i == n_axis else 1 for i in range(4)])
        ts.append(t * rows)  # blocks of very different magnitudes
        ts[-1][(slice(None),) * n_axis + (slice(64, None),)] = 0.0  # an all-zero (partial) block
    splits, amax = api._split_blocks(ts, [api._bhnd(t, layout) for t in ts], torch.cuda.current_device())
    TB = -(-N // 64)
    per_b = [H * TB for H in heads]
    amax = amax.view(B, sum(per_b))
    for i, (t, s, H) in enumerate(zip(ts, splits, heads)):
        x = (t.transpose(1, 2) if layout == "bnhd" else t).double()  # (B, H, N, D)
        m = amax[:, sum(per_b[:i]) : sum(per_b[: i + 1])].reshape(B, H, TB)
        blocks = torch.nn.functional.pad(x.abs().amax(-1), (0, 64 * TB - N)).view(B, H, TB, 64).amax(-1)
        assert torch.equal(m.double(), blocks) and s.shape == (B, 2 * H, N, D) and s.dtype == torch.float16
        e = torch.where(m > 0, 15 - torch.frexp(m).exponent, 15).repeat_interleave(64, -1)[..., :N, None]
        xs = torch.ldexp(x, e)
        hi, lo = s[:, :H].double(), s[:, H:].double()
        assert torch.equal(hi, xs.float().half().double())
        assert ((hi + lo - xs).abs() <= 2**-22 * 2**15 + 2**-25).all()
        assert (xs.abs().amax(-1) < 2**15).all() and (xs[:, :, :64].abs().amax((-1, -2)) >= 2**14).all()


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["bnhd", "bhnd"])
@pytest.mark.parametrize("causal", [False, "top_left", "bottom_right"])
def test_autograd_fp32_matches_float64(layout, causal):
    """loss.backward() through flash_attn_func / scaled_dot_product_attention (the custom op's
    autograd formula), GQA 4:2, Nq != Nk, a non-contiguous upstream gradient."""
    import torch

    import tileattn

    B, H, H_kv, Nq, Nk, D = 2, 4, 2, 77, 130, 64
    shape = lambda N, heads: (B, N, heads, D) if layout == "bnhd" else (B, heads, N, D)
    q = torch.randn(shape(Nq, H), device="cuda", requires_grad=True)
    k, v = (torch.randn(shape(Nk, H_kv), device="cuda", requires_grad=True) for _ in range(2))
    dO = torch.randn(q.shape[::-1], device="cuda").permute(3, 2, 1, 0)  # strided: last dim not contiguous
    if layout == "bnhd":
        out = tileattn.flash_attn_func(q, k, v, causal=causal)
    else:
        out = tileattn.scaled_dot_product_attention(q, k, v, is_causal=causal if causal else False, enable_gqa=True)
    assert out.grad_fn is not None
    out.backward(dO)
    # flash_attn_func's causal=True is bottom-right, SDPA's top-left; the strings are explicit.
    expected = reference_grads(q, k, v, dO, D**-0.5, causal or None, layout)
    torch_grads = reference_grads(q, k, v, dO, D**-0.5, causal or None, layout, q.dtype)
    _assert_within_torch_error([q.grad, k.grad, v.grad], expected, torch_grads, "float32")


@pytest.mark.gpu
def test_autograd_follows_the_forwards_precision():
    """precision="tf32" in the forward reaches the backward op: its gradients are the TF32 rung's
    (close to float64 within TF32_REL, and not the 3xTF32 rung's bits); the TF32 rung asked for by
    name without precision="tf32" raises."""
    import torch

    import tileattn
    from tileattn.backward import attention_backward

    q, k, v = (torch.randn(2, 300, 4, 64, device="cuda", requires_grad=True) for _ in range(3))
    dO = torch.randn_like(q)
    grads = {}
    for precision in (None, "tf32"):
        for t in (q, k, v):
            t.grad = None
        tileattn.flash_attn_func(q, k, v, causal=True, precision=precision).backward(dO)
        grads[precision] = [t.grad.clone() for t in (q, k, v)]
    expected = reference_grads(q, k, v, dO, 0.125, "bottom_right", "bnhd")
    scale = max(_rms(e) for e in expected)
    for name, g32, g, e in zip(("dq", "dk", "dv"), grads[None], grads["tf32"], expected):
        assert _rms(g.double() - e) <= TF32_REL * scale, name
        assert _rms(g32.double() - e) < _rms(g.double() - e) / 10, f"{name}: the default is not FP32-accurate"
    with torch.no_grad():
        out, lse = tileattn.flash_attn_func(q, k, v, return_lse=True)
        with pytest.raises(ValueError, match="'bwd_v2.2_tf32' computes with TF32 products"):
            attention_backward(q, k, v, out, lse, dO, 0.125, None, "bnhd", version="bwd_v2.2_tf32")


# Every head dim bwd_v2 takes, at every shape for 64, 128 and 256 (one per tiling, and the widest)
# and at all but N=4224 for the others.
BWD_V2_CASES = [
    (D, *shape) for D in BWD_VERSIONS["bwd_v2"].head_dims for shape in SHAPES if D in (64, 128, 256) or shape[3] < 4096
]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("D,B,H,H_kv,Nq,Nk,causal,scale,layout", BWD_V2_CASES)
def test_backward_16bit_matches_float64(dtype, D, B, H, H_kv, Nq, Nk, causal, scale, layout):
    """bwd_v2 against float64 autograd: within 2x the error of PyTorch's own math backward at the
    same precision (plus a small floor), as issue 11 asks."""
    _check_backward(dtype, D, B, H, H_kv, Nq, Nk, causal, scale, layout)


def _needs_hopper():
    import torch

    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the wgmma backward rungs (bwd_v3 .. bwd_v6) run on sm_90")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize(
    "D,B,H,H_kv,Nq,Nk,causal,scale,layout", [(D, *shape) for D in BWD_VERSIONS["bwd_v3"].head_dims for shape in SHAPES]
)
def test_backward_wgmma_matches_float64(dtype, D, B, H, H_kv, Nq, Nk, causal, scale, layout):
    """bwd_v3 (Hopper's wgmma) against float64 autograd, as bwd_v2: within 2x PyTorch's own
    error at the same precision plus the floor, at the forward's awkward shapes."""
    _needs_hopper()
    _check_backward(dtype, D, B, H, H_kv, Nq, Nk, causal, scale, layout, version="bwd_v3")


_WS_RUNGS = ("bwd_v4", "bwd_v5", "bwd_v6")  # the warp-specialised rungs, on mbarrier pipelines
_WS_SMOKE = """
import torch
from tileattn import api
from tileattn.backward import attention_backward
from tileattn.versions import BWD_VERSIONS
for D, mode in ((64, "top_left"), (128, None), (256, "top_left"), (256, None)):
    q, k, v, dO = (torch.randn(1, 2, 300, D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    out, lse = api._call(q, k, v, None, mode, "bhnd", None, None, "scale", True)
    for version in RUNGS:
        if D in BWD_VERSIONS[version].tiles:
            attention_backward(q, k, v, out, lse, dO, D**-0.5, mode, "bhnd", version=version)
            torch.cuda.synchronize()
    if D in BWD_VERSIONS["bwd_v5"].tiles:
        attention_backward(q, k, v, out, lse, dO, D**-0.5, mode, "bhnd", version="bwd_v5", deterministic=True)
        torch.cuda.synchronize()
    if D in BWD_VERSIONS["bwd_v2.3"].tiles:  # FP32 on the same pipeline
        q, k, v, dO, out = (t.float() for t in (q, k, v, dO, out))
        attention_backward(q, k, v, out, lse, dO, D**-0.5, mode, "bhnd", version="bwd_v2.3")
        torch.cuda.synchronize()
""".replace("RUNGS", repr(_WS_RUNGS))


@pytest.fixture(scope="module")
def ws_rungs_finish():
    """The warp-specialised rungs' mbarrier pipelines first run small calls in a child process with
    a time limit, so that a pipeline that hangs fails their tests instead of stalling the suite."""
    import subprocess
    import sys

    _needs_hopper()
    try:
        run = subprocess.run([sys.executable, "-c", _WS_SMOKE], timeout=180, capture_output=True, text=True)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{_WS_RUNGS} did not finish ten small backward calls in 180 s (a hang); their tests did not run")
    assert run.returncode == 0, f"{_WS_RUNGS}' first calls failed:\n{run.stderr[-3000:]}"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize(
    "version,D,B,H,H_kv,Nq,Nk,causal,scale,layout",
    [(v, D, *shape) for v in _WS_RUNGS for D in BWD_VERSIONS[v].head_dims for shape in SHAPES],
)
def test_backward_ws_matches_float64(ws_rungs_finish, version, dtype, D, B, H, H_kv, Nq, Nk, causal, scale, layout):
    """bwd_v4, bwd_v5 (warp-specialised, 128 keys a CTA) and bwd_v6 (D=256: the head dim split
    between the warpgroups) against float64 autograd, as bwd_v2 and bwd_v3."""
    _check_backward(dtype, D, B, H, H_kv, Nq, Nk, causal, scale, layout, version=version)


def _blocked_dq(dq, Br: int):
    """bwd_v5's (and bwd_v6's) dQ accumulator for the (B, H, rows, D) values dq, written as a direct
    model of its chunks: value 2 hh + e of n8 of thread 32 warp + 4 g + t is row 16 warp + 8 hh + g,
    column 8 n8 + 2 t + e of a 64 x 64 tile of its Q block (the wgmma accumulator layout), the
    block's tiles row strip by row strip, column tile by column tile (a warpgroup's: columns 64 w..
    in bwd_v5 at D=128, rows 64 w.. at Br=128; columns 128 w.. in bwd_v6's two)."""
    import torch

    B, H, rows, D = dq.shape
    acc = torch.empty(B, H, rows * D, dtype=torch.float32, device=dq.device)
    i = 0
    for blk in range(rows // Br):
        for strip, c in ((strip, c) for strip in range(Br // 64) for c in range(D // 64)):
            row0, col0 = blk * Br + 64 * strip, 64 * c
            for n8 in range(8):
                for tid in range(128):
                    warp, g, t = tid // 32, tid % 32 // 4, tid % 4
                    for hh in range(2):
                        for e in range(2):
                            acc[:, :, i] = dq[:, :, row0 + 16 * warp + 8 * hh + g, col0 + 8 * n8 + 2 * t + e]
                            i += 1
    return acc.view(B, H, rows, D)


@pytest.mark.parametrize("layout", ["bnhd", "bhnd"])
@pytest.mark.parametrize("D,Br,Nq", [(64, 64, 64), (64, 64, 100), (128, 64, 130), (64, 128, 200), (256, 64, 70)])
def test_dq_from_blocks_undoes_the_accumulator_order(layout, D, Br, Nq):
    """testing.dq_from_blocks (bwd_dq_convert's model) against the direct model of bwd_v5's chunks
    (CPU), at both tiles of Br: the accumulator is 64-row strips whatever the rung's Br."""
    import torch

    from tileattn.testing import dq_from_blocks

    B, H, blocks = 2, 3, -(-Nq // Br)
    dq = torch.randn(B, H, blocks * Br, D)
    got = dq_from_blocks(_blocked_dq(dq, Br), Nq, layout, torch.float64)
    assert got.dtype == torch.float64 and torch.equal(got, dq[:, :, :Nq].double())
    if layout == "bnhd":  # a (B, H, Nq, D) view of (B, Nq, H, D) memory: like() needs no copy
        assert got.transpose(1, 2).is_contiguous()


@pytest.mark.parametrize("Br", [64, 128])
def test_dq_from_blocks_of_packed_sequences(Br):
    """The packed model (bwd_v5_varlen's chunks, numbered as reference.varlen_kv_blocks) against
    the direct model of each sequence's chunks written at its start(b) (CPU): offsets from 5 on,
    an empty sequence, one of a single row, rows past the last sequence 0."""
    import torch

    from tileattn.testing import dq_from_blocks

    lens, start, H, D = [130, 0, 1, 64, 200], 5, 2, 64
    cu = torch.cumsum(torch.tensor([start, *lens]), 0).to(torch.int32)
    total = int(cu[-1]) + 7  # rows of q past the last sequence
    chunks = -(-total // Br) + len(lens)
    dq = torch.randn(1, H, total, D)
    rows = torch.zeros(1, H, chunks * Br, D)  # each sequence's rows at its first chunk, whole chunks each
    for b, n in enumerate(lens):
        first = (int(cu[b]) - start) // Br + b
        rows[:, :, first * Br : first * Br + n] = dq[:, :, int(cu[b]) : int(cu[b]) + n]
    got = dq_from_blocks(_blocked_dq(rows, Br), total, "bnhd", torch.float64, cu, Br)
    want = dq.double().clone()
    want[:, :, :start], want[:, :, int(cu[-1]) :] = 0, 0
    assert torch.equal(got, want)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["bnhd", "bhnd"])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("D,Br", [(64, 128), (128, 64)])
def test_dq_convert_of_packed_sequences_matches_its_model(layout, dtype, D, Br):
    """bwd_dq_convert over packed sequences (bwd_v5_varlen's chunks) against testing.dq_from_blocks:
    70 sequences of 0..300 rows from row 17 on, output poisoned with NaN first (rows no sequence
    holds must come out 0)."""
    import torch

    from tileattn.backward import _dq_from_blocks
    from tileattn.testing import dq_from_blocks

    lens = torch.randint(0, 301, (70,), generator=torch.Generator().manual_seed(D))
    cu = torch.cumsum(torch.cat([torch.tensor([17]), lens]), 0).to("cuda", torch.int32)
    total, H = int(cu[-1]) + 5, 3
    acc = torch.randn(1, H, (-(-total // Br) + 70) * Br, D, device="cuda")
    dt = getattr(torch, dtype)
    poison = torch.full((H * total * D,), float("nan"), device="cuda", dtype=dt)
    del poison
    got = _dq_from_blocks(acc, total, layout, dt, torch.cuda.current_device(), cu, Br)
    want = dq_from_blocks(acc, total, layout, dt, cu, Br)
    assert got.shape == want.shape == (1, H, total, D) and torch.equal(got, want)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["bnhd", "bhnd"])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("D,B,H,Nq", [(64, 2, 3, 1), (64, 1, 2, 200), (128, 3, 1, 130), (128, 1, 65537, 64)])
def test_dq_convert_matches_its_model(layout, dtype, D, B, H, Nq):
    """bwd_dq_convert (the blocked float32 dQ -> the gradient) against testing.dq_from_blocks, on
    random accumulators (rows past Nq included: they must not be written), output poisoned with
    NaN first; B * H above 65535 too (its grid is one-dimensional)."""
    import torch

    from tileattn.backward import _dq_from_blocks
    from tileattn.testing import dq_from_blocks

    rows = -(-Nq // 64) * 64
    acc = torch.randn(B, H, rows, D, device="cuda")
    dt = getattr(torch, dtype)
    # The output is fresh memory: NaN into the block of its size that the allocator hands out next.
    poison = torch.full((B * H * Nq * D,), float("nan"), device="cuda", dtype=dt)
    del poison
    got = _dq_from_blocks(acc, Nq, layout, dt, torch.cuda.current_device())
    want = dq_from_blocks(acc, Nq, layout, dt)
    assert got.shape == want.shape == (B, H, Nq, D) and torch.equal(got, want)
    assert (got.transpose(1, 2) if layout == "bnhd" else got).is_contiguous()  # the caller's layout


@pytest.mark.parametrize(
    "arch,dtype,D,deterministic,rung",
    [
        ((9, 0), "bfloat16", 64, False, "bwd_v5"),
        ((9, 0), "float16", 128, True, "bwd_v5"),
        ((9, 0), "bfloat16", 256, False, "bwd_v6"),
        ((9, 0), "bfloat16", 256, True, "bwd_v2"),  # bwd_v6 has no deterministic mode
        ((9, 0), "float16", 96, False, "bwd_v2"),
        ((8, 0), "bfloat16", 256, False, "bwd_v2"),
        ((9, 0), "float32", 128, False, "bwd_v2.3"),
        ((9, 0), "float32", 64, True, "bwd_v2.2"),  # bwd_v2.3 has no deterministic mode
        ((9, 0), "float32", 32, False, "bwd_v2.2"),
        ((8, 0), "float32", 128, False, "bwd_v2.2"),
    ],
)
def test_default_rung(monkeypatch, arch, dtype, D, deterministic, rung):
    """The rung autograd picks, by arch, dtype, head dim and determinism (CPU: the arch is faked)."""
    from tileattn import backward

    monkeypatch.setattr(_nvrtc, "device_arch", lambda device_index: arch)
    assert backward.default_rung(dtype, D, deterministic, 0) == rung
    if dtype == "float32":  # precision="tf32" picks the TF32 rung everywhere
        assert backward.default_rung(dtype, D, deterministic, 0, "tf32") == "bwd_v2.2_tf32"


@pytest.mark.parametrize(
    "arch,dtype,D,varlen,variants,rung",
    [
        ((9, 0), "bfloat16", 64, True, False, "bwd_v5_varlen"),
        ((9, 0), "float16", 128, True, False, "bwd_v5_varlen"),
        ((9, 0), "bfloat16", 96, True, False, "bwd_v2_varlen"),
        ((9, 0), "bfloat16", 64, True, True, "bwd_v5_variants_varlen"),
        ((9, 0), "float16", 128, False, True, "bwd_v5_variants"),
        ((9, 0), "bfloat16", 256, False, True, "bwd_v2_variants"),
        ((9, 0), "bfloat16", 80, True, True, "bwd_v2_variants_varlen"),
        ((8, 0), "bfloat16", 64, True, False, "bwd_v2_varlen"),
        ((8, 0), "bfloat16", 128, False, True, "bwd_v2_variants"),
    ],
)
def test_special_rung(monkeypatch, arch, dtype, D, varlen, variants, rung):
    """The backward kernel of packed sequences and of the score variants: bwd_v5's on Hopper at D =
    64, 128, the mma.sync kernels elsewhere (CPU: the arch is faked)."""
    from tileattn import backward

    monkeypatch.setattr(_nvrtc, "device_arch", lambda device_index: arch)
    assert backward.special_rung(dtype, D, varlen, variants, 0).name == rung


def test_forced_special_rung_restores_the_choice(monkeypatch):
    """testing.forced_special_rung (the probes' way to time the kernel Hopper ran before): the
    forced entry inside the block, backward.special_rung's own choice after it, even on an error."""
    from tileattn import backward
    from tileattn.testing import forced_special_rung

    monkeypatch.setattr(_nvrtc, "device_arch", lambda device_index: (9, 0))
    with pytest.raises(KeyError), forced_special_rung(BWD_V2_VARLEN):
        assert backward.special_rung("bfloat16", 64, True, False, 0) is BWD_V2_VARLEN
        raise KeyError
    assert backward.special_rung("bfloat16", 64, True, False, 0) is BWD_V5_VARLEN


@pytest.mark.parametrize(
    "causal,deterministic,adds,BH,Nq,Nk,D,plan",
    [
        (None, False, True, 64, 8192, 8192, 128, (4092, 32, 4)),  # the bwd suite: 4096 blocks, 31 waves + 4
        (None, False, True, 128, 4096, 4096, 64, (4092, 8, 4)),  # (parts of at least 4 of the 32 Q blocks)
        (None, False, True, 512, 1024, 1024, 128, None),  # 16 Q blocks a K/V block: too short to gain
        (None, False, True, 2, 4100, 200, 128, (0, 16, 4)),  # one wave of 4: the tail is every block
        (None, False, True, 66, 2048, 128, 128, (0, 2, 66)),  # 66 = half the SMs
        (None, False, True, 67, 2048, 128, 128, None),  # 67 of 132: no gain in halving them
        (None, False, True, 132, 8192, 128, 128, None),  # whole waves
        ("top_left", False, True, 64, 8192, 8192, 128, None),  # causal: bwd_tile's order instead
        (None, True, True, 64, 8192, 8192, 128, None),  # deterministic: the adds' order is fixed
        (None, False, False, 64, 8192, 8192, 128, None),  # float32 accumulators stored, not added
    ],
)
def test_tail_plan(monkeypatch, causal, deterministic, adds, BH, Nq, Nk, D, plan):
    """backward._tail_plan on 132 SMs (CPU): which calls split the last partial wave of K/V blocks,
    from where in the launch's order, into how many parts."""
    from tileattn import backward

    monkeypatch.setattr(_nvrtc, "sm_count", lambda device_index: 132)
    entry = BWD_VERSIONS["bwd_v5"]
    assert backward._tail_plan(entry, causal, deterministic, adds, BH, Nq, Nk, *entry.tiles[D], 0) == plan
    assert backward._tail_plan(BWD_VERSIONS["bwd_v6"], causal, deterministic, adds, BH, Nq, Nk, 64, 64, 0) is None


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("case", ["main_and_tail", "tail_only", "mqa_tail"])
def test_backward_tail_split(ws_rungs_finish, dtype, D, case):
    """bwd_v5 where the last partial wave of K/V blocks runs as split parts (backward._tail_plan):
    after a main launch, as the whole call, and with MQA (the parts add into the accumulators),
    against float64 autograd."""
    from tileattn import backward

    sms = _nvrtc.sm_count(0)
    B, H, H_kv, Nq, Nk, layout = {
        "main_and_tail": (1, (sms + 4) // 2, (sms + 4) // 2, 4100, 250, "bnhd"),  # 2 K/V blocks a head: r = 3 or 4
        "tail_only": (1, 2, 2, 4100, 200, "bhnd"),
        "mqa_tail": (2, 4, 1, 4100, 500, "bnhd"),
    }[case]
    entry = BWD_VERSIONS["bwd_v5"]
    plan = backward._tail_plan(entry, None, False, True, B * H, Nq, Nk, *entry.tiles[D], 0)
    assert plan is not None and (plan[0] > 0) == (case == "main_and_tail"), plan
    _check_backward(dtype, D, B, H, H_kv, Nq, Nk, None, None, layout, version="bwd_v5")


@pytest.mark.gpu
def test_backward_ws_refuses_deterministic():
    import torch

    from tileattn.backward import attention_backward

    _needs_hopper()
    q, k, v, dO = (torch.randn(1, 64, 2, 64, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    lse = torch.zeros(1, 2, 64, device="cuda")
    with pytest.raises(ValueError, match="'bwd_v4' has no deterministic mode"):
        attention_backward(q, k, v, q, lse, dO, 0.125, None, "bnhd", version="bwd_v4", deterministic=True)


@pytest.mark.gpu
@pytest.mark.parametrize("version", ["bwd_v3", "bwd_v5"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_backward_wgmma_deterministic(ws_rungs_finish, version, dtype):
    """bwd_v3 and bwd_v5 with deterministic=True: within the tolerance of float64 (GQA 4:1, causal,
    Nq != Nk; D=128 and 64) and bitwise-identical over three runs (non-causal too: every K/V block
    adds into every Q block's dQ)."""
    import torch

    import tileattn
    from tileattn.backward import attention_backward

    _check_backward(dtype, 128, 2, 8, 2, 1000, 777, "bottom_right", None, "bnhd", deterministic=True, version=version)
    _check_backward(dtype, 64, 1, 4, 1, 203, 1023, None, None, "bhnd", deterministic=True, version=version)
    dt = getattr(torch, dtype)
    for D, causal in ((64, True), (128, False)):
        q = torch.randn(1, 999, 4, D, device="cuda", dtype=dt)
        k, v = (torch.randn(1, 999, 1, D, device="cuda", dtype=dt) for _ in range(2))
        dO = torch.randn_like(q)
        with torch.no_grad():
            out, lse = tileattn.flash_attn_func(q, k, v, causal=causal, return_lse=True)
            mode = "bottom_right" if causal else None
            runs = [attention_backward(q, k, v, out, lse, dO, D**-0.5, mode, "bnhd", version=version,
                                       deterministic=True) for _ in range(3)]  # fmt: skip
        for run in runs[1:]:
            assert all(torch.equal(a, b) for a, b in zip(runs[0], run)), f"D={D} causal={causal}: runs differ"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_torch_compile_training_step_matches_eager(dtype):
    """torch.compile(fullgraph=True) of a small transformer block's training step (forward,
    loss, backward through tileattn::fwd's autograd formula): the same gradients as eager."""
    import torch
    from test_gpu import _block

    dt = getattr(torch, dtype)
    torch._dynamo.reset()
    torch.manual_seed(0)
    block = _block().to(device="cuda", dtype=dt)
    x = torch.randn(2, 333, 256, device="cuda", dtype=dt)

    def step(model):
        model.zero_grad(set_to_none=True)
        loss = model(x).float().square().mean()
        loss.backward()
        return loss.detach(), [p.grad.detach().clone() for p in model.parameters()]

    loss_e, grads_e = step(block)
    compiled = torch.compile(block, fullgraph=True)  # any graph break raises
    loss_c, grads_c = step(compiled)
    tol = dict(rtol=3e-2, atol=3e-2) if dtype == "bfloat16" else dict(rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(loss_c, loss_e, **tol)
    for ge, gc in zip(grads_e, grads_c):
        torch.testing.assert_close(gc, ge, **tol)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_deterministic_backward_is_bitwise_reproducible(dtype):
    """deterministic=True: two runs give identical bits (GQA 4:1, causal, many K/V blocks adding
    into each Q block's dQ), and agree with the default (atomic) mode within rounding."""
    import torch

    import tileattn
    from tileattn.backward import attention_backward

    dt = getattr(torch, dtype)
    B, H, H_kv, N, D = 2, 8, 2, 1000, 64
    q = torch.randn(B, N, H, D, device="cuda", dtype=dt)
    k, v = (torch.randn(B, N, H_kv, D, device="cuda", dtype=dt) for _ in range(2))
    dO = torch.randn_like(q)
    with torch.no_grad():
        out, lse = tileattn.flash_attn_func(q, k, v, causal=True, return_lse=True)
        runs = [attention_backward(q, k, v, out, lse, dO, D**-0.5, "bottom_right", "bnhd", deterministic=True)
                for _ in range(3)]  # fmt: skip
        atomic = attention_backward(q, k, v, out, lse, dO, D**-0.5, "bottom_right", "bnhd")
    for i, name in enumerate(("dq", "dk", "dv")):
        assert all(torch.equal(runs[0][i], run[i]) for run in runs[1:]), f"{name} differs between runs"
    tol = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1e-2}[dtype]
    for name, g, a in zip(("dq", "dk", "dv"), runs[0], atomic):
        torch.testing.assert_close(g, a, rtol=tol, atol=tol, msg=lambda m, name=name: f"{name}: {m}")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,D", [("float32", 64), ("bfloat16", 64), ("bfloat16", 256)])
def test_backward_packed_qkv_and_many_heads(dtype, D):
    """q, k, v as views into one packed (B, N, 3, H, D) tensor (strided, not contiguous), and B*H
    above gridDim.y's 65535 (the launches split over bh_offset); the default rung of each (D=256:
    bwd_v6 on sm_90)."""
    import torch

    import tileattn
    from tileattn.backward import attention_backward

    dt = getattr(torch, dtype)
    for B, H, N in ((2, 4, 77), (1, 65536 + 5, 3)):
        qkv = torch.randn(B, N, 3, H, D, device="cuda", dtype=dt)
        q, k, v = qkv.unbind(2)
        dO = torch.randn_like(q)
        with torch.no_grad():
            out, lse = tileattn.flash_attn_func(q, k, v, causal="top_left", return_lse=True)
            got = attention_backward(q, k, v, out, lse, dO, D**-0.5, "top_left", "bnhd")
        expected = reference_grads(q, k, v, dO, D**-0.5, "top_left", "bnhd")
        torch_grads = reference_grads(q, k, v, dO, D**-0.5, "top_left", "bnhd", q.dtype)
        _assert_within_torch_error(got, expected, torch_grads, dtype, what=f"B={B} H={H} ")


@pytest.mark.gpu
def test_backward_suite_times_every_implementation_in_rounds(monkeypatch):
    """bench.backward_suite on one small case (soak and windows shortened): every implementation
    gets a row with its rounds' times and their median, and ours carry ratios to each peer."""
    import statistics

    from tileattn import bench

    monkeypatch.setattr(bench, "_SOAK_S", 0.01)
    monkeypatch.setattr(bench, "_STEADY_REP_MS", 5)
    rows = bench.backward_suite([bench.Case(1, 2, 200, 64, "bfloat16", True)], rungs=["bwd_v5"])
    by_impl = {r["impl"]: r for r in rows}
    assert {"bwd_v5", "bwd_v5_deterministic", "sdpa_cudnn", "sdpa_flash"} <= set(by_impl), sorted(by_impl)
    for r in rows:
        assert len(r["ms_rounds"]) == bench._BWD_ROUNDS and r["ms"] == statistics.median(r["ms_rounds"]), r
    ours = by_impl["bwd_v5"]
    assert ours["rel_err"] < 1e-2 and ours["vs_sdpa_flash"] > 0, ours
