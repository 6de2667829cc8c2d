"""The score variants of flash_attn_func and flash_attn_varlen_func (a sliding window, softcap,
ALiBi; v3.3's variants kernel, csrc/v3_3_wgmma.cu, and v3.1's on the mma.sync path,
csrc/v3_1_mma.cu): every instantiation compiles without spills to the instructions it exists for
(tests/test_varlen.py compiles v3.1's), the plain kernels carry none of it, the right kernel is
picked per arch, head dim and version, and bad input raises naming the argument (CPU); outputs and
lse against float64 on both rungs with each variant and all of them crossed with both causal
alignments and none, Nq != Nk, GQA, N=1, strided inputs, NaN-poisoned outputs, packed sequences
and B*H past gridDim.y, and the gradients (bwd_v2_variants) against float64 autograd (GPU)."""

import numpy as np
import pytest
import torch

from tileattn import _nvrtc, api, flash_attn_func, flash_attn_varlen_func, reference, serving
from tileattn.testing import (
    assert_serving_output,
    assert_within_torch_error,
    compile_entry_spill_free,
    compile_in_parallel,
    cu_seqlens,
    poison_allocator,
    reference_grads,
)
from tileattn.versions import (
    V3_1_VARIANTS,
    V3_1_VARLEN,
    V3_3_VARIANTS,
    V3_6_VARIANTS,
    V3_7_VARIANTS,
    V3_8_ALIBI,
    V3_9_WINDOW,
    VERSIONS,
)

WGMMA_INSTANCES = [(e, *i) for e in (V3_3_VARIANTS, V3_6_VARIANTS, V3_7_VARIANTS) for i in e.instantiations()]


@pytest.fixture(scope="module")
def compiled_in_parallel():
    """The kernels below compiled and disassembled up front, one NVRTC and cuobjdump per core."""
    plain_causal = ((dt, D, c) for e in (V3_8_ALIBI, V3_9_WINDOW) for dt, D, c in e.instantiations())
    instances = [*WGMMA_INSTANCES, *((e, *i) for e in (V3_8_ALIBI, V3_9_WINDOW) for i in e.instantiations())]
    jobs = {(e.file, e.name_expression(dt, D, c), "sm_90a") for e, dt, D, c in instances}
    jobs |= {_plain_causal_job(*i) for i in plain_causal}  # what v3.8's and v3.9's tests count against
    compile_in_parallel(jobs, disassemble=jobs)


def _plain_causal(D):
    """The plain causal rung that v3.8 and v3.9 build on at this head dim: v3.7's three consumers
    at D=64, v3.6 at D=128."""
    return VERSIONS["v3.7" if D == 64 else "v3.6"]


def _plain_causal_job(dtype, D, causal):
    """(file, name expression, arch) of _plain_causal's kernel (on Hopper: its tiles)."""
    plain = _plain_causal(D)
    return plain.file, plain.name_expression(dtype, D, causal, 90), "sm_90a"


def _plain_causal_sass(dtype, D, causal) -> str:
    return _nvrtc.sass(_nvrtc.compile_kernel(*_plain_causal_job(dtype, D, causal)))


@pytest.mark.parametrize("entry,dtype,D,causal", WGMMA_INSTANCES)
def test_variants_kernel_compiles_without_spills(compiled_in_parallel, entry, dtype, D, causal):
    _, sass = compile_entry_spill_free(entry, dtype, D, causal)
    # wgmma (HGMMA) as in v3.3, and softcap's tanh on the SFU (one MUFU.TANH a score).
    assert "HGMMA.64x" in sass and "MUFU.TANH" in sass and "MUFU.EX2" in sass
    # v3.6's walk strides over tiles by gridDim.x (v3.3's packed_tile reads it too).
    assert "c[0x0][0xc]" in sass
    # The speculative softmax (v3_3_wgmma.cu), whose check is the warpgroup's vote (BAR.RED.AND): at
    # D = 128 only (at D = 64 it measured slower with softcap and the window).
    assert ("BAR.RED.AND" in sass) == (D == 128)


@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_softcap_costs_one_fmul_a_score(compiled_in_parallel, D, causal):
    """The softcap keeps tanh(S s / c) in the fragment and its factor c / s rides the exponent's
    scale (mma.cuh: exp_scale_log2): one FMUL a score (S s / c) beside its MUFU.TANH, not two.
    Counted against v3.6's plain kernel of the same tile, which has neither."""
    _, sass = compile_entry_spill_free(V3_6_VARIANTS, "bfloat16", D, causal)
    v36 = VERSIONS["v3.6"]
    plain = _nvrtc.sass(_nvrtc.compile_kernel(v36.file, v36.name_expression("bfloat16", D, causal), "sm_90a"))
    tanh = sass.count("MUFU.TANH")
    assert tanh >= 128  # the block loop's two copies, 64 scores each
    assert sass.count(" FMUL ") - plain.count(" FMUL ") <= tanh + 8


@pytest.mark.parametrize("dtype,D,causal", V3_8_ALIBI.instantiations())
def test_alibi_mma_adds_one_k_step_and_no_instruction_a_score(compiled_in_parallel, dtype, D, causal):
    """v3.8: the plain causal kernel of its tile (v3.7 at D=64, v3.6 at 128) plus one bf16 k16
    step of S at each of its three issue sites (whatever the inputs' dtype: the block loop's two and
    the speculative softmax's S issued again), no tanh, and no FFMA a score (the variants kernels'
    ALiBi: 64 a block's copy of the loop, 158 more in all).  Both speculate (the warpgroup's vote,
    BAR.RED.AND), with the same exponentials."""
    _, sass = compile_entry_spill_free(V3_8_ALIBI, dtype, D, causal)
    base = _plain_causal_sass(dtype, D, causal)
    assert "BAR.RED.AND" in sass and "BAR.RED.AND" in base
    bf16 = "HGMMA.64x128x16.F32.BF16"
    assert sass.count(bf16) - base.count(bf16) == 3
    assert sass.count("HGMMA") == base.count("HGMMA") + 3
    assert "MUFU.TANH" not in sass and sass.count("MUFU.EX2") <= base.count("MUFU.EX2")
    assert sass.count(" FFMA ") - base.count(" FFMA ") < 32


