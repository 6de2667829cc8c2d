"""Every rung against float64 on awkward shapes, outputs poisoned with NaN before each launch.
Fresh random inputs each run; the seed is in the failure message."""

import os

import pytest

from tileattn.testing import Case, passed, run_case, tolerance
from tileattn.versions import VERSIONS

pytestmark = pytest.mark.gpu

RUNGS = [name for name, v in VERSIONS.items() if v.dtypes == ("float32",)]
MMA = [name for name, v in VERSIONS.items() if v.kind == "mma"]
MMA_DIMS = [16, 24, 40, 64, 72, 96, 128, 160, 192, 256]


def _check(case: Case):
    import torch

    seed = int.from_bytes(os.urandom(4), "little")
    gen = torch.Generator(device="cuda").manual_seed(seed)
    res = run_case(case, gen)
    assert passed(case, res), f"{case.label()} seed={seed}: {res} (tolerance {tolerance(case, res)})"


@pytest.mark.parametrize("causal", [None, "top_left"])
@pytest.mark.parametrize("N", [1, 17, 127, 128, 129, 1000, 4097])
@pytest.mark.parametrize("D", [32, 64, 128])
@pytest.mark.parametrize("version", RUNGS)
def test_awkward_lengths(version, D, N, causal):
    if D not in VERSIONS[version].tiles:
        pytest.skip(f"{version} has no head dim {D}")
    _check(Case(version, B=1, H=2, Nq=N, D=D, causal=causal))


@pytest.mark.parametrize("version", RUNGS)
@pytest.mark.parametrize(
    "Nq,Nk,causal",
    [
        (100, 300, "bottom_right"),
        (300, 100, "bottom_right"),
        (100, 300, "top_left"),
        (300, 100, "top_left"),
        (33, 1, None),
    ],
)
def test_nq_ne_nk(version, Nq, Nk, causal):
    _check(Case(version, Nq=Nq, Nk=Nk, causal=causal))


@pytest.mark.parametrize("version", RUNGS)
@pytest.mark.parametrize("layout", ["bhnd", "bnhd"])
def test_noncontiguous_packed_qkv(version, layout):
    _check(Case(version, B=2, H=4, Nq=203, D=64, causal="top_left", layout=layout, noncontiguous=True))


@pytest.mark.parametrize("version", list(VERSIONS))
def test_misaligned_contiguous_inputs(version):
    """Contiguous q, k, v one element past a 16-byte boundary (found faulting in the kernels'
    16-byte copies before 6c8bf90): copied into aligned memory, every rung."""
    dtype = VERSIONS[version].dtypes[-1]
    _check(Case(version, B=2, H=3, Nq=77, D=_dim(version, 64), causal="bottom_right", misaligned=True, dtype=dtype))


@pytest.mark.parametrize("version", RUNGS)
def test_gqa(version):
    _check(Case(version, B=2, H=8, H_kv=2, Nq=150, D=64, causal="bottom_right"))


FP32_ACCURATE = [n for n in RUNGS if VERSIONS[n].kind == "tensor_fp32" and VERSIONS[n].precision == "fp32"]


@pytest.mark.parametrize("version", FP32_ACCURATE)
def test_fp32_rungs_heads_and_rows_of_any_magnitude(version):
    """The FP32-accurate tensor-core rungs hold FP32-level error in every head, whatever the
    magnitudes of the others: heads of v 1e8 apart and rows of k 1e3 apart.  (With an exponent per
    tensor, v2.4's first form, the smallest head's halves would sit 2^27 below the scale, in fp16's
    subnormals: ~2^-12 relative precision by count of bits.  split_blocks gives each 64-row block
    its own.)"""
    import torch

    from tileattn import api
    from tileattn.testing import TOLERANCE, reference

    B, H, N = 1, 4, 300
    D = 64
    mags = torch.tensor([1e-4, 1e-1, 1e2, 1e4], device="cuda").view(1, H, 1, 1)
    q = torch.randn(B, H, N, D, device="cuda") * torch.tensor([1e-3, 1.0, 0.3, 1e-1], device="cuda").view(1, H, 1, 1)
    k = torch.randn(B, H, N, D, device="cuda") * torch.logspace(-2, 1, N, device="cuda").view(1, 1, N, 1)
    v = torch.randn(B, H, N, D, device="cuda") * mags
    o = torch.full_like(q, float("nan"))
    api._attention(q, k, v, None, "top_left", version, out_layout="bhnd", out=o)
    ref, _ = reference(q, k, v, D**-0.5, "top_left")
    err = ((o.double() - ref).square().sum((0, 2, 3)) / ref.square().sum((0, 2, 3))).sqrt()
    assert (err <= TOLERANCE["fp32"]).all(), f"per-head relative error {err.tolist()}"


