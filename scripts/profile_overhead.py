"""Where the host time of one call goes, piece by piece, on a GPU: each piece of the call path
timed alone in a CPU-bound loop (bf16, D=64, B=1, H=16, N=1: the GPU finishes long before the
host issues the next launch), beside the whole call and torch's floor (an in-place add).

    python scripts/profile_overhead.py [calls]
"""

import ctypes
import sys
import time

import torch

import tileattn
from tileattn import _nvrtc, _params, api

calls = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
q, k, v = (torch.randn(1, 1, 16, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
plan = api._plan("bfloat16", 64, False, None, None, 0, 8192)
dev = q.device
stream = api._current_stream(0)
cu = _nvrtc._libcuda()
# The launch as it was before launch plans held a CUfunction: the CUkernel handle (the driver
# finds its function in the current context on every launch) and one pointer per parameter.
entry = tileattn.VERSIONS["v3.3"]
cubin = _nvrtc.compile_kernel(entry.file, entry.name_expression("bfloat16", 64, False, 90), "sm_90a")
layout = _params.packer(cubin.data, cubin.lowered_name, True)
kernel = _nvrtc.load(cubin).function
base = ctypes.addressof(plan.params.buf)
kernel_params = (ctypes.c_void_p * len(layout.offsets))(*[base + off for off in layout.offsets])
scratch = bytearray(len(plan.params.buf))  # (packing into the plan's own buffer would clobber the launch's args)
pieces = {
    "flash_attn_func (whole call)": lambda: tileattn.flash_attn_func(q, k, v),
    "torch.add_ (one PyTorch op)": lambda: q.add_(0),
    "_validate": lambda: api._validate(q, k, v, None, None, "bnhd"),
    "torch.empty (O)": lambda: torch.empty((1, 1, 16, 64), dtype=q.dtype, device=dev),
    "q.new_empty (O)": lambda: q.new_empty((1, 1, 16, 64)),
    "torch.empty_like (O)": lambda: torch.empty_like(q),
    "_current_stream": lambda: api._current_stream(0),
    "_plan lookup": lambda: api._plan("bfloat16", 64, False, None, None, 0, 8192),
    "pack_into": lambda: plan.pack(scratch, 0, *([0] * 22), 1.0, 0, 0),
    "cuCtxGetCurrent (ctypes)": lambda: cu.get_current(_nvrtc._current.addr),
    "_nvrtc.launch (CUfunction, extra)": lambda: _nvrtc.launch(
        plan.function, plan.context, stream, 1, 16, plan.threads, plan.smem, plan.params.extra_addr
    ),
    "cuLaunchKernel (CUfunction, extra)": lambda: cu.launch(
        plan.function, 1, 16, 1, plan.threads, 1, 1, plan.smem, stream, None, plan.params.extra_addr
    ),
    "cuLaunchKernel (CUkernel, kernelParams)": lambda: cu.launch(
        kernel, 1, 16, 1, plan.threads, 1, 1, plan.smem, stream, kernel_params, None
    ),
    "cuLaunchKernel (CUfunction, kernelParams)": lambda: cu.launch(
        plan.function, 1, 16, 1, plan.threads, 1, 1, plan.smem, stream, kernel_params, None
    ),
}
# Decode (issue 12): B=1, GQA 32:8, one token over 1,024 cached keys, D=128 (dec_v5 on Hopper).
# At B=1 every decode rung measured ~0.1 ms against cuDNN's 0.035 at 16k keys (bench/results/decode.json).
from tileattn import serving  # noqa: E402

qd = torch.randn(1, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
kd, vd = (torch.randn(1, 1024, 8, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
lens = torch.full((1,), 1024, dtype=torch.int32, device="cuda")
pieces |= {
    "flash_attn_with_kvcache (whole call)": lambda: serving.flash_attn_with_kvcache(qd, kd, vd, cache_seqlens=lens),
    "  _decode_entry": lambda: serving._decode_entry("bfloat16", 128, 0, None, 0, True),
    "  _variants": lambda: serving._variants((-1, -1), 0.0, None, False, 1, 32, 1025, qd.device),
    "  num_splits_heuristic (cached)": lambda: serving.num_splits_heuristic(8, 16, 132),
    "  _cache_maps (cached)": lambda: serving._cache_maps(kd, vd, 64),
    "  entry_kernel lookup": lambda: api.entry_kernel("dec_v5", "bfloat16", 128, False, 0),
}
with torch.no_grad():
    tileattn.flash_attn_func(q, k, v)  # fills the plan's parameter buffer that the launch piece reuses
    for name, fn in pieces.items():
        for _ in range(200):
            fn()
        torch.cuda.synchronize()
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            torch.cuda.synchronize()
            best = min(best, (time.perf_counter() - t0) / calls * 1e6)
        print(f"{name:32s} {best:6.2f} us")
