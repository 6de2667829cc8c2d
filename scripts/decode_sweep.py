"""One decode shape (issue 12's: bf16, B=16, 32 query heads over 8 K/V heads, one token, 16,384
cached keys, D=128) across the pipelined rungs' tile (Bc), the number of splits and page sizes
(16, 32, 256 rows, shuffled), beside cuDNN in the same run: which of the heuristic's choices
and the registered tiles are worth changing.  Prints a table; writes nothing.
Run on a GPU: python scripts/decode_sweep.py"""

import dataclasses
import functools

import torch
from triton.testing import do_bench

from tileattn import _nvrtc, api, serving, versions
from tileattn.bench import _peer_fn, paged_cache

B, H, H_kv, Nk, D = 16, 32, 8, 16384, 128
gen = torch.Generator(device="cuda").manual_seed(0)
q = torch.randn(B, 1, H, D, device="cuda", dtype=torch.bfloat16, generator=gen)
k, v = (torch.randn(B, Nk, H_kv, D, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(2))
gbytes = B * Nk * H_kv * D * 4 / 1e9
ms = do_bench(_peer_fn("sdpa_cudnn", q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), False), rep=200)
print(f"sdpa_cudnn: {ms:.3f} ms {gbytes / ms:.2f} TB/s")


caches = {None: (k, v, None), **{p: paged_cache(k, v, p, gen) for p in (16, 32, 256)}}
for base, tiles in ((versions.DEC_V3, (64,)), (versions.DEC_V4, (32, 64)), (versions.DEC_V5, (16, 32, 64))):
    for Bc in tiles:
        entry = dataclasses.replace(base, tiles={D: (16, Bc)})
        versions.KERNEL_ENTRIES[entry.name] = entry
        serving.DEC_VERSIONS = tuple(entry if e.name == entry.name else e for e in serving.DEC_VERSIONS)
        api.entry_kernel.cache_clear()
        for page_size, (kc, vc, table) in caches.items():
            if not serving._takes_pages(entry, D, page_size or 0, True):
                continue
            for splits in (0, 1, 2) if page_size is None else (0,):
                fn = lambda: serving.flash_attn_with_kvcache(
                    q, kc, vc, cache_seqlens=Nk, block_table=table, num_splits=splits, version=entry.name
                )
                ms = do_bench(fn, rep=200)
                print(
                    f"{entry.name} Bc={Bc} pages={page_size or '-'} num_splits={splits or 'auto'}: "
                    f"{ms:.3f} ms {gbytes / ms:.2f} TB/s"
                )
# dec_v5's tensor maps: how many bytes each L2 miss fills (the forward's 128 so far).
tensor_map_4d = _nvrtc.tensor_map_4d
for promotion in (0, 64, 256):
    _nvrtc.tensor_map_4d = functools.partial(tensor_map_4d, l2_promotion=promotion)
    serving._tensor_maps.cache_clear()
    ms = do_bench(lambda: serving.flash_attn_with_kvcache(q, k, v, version="dec_v5"), rep=200)
    print(f"dec_v5 Bc=64 L2 promotion {promotion} bytes: {ms:.3f} ms {gbytes / ms:.2f} TB/s")
_nvrtc.tensor_map_4d = tensor_map_4d
ms = do_bench(_peer_fn("sdpa_cudnn", q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), False), rep=200)
print(f"sdpa_cudnn (again): {ms:.3f} ms {gbytes / ms:.2f} TB/s")