@pytest.mark.parametrize("version", RUNGS + MMA)
@pytest.mark.parametrize("scale", [-0.3, 0.0, 0.5])
def test_softmax_scale_sign_and_zero(version, scale):
    # Negative scales reach the kernels as (-q, -scale); scale 0 is a plain average of the visible v.
    dtype = VERSIONS[version].dtypes[0]
    D = _dim(version, 64)
    _check(Case(version, B=1, H=2, Nq=100, Nk=300, D=D, causal="bottom_right", dtype=dtype, scale=scale))


@pytest.mark.parametrize("version", RUNGS)
def test_many_heads_beyond_grid_limit(version):
    # B*H = 70000 > 65535, the gridDim.y limit; the rung's smallest head dim (v2.4 starts at 64).
    _check(Case(version, B=7, H=10000, Nq=17, D=min(VERSIONS[version].head_dims), causal="top_left"))


# ---- fp16/bf16 tensor-core rungs ----------------------------------------------------------------


def _dim(version, D):
    """D, or the rung's nearest head dim (v3.4 runs D=64 only, v3.6_wide D=128 only)."""
    return min(VERSIONS[version].tiles, key=lambda d: abs(d - D))


@pytest.mark.parametrize("causal", [None, "bottom_right"])
@pytest.mark.parametrize("N", [1, 17, 113, 203, 1023, 4224])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("version", MMA)
def test_mma_awkward_lengths(version, dtype, N, causal):
    _check(Case(version, B=1, H=2, Nq=N, D=_dim(version, 128), causal=causal, dtype=dtype))


