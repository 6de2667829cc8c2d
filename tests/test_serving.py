"""Split-KV decoding over a KV cache (serving.py, csrc/dec_v1_splitkv.cu; issue 12, being built):
every instantiation compiles under NVRTC within its spill budget with the instructions it exists
for, its parameter block is the host's DEC_ARGS, and bad input raises (CPU); outputs against
float64 per sequence, contiguous and paged caches of page sizes 1..256 (GPU)."""

import pytest
import torch

from tileattn import _nvrtc, _params
from tileattn.versions import DEC_COMBINE, DEC_V1

INSTANCES = [
    (entry, dtype, D, causal, arch)
    for entry in (DEC_V1, DEC_COMBINE)
    for dtype in entry.dtypes
    for D in entry.head_dims
    for causal in ((False, True) if entry is DEC_V1 else (False,))
    for arch in ("sm_80", "sm_90")
]


@pytest.mark.parametrize("entry,dtype,D,causal,arch", INSTANCES, ids=lambda x: getattr(x, "name", str(x)))
def test_decode_kernels_compile_within_budget(entry, dtype, D, causal, arch):
    cubin = _nvrtc.compile_kernel(entry.file, entry.name_expression(dtype, D, causal), arch)
    res = cubin.resources
    budget = entry.spill_bytes.get(D, 0)
    assert res["stack_bytes"] <= budget and res["spill_stores"] <= budget and res["spill_loads"] <= budget, res
    assert _params.smem_bytes(cubin) <= (163 if arch == "sm_80" else 227) * 1024
    layout = _params.packer(cubin.data, cubin.lowered_name, False, _params.DEC_ARGS, [])
    assert layout.offsets[0] == 0
    sass = _nvrtc.sass(cubin)
    if entry is DEC_V1:  # mma.sync, ldmatrix (.trans for V), cp.async row gathers
        assert "HMMA.16816.F32" in sass and "LDSM.16.MT88.4" in sass and "LDGSTS" in sass


def _cache(B=2, Nk=40, H_kv=2, D=64, dtype=torch.float16, device="cpu"):
    return (torch.zeros(B, Nk, H_kv, D, dtype=dtype, device=device) for _ in range(2))


def test_decode_bad_input_names_the_argument():
    from tileattn.serving import decode_with_kvcache

    q = torch.zeros(2, 1, 4, 64, dtype=torch.float16)
    k, v = _cache()
    with pytest.raises(TypeError, match="float16 or bfloat16"):
        decode_with_kvcache(q.float(), k, v)
    with pytest.raises(ValueError, match="q must be a CUDA tensor"):
        decode_with_kvcache(q, k, v)
    with pytest.raises(ValueError, match="k_cache must be a 4-D tensor"):
        decode_with_kvcache(q, k[0], v)


def _expected(q, k_seqs, v_seqs, scale, causal):
    """float64 attention per sequence (testing.reference): q (B, Nq, H, D), k_seqs[b] (seqlen_b,
    H_kv, D); an empty cache gives O = 0 and lse -inf."""
    from tileattn.testing import reference

    B, Nq, H, D = q.shape
    out = torch.zeros(B, Nq, H, D, dtype=torch.float64, device=q.device)
    lse = torch.full((B, H, Nq), float("-inf"), dtype=torch.float64, device=q.device)
    for b in range(B):
        if k_seqs[b].shape[0] == 0:
            continue
        heads = lambda t: t.transpose(0, 1)[None]  # (n, H, D) -> (1, H, n, D)
        o, l = reference(heads(q[b]), heads(k_seqs[b]), heads(v_seqs[b]), scale, "bottom_right" if causal else None)
        out[b], lse[b] = o[0].transpose(0, 1), l[0]
    return out, lse


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("D", DEC_V1.head_dims)
@pytest.mark.parametrize(
    "H,H_kv,Nq,causal,page_size,num_splits",
    [
        (32, 8, 1, False, None, 0),  # GQA 32:8 decode, contiguous
        (8, 8, 1, True, 16, 0),  # MHA, paged
        (32, 8, 3, True, 1, 5),  # three tokens, page size 1
        (4, 1, 7, True, 64, 3),  # MQA, 28 rows over two row blocks
        (16, 2, 1, False, 256, 1),
    ],
)
def test_decode_matches_float64(dtype, D, H, H_kv, Nq, causal, page_size, num_splits):
    from tileattn.serving import decode_with_kvcache

    gen = torch.Generator(device="cuda").manual_seed(D + Nq)
    lens = [0, 1, 77, 300, 1023]  # a sequence with an empty cache, one with one key
    B, Nk = len(lens), 1100
    q = torch.randn(B, Nq, H, D, device="cuda", dtype=dtype, generator=gen)
    k_seqs = [torch.randn(n, H_kv, D, device="cuda", dtype=dtype, generator=gen) for n in lens]
    v_seqs = [torch.randn(n, H_kv, D, device="cuda", dtype=dtype, generator=gen) for n in lens]
    seqlens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    if page_size is None:
        k_cache = torch.full((B, Nk, H_kv, D), float("nan"), device="cuda", dtype=dtype)  # unused rows: NaN
        v_cache = k_cache.clone()
        for b, n in enumerate(lens):
            k_cache[b, :n], v_cache[b, :n] = k_seqs[b], v_seqs[b]
        block_table = None
    else:  # pages in shuffled order, unused slots NaN
        pages = [-(-n // page_size) for n in lens]
        order = torch.randperm(sum(pages) + 3, generator=torch.Generator().manual_seed(1)).tolist()
        k_cache = torch.full((len(order), page_size, H_kv, D), float("nan"), device="cuda", dtype=dtype)
        v_cache = k_cache.clone()
        block_table = torch.zeros(B, max(pages), dtype=torch.int32, device="cuda")
        used = 0
        for b, n in enumerate(lens):
            for p in range(pages[b]):
                page = order[used]
                used += 1
                block_table[b, p] = page
                rows = slice(p * page_size, min(n, (p + 1) * page_size))
                k_cache[page, : rows.stop - rows.start] = k_seqs[b][rows]
                v_cache[page, : rows.stop - rows.start] = v_seqs[b][rows]
    scale = D**-0.5
    out, lse = decode_with_kvcache(
        q, k_cache, v_cache, seqlens, block_table, causal=causal, num_splits=num_splits, return_lse=True
    )
    o_ref, lse_ref = _expected(q, k_seqs, v_seqs, scale, causal)
    assert not out.isnan().any()
    err = ((out.double() - o_ref).norm() / o_ref.norm()).item()
    assert err < (1e-2 if dtype == torch.bfloat16 else 2e-3), err
    finite = torch.isfinite(lse_ref)
    assert torch.equal(torch.isfinite(lse), finite)
    torch.testing.assert_close(lse[finite].double(), lse_ref[finite], rtol=1e-4, atol=1e-4)