@pytest.mark.parametrize("dtype,D,causal", V3_9_WINDOW.instantiations())
def test_window_kernel_is_plain_causal_with_a_left_edge(compiled_in_parallel, dtype, D, causal):
    """v3.9: the plain causal kernel of the same tile (v3.7's at D=64, v3.6's at D=128) with the
    window's left edge: spill-free, the speculative softmax's vote (BAR.RED.AND), the plain
    kernel's MMAs and exponentials, no tanh, and the edge's mask on the edge blocks only (a few
    dozen ISETP / FSEL a copy of the loop, no FFMA a score)."""
    _, sass = compile_entry_spill_free(V3_9_WINDOW, dtype, D, causal)
    assert "BAR.RED.AND" in sass and "MUFU.TANH" not in sass
    assert _plain_causal(D).tile(D, 90) == V3_9_WINDOW.tiles[D]
    base = _plain_causal_sass(dtype, D, causal)
    assert sass.count("HGMMA") == base.count("HGMMA")
    assert sass.count("MUFU.EX2") == base.count("MUFU.EX2")
    assert abs(sass.count(" FFMA ") - base.count(" FFMA ")) < 32


def test_alibi_slope_in_three_bf16_terms_is_exact():
    """v3.8's A fragment (v3_3_wgmma.cu alibi_slope_fragment): slope / scale as hi + mid + lo, each
    the bf16 rounding of what is left, holds every bit of the float32 over 52 decades, and each
    term times a key column c < 256 is exact in FP32 (8 + 8 significant bits), so the tensor
    core's sum is the float32 bias slope_s c up to the accumulator's own rounding."""
    gen = torch.Generator().manual_seed(0)
    s = torch.exp(torch.empty(100_000).uniform_(-60, 60, generator=gen)).float()
    bf16 = lambda x: x.bfloat16().float()
    hi = bf16(s)
    mid = bf16(s - hi)
    lo = bf16(s - hi - mid)
    assert torch.equal(hi.double() + mid.double() + lo.double(), s.double())
    c = torch.arange(256, dtype=torch.float64)
    for term in (hi, mid, lo):
        t = term[:1000, None].double()
        assert torch.equal((t * c).float().double(), t * c)


def test_plain_v33_has_no_variant_code():
    """The variants are a separate instantiation: the plain kernel carries no tanh."""
    cubin = _nvrtc.compile_kernel("v3_3_wgmma.cu", VERSIONS["v3.3"].name_expression("bfloat16", 128, True), "sm_90a")
    assert "MUFU.TANH" not in _nvrtc.sass(cubin)


@pytest.mark.parametrize("D", [64, 96, 256])
def test_plain_v31_has_no_variant_code(D):
    """v3.1's variants kernel is the varlen kernel's body compiled with VARIANTS: it has the tanh,
    v3_1_fwd (the rung, at its Hopper tile and its default one) and v3_1_varlen_fwd have none."""
    v31 = VERSIONS["v3.1"]
    plain = [(v31.name_expression("bfloat16", D, True, arch), arch) for arch in (80, 90)]
    plain.append((V3_1_VARLEN.name_expression("bfloat16", D, True), 90))
    for expr, arch in plain:
        assert "MUFU.TANH" not in _nvrtc.sass(_nvrtc.compile_kernel("v3_1_mma.cu", expr, f"sm_{arch}")), expr
    cubin = _nvrtc.compile_kernel("v3_1_mma.cu", V3_1_VARIANTS.name_expression("bfloat16", D, True), "sm_90")
    assert "MUFU.TANH" in _nvrtc.sass(cubin)


@pytest.mark.parametrize(
    "cc,D,version,variants,dtype,expected",
    [
        ((9, 0), 128, None, True, torch.bfloat16, "v3.3_variants"),  # packed (dense=False)
        ((9, 0), 128, None, False, torch.bfloat16, "v3.3_packed"),
        ((9, 0), 128, "v3.3", True, torch.float16, "v3.3_variants"),
        ((9, 0), 128, "v3.1", True, torch.bfloat16, "v3.1_variants"),  # forced onto mma.sync
        ((9, 0), 128, "v3.1", False, torch.bfloat16, "v3.1_varlen"),
        ((9, 0), 96, None, True, torch.float16, "v3.1_variants"),  # a head dim v3.3 has not
        ((8, 0), 64, None, True, torch.bfloat16, "v3.1_variants"),
        ((8, 9), 256, "v3.1", True, torch.float16, "v3.1_variants"),
        ((10, 0), 128, None, True, torch.bfloat16, "v3.1_variants"),  # (wgmma is sm_90a only)
        ((8, 0), 128, "v3.3", True, torch.bfloat16, r"on sm_80 with version='v3.3'"),
        ((9, 0), 40, None, True, torch.bfloat16, r"sm_80\+ \(v3.1\) at head dims \(32, 64, 80, 96, 128, 160"),
        ((9, 0), 64, None, True, torch.float32, "got torch.float32 at head dim 64 on sm_90"),
        ((7, 5), 64, None, True, torch.float16, "on sm_75"),
    ],
)
def test_packed_path_picks_the_kernel(monkeypatch, cc, D, version, variants, dtype, expected):
    """_packed_path: v3.3's kernels on Hopper at its head dims unless version="v3.1", v3.1's
    elsewhere on sm_80+; NotImplementedError naming what runs where otherwise."""
    monkeypatch.setattr(_nvrtc, "device_arch", lambda index: cc)
    device = torch.device("cuda", 0)
    if expected.endswith(("_variants", "_packed", "_varlen")):
        assert serving._packed_path("x", dtype, D, device, variants, version) == expected
    else:
        with pytest.raises(NotImplementedError, match=expected):
            serving._packed_path("x", dtype, D, device, variants, version)


@pytest.mark.parametrize(
    "cc,D,version,dtype,expected",
    [
        ((9, 0), 128, None, torch.bfloat16, "v3.6_variants"),
        ((9, 0), 64, None, torch.bfloat16, "v3.6_variants"),  # three=False: a softcap, or short causal
        ((9, 0), 64, "v3.6", torch.float16, "v3.6_variants"),
        ((9, 0), 64, "v3.7", torch.float16, "v3.7_variants"),
        ((9, 0), 128, "v3.7", torch.float16, r"version='v3.7' runs x on Hopper .* at head dims \(64,\)"),
        ((9, 0), 128, "v3.3", torch.bfloat16, "v3.3_variants"),  # the named rung
        ((9, 0), 256, None, torch.bfloat16, "v3.3_variants"),  # a head dim v3.6 has not
        ((9, 0), 96, None, torch.float16, "v3.1_variants"),
        ((8, 0), 128, None, torch.bfloat16, "v3.1_variants"),
        ((9, 0), 256, "v3.6", torch.bfloat16, r"version='v3.6' runs x on Hopper .* at head dims \(64, 128\)"),
        ((8, 0), 64, "v3.6", torch.bfloat16, r"version='v3.6' .* on sm_80"),
        ((9, 0), 128, "v3.8", torch.bfloat16, r"version='v3.8' runs causal ALiBi alone"),  # (alibi=False)
        ((9, 0), 128, "v3.9", torch.bfloat16, r"version='v3.9' runs a causal window alone"),  # (window_only=False)
    ],
)
def test_dense_variants_pick_the_persistent_kernel(monkeypatch, cc, D, version, dtype, expected):
    """Dense calls with variants (flash_attn_func): v3.6's persistent variants kernel on Hopper at
    its head dims, else as packed calls; version="v3.6" or "v3.7" elsewhere raises naming where
    it runs."""
    monkeypatch.setattr(_nvrtc, "device_arch", lambda index: cc)
    device = torch.device("cuda", 0)
    if expected.endswith("_variants"):
        assert serving._packed_path("x", dtype, D, device, True, version, dense=True) == expected
    else:
        with pytest.raises(NotImplementedError, match=expected):
            serving._packed_path("x", dtype, D, device, True, version, dense=True)


