"""The Python part of a call's host time, measurable without a GPU: the real call path on CPU
tensors with the three GPU pieces replaced (a plan built from a real cubin compiled here, a no-op
launch, stream 0).  After the first call it times the prepared-launch path (api._CALLS).  What it
leaves out is what a GPU adds: allocating O on the device (~2 us) and the driver's own
cuLaunchKernel (~5 us on an H200 host; scripts/profile_overhead.py times both there).

    python scripts/host_overhead.py [calls]
"""

import sys
import time

import torch

import tileattn
from tileattn import _nvrtc, _params, api
from tileattn.versions import VERSIONS

calls = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
entry = VERSIONS["v3.3"]
cubin = _nvrtc.compile_kernel(entry.file, entry.name_expression("bfloat16", 64, False, 90), "sm_90a")
layout = _params.packer(cubin.data, cubin.lowered_name, True)
plan = api.Plan(
    function=0,
    context=0,
    Br=128,
    Bc=128,
    threads=384,
    smem=1000,
    per_head=False,
    workspace_per_row=0,
    tma_offset=layout.tma_offset,
    pack=layout.pack,
    params=_nvrtc.ParamBuffer(layout.init),
)
api._DEVICE_TYPE = "cpu"
api._plan = lambda *key: plan
api._current_stream = lambda index: 0
api._tensor_maps = lambda *a: bytes(_params.TMA_MAPS_BYTES)
_nvrtc.launch = lambda *a: None

q, k, v = (torch.randn(1, 16, 1, 64, dtype=torch.bfloat16) for _ in range(3))
with torch.no_grad():
    for fn_name, fn in [
        ("flash_attn_func", lambda: tileattn.flash_attn_func(q, k, v)),
        (
            "torch.empty x2 (CPU)",
            lambda: (torch.empty((1, 16, 1, 64), dtype=torch.bfloat16), torch.empty((1, 1, 16), dtype=torch.float32)),
        ),
    ]:
        for _ in range(1000):
            fn()
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            best = min(best, (time.perf_counter() - t0) / calls * 1e6)
        print(f"{fn_name:24s} {best:6.2f} us per call (host, best of 5 x {calls})")
