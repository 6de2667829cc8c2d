"""Decode at B=1 (GQA 32:8, one token, 16,384 keys, D=128, bf16): the call as timed by do_bench
(host path included, as the decode bench times it) against the same call replayed from a CUDA
graph (kernels only), beside cuDNN.  Prints a few lines; writes nothing.  Run on a GPU."""

import torch
from triton.testing import do_bench

from tileattn import serving
from tileattn.bench import _peer_fn

B, H, H_kv, Nk, D = 1, 32, 8, 16384, 128
q = torch.randn(B, 1, H, D, device="cuda", dtype=torch.bfloat16)
k, v = (torch.randn(B, Nk, H_kv, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
lens = torch.full((B,), Nk, dtype=torch.int32, device="cuda")
gbytes = B * Nk * H_kv * D * 4 / 1e9
call = lambda: serving.flash_attn_with_kvcache(q, k, v, cache_seqlens=lens)
call()
stream = torch.cuda.Stream()
stream.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(stream):
    call()
torch.cuda.current_stream().wait_stream(stream)
graph = torch.cuda.CUDAGraph()
with torch.cuda.graph(graph):
    out = call()
graph.replay()
torch.cuda.synchronize()
torch.testing.assert_close(out, call(), rtol=0, atol=0)
for name, fn in (
    ("flash_attn_with_kvcache, eager", call),
    ("flash_attn_with_kvcache, CUDA graph replay", graph.replay),
    ("sdpa_cudnn, eager", _peer_fn("sdpa_cudnn", q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), False)),
):
    ms = do_bench(fn, rep=200)
    print(f"{name:45s} {ms * 1e3:7.1f} us  {gbytes / ms:.2f} TB/s")