@pytest.mark.parametrize("D", [64, 128])
def test_causal_window_alone_takes_v3_9(monkeypatch, D):
    """A causal window alone (window_only) runs v3.9's kernel by default and when named; with a
    softcap or ALiBi beside it (window_only false) the variants kernel, v3.3's at D=256; naming v3.9
    where it does not run is an error."""
    monkeypatch.setattr(_nvrtc, "device_arch", lambda index: (9, 0))
    device, path = torch.device("cuda", 0), serving._packed_path
    assert path("x", torch.bfloat16, D, device, True, "v3.9", dense=True, window_only=True) == "v3.9_window"
    assert path("x", torch.float16, D, device, True, None, dense=True, window_only=True) == "v3.9_window"
    assert path("x", torch.bfloat16, D, device, True, None, dense=True) == "v3.6_variants"
    assert path("x", torch.bfloat16, D, device, True, "v3.6", dense=True, window_only=True) == "v3.6_variants"
    assert path("x", torch.bfloat16, 256, device, True, None, dense=True, window_only=True) == "v3.3_variants"
    with pytest.raises(NotImplementedError, match=r"version='v3.9' runs .* head dims \(64, 128\)"):
        path("x", torch.bfloat16, 256, device, True, "v3.9", dense=True, window_only=True)


@pytest.mark.parametrize(
    "D,softcap,window,causal,Nq,expected",
    [
        (64, 0.0, (-1, -1), False, 100, "v3.7_variants"),  # plain non-causal D = 64 runs v3.7
        (64, 0.0, (-1, 0), True, 4096, "v3.8_alibi"),  # causal ALiBi alone: on the tensor core
        (64, 0.0, (-1, 0), True, 1000, "v3.6_variants"),  # a short causal call: plain runs v3.6 there
        (64, 30.0, (-1, 0), True, 4096, "v3.6_variants"),  # softcap: the SFU binds on three consumers
        (64, 0.0, (300, 0), True, 4096, "v3.6_variants"),  # a window
        (64, 0.0, (-1, 300), False, 4096, "v3.6_variants"),  # a window to the right
        (128, 0.0, (-1, 0), True, 4096, "v3.8_alibi"),
        (128, 0.0, (-1, 0), True, 1000, "v3.8_alibi"),
        (128, 0.0, (-1, -1), False, 4096, "v3.6_variants"),  # |pos - j| is not linear across the diagonal
        (128, 2.0, (-1, 0), True, 4096, "v3.6_variants"),
    ],
)
def test_dense_variants_take_three_consumers_as_plain_v3_7(monkeypatch, D, softcap, window, causal, Nq, expected):
    """attention_variants's default on Hopper (ALiBi slopes given): v3.8 for causal ALiBi alone at
    D = 128, and at D = 64 where the plain dispatch takes v3.7 (not a short causal call); v3.7's
    variants kernel for non-causal ALiBi alone there; windows and softcap stay on v3.6's."""
    assert _variants_kernel(monkeypatch, D, softcap, window, causal, Nq, alibi=True) == expected


@pytest.mark.parametrize(
    "D,softcap,window,causal,expected",
    [
        (64, 0.0, (300, 0), True, "v3.9_window"),  # a causal window alone: plain causal's kernel
        (128, 0.0, (4096, 0), True, "v3.9_window"),
        (64, 30.0, (300, 0), True, "v3.6_variants"),  # with a softcap
        (128, 0.0, (300, 300), False, "v3.6_variants"),  # no causal mask: both edges
        (256, 0.0, (300, 0), True, "v3.3_variants"),  # a head dim v3.9 has not
    ],
)
def test_dense_causal_window_alone_takes_v3_9(monkeypatch, D, softcap, window, causal, expected):
    """attention_variants's default on Hopper without ALiBi: v3.9 for a causal window alone at
    D = 64 and 128; a window beside a softcap, a two-sided window or another head dim stays on a
    variants kernel."""
    assert _variants_kernel(monkeypatch, D, softcap, window, causal, 4096, alibi=False) == expected


def _variants_kernel(monkeypatch, D, softcap, window, causal, Nq, alibi):
    """The kernel attention_variants launches on a (mocked) Hopper for these variants (bf16,
    2 heads, ALiBi slopes given or not), nothing run."""
    monkeypatch.setattr(_nvrtc, "device_arch", lambda index: (9, 0))
    chosen = []
    monkeypatch.setattr(serving, "_launch_packed", lambda *a, kernel, **kw: chosen.append(kernel))
    q = torch.zeros(1, Nq, 2, D, dtype=torch.bfloat16, device="meta")
    k = v = torch.zeros(1, Nq, 2, D, dtype=torch.bfloat16, device="meta")
    monkeypatch.setattr(serving, "_prepare_scale_and_rows", lambda q, k, v, s, f: (q, k, v, s))
    monkeypatch.setattr(api, "_outputs", lambda out, lse, shape, dtype, *_: (torch.empty(shape, device="meta"), None))
    slopes = torch.zeros(2, device="meta") if alibi else None
    serving.attention_variants(q, k, v, 0.1, "top_left" if causal else None, window, softcap, slopes, False)
    (kernel,) = chosen
    return kernel


def test_reference_top_left_window_is_causal_mask():
    """attention_serving's offset: top-left causal equals the naive reference's top_left."""
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 2, n, 16)) for n in (5, 9, 9))
    o, lse = reference.attention_serving(q, k, v, causal=True, offset=0)
    o_ref, lse_ref = reference.attention_naive(q, k, v, None, "top_left")
    np.testing.assert_allclose(o, o_ref, atol=1e-12)
    np.testing.assert_allclose(lse, lse_ref, atol=1e-12)


def _cpu(B=2, N=8, H=4, H_kv=2, D=64):
    return [torch.zeros(B, N, h, D, dtype=torch.float16) for h in (H, H_kv, H_kv)]


