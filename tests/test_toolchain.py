"""The NVRTC that compiles our kernels is the one a GPU user gets from `pip install`: the wheel
pip pairs with torch's CUDA build.  (CI runs the compile tests once more under the newest NVRTC.)"""

import pytest
import torch

from tileattn import _nvrtc


def test_nvrtc_is_the_one_paired_with_torchs_cuda_build():
    if torch.version.cuda is None:
        pytest.skip("a CPU build of torch pins no NVRTC")
    torch_cuda = tuple(int(x) for x in torch.version.cuda.split(".")[:2])
    nvrtc = tuple(int(x) for x in _nvrtc.nvrtc_version().split("."))
    if torch_cuda[0] < 13:
        pytest.skip(f"torch built for CUDA {torch.version.cuda}: tileattn still uses NVRTC 13 (README)")
    assert nvrtc == torch_cuda, (
        f"NVRTC {nvrtc} but torch is built for CUDA {torch.version.cuda}: "
        "pip should have paired them (torch pins nvidia-cuda-nvrtc)"
    )


def test_versions_in_the_key_are_full():
    full = _nvrtc.nvrtc_full_version()
    assert full.startswith(_nvrtc.nvrtc_version()) and "libnvrtc" in full
    assert _nvrtc.headers_version().startswith("CUDART_VERSION 1")


def test_sass_tools_come_from_the_wheels():
    # cuobjdump needs nvdisasm: both are test dependencies (pyproject's [test] extra).
    assert "nvidia" in _nvrtc._find_tool("cuobjdump") and "nvidia" in _nvrtc._find_tool("nvdisasm")
