"""flash_attn_with_kvcache (serving.py; split-KV decoding, csrc/dec_common.cuh, dec_v1, dec_v2):
every instantiation compiles under NVRTC within its spill budget with the instructions it exists
for, its parameter block is the host's DEC_ARGS, the split heuristic fills the device, and bad
input raises naming the argument (CPU); outputs against float64 per sequence with contiguous and
paged caches (page sizes 1..256, pages shuffled, unused rows NaN), the in-place append, sliding
windows, softcap and ALiBi crossed with causal, and every decode kernel the GPU runs (GPU)."""

import numpy as np
import pytest
import torch

from tileattn import _nvrtc, _params, flash_attn_with_kvcache, reference
from tileattn.serving import num_splits_heuristic
from tileattn.testing import assert_serving_output, compile_archs, compile_dtypes, compile_in_parallel
from tileattn.versions import DEC_COMBINE, DEC_V1, DEC_V2, DEC_V3, DEC_V4, DEC_V5, DEC_VERSIONS

INSTANCES = [
    (entry, dtype, D, causal, arch)
    for entry in (*DEC_VERSIONS, DEC_COMBINE)
    for dtype, D, causal in entry.instantiations()
    for arch in compile_archs(["sm_80", "sm_90"])
    if int(arch[3:]) >= entry.min_arch and dtype in compile_dtypes(entry, arch)  # one 16-bit type an arch
]


@pytest.fixture(scope="module")
def compiled_in_parallel():
    """The decode kernels compiled and disassembled up front, one NVRTC and cuobjdump per core."""
    jobs = {(e.file, e.name_expression(dt, D, c), a) for e, dt, D, c, a in INSTANCES}
    compile_in_parallel(jobs, disassemble=jobs)