BAD_INPUT = [
    (dict(window_size=(-2, 0)), ValueError, "window_size entries must be >= -1"),
    (dict(window_size=4), TypeError, "window_size must be a pair of ints"),
    (dict(softcap=-1.0), ValueError, "softcap must be finite and >= 0"),
    (dict(softcap=float("inf")), ValueError, "softcap must be finite and >= 0"),
    (dict(softcap="big"), TypeError, "softcap must be a float"),
    (dict(alibi_slopes=torch.zeros(3)), ValueError, r"alibi_slopes must be a float32 tensor of shape \(4,\)"),
    (dict(alibi_slopes=torch.zeros(4, dtype=torch.float64)), ValueError, "alibi_slopes must be a float32"),
    (dict(window_size=(8, 0), version="v2.3"), ValueError, "alibi_slopes run on v3.9, v3.8, v3.7, v3.6, v3.3 or v3.1"),
    (dict(softcap=1.0, precision="tf32"), ValueError, r"precision=None\); got version=None, precision='tf32'"),
    (dict(window_size=(8, 0), version="v3.1"), ValueError, "q must be a CUDA tensor"),  # (v3.1 takes variants)
    (dict(softcap=1.0), ValueError, "q must be a CUDA tensor"),
    (dict(window_size=(2.7, 0)), TypeError, "window_size must be a pair of ints"),
    (dict(window_size=(True, 0)), TypeError, "window_size must be a pair of ints"),
    (dict(window_size=np.array([4, 0])), ValueError, "q must be a CUDA tensor"),  # (an array of ints is fine)
]


@pytest.mark.parametrize("change,error,match", BAD_INPUT)
def test_variants_bad_input_names_the_argument(change, error, match):
    with pytest.raises(error, match=match):
        flash_attn_func(*_cpu(), **change)


@pytest.mark.parametrize("D,deterministic,match", [
    (40, False, "no backward pass for window_size, softcap or alibi_slopes with float16 at head dim 40"),
    (64, True, "no deterministic mode"),
])  # fmt: skip
def test_variants_refuse_gradients_they_cannot_give(D, deterministic, match):
    """An input that requires grad where bwd_v2_variants has no instantiation, or with
    deterministic=True (its dQ adds are atomics), raises before anything runs."""
    q, k, v = _cpu(D=D)
    q.requires_grad_()
    with pytest.raises(RuntimeError, match=match):
        flash_attn_func(q, k, v, window_size=(4, 0), deterministic=deterministic)


def test_variants_refuse_gradients_under_deterministic_algorithms():
    """torch.use_deterministic_algorithms(True) asks for the deterministic backward as
    deterministic=True does, which the variants do not have: the call raises."""
    q, k, v = _cpu(D=64)
    q.requires_grad_()
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        with pytest.raises(RuntimeError, match="use_deterministic_algorithms"):
            flash_attn_func(q, k, v, softcap=30.0)
    finally:
        torch.use_deterministic_algorithms(before)


def test_which_arguments_are_variants():
    """A causal mask's right = 0 is no window (the plain kernels run); anything else is."""
    cases = [  # window_size, softcap, slopes, causal -> a variant?
        ((-1, -1), 0.0, None, False, False), ((-1, -1), 0.0, None, True, False), ((-1, 0), 0.0, None, True, False),
        ((-1, 0), 0.0, None, False, True), ((8, 0), 0.0, None, True, True), ((-1, -1), 1.0, None, True, True),
        ((-1, -1), 0.0, torch.zeros(4), False, True), ((500, 500), 0.0, None, False, False),
    ]  # fmt: skip
    for window_size, softcap, slopes, causal, expected in cases:
        window, cap, slopes = serving._variants(window_size, softcap, slopes, causal, 2, 4, 100, torch.device("cpu"))
        assert serving.any_variant(window, cap, slopes, causal) == expected, (window_size, softcap, causal)


@pytest.mark.parametrize(
    "change",
    [dict(window_size=(-1, 0), causal=True, version="v3.1"), dict(window_size=[-1, -1], version="v3.1"),
     dict(window_size=(100, 100), version="v3"), dict(softcap=0.0, version="v3.1")],
)  # fmt: skip
def test_arguments_that_are_no_variant_take_the_plain_path(change):
    """No variant, whatever the version: the plain path and its checks run (here: CUDA's)."""
    with pytest.raises(ValueError, match="q must be a CUDA tensor"):
        flash_attn_func(*_cpu(), **change)


def test_kernel_softcap_drops_a_cap_that_cannot_bind():
    """The kernels divide softcap by the folded scale (>= 1e-30 / log2 e): where that overflows
    float32 the cap is off (exact), else it is passed as given."""
    assert serving._kernel_softcap(50.0, 0.125) == 50.0
    assert serving._kernel_softcap(30.0, -0.1) == 30.0  # (a negative scale goes onto q)
    assert serving._kernel_softcap(1e9, 0.0) == 0.0  # scale 0: 1e9 / 6.9e-31 overflows
    assert serving._kernel_softcap(2e8, 0.0) == 2e8
    assert serving._kernel_softcap(1e39, 0.125) == 0.0  # no float32 at all
    assert serving._kernel_softcap(0.0, 0.125) == 0.0


def test_a_window_wider_than_the_sequences_is_no_variant():
    """Arguments that amount to no variant take the plain path (here: its CUDA check)."""
    q, k, v = _cpu()
    with pytest.raises(ValueError, match="q must be a CUDA tensor"):
        flash_attn_func(q, k, v, causal=True, window_size=(100, 100))


# ---- GPU -------------------------------------------------------------------------------------

_VARIANTS = {
    "window": dict(window=(61, 29)),
    "window_left": dict(window=(130, -1)),
    "softcap": dict(softcap=1.5),
    # softcap with a window and no ALiBi: the window's edges masked after the tanh
    "softcap_window": dict(window=(61, 29), softcap=1.5),
    "softcap_window_left": dict(window=(130, -1), softcap=1.5),
    "alibi": dict(alibi="H"),
    "alibi_bh": dict(alibi="BH"),
    "all": dict(window=(200, 7), softcap=3.0, alibi="BH"),
}


# (rung, head dim): v3.3's head dims, and v3.1's (mma.sync) at its two row tiles per warp (64:
# Bc=64, 128: Bc=32), a head dim v3.3 has not (96) and its one row tile per warp (256: Br=64).
_RUNG_DIMS = [("v3.3", 64), ("v3.3", 128), ("v3.3", 256), ("v3.1", 64), ("v3.1", 96), ("v3.1", 128), ("v3.1", 256)]
# (v3.7's and v3.6's variants kernels: dense calls only)
_DENSE_RUNG_DIMS = [("v3.7", 64), ("v3.6", 64), ("v3.6", 128), *_RUNG_DIMS]