@pytest.mark.parametrize("causal", [None, "bottom_right"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("version", MMA)
def test_mma_row_max_jumps_between_blocks(version, dtype, causal):
    """Scores spread wide (scale 1.5 at D = 128: a score's spread is ~17, so a row's max often grows
    by more than 2^10 from one K/V block to the next): the online softmax rebases on blocks past a
    row's first, through the lazy rebase's path and the speculative softmax's fall-back
    (csrc/v3_3_wgmma.cu, speculative_softmax)."""
    _check(Case(version, B=1, H=2, Nq=1000, D=_dim(version, 128), causal=causal, dtype=dtype, scale=1.5))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("version,D", [(v, D) for v in MMA for D in MMA_DIMS if D in VERSIONS[v].tiles])
def test_mma_head_dims(version, dtype, D):
    _check(Case(version, B=2, H=3, Nq=203, D=D, causal="top_left", dtype=dtype))


@pytest.mark.parametrize("version", MMA)
@pytest.mark.parametrize(
    "Nq,Nk,causal",
    [
        (113, 1023, "bottom_right"),
        (1023, 113, "bottom_right"),
        (113, 1023, "top_left"),
        (1023, 113, "top_left"),
        (203, 17, None),
    ],
)
def test_mma_nq_ne_nk(version, Nq, Nk, causal):
    _check(Case(version, B=2, H=2, Nq=Nq, Nk=Nk, D=_dim(version, 64), causal=causal, dtype="bfloat16"))


@pytest.mark.parametrize("version", MMA)
@pytest.mark.parametrize("H,H_kv", [(16, 2), (8, 1)])  # GQA 8:1 and MQA
def test_mma_gqa_mqa(version, H, H_kv):
    _check(Case(version, B=2, H=H, H_kv=H_kv, Nq=1023, D=_dim(version, 128), causal="bottom_right", dtype="float16"))


@pytest.mark.parametrize("version", MMA)
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_mma_packed_qkv_views(version, dtype):
    D = _dim(version, 64)
    _check(Case(version, B=2, H=4, Nq=1023, D=D, causal="top_left", layout="bnhd", noncontiguous=True, dtype=dtype))


@pytest.mark.parametrize("version", MMA)
def test_mma_many_heads(version):
    _check(Case(version, B=7, H=10000, Nq=17, D=_dim(version, 64), causal="bottom_right", dtype="bfloat16"))


@pytest.mark.parametrize("version,D", [("v3.6", 64), ("v3.6", 128), ("v3.6", 256), ("v3.6_wide", 128), ("v3.7", 64)])
@pytest.mark.parametrize(
    "Nq,Nk,causal",
    [(1023, 1023, None), (1023, 1023, "top_left"), (1023, 300, "bottom_right"), (300, 2000, "bottom_right")],
)
def test_persistent_many_tiles_per_cta(version, D, Nq, Nk, causal):
    """The persistent rungs with several tiles per CTA (B*H*Tr = 111 * 8 or 111 * 3 against the GPU's
    ~132 CTAs; v3.7's 192-row tiles: 111 * 6 or 111 * 2): the K/V pipeline and Q's buffer carried
    from tile to tile, tiles that see no key (bottom_right with Nk < Nq), and the causal pairs
    over an odd number of heads (111)."""
    _check(Case(version, B=3, H=37, Nq=Nq, Nk=Nk, D=D, causal=causal, dtype="bfloat16"))


@pytest.mark.parametrize(
    "B,H,N",
    [
        (1, 3, 2000),  # 17 units on 17 CTAs: no whole round of pairs before the tail, every tile sorted
        (5, 29, 2100),  # Tr = 11: the tail starts inside a head's pairs and ends with every middle block
        (10, 100, 500),  # Tr = 3: the pairs end before the tail, which holds middle blocks only
    ],
)
def test_sorted_tail_covers_every_tile(B, H, N):
    """v3.7's causal walk with its sorted tail (csrc/common.cuh sorted_tail_rounds, R = 2 for
    192-row tiles) at shapes that take each branch of sorted_tail_tile on a 132-SM GPU; the output
    is NaN-poisoned, so a tile the walk skipped or took twice shows against float64."""
    _check(Case("v3.7", B=B, H=H, Nq=N, D=64, causal="bottom_right", dtype="bfloat16"))


@pytest.mark.parametrize("version,D", [("v3.6", 64), ("v3.6", 128), ("v3.6", 256), ("v3.6_wide", 128), ("v3.7", 64)])
def test_o_stage_falls_back_on_unaligned_out(version, D):
    """The persistent rungs copy O out of a shared-memory stage by tensor stores, whose map takes a
    16-byte aligned base (v3_3_wgmma.cu, v3_3_stages_o); an output buffer 4 bytes off (the core's
    `out` argument; the direct stores take 4-byte pairs) gets no map and takes the direct stores
    instead, with every row written and correct."""
    import math

    import torch

    from tileattn import api
    from tileattn.testing import reference

    B, H, N = 2, 3, 203
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    out = torch.full((B * H * N * D + 2,), math.nan, device="cuda", dtype=torch.bfloat16)[2:].view(B, H, N, D)
    o, _ = api._attention(q, k, v, None, "top_left", version, out_layout="bhnd", out=out)
    ref, _ = reference(q, k, v, 1.0 / math.sqrt(D), "top_left")
    assert o.data_ptr() == out.data_ptr() and o.data_ptr() % 16 == 4
    assert ((o.double() - ref).norm() / ref.norm()).item() < 1e-2


def test_default_dispatch_short_causal_rule():
    """D=64's default plan: v3.7's 192-row tiles, except causal calls of fewer than
    SHORT_CAUSAL_ROWS query rows, which take v3.6's 128 (versions.select's one shape rule)."""
    from tileattn import api
    from tileattn.versions import SHORT_CAUSAL_ROWS

    cc = api._nvrtc.device_arch(0)
    if cc[0] * 10 + cc[1] != 90:
        pytest.skip("the rule is Hopper's (v3.6 and v3.7 are sm_90a rungs)")
    for causal, Nq, Br in ((False, 1, 192), (True, SHORT_CAUSAL_ROWS - 1, 128), (True, SHORT_CAUSAL_ROWS, 192)):
        assert api._plan("bfloat16", 64, causal, None, None, 0, Nq).Br == Br, (causal, Nq)


def test_default_dispatch_half_and_causal_conventions():
    import torch

    import tileattn

    q, k, v = (torch.randn(1, n, 4, 64, device="cuda", dtype=torch.bfloat16) for n in (100, 300, 300))
    o_br = tileattn.flash_attn_func(q, k, v, causal=True)  # bottom-right: query i sees j <= i + 200
    o_tl = tileattn.flash_attn_func(q, k, v, causal="top_left")
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
    ).transpose(1, 2)
    assert o_br.dtype == torch.bfloat16
    assert (o_tl.float() - ref.float()).abs().max().item() < 2e-2  # SDPA's is_causal is top-left
    assert (o_br.float() - ref.float()).abs().max().item() > 1e-1


def test_public_wrappers_agree_and_default_dispatch():
    import torch

    import tileattn

    q, k, v = (torch.randn(2, 300, 4, 64, device="cuda") for _ in range(3))
    o_flash, lse = tileattn.flash_attn_func(q, k, v, causal=True, return_lse=True)
    o_sdpa = tileattn.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
    )
    assert o_flash.shape == (2, 300, 4, 64) and lse.shape == (2, 4, 300) and lse.dtype == torch.float32
    torch.testing.assert_close(o_flash.transpose(1, 2), o_sdpa, rtol=0, atol=0)
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2).double(), k.transpose(1, 2).double(), v.transpose(1, 2).double(), is_causal=True
    )
    assert ((o_sdpa.double() - ref).norm() / ref.norm()).item() < 1e-5
    # softmax_scale is honoured
    o2 = tileattn.flash_attn_func(q, k, v, softmax_scale=0.3)
    ref2 = torch.nn.functional.scaled_dot_product_attention(*(t.transpose(1, 2).double() for t in (q, k, v)), scale=0.3)
    assert ((o2.transpose(1, 2).double() - ref2).norm() / ref2.norm()).item() < 1e-5