@pytest.mark.parametrize("entry,dtype,D,causal,arch", INSTANCES, ids=lambda x: getattr(x, "name", str(x)))
def test_decode_kernels_compile_within_budget(compiled_in_parallel, entry, dtype, D, causal, arch):
    cubin = _nvrtc.compile_kernel(entry.file, entry.name_expression(dtype, D, causal), arch)
    res = cubin.resources
    budget = entry.spill_bytes.get(D, 0)
    assert res["stack_bytes"] <= budget and res["spill_stores"] <= budget and res["spill_loads"] <= budget, res
    assert _params.smem_bytes(cubin) <= (163 if arch == "sm_80" else 227) * 1024
    layout = _params.packer(cubin.data, cubin.lowered_name, entry.tensor_maps, _params.DEC_ARGS, [])
    assert layout.offsets[0] == 0 and (layout.tma_offset is not None) == entry.tensor_maps
    sass = _nvrtc.sass(cubin)
    if entry is DEC_V1:  # mma.sync, ldmatrix (.trans for V), cp.async row gathers
        assert "HMMA.16816.F32" in sass and "LDSM.16.MT88.4" in sass and "LDGSTS" in sass
    if entry in (DEC_V2, DEC_V3, DEC_V4):  # the same MMAs and mbarrier waits; rows by the bulk-copy engine / cp.async
        assert "HMMA.16816.F32" in sass and "LDSM.16.MT88.4" in sass and "SYNCS" in sass
        assert ("UBLKCP" in sass) == (entry is DEC_V2) and "LDGSTS" in sass  # (Q by cp.async in all)
    if entry is DEC_V5:  # K and V by tensor copies (one per 64-column panel of each); Q by cp.async
        assert "HMMA.16816.F32" in sass and "LDSM.16.MT88.4" in sass and "SYNCS" in sass
        assert sass.count("UTMALDG") % (2 * D // 64) == 0 and "UTMALDG" in sass and "UBLKCP" not in sass


@pytest.mark.parametrize("entry", [DEC_V4, DEC_V5], ids=lambda e: e.name)
def test_warp_tile_decode_is_one_block_per_sm_with_many_stages(entry):
    """dec_v4, dec_v5: up to ~200 KB of stages, one block per H200 SM, each consumer warp owning a
    quarter of them (csrc/dec_pipeline.cuh): at least two per warp for dec_v4; dec_v5's stages
    are unpadded swizzled tiles, 1024-byte aligned, at least 128 KB of them (its 64-key tiles
    leave one stage per warp at D=128: measured as fast as 12 stages of 32 keys)."""
    for D in (64, 128, 256):
        cubin = _nvrtc.compile_kernel(entry.file, entry.name_expression("bfloat16", D, False), "sm_90")
        smem = _params.smem_bytes(cubin)
        pitch, Bc = 2 * D + 16, entry.tiles[D][1]
        assert smem <= 227 * 1024 < 2 * (smem + 1024)
        if entry.tensor_maps:
            head = -(-(64 + 16 * pitch) // 1024) * 1024  # barriers and Q, then the aligned stages
            assert (smem - head) % (4 * D * Bc) == 0 and (smem - head) // (4 * D * Bc) >= 4
            assert smem - head >= 128 * 1024
        else:
            assert (smem - 16 * pitch) // (2 * Bc * pitch) >= 8


@pytest.mark.parametrize("entry", [DEC_V2, DEC_V3], ids=lambda e: e.name)
def test_pipelined_decode_fits_two_blocks_per_sm_up_to_d128(entry):
    """Bytes in flight set decode's speed: two blocks (each STAGES tiles ahead) per H200 SM."""
    for D in (64, 128):
        cubin = _nvrtc.compile_kernel(entry.file, entry.name_expression("bfloat16", D, False), "sm_90")
        assert 2 * (_params.smem_bytes(cubin) + 1024) <= 228 * 1024
        assert 2 * cubin.resources["registers"] * _params.block_threads(cubin.data, cubin.lowered_name) <= 65536


def test_num_splits_heuristic():
    slots = 2 * 132
    assert num_splits_heuristic(16 * 8, 256, slots) == 2  # B=16, GQA 32:8: one wave of 256 blocks
    assert num_splits_heuristic(64 * 32, 256, slots) == 1  # the blocks alone fill the device
    assert num_splits_heuristic(8, 4, slots) == 4  # never more splits than tiles
    assert num_splits_heuristic(0, 10, slots) == 1
    s = num_splits_heuristic(8, 256, slots)  # B=1: splits until the wave is nearly full
    assert 8 * s <= slots and 8 * s >= 0.85 * slots


def _cpu(B=2, Nq=1, H=4, H_kv=2, D=64, Nk=40, dtype=torch.float16):
    q = torch.zeros(B, Nq, H, D, dtype=dtype)
    return q, torch.zeros(B, Nk, H_kv, D, dtype=dtype), torch.zeros(B, Nk, H_kv, D, dtype=dtype)


BAD_INPUT = [
    (lambda q, k, v: dict(q=q.float()), TypeError, "q must be a float16 or bfloat16"),
    (lambda q, k, v: dict(k_cache=k[0]), ValueError, "k_cache must be a 4-D tensor"),
    (lambda q, k, v: dict(v_cache=v.bfloat16()), ValueError, "v_cache must be a tensor of q's dtype"),
    (lambda q, k, v: dict(k=k[:, :1]), ValueError, "k and v must be given together"),
    (lambda q, k, v: dict(k_cache=k[..., :32], v_cache=v[..., :32]), ValueError, "one head dim"),
    (lambda q, k, v: dict(q=torch.zeros(2, 1, 4, 48, dtype=q.dtype)), ValueError, "q and the caches"),
    (lambda q, k, v: dict(q=torch.zeros(2, 1, 3, 64, dtype=q.dtype)), ValueError, r"multiple of the caches' \(2\)"),
    (lambda q, k, v: dict(v_cache=v[:, :39]), ValueError, "k_cache and v_cache must have one shape"),
    (lambda q, k, v: dict(k_cache=k.transpose(1, 3)), ValueError, "k_cache must have a contiguous last"),
    (lambda q, k, v: dict(cache_seqlens=torch.zeros(2)), ValueError, "cache_seqlens must be a 1-D int32"),
    (lambda q, k, v: dict(cache_seqlens=torch.zeros(3, dtype=torch.int32)), ValueError, r"shape \(2\)"),
    (lambda q, k, v: dict(block_table=torch.zeros(2, 4)), ValueError, "block_table must be a 2-D int32"),
    (lambda q, k, v: dict(block_table=torch.zeros(2, 4, dtype=torch.int32)), ValueError, "cache_seqlens is needed"),
    (lambda q, k, v: dict(k=k[:, :1], v=v[:, :1]), ValueError, "cache_seqlens is needed"),
    (lambda q, k, v: dict(k=k[:, :1, :1], v=v[:, :1, :1], cache_seqlens=3), ValueError, "k and v must be"),
    (lambda q, k, v: dict(window_size=(-2, 0)), ValueError, "window_size entries must be >= -1"),
    (lambda q, k, v: dict(window_size=3), TypeError, "window_size must be a pair"),
    (lambda q, k, v: dict(softcap=-1.0), ValueError, "softcap must be finite and >= 0"),
    (lambda q, k, v: dict(alibi_slopes=torch.zeros(3)), ValueError, r"alibi_slopes must be a float32 tensor of shape"),
    (lambda q, k, v: dict(alibi_slopes=torch.zeros(4, dtype=torch.float64)), ValueError, "alibi_slopes must be"),
    (lambda q, k, v: dict(num_splits=-1), ValueError, "num_splits must be an int >= 0"),
    (lambda q, k, v: dict(cache_seqlens=41), ValueError, r"cache_seqlens must be in \[0, 40\]"),
    (lambda q, k, v: dict(k=k[:, :2], v=v[:, :2], cache_seqlens=39), ValueError, r"must be in \[0, 38\]"),
    (
        lambda q, k, v: dict(cache_seqlens=torch.zeros(2, 2, dtype=torch.int32)[:, 0]),
        ValueError,
        "cache_seqlens must be contiguous",
    ),
    (lambda q, k, v: dict(softmax_scale=float("inf")), ValueError, "softmax_scale must be finite"),
    (lambda q, k, v: dict(), ValueError, "must be CUDA tensors"),
]


@pytest.mark.parametrize("change,error,match", BAD_INPUT)
def test_kvcache_bad_input_names_the_argument(change, error, match):
    q, k, v = _cpu()
    kwargs = dict(q=q, k_cache=k, v_cache=v)
    kwargs.update(change(q, k, v))
    with pytest.raises(error, match=match):
        flash_attn_with_kvcache(**kwargs)


def test_kvcache_refuses_inputs_that_require_grad():
    q, k, v = _cpu()
    with pytest.raises(RuntimeError, match="has no backward"):
        flash_attn_with_kvcache(q.requires_grad_(), k, v)


def test_kvcache_unknown_version():
    q, k, v = _cpu()
    with pytest.raises(ValueError, match="version must be one of"):
        flash_attn_with_kvcache(q, k, v, version="dec_v9")


# ---- GPU ---------------------------------------------------------------------------------------


def _versions():
    if not torch.cuda.is_available():
        return [e.name for e in DEC_VERSIONS]
    cc = torch.cuda.get_device_capability()
    return [e.name for e in DEC_VERSIONS if e.min_arch <= cc[0] * 10 + cc[1]]


def _skip_unless_pages_fit(version: str, D: int, page_size) -> None:
    """dec_v5 raises for pages its tensor copies cannot take (tested on the CPU below)."""
    from tileattn import serving

    entry = next(e for e in DEC_VERSIONS if e.name == version)
    if entry.page_rule == "copy_engine" and not serving._takes_pages(entry, D, page_size or 0, True):
        pytest.skip(f"{version}'s tensor copies take no pages of {page_size} rows at D={D}")


def _expected(q, k_seqs, v_seqs, scale, causal, **variants):
    """float64 (O, lse) per sequence from the NumPy reference (reference.attention_serving): q
    (B, Nq, H, D), k_seqs[b] (seqlen_b, H_kv, D); an empty cache gives O = 0 and lse -inf."""
    B, Nq, H, D = q.shape
    out = np.zeros((B, Nq, H, D))
    lse = np.full((B, H, Nq), -np.inf)
    alibi = variants.pop("alibi_slopes", None)
    for b in range(B):
        if k_seqs[b].shape[0] == 0:
            continue
        heads = lambda t: t.double().cpu().numpy().transpose(1, 0, 2)[None]  # (n, H, D) -> (1, H, n, D)
        slopes = None if alibi is None else (alibi[b] if alibi.dim() == 2 else alibi).cpu().numpy()
        o, l = reference.attention_serving(
            heads(q[b]), heads(k_seqs[b]), heads(v_seqs[b]), scale, causal, alibi_slopes=slopes, **variants
        )
        out[b], lse[b] = o[0].transpose(1, 0, 2), l[0]
    return torch.from_numpy(out), torch.from_numpy(lse)


def _build_cache(k_seqs, v_seqs, Nk, page_size, gen_seed=1):
    """A contiguous (B, Nk, H_kv, D) cache, or shuffled pages (plus three unused ones) and a block
    table; unused rows hold NaN (the kernels must never let them reach O)."""
    B = len(k_seqs)
    _, H_kv, D = k_seqs[0].shape
    kw = dict(device="cuda", dtype=k_seqs[0].dtype)
    if page_size is None:
        k_cache = torch.full((B, Nk, H_kv, D), float("nan"), **kw)
        v_cache = k_cache.clone()
        for b in range(B):
            n = k_seqs[b].shape[0]
            k_cache[b, :n], v_cache[b, :n] = k_seqs[b], v_seqs[b]
        return k_cache, v_cache, None
    pages_per_seq = -(-Nk // page_size)
    order = torch.randperm(B * pages_per_seq + 3, generator=torch.Generator().manual_seed(gen_seed)).tolist()
    k_cache = torch.full((len(order), page_size, H_kv, D), float("nan"), **kw)
    v_cache = k_cache.clone()
    block_table = torch.tensor(order[: B * pages_per_seq], dtype=torch.int32, device="cuda").view(B, pages_per_seq)
    for b in range(B):
        for j in range(k_seqs[b].shape[0]):
            page, row = block_table[b, j // page_size].item(), j % page_size
            k_cache[page, row], v_cache[page, row] = k_seqs[b][j], v_seqs[b][j]
    return k_cache, v_cache, block_table


@pytest.mark.gpu
@pytest.mark.parametrize("version", _versions())
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("D", sorted({D for e in DEC_VERSIONS for D in e.tiles}))
@pytest.mark.parametrize(
    "H,H_kv,Nq,causal,page_size,num_splits",
    [
        (32, 8, 1, False, None, 0),  # GQA 32:8 decode, contiguous
        (8, 8, 1, True, 16, 0),  # MHA, paged
        (32, 8, 3, True, 1, 5),  # three tokens, page size 1
        (4, 1, 7, True, 64, 3),  # MQA, 28 rows over two row blocks
        (16, 2, 1, False, 256, 1),
        (32, 8, 3, True, 16, 1),  # one split, several tokens: the decode kernel writes out itself
        (4, 1, 7, True, 64, 1),
    ],
)
def test_decode_matches_float64(version, dtype, D, H, H_kv, Nq, causal, page_size, num_splits):
    if D not in next(e for e in DEC_VERSIONS if e.name == version).tiles:
        pytest.skip(f"{version} has no head dim {D}")
    _skip_unless_pages_fit(version, D, page_size)
    gen = torch.Generator(device="cuda").manual_seed(D + Nq)
    lens = [0, 1, 77, 300, 1023]  # a sequence with an empty cache, one with one key
    B, Nk = len(lens), 1100
    q = torch.randn(B, Nq, H, D, device="cuda", dtype=dtype, generator=gen)
    k_seqs = [torch.randn(n, H_kv, D, device="cuda", dtype=dtype, generator=gen) for n in lens]
    v_seqs = [torch.randn(n, H_kv, D, device="cuda", dtype=dtype, generator=gen) for n in lens]
    seqlens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    k_cache, v_cache, block_table = _build_cache(k_seqs, v_seqs, Nk, page_size)
    # NaN in the blocks the call's out and lse are likely to get from torch's caching allocator:
    # a row the kernels fail to write shows (with one split no merge kernel writes them).
    torch.full((B, Nq, H, D), float("nan"), device="cuda", dtype=dtype)
    torch.full((B, H, Nq), float("nan"), device="cuda")
    out, lse = flash_attn_with_kvcache(
        q, k_cache, v_cache, None, None, seqlens, block_table, causal=causal, num_splits=num_splits,
        return_lse=True, version=version,
    )  # fmt: skip
    assert_serving_output(out, lse, *_expected(q, k_seqs, v_seqs, D**-0.5, causal), dtype)


VARIANTS = [
    dict(window=(64, -1)),
    dict(window=(10, 5)),
    dict(window=(0, 0)),
    dict(softcap=2.0),
    dict(alibi="per_head"),
    dict(alibi="per_batch", softcap=5.0, window=(200, -1)),
    dict(window=(-1, 2**31 - 1)),  # as wide as it gets: no window (and no int32 overflow)
    dict(softcap=2.0, alibi="per_head", scale=0.0),  # the variants at scale 0 (no division by it)
]


@pytest.mark.gpu
@pytest.mark.parametrize("version", _versions())
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: "-".join(f"{k}={v[k]}" for k in v))
@pytest.mark.parametrize("page_size", [None, 16, 64])
def test_variants_match_float64(version, causal, variant, page_size):
    dtype, D, H, H_kv, Nq = torch.bfloat16, 128, 8, 2, 3
    _skip_unless_pages_fit(version, D, page_size)
    gen = torch.Generator(device="cuda").manual_seed(7)
    lens = [0, 1, 150, 700]
    B, Nk = len(lens), 720
    q = torch.randn(B, Nq, H, D, device="cuda", dtype=dtype, generator=gen)
    k_seqs = [torch.randn(n, H_kv, D, device="cuda", dtype=dtype, generator=gen) for n in lens]
    v_seqs = [torch.randn(n, H_kv, D, device="cuda", dtype=dtype, generator=gen) for n in lens]
    k_cache, v_cache, block_table = _build_cache(k_seqs, v_seqs, Nk, page_size)
    seqlens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    alibi = {
        None: None,
        "per_head": torch.rand(H, device="cuda", generator=gen) * 0.1,
        "per_batch": torch.rand(B, H, device="cuda", generator=gen) * 0.1,
    }[variant.get("alibi")]
    window, softcap = variant.get("window", (-1, -1)), variant.get("softcap", 0.0)
    scale = variant.get("scale", D**-0.5)
    out, lse = flash_attn_with_kvcache(
        q, k_cache, v_cache, None, None, seqlens, block_table, softmax_scale=scale, causal=causal,
        window_size=window, softcap=softcap, alibi_slopes=alibi, num_splits=3, return_lse=True, version=version,
    )  # fmt: skip
    expected = _expected(q, k_seqs, v_seqs, scale, causal, window=window, softcap=softcap, alibi_slopes=alibi)
    assert_serving_output(out, lse, *expected, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("version", _versions())
@pytest.mark.parametrize("page_size", [None, 1, 16, 64, 256])
@pytest.mark.parametrize("Nnew", [1, 4])
def test_append_then_attend(version, page_size, Nnew):
    """k, v land in the cache at cache_seqlens (every other row untouched), and the new tokens
    attend causally to the cache plus themselves; cache_seqlens is not changed."""
    dtype, D, H, H_kv = torch.float16, 64, 8, 4
    _skip_unless_pages_fit(version, D, page_size)
    gen = torch.Generator(device="cuda").manual_seed(Nnew)
    lens = [0, 1, 255, 300]
    B, Nk = len(lens), 320
    full = [torch.randn(n + Nnew, H_kv, D, device="cuda", dtype=dtype, generator=gen) for n in lens]
    vfull = [torch.randn(n + Nnew, H_kv, D, device="cuda", dtype=dtype, generator=gen) for n in lens]
    k_cache, v_cache, block_table = _build_cache([f[:n] for f, n in zip(full, lens)],
                                                 [f[:n] for f, n in zip(vfull, lens)], Nk, page_size)  # fmt: skip
    k_new = torch.stack([f[n:] for f, n in zip(full, lens)])
    v_new = torch.stack([f[n:] for f, n in zip(vfull, lens)])
    q = torch.randn(B, Nnew, H, D, device="cuda", dtype=dtype, generator=gen)
    seqlens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    out, lse = flash_attn_with_kvcache(
        q, k_cache, v_cache, k_new, v_new, seqlens, block_table, causal=True, return_lse=True, version=version
    )
    assert seqlens.tolist() == lens
    k_expected, v_expected, _ = _build_cache(full, vfull, Nk, page_size)  # the same pages, the rows appended
    torch.testing.assert_close(k_cache, k_expected, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(v_cache, v_expected, rtol=0, atol=0, equal_nan=True)
    assert_serving_output(out, lse, *_expected(q, full, vfull, D**-0.5, True), dtype)


@pytest.mark.gpu
def test_kvcache_awkward_inputs():
    """A strided q (a view of a wider buffer), a negative scale, an int cache_seqlens, and a batch
    whose B * H_kv passes gridDim.y's 65535 (run in slices)."""
    dtype, D = torch.bfloat16, 64
    gen = torch.Generator(device="cuda").manual_seed(3)
    wide = torch.randn(3, 1, 8, 2 * D, device="cuda", dtype=dtype, generator=gen)
    q = wide[..., :D]
    k = torch.randn(3, 50, 2, D, device="cuda", dtype=dtype, generator=gen)
    v = torch.randn_like(k)
    out = flash_attn_with_kvcache(q, k, v, cache_seqlens=40, softmax_scale=-0.3)
    o_ref, _ = _expected(q, list(k[:, :40]), list(v[:, :40]), -0.3, False)
    assert ((out.double().cpu() - o_ref).norm() / o_ref.norm()).item() < 1e-2
    B = 65536 + 7  # one K/V head, one token: blocks = B
    q = torch.randn(B, 1, 1, D, device="cuda", dtype=dtype, generator=gen)
    k = torch.randn(B, 3, 1, D, device="cuda", dtype=dtype, generator=gen)
    v = torch.randn_like(k)
    out = flash_attn_with_kvcache(q, k, v)
    P = torch.softmax(torch.einsum("bqhd,bkhd->bhqk", q.float(), k.float()) * D**-0.5, dim=-1)
    torch.testing.assert_close(out.float(), torch.einsum("bhqk,bkhd->bqhd", P, v.float()), rtol=2e-2, atol=2e-2)


def test_decode_rung_choice_by_page_size(monkeypatch):
    """Hopper's default decode rung: dec_v5 for contiguous caches, pages of a multiple of its tile
    and pages of a multiple of 8 rows dividing it; dec_v4 for other pages of at least its tile,
    dec_v3 below; a rung named by version= runs whatever the pages, except dec_v5, which raises
    for pages its tensor copies cannot take."""
    from tileattn import _nvrtc, serving

    monkeypatch.setattr(_nvrtc, "device_arch", lambda index: (9, 0))
    pick = lambda page_size, version=None, tc=True: (
        serving._decode_entry("bfloat16", 128, 0, version, page_size, tc).name
    )
    assert pick(0) == pick(256) == pick(32) == pick(64) == pick(16) == pick(8) == "dec_v5"
    assert pick(48) == pick(0, tc=False) == pick(256, tc=False) == "dec_v4"
    assert pick(1) == pick(4) == pick(24) == pick(16, tc=False) == "dec_v3"
    assert pick(16, "dec_v4") == "dec_v4" and pick(64, "dec_v5") == pick(16, "dec_v5") == "dec_v5"
    for page_size, tc in ((4, True), (24, True), (48, True), (0, False)):
        with pytest.raises(ValueError, match=r"dec_v5 copies tiles of 64 rows .* one of \[8, 16, 32\]"):
            pick(page_size, "dec_v5", tc)
    monkeypatch.setattr(_nvrtc, "device_arch", lambda index: (8, 0))
    assert pick(16) == pick(0) == "dec_v1"