def _needs(version):
    """v3.6 and v3.3 run on Hopper only, v3.1 (and version=None) on any GPU of the tests (sm_80+)."""
    if version in ("v3.7", "v3.6", "v3.3") and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("v3.3 runs on Hopper")


def _slopes(kind, B, H, gen):
    if kind is None:
        return None
    shape = (H,) if kind == "H" else (B, H)
    return torch.rand(shape, device="cuda", generator=gen) * 0.3


def _as_np(t):
    return t.double().cpu().numpy()


def _float64_reference(q, k, v, scale, causal, window, softcap, slopes):
    """(O, lse) of reference.attention_serving in float64 for flash_attn_func's layout ((B, N, H, D)),
    positions aligned as ``causal`` (False, "top_left", "bottom_right"); O back in that layout."""
    heads = lambda t: _as_np(t).transpose(0, 2, 1, 3)
    o_ref, lse_ref = reference.attention_serving(
        heads(q), heads(k), heads(v), scale, causal=bool(causal), window=window, softcap=softcap,
        alibi_slopes=None if slopes is None else slopes.cpu().numpy(), offset=0 if causal == "top_left" else None,
    )  # fmt: skip
    return torch.from_numpy(o_ref.transpose(0, 2, 1, 3).copy()), torch.from_numpy(lse_ref)