@pytest.mark.parametrize("version", ["v2.3", "v2.4", "v2.5", "v3.3", "v1"])
def test_repeated_calls_reuse_a_prepared_launch(version):
    """The second call of a signature takes the cached launch (api._CALLS): fresh data (new
    pointers, so new TMA descriptors), NaN-poisoned memory where O will be allocated, a view of
    the same strides at a misaligned offset (must fall back and copy), a negative scale (never
    cached), and lse on and off: every result against float64."""
    import torch

    import tileattn
    from tileattn import api

    dtype = torch.float32 if VERSIONS[version].dtypes[0] == "float32" else torch.bfloat16
    shape = (2, 77, 4, 64)
    tol = 1e-5 if dtype == torch.float32 else 2e-2

    def ref(q, k, v, scale=None):
        return torch.nn.functional.scaled_dot_product_attention(
            *(t.transpose(1, 2).double() for t in (q, k, v)), is_causal=True, scale=scale
        ).transpose(1, 2)

    def check(o, r):
        assert not o.isnan().any() and ((o.double() - r).norm() / r.norm()).item() < tol

    api._CALLS.clear()
    for _ in range(4):
        q, k, v = (torch.randn(shape, device="cuda", dtype=dtype) for _ in range(3))
        torch.empty(q.numel() * 4, device="cuda").fill_(float("nan"))  # poison what O may reuse
        o, lse = tileattn.flash_attn_func(q, k, v, causal="top_left", version=version, return_lse=True)
        check(o, ref(q, k, v))
        o = tileattn.flash_attn_func(q, k, v, causal="top_left", version=version)
        check(o, ref(q, k, v))
    assert len(api._CALLS) == 2  # with and without lse
    # Same shape and strides, misaligned data (offset by one element): not the cached pointers' path.
    big = torch.randn(3, 2 * 77 * 4 * 64 + 1, device="cuda", dtype=dtype)
    q, k, v = (big[i, 1 : 1 + q.numel()].view(shape) for i in range(3))
    check(tileattn.flash_attn_func(q, k, v, causal="top_left", version=version), ref(q, k, v))
    # A negative scale is computed on -q and never cached.
    check(tileattn.flash_attn_func(q, k, v, softmax_scale=-0.2, causal="top_left", version=version), ref(q, k, v, -0.2))
    assert len(api._CALLS) == 2


def test_zero_length_inputs():
    import torch

    import tileattn

    q = torch.randn(2, 0, 4, 64, device="cuda")
    assert tileattn.flash_attn_func(q, q, q).shape == (2, 0, 4, 64)
    q1 = torch.randn(2, 5, 4, 64, device="cuda")
    o, lse = tileattn.flash_attn_func(q1, q, q, return_lse=True)
    assert torch.all(o == 0) and torch.all(torch.isneginf(lse))


def test_wrong_device_index_or_cpu_mix():
    import torch

    import tileattn

    q = torch.randn(1, 8, 2, 64, device="cuda")
    with pytest.raises(ValueError, match="k must be a CUDA tensor, got device 'cpu'"):
        tileattn.flash_attn_func(q, q.cpu(), q)


def test_launch_waits_for_work_queued_on_the_current_stream():
    """Inputs written on a side stream behind a long sleep: a launch on any other stream would
    read them before they are written."""
    import torch

    import tileattn

    for dtype, version in ((torch.float32, None), (torch.bfloat16, None), (torch.bfloat16, "v3.2")):
        q_new = torch.randn(1, 2048, 8, 64, device="cuda", dtype=dtype)
        ref = tileattn.flash_attn_func(q_new, q_new, q_new, version=version)
        q = torch.zeros_like(q_new)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            torch.cuda._sleep(100_000_000)  # ~50 ms of GPU time before the copy
            q.copy_(q_new)
            o = tileattn.flash_attn_func(q, q, q, version=version)
        s.synchronize()
        torch.testing.assert_close(o, ref, rtol=0, atol=0)


@pytest.mark.parametrize("version", [None, "v3.2", "v3.3", "v2.3"])
def test_cuda_graph_capture_and_replay(version):
    import torch

    import tileattn
    from tileattn.versions import VERSIONS

    dtype = torch.float32 if version is None or VERSIONS[version].dtypes == ("float32",) else torch.bfloat16
    q, k, v = (torch.randn(2, 300, 4, 64, device="cuda", dtype=dtype) for _ in range(3))
    tileattn.flash_attn_func(q, k, v, causal=True, version=version)  # compile and load outside the capture
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        o = tileattn.flash_attn_func(q, k, v, causal=True, version=version)
    for _ in range(2):  # new inputs in the same buffers: only a captured launch sees them
        for t in (q, k, v):
            t.copy_(torch.randn_like(t))
        o.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(o, tileattn.flash_attn_func(q, k, v, causal=True, version=version), rtol=0, atol=0)


def test_thread_keeps_its_current_device_and_context():
    import threading

    import torch
    from cuda.bindings import driver

    import tileattn

    q = torch.randn(1, 64, 2, 64, device="cuda")
    tileattn.flash_attn_func(q, q, q)
    seen = {}

    def worker():  # a new thread has no current context; a call must not leave one behind
        seen["before"] = int(driver.cuCtxGetCurrent()[1])
        seen["out"] = tileattn.flash_attn_func(q, q, q)
        seen["after"] = int(driver.cuCtxGetCurrent()[1])

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert seen["before"] == 0 and seen["after"] == 0
    torch.testing.assert_close(seen["out"], tileattn.flash_attn_func(q, q, q), rtol=0, atol=0)


def test_call_on_another_device_leaves_the_current_one():
    import torch

    import tileattn

    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs (the device script runs it on nvidia-h200-x2)")
    torch.cuda.set_device(0)
    for dtype in (torch.float32, torch.bfloat16):
        q1 = torch.randn(2, 300, 4, 64, device="cuda:1", dtype=dtype)
        o1 = tileattn.flash_attn_func(q1, q1, q1, causal=True)
        assert torch.cuda.current_device() == 0 and o1.device == q1.device
        o0 = tileattn.flash_attn_func(q1.to("cuda:0"), q1.to("cuda:0"), q1.to("cuda:0"), causal=True)
        torch.testing.assert_close(o1.cpu(), o0.cpu(), rtol=0, atol=0)
        assert torch.cuda.current_device() == 0