def _assert_matches_float64(out, lse, q, k, v, scale, causal, window, softcap, slopes, dtype):
    """(O, lse) against _float64_reference within the serving tests' bounds."""
    assert_serving_output(out, lse, *_float64_reference(q, k, v, scale, causal, window, softcap, slopes), dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("version,D", _DENSE_RUNG_DIMS)
@pytest.mark.parametrize("causal", [False, "top_left", "bottom_right"])
@pytest.mark.parametrize("variant", list(_VARIANTS))
def test_variants_match_float64(dtype, version, D, causal, variant):
    _needs(version)
    spec = _VARIANTS[variant]
    gen = torch.Generator(device="cuda").manual_seed(D + len(variant))
    B, Nq, Nk, H, H_kv = 2, 300, 457, 4, 2  # Nq != Nk, neither a multiple of a tile; GQA
    q = torch.randn(B, Nq, H, D, device="cuda", dtype=dtype, generator=gen)
    k, v = (torch.randn(B, Nk, H_kv, D, device="cuda", dtype=dtype, generator=gen) for _ in range(2))
    slopes = _slopes(spec.get("alibi"), B, H, gen)
    window, softcap = spec.get("window", (-1, -1)), spec.get("softcap", 0.0)
    out = torch.full((B, Nq, H, D), float("nan"), device="cuda", dtype=dtype)  # poisoned
    lse = torch.full((B, H, Nq), float("nan"), device="cuda")
    mode = causal or None
    checked = serving._variants(window, softcap, slopes, mode is not None, B, H, Nq + Nk, q.device)
    serving.attention_variants(
        q, k, v, D**-0.5, mode, checked[0], softcap, slopes, True, out=out, lse=lse, version=version
    )
    _assert_matches_float64(out, lse, q, k, v, D**-0.5, causal, window, softcap, slopes, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("version,D", [("v3.7", 64), ("v3.6", 64), ("v3.6", 128), ("v3.3", 128)])
@pytest.mark.parametrize("causal", [False, "bottom_right"])
@pytest.mark.parametrize("window", [(-1, -1), (700, 300)])
def test_softcap_row_max_jumps_between_blocks(dtype, version, D, causal, window):
    """Softcap 12 over keys whose first 128 give scores near 0 and the rest scores of spread ~6:
    a row's max grows by ~10-17 (log2) after its first K/V block, so the speculative softmax's
    check (TILEATTN_SPEC_VARIANTS, v3_3_wgmma.cu) fails and the block takes the ordinary path, in
    the variants kernels as in the plain ones (test_gpu's test_mma_row_max_jumps_between_blocks).
    The bounds are the variants tests' own plus the SFU's tanh (about 2^-11 relative, times the
    cap of 12 in lse)."""
    _needs(version)
    gen = torch.Generator(device="cuda").manual_seed(D + len(str(causal)) + window[0])
    B, Nq, Nk, H, H_kv = 2, 700, 1000, 4, 2
    q = torch.randn(B, Nq, H, D, device="cuda", dtype=dtype, generator=gen)
    k, v = (torch.randn(B, Nk, H_kv, D, device="cuda", dtype=dtype, generator=gen) for _ in range(2))
    k[:, :128] *= 0.01
    k[:, 128:] *= 6.0
    out = torch.full((B, Nq, H, D), float("nan"), device="cuda", dtype=dtype)  # poisoned
    lse = torch.full((B, H, Nq), float("nan"), device="cuda")
    mode = causal or None
    checked = serving._variants(window, 12.0, None, mode is not None, B, H, Nq + Nk, q.device)
    serving.attention_variants(q, k, v, D**-0.5, mode, checked[0], 12.0, None, True, out=out, lse=lse, version=version)
    o_ref, lse_ref = _float64_reference(q, k, v, D**-0.5, causal, window, 12.0, None)
    err = ((out.cpu().double() - o_ref).norm() / o_ref.norm()).item()
    assert err < (1e-2 if dtype == torch.bfloat16 else 3e-3), err
    assert torch.isfinite(lse).all()
    assert (lse.cpu().double() - lse_ref).abs().max().item() < 1e-2


@pytest.mark.gpu
@pytest.mark.parametrize("window_left", [0, 1, 127, 128, 129, 300, 511, 640, 896, 1000])
@pytest.mark.parametrize(
    "Nq,Nk,causal", [(1000, 1000, "bottom_right"), (1000, 1000, "top_left"), (777, 1029, "top_left")]
)
def test_causal_left_windows_match_float64(window_left, Nq, Nk, causal):
    """v3.6's variants kernel (persistent) under causal left windows at offset 0 and beside it: windows
    of whole blocks and not, under one block, none that binds (1000), 64 heads so that CTAs take
    several pairs; bf16, D=64, float64 reference, NaN-poisoned outputs."""
    _needs("v3.6")
    gen = torch.Generator(device="cuda").manual_seed(window_left + Nq)
    B, H, H_kv, D, dtype = 8, 8, 2, 64, torch.bfloat16
    q = torch.randn(B, Nq, H, D, device="cuda", dtype=dtype, generator=gen)
    k, v = (torch.randn(B, Nk, H_kv, D, device="cuda", dtype=dtype, generator=gen) for _ in range(2))
    out = torch.full((B, Nq, H, D), float("nan"), device="cuda", dtype=dtype)
    lse = torch.full((B, H, Nq), float("nan"), device="cuda")
    window = (window_left, 0)
    checked = serving._variants(window, 0.0, None, True, B, H, Nq + Nk, q.device)
    serving.attention_variants(q, k, v, D**-0.5, causal, checked[0], 0.0, None, True, out=out, lse=lse, version="v3.6")
    _assert_matches_float64(out, lse, q, k, v, D**-0.5, causal, window, 0.0, None, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("version", ["v3.6", "v3.3", "v3.1"])
@pytest.mark.parametrize("causal", [False, "top_left", "bottom_right"])
@pytest.mark.parametrize("scale", [0.0, -0.07])
def test_variants_more_queries_than_keys_and_scale_zero(version, causal, scale):
    """Nq > Nk (a negative bottom-right offset: early rows see no key), and a scale of 0 (every
    score 0 before ALiBi; softcap then leaves it 0) or negative, with all three variants."""
    _needs(version)
    gen = torch.Generator(device="cuda").manual_seed(int(scale * 100) + len(str(causal)))
    B, Nq, Nk, H, H_kv, D = 2, 457, 300, 4, 1, 128
    q = torch.randn(B, Nq, H, D, device="cuda", dtype=torch.float16, generator=gen)
    k, v = (torch.randn(B, Nk, H_kv, D, device="cuda", dtype=torch.float16, generator=gen) for _ in range(2))
    slopes = _slopes("BH", B, H, gen)
    window, softcap = (90, 40), 1e9 if scale == 0.0 else 2.0  # (1e9 at scale 0: a cap that cannot bind)
    out, lse = flash_attn_func(q, k, v, softmax_scale=scale, causal=causal, window_size=window, softcap=softcap,
                               alibi_slopes=slopes, return_lse=True, version=version)  # fmt: skip
    _assert_matches_float64(out, lse, q, k, v, scale, causal, window, softcap, slopes, torch.float16)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "version,D", [("v3.7", 64), ("v3.6", 64), ("v3.3", 64), ("v3.1", 64), (None, 96)]
)  # (96: v3.1)
@pytest.mark.parametrize("Nq,Nk", [(1, 1), (1, 700), (129, 1), (700, 700)])
def test_variants_public_call_awkward(version, D, Nq, Nk):
    """flash_attn_func itself: N=1, strided views of one qkv buffer, a negative scale."""
    _needs(version)
    gen = torch.Generator(device="cuda").manual_seed(Nq + Nk)
    B, H = 3, 4
    buf = torch.randn(B, max(Nq, Nk), 3, H, D, device="cuda", dtype=torch.bfloat16, generator=gen)
    q, k, v = buf[:, :Nq, 0], buf[:, :Nk, 1], buf[:, :Nk, 2]
    slopes = _slopes("H", B, H, gen)
    out, lse = flash_attn_func(q, k, v, softmax_scale=-0.1, causal=True, window_size=(37, 0), softcap=2.0,
                               alibi_slopes=slopes, return_lse=True, version=version)  # fmt: skip
    _assert_matches_float64(out, lse, q, k, v, -0.1, "bottom_right", (37, 0), 2.0, slopes, torch.bfloat16)


def _bloom_slopes(H, B=None):
    """BLOOM's ALiBi slopes 2^(-8 (h + 1) / H), the steepest ~0.7: biases of hundreds of nats
    over long rows, which the three-term slope of v3.8 (v3_8_alibi_mma.cu) must carry exactly."""
    slopes = 2.0 ** (-8.0 * torch.arange(1, H + 1, device="cuda") / H)
    return slopes if B is None else slopes.repeat(B, 1) * torch.linspace(0.5, 1.5, B, device="cuda")[:, None]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("causal", ["top_left", "bottom_right"])
@pytest.mark.parametrize(
    "Nq,Nk,scale",
    [(300, 457, None), (457, 300, None), (1, 700, None), (2000, 2000, None), (700, 700, 0.0), (129, 300, 3.0)],
)
def test_alibi_mma_matches_float64(dtype, D, causal, Nq, Nk, scale):
    """v3.8 (causal ALiBi alone, the key term on the tensor core) against float64: lengths off every
    tile, Nq < Nk, Nq > Nk (rows that see no key), N=1, GQA, (B, H) slopes of BLOOM's range, a
    scale of 0 (the bias alone: slope / scale taken at the 1e-30 clamp) and a large one."""
    _needs("v3.7")
    gen = torch.Generator(device="cuda").manual_seed(Nq * 3 + Nk + D)
    B, H, H_kv = 2, 8, 2
    scale = D**-0.5 if scale is None else scale
    q = torch.randn(B, Nq, H, D, device="cuda", dtype=dtype, generator=gen)
    k, v = (torch.randn(B, Nk, H_kv, D, device="cuda", dtype=dtype, generator=gen) for _ in range(2))
    slopes = _bloom_slopes(H, B)
    out = torch.full((B, Nq, H, D), float("nan"), device="cuda", dtype=dtype)
    lse = torch.full((B, H, Nq), float("nan"), device="cuda")
    serving.attention_variants(q, k, v, scale, causal, (-1, -1), 0.0, slopes, True, out=out, lse=lse, version="v3.8")
    _assert_matches_float64(out, lse, q, k, v, scale, causal, (-1, 0), 0.0, slopes, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("causal", ["top_left", "bottom_right"])
@pytest.mark.parametrize("left", [0, 1, 127, 300, 1000])
@pytest.mark.parametrize("Nq,Nk", [(300, 457), (457, 300), (1, 700), (2000, 2000)])
def test_window_plain_kernel_matches_float64(dtype, D, causal, left, Nq, Nk):
    """v3.9 (a causal window alone on the plain causal kernel) against float64: windows of 0 keys
    past the diagonal to wider than the tile, edges inside and across K/V blocks, lengths off every
    tile, Nq > Nk (rows that see no key), N=1, GQA."""
    _needs("v3.7")
    gen = torch.Generator(device="cuda").manual_seed(Nq * 3 + Nk + D + left)
    B, H, H_kv = 2, 8, 2
    q = torch.randn(B, Nq, H, D, device="cuda", dtype=dtype, generator=gen)
    k, v = (torch.randn(B, Nk, H_kv, D, device="cuda", dtype=dtype, generator=gen) for _ in range(2))
    out = torch.full((B, Nq, H, D), float("nan"), device="cuda", dtype=dtype)
    lse = torch.full((B, H, Nq), float("nan"), device="cuda")
    serving.attention_variants(q, k, v, D**-0.5, causal, (left, 0), 0.0, None, True, out=out, lse=lse, version="v3.9")
    _assert_matches_float64(out, lse, q, k, v, D**-0.5, causal, (left, 0), 0.0, None, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("loud", ["first", "last"])
@pytest.mark.parametrize("slopes", ["bloom", "flat"])
def test_alibi_row_max_jumps_between_blocks(dtype, D, loud, slopes):
    """v3.8 over keys whose first (or last) 128 give scores of spread ~6 and the rest scores near 0,
    with BLOOM's slopes or flat ones (2^-10): a row's max jumps between K/V blocks against the walk's
    order either way (v3.8 walks from the diagonal leftwards), so its speculative softmax
    (v3_3_wgmma.cu) must fail its check and take the ordinary path, S issued again with the ALiBi
    step."""
    _needs("v3.7")
    gen = torch.Generator(device="cuda").manual_seed(D + len(loud) + len(slopes))
    B, Nq, Nk, H, H_kv = 2, 700, 1000, 8, 2
    q = torch.randn(B, Nq, H, D, device="cuda", dtype=dtype, generator=gen)
    k, v = (torch.randn(B, Nk, H_kv, D, device="cuda", dtype=dtype, generator=gen) for _ in range(2))
    loud_keys = slice(0, 128) if loud == "first" else slice(Nk - 128, Nk)
    k *= 0.01
    k[:, loud_keys] *= 600.0
    slope = _bloom_slopes(H) if slopes == "bloom" else torch.full((H,), 2.0**-10, device="cuda")
    out = torch.full((B, Nq, H, D), float("nan"), device="cuda", dtype=dtype)  # poisoned
    lse = torch.full((B, H, Nq), float("nan"), device="cuda")
    serving.attention_variants(q, k, v, D**-0.5, "bottom_right", (-1, -1), 0.0, slope, True, out=out, lse=lse,
                               version="v3.8")  # fmt: skip
    _assert_matches_float64(out, lse, q, k, v, D**-0.5, "bottom_right", (-1, 0), 0.0, slope, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("B,H,N", [(4100, 16, 3), (1, 2, 4096)])
def test_alibi_mma_public_call(B, H, N):
    """flash_attn_func's default for causal ALiBi alone (v3.8 at D = 64 past the short causal rule
    and at D = 128): strided views of one qkv buffer, a negative scale, B*H = 65,600 (one
    persistent launch; each tile finds its own (b, h) slope) and N = 4096 against float64."""
    _needs("v3.7")
    gen = torch.Generator(device="cuda").manual_seed(B + N)
    for D in (64, 128):
        buf = torch.randn(B, N, 3, H, D, device="cuda", dtype=torch.bfloat16, generator=gen)
        q, k, v = buf[:, :, 0], buf[:, :, 1], buf[:, :, 2]
        slopes = _bloom_slopes(H, B)
        out, lse = flash_attn_func(q, k, v, softmax_scale=-0.1, causal=True, alibi_slopes=slopes, return_lse=True)
        _assert_matches_float64(out, lse, q, k, v, -0.1, "bottom_right", (-1, 0), 0.0, slopes, torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.parametrize("version", ["v3.7", "v3.6", "v3.3", "v3.1"])
def test_variants_past_grid_y(version):
    """B*H = 65,600 with a window and (B, H) ALiBi slopes: two launches (v3.6: one persistent
    launch over every tile, as v3.7); the second's batches must find their own slopes and lse rows."""
    _needs(version)
    gen = torch.Generator(device="cuda").manual_seed(3)
    B, H, N, D = 4100, 16, 3, 64
    q, k, v = (torch.randn(B, N, H, D, device="cuda", dtype=torch.float16, generator=gen) for _ in range(3))
    slopes = _slopes("BH", B, H, gen)
    out, lse = flash_attn_func(
        q, k, v, causal=True, window_size=(1, 0), alibi_slopes=slopes, return_lse=True, version=version
    )
    S = torch.einsum("bihd,bjhd->bhij", q.float(), k.float()) * D**-0.5
    i, j = torch.arange(N, device="cuda")[:, None], torch.arange(N, device="cuda")[None, :]
    S = S - slopes[:, :, None, None] * (i - j).abs()
    S = S.masked_fill((j > i) | (j < i - 1), float("-inf"))
    ref = torch.einsum("bhij,bjhd->bihd", torch.softmax(S, dim=-1), v.float())
    torch.testing.assert_close(out.float(), ref, rtol=2e-3, atol=2e-3)
    torch.testing.assert_close(lse, torch.logsumexp(S, dim=-1), rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("version,D", _RUNG_DIMS)
@pytest.mark.parametrize("causal", [False, "top_left", "bottom_right"])
@pytest.mark.parametrize("variant", list(_VARIANTS))
def test_varlen_variants_match_float64(version, D, causal, variant):
    _needs(version)
    spec = _VARIANTS[variant]
    dtype = torch.bfloat16
    gen = torch.Generator(device="cuda").manual_seed(D)
    lens_q = [0, 1, 17, 128, 129, 300, 5]
    lens_k = [3, 1, 40, 128, 100, 333, 0]  # Nq != Nk both ways, a sequence with no key
    H, H_kv = 4, 2
    q = torch.randn(sum(lens_q), H, D, device="cuda", dtype=dtype, generator=gen)
    # k, v with 37 rows of NaN past the last sequence (a preallocated buffer's unused tail)
    nan_tail = torch.full((37, H_kv, D), float("nan"), device="cuda", dtype=dtype)
    k, v = (torch.cat([torch.randn(sum(lens_k), H_kv, D, device="cuda", dtype=dtype, generator=gen), nan_tail])
            for _ in range(2))  # fmt: skip
    slopes = _slopes(spec.get("alibi"), len(lens_q), H, gen)
    window, softcap = spec.get("window", (-1, -1)), spec.get("softcap", 0.0)
    out, lse = flash_attn_varlen_func(
        q, k, v, cu_seqlens(lens_q), cu_seqlens(lens_k), max(lens_q), max(lens_k), causal=causal, window_size=window,
        softcap=softcap, alibi_slopes=slopes, return_lse=True, version=version,
    )  # fmt: skip
    used = sum(lens_k)
    O, lse_ref = reference.attention_varlen(
        _as_np(q), _as_np(k[:used]), _as_np(v[:used]), cu_seqlens(lens_q).tolist(), cu_seqlens(lens_k).tolist(),
        softmax_scale=D**-0.5, causal=bool(causal), window=window, softcap=softcap,
        offset=0 if causal == "top_left" else None,
        alibi_slopes=None if slopes is None else slopes.cpu().numpy(),
    )  # fmt: skip
    assert_serving_output(out, lse, torch.from_numpy(O), torch.from_numpy(lse_ref), dtype)


def test_fwd_variants_op_fake_shapes():
    """tileattn::fwd_variants' fake implementation (what torch.compile traces) gives O in q's
    shape and lse (B, H, Nq), with no device."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        q = torch.empty(2, 10, 4, 64, dtype=torch.bfloat16, device="cuda")
        k = torch.empty(2, 12, 2, 64, dtype=torch.bfloat16, device="cuda")
        o, lse = torch.ops.tileattn.fwd_variants(q, k, k, None, 0.125, 2, 5, -1, 0.0)
    assert o.shape == q.shape and o.dtype == q.dtype and lse.shape == (2, 4, 10) and lse.dtype == torch.float32


def test_variants_autograd_formula_fake_shapes():
    """tileattn::fwd_variants' autograd formula (backward.py's setup_context and backward, called
    as autograd would, with fake tensors and no device): the backward reaches
    tileattn::bwd_variants, whose fake gives each input's gradient its shape (k and v of fewer
    heads under GQA), and no argument past v takes a gradient."""
    import types

    from torch._subclasses.fake_tensor import FakeTensorMode

    from tileattn import backward

    with FakeTensorMode():
        q = torch.empty(2, 10, 4, 64, dtype=torch.bfloat16, device="cuda")
        k, v = (torch.empty(2, 12, 2, 64, dtype=torch.bfloat16, device="cuda") for _ in "kv")
        inputs = (q, k, v, None, 0.125, 2, 5, -1, 1.5, None)
        output = torch.ops.tileattn.fwd_variants(*inputs[:-1])
        ctx = types.SimpleNamespace(mark_non_differentiable=lambda *t: None)
        ctx.save_for_backward = lambda *t: setattr(ctx, "saved_tensors", t)
        backward._setup_variants_context(ctx, inputs, output)
        grads = backward._backward_variants(ctx, torch.empty_like(q), None)
    assert [g.shape for g in grads[:3]] == [q.shape, k.shape, v.shape] and grads[3:] == (None,) * 7


@pytest.mark.gpu
@pytest.mark.parametrize("version", ["v3.3", "v3.1"])
def test_variants_under_torch_compile_fullgraph(version):
    """flash_attn_func with a window, softcap and ALiBi inside torch.compile(fullgraph=True): the
    custom op, no graph break, eager's output bit for bit (so the op passed version on: the other
    rung's output would differ in the last bits)."""
    _needs(version)
    gen = torch.Generator(device="cuda").manual_seed(11)
    q, k, v = (torch.randn(2, 300, 4, 64, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(3))
    slopes = _slopes("H", 2, 4, gen)

    def f(q, k, v):
        o = flash_attn_func(
            q, k, v, causal=True, window_size=(50, 0), softcap=2.0, alibi_slopes=slopes, version=version
        )
        return o * 2

    torch._dynamo.reset()
    with torch.no_grad():
        eager = f(q, k, v)
        compiled = torch.compile(f, fullgraph=True)(q, k, v)
    torch.testing.assert_close(compiled, eager, rtol=0, atol=0)


# ---- gradients (bwd_v2_variants) ---------------------------------------------------------------


def _check_variant_grads(dtype, D, B, Nq, Nk, H, H_kv, causal, scale, spec, gen):
    """flash_attn_func's gradients under the variants of ``spec`` against float64 autograd of the
    same scores (testing.reference_grads), within twice PyTorch's own error at ``dtype`` plus the
    floor; the inputs unchanged, the backward's buffers NaN-poisoned first."""
    q = torch.randn(B, Nq, H, D, device="cuda", dtype=dtype, generator=gen)
    k, v = (torch.randn(B, Nk, H_kv, D, device="cuda", dtype=dtype, generator=gen) for _ in range(2))
    dO = torch.randn(B, Nq, H, D, device="cuda", dtype=dtype, generator=gen)
    slopes = _slopes(spec.get("alibi"), B, H, gen)
    window, softcap = spec.get("window", (-1, -1)), spec.get("softcap", 0.0)
    inputs = [t.clone() for t in (q, k, v, dO)]
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = flash_attn_func(*leaves, softmax_scale=scale, causal=causal, window_size=window, softcap=softcap,
                          alibi_slopes=slopes)  # fmt: skip
    poison_allocator(4 * (3 * q.numel() + 3 * k.numel()))
    out.backward(dO)
    assert all(torch.equal(a, b) for a, b in zip(inputs, (q, k, v, dO))), "an input was modified"
    mode = {False: None, True: "bottom_right"}.get(causal, causal)
    variants = dict(window=window, softcap=softcap, alibi_slopes=slopes)
    expected = reference_grads(q, k, v, dO, scale, mode, "bnhd", **variants)
    torch_grads = reference_grads(q, k, v, dO, scale, mode, "bnhd", dtype, **variants)
    got = [t.grad for t in leaves]
    assert_within_torch_error(got, expected, torch_grads, str(dtype).removeprefix("torch."))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("D", [64, 128, 256])  # bwd_v2's two K/V tiles (Bc = 64; 32 above D = 128)
@pytest.mark.parametrize("causal", [False, "top_left", "bottom_right"])
@pytest.mark.parametrize("variant", list(_VARIANTS))
@pytest.mark.parametrize("H_kv", [4, 2])
def test_variant_gradients_match_float64(dtype, D, causal, variant, H_kv):
    """Each variant and all three, crossed with both causal alignments and none, Nq != Nk (neither
    a multiple of a tile), MHA (dK, dV written straight into the poisoned gradients, K/V blocks no
    row sees included) and GQA 2:1; the forward on the default dense path (v3.6 / v3.3 on Hopper)."""
    gen = torch.Generator(device="cuda").manual_seed(D + len(variant) + len(str(causal)) + H_kv)
    _check_variant_grads(dtype, D, 2, 300, 457, 4, H_kv, causal, D**-0.5, _VARIANTS[variant], gen)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, "top_left", "bottom_right"])
@pytest.mark.parametrize("scale", [-0.07, 0.3, 0.0])
@pytest.mark.parametrize("Nq,Nk", [(457, 300), (1, 1), (1, 130), (65, 1)])
def test_variant_gradients_awkward(causal, scale, Nq, Nk):
    """More queries than keys (bottom-right: early rows see no key, their gradients 0), N = 1, MQA,
    a negative scale (the forward negates q: the backward negates dq back), all three variants."""
    gen = torch.Generator(device="cuda").manual_seed(Nq + 7 * Nk)
    spec = dict(window=(90, 40), softcap=2.0, alibi="BH")
    _check_variant_grads(torch.float16, 128, 2, Nq, Nk, 4, 1, causal, scale, spec, gen)