def test_threads_with_many_layouts_at_once():
    """8 threads, each with its own shapes (so its own TMA descriptors), results checked."""
    from concurrent.futures import ThreadPoolExecutor

    import torch

    import tileattn

    def one(i):
        n = 100 + 37 * i
        q, k, v = (torch.randn(1, n, 2, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        out = []
        for _ in range(20):
            out.append(tileattn.flash_attn_func(q, k, v, version="v3.2"))
        torch.cuda.synchronize()
        ref = torch.nn.functional.scaled_dot_product_attention(*(t.transpose(1, 2).float() for t in (q, k, v)))
        return max((o.transpose(1, 2).float() - ref).abs().max().item() for o in out)

    with ThreadPoolExecutor(8) as pool:
        errors = list(pool.map(one, range(8)))
    assert max(errors) < 2e-2, errors


def test_inputs_never_modified():
    """A negative scale (the kernels take -q) and misaligned views (copied once) leave the
    caller's tensors bit-for-bit as they were."""
    import torch

    import tileattn

    buf = torch.randn(2, 77, 4, 65, device="cuda")
    q, k, v = buf[..., 1:], buf.flip(1)[..., 1:], buf[..., :64]  # q, k not 16-byte aligned
    before = [t.clone() for t in (buf, q, k, v)]
    o = tileattn.flash_attn_func(q, k, v, softmax_scale=-0.2, causal=True)
    torch.cuda.synchronize()
    assert all(torch.equal(a, b) for a, b in zip(before, (buf, q, k, v)))
    ref = tileattn.flash_attn_func(q.contiguous(), k.contiguous(), v.contiguous(), softmax_scale=-0.2, causal=True)
    torch.testing.assert_close(o, ref, rtol=0, atol=0)


# ---- the custom op, torch.compile, SDPA's signature, transformers -------------------------------


@pytest.mark.parametrize("dtype,layout", [("bfloat16", "bnhd"), ("float32", "bhnd"), ("float16", "bnhd")])
def test_custom_op_opcheck(dtype, layout):
    import torch

    import tileattn  # noqa: F401  (registers tileattn::fwd)

    dt = getattr(torch, dtype)
    shape = (2, 77, 4, 64) if layout == "bnhd" else (2, 4, 77, 64)
    kv_shape = (2, 100, 2, 64) if layout == "bnhd" else (2, 2, 100, 64)
    q = torch.randn(shape, device="cuda", dtype=dt)
    k, v = (torch.randn(kv_shape, device="cuda", dtype=dt) for _ in range(2))
    for causal in (0, 1, 2):
        torch.library.opcheck(torch.ops.tileattn.fwd.default, (q, k, v, 0.125, causal, layout, None, None))


def _block(dim=256, heads=4, kv_heads=2, fn=None):
    """A small pre-norm transformer block whose attention is tileattn.flash_attn_func."""
    import torch

    import tileattn

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = torch.nn.LayerNorm(dim)
            self.q = torch.nn.Linear(dim, dim)
            self.kv = torch.nn.Linear(dim, 2 * dim // heads * kv_heads)
            self.o = torch.nn.Linear(dim, dim)
            self.mlp = torch.nn.Sequential(
                torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(), torch.nn.Linear(4 * dim, dim)
            )

        def forward(self, x):
            B, N, _ = x.shape
            h = self.norm(x)
            q = self.q(h).view(B, N, heads, dim // heads)
            k, v = self.kv(h).view(B, N, 2, kv_heads, dim // heads).unbind(2)
            a = tileattn.flash_attn_func(q, k, v, causal=True)
            x = x + self.o(a.reshape(B, N, dim))
            return x + self.mlp(x)

    return Block()


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_torch_compile_fullgraph_matches_eager(dtype):
    import torch

    dt = getattr(torch, dtype)
    torch._dynamo.reset()
    block = _block().to(device="cuda", dtype=dt)
    x = torch.randn(2, 333, 256, device="cuda", dtype=dt)
    with torch.no_grad():
        eager = block(x)
        compiled = torch.compile(block, fullgraph=True)  # any graph break raises
        out = compiled(x)
        out2 = compiled(torch.randn_like(x))  # a second call reuses the graph
    assert out2.shape == x.shape
    tol = dict(rtol=2e-2, atol=2e-2) if dtype == "bfloat16" else dict(rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(out, eager, **tol)


def test_torch_compile_with_cuda_graphs():
    import torch

    torch._dynamo.reset()
    block = _block().to(device="cuda", dtype=torch.bfloat16)
    x = torch.randn(2, 200, 256, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        eager = block(x)
        compiled = torch.compile(block, mode="reduce-overhead", fullgraph=True)
        for _ in range(3):  # warm-up, record, replay
            out = compiled(x).clone()
    torch.testing.assert_close(out, eager, rtol=2e-2, atol=2e-2)


def test_sdpa_signature_is_a_drop_in():
    import torch
    import torch.nn.functional as F

    import tileattn

    q = torch.randn(2, 8, 300, 64, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(2, 2, 300, 64, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    ours = tileattn.scaled_dot_product_attention(q, k, v, None, 0.0, True, None, True)  # positional, as SDPA
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=True, enable_gqa=True)
    torch.testing.assert_close(ours, ref, rtol=2e-2, atol=2e-2)
    with pytest.raises(ValueError, match="enable_gqa=True"):
        tileattn.scaled_dot_product_attention(q, k, v)
    with pytest.raises(NotImplementedError, match="attn_mask"):
        tileattn.scaled_dot_product_attention(
            q, k, v, attn_mask=torch.ones(300, 300, device="cuda", dtype=torch.bool), enable_gqa=True
        )
    with pytest.raises(NotImplementedError, match="dropout_p must be 0.0"):
        tileattn.scaled_dot_product_attention(q, k, v, dropout_p=0.1, enable_gqa=True)


def _tiny_llama():
    from tileattn.integrations.transformers import random_llama

    return random_llama(hidden=512, layers=2, heads=8, kv_heads=2, head_dim=64, vocab=1000)


def test_transformers_logits_match_sdpa():
    import torch

    pytest.importorskip("transformers", reason="transformers is an optional extra (the device image has it)")
    import tileattn.integrations.transformers as tileattn_hf

    tileattn_hf.register()
    model = _tiny_llama()
    ids = torch.randint(0, 1000, (3, 257), device="cuda")
    logits = {}
    for impl in ("sdpa", "tileattn"):
        model.set_attn_implementation(impl)
        with torch.no_grad():
            logits[impl] = model(input_ids=ids).logits.float()
    assert model.config._attn_implementation == "tileattn"
    torch.testing.assert_close(logits["tileattn"], logits["sdpa"], rtol=0, atol=0.05)

    # A left-padded batch, its prefill and a decode step with the cache: tileattn's packed path
    # (flash_attn_varlen_func over the valid tokens), no fallback warning.
    from tileattn.testing import padded_prefill_and_step

    mask = torch.ones_like(ids)
    mask[0, :100] = 0
    mask[2, :3] = 0
    step = torch.randint(0, 1000, (3, 1), device="cuda")
    for impl in ("sdpa", "tileattn"):
        logits[impl] = padded_prefill_and_step(model, impl, ids, mask, step)
    keep = mask.bool()
    torch.testing.assert_close(logits["tileattn"][0][keep], logits["sdpa"][0][keep], rtol=0, atol=0.05)
    torch.testing.assert_close(logits["tileattn"][1], logits["sdpa"][1], rtol=0, atol=0.05)


def test_transformers_gemma2_softcap_and_sliding_window_match_eager():
    """A random Gemma 2 (a sliding-window layer and a full one, logit softcap 50) runs both layers
    in tileattn's variants kernels (no fallback warning) and matches transformers' eager path
    (SDPA's drops the softcap), with the sequence longer than the window."""
    import warnings

    import torch

    pytest.importorskip("transformers", reason="transformers is an optional extra (the device image has it)")
    from transformers import Gemma2Config, Gemma2ForCausalLM

    import tileattn.integrations.transformers as tileattn_hf

    tileattn_hf.register()
    config = Gemma2Config(
        hidden_size=512, intermediate_size=1024, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=4,
        head_dim=128, vocab_size=1000, sliding_window=96, attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
        query_pre_attn_scalar=128, layer_types=["sliding_attention", "full_attention"],
    )  # fmt: skip
    torch.manual_seed(0)
    model = Gemma2ForCausalLM(config).to(device="cuda", dtype=torch.bfloat16).eval()
    ids = torch.randint(0, 1000, (3, 300), device="cuda")
    logits = {}
    tileattn_hf._warned.clear()
    # Random weights leave the scores far below softcap 50, so the logits alone would not notice a
    # dropped softcap: the calls' arguments are recorded too.
    calls, flash_attn_func = [], tileattn_hf.api.flash_attn_func

    def spy(*args, **kwargs):
        calls.append((kwargs["window_size"], kwargs["softcap"]))
        return flash_attn_func(*args, **kwargs)

    for impl in ("eager", "tileattn"):
        model.set_attn_implementation(impl)
        with torch.no_grad(), warnings.catch_warnings(), pytest.MonkeyPatch.context() as mp:
            mp.setattr(tileattn_hf.api, "flash_attn_func", spy)
            warnings.filterwarnings("error", message="tileattn:")  # a fallback to SDPA warns
            logits[impl] = model(input_ids=ids).logits.float()
    torch.testing.assert_close(logits["tileattn"], logits["eager"], rtol=0, atol=0.05)
    assert calls == [((95, 0), 50.0), ((-1, -1), 50.0)]  # the sliding layer, then the full one


def test_transformers_training_runs_tileattn_with_correct_gradients():
    """Training (grad mode on, FP32, D=64) goes through tileattn's backward, not the fallback, and
    gives SDPA's gradients."""
    import warnings

    import torch

    pytest.importorskip("transformers", reason="transformers is an optional extra (the device image has it)")
    import tileattn.integrations.transformers as tileattn_hf

    tileattn_hf.register()
    model = _tiny_llama().float().train()
    model.config.attention_dropout = 0.0
    ids = torch.randint(0, 1000, (2, 65), device="cuda")
    grads = {}
    tileattn_hf._warned.clear()
    for impl in ("sdpa", "tileattn"):
        model.set_attn_implementation(impl)
        model.zero_grad()
        with warnings.catch_warnings():
            warnings.filterwarnings("error", message="tileattn:")  # a fallback to SDPA warns
            model(input_ids=ids, labels=ids).loss.backward()
        grads[impl] = model.model.layers[0].self_attn.q_proj.weight.grad.clone()
    torch.testing.assert_close(grads["tileattn"], grads["sdpa"], rtol=1e-4, atol=1e-6)


def test_transformers_gemma2_trains_through_the_variants_backward():
    """Gemma 2 training in bf16 (a sliding-window layer shorter than the sequence and a full one,
    both softcapped, GQA) runs tileattn's variants forward and backward (no fallback warning, every
    call with inputs that require grad), and its attention weights' gradients are as close to a
    float32 eager run's as bf16 eager's are.  The q and k projections are scaled up so that the
    scores reach the softcap: with the random weights as drawn tanh would be the identity."""
    import torch

    pytest.importorskip("transformers", reason="transformers is an optional extra (the device image has it)")
    from transformers import Gemma2Config, Gemma2ForCausalLM

    import tileattn.integrations.transformers as tileattn_hf
    from tileattn.testing import assert_grads_as_close_as, attention_weight_grads

    tileattn_hf.register()
    config = Gemma2Config(
        hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=64, vocab_size=1000, sliding_window=40, attn_logit_softcapping=5.0, final_logit_softcapping=30.0,
        query_pre_attn_scalar=64, attention_dropout=0.0, layer_types=["sliding_attention", "full_attention"],
    )  # fmt: skip
    torch.manual_seed(0)
    base = Gemma2ForCausalLM(config).cuda().float().train()
    with torch.no_grad():
        for layer in base.model.layers:
            layer.self_attn.q_proj.weight.mul_(8.0)
            layer.self_attn.k_proj.weight.mul_(8.0)
    ids = torch.randint(0, 1000, (2, 131), device="cuda")
    calls, flash_attn_func = [], tileattn_hf.api.flash_attn_func

    def spy(q, *args, **kwargs):
        calls.append((kwargs["window_size"], kwargs["softcap"], q.requires_grad))
        return flash_attn_func(q, *args, **kwargs)

    tileattn_hf._warned.clear()  # (a fallback warns once per reason)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tileattn_hf.api, "flash_attn_func", spy)
        grads = lambda impl, dtype: attention_weight_grads(base, impl, dtype, input_ids=ids, labels=ids)
        reference, eager_bf16 = grads("eager", torch.float32), grads("eager", torch.bfloat16)
        ours = grads("tileattn", torch.bfloat16)
    assert calls == [((39, 0), 5.0, True), ((-1, -1), 5.0, True)]  # the sliding layer, then the full one
    assert_grads_as_close_as(ours, eager_bf16, reference)


def test_transformers_padded_batch_trains_through_the_varlen_backward():
    """Training on a left-padded bf16 batch runs the packed path (padding_aware_mask's (B, L) mask,
    flash_attn_varlen_func and its backward; no fallback warning), and the attention weights'
    gradients are as close to a float32 SDPA run's as bf16 SDPA's are (padded positions carry
    label -100, so neither path's padded rows reach the loss)."""
    import torch

    pytest.importorskip("transformers", reason="transformers is an optional extra (the device image has it)")
    import tileattn.integrations.transformers as tileattn_hf
    from tileattn.testing import assert_grads_as_close_as, attention_weight_grads

    tileattn_hf.register()
    torch.manual_seed(0)
    base = _tiny_llama().float().train()
    base.config.attention_dropout = 0.0
    ids = torch.randint(0, 1000, (3, 97), device="cuda")
    mask = torch.ones_like(ids)
    mask[0, :40], mask[2, :1] = 0, 0  # left padding
    labels = ids.masked_fill(mask == 0, -100)
    calls, padded = [], tileattn_hf._padded_attention
    tileattn_hf._warned.clear()  # (a fallback warns once per reason)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tileattn_hf, "_padded_attention", lambda q, *a: calls.append(q.requires_grad) or padded(q, *a))
        inputs = dict(input_ids=ids, attention_mask=mask, labels=labels)
        grads = lambda impl, dtype: attention_weight_grads(base, impl, dtype, **inputs)
        reference, sdpa_bf16 = grads("sdpa", torch.float32), grads("sdpa", torch.bfloat16)
        ours = grads("tileattn", torch.bfloat16)
    assert calls == [True, True]  # both layers, on the packed path, with gradients
    assert_grads_as_close_as(ours, sdpa_bf16, reference)
